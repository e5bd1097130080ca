"""Issue 25, the smaller points: a sweep that wrote nothing, a torchvision for the other torch at build and run
time, resuming from a run that failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from hermetic.record.group import group_flags
from synthetic_records import synthetic_record
from hermetic.run.resume import ResumeSource
from run_support import hermetic_run, run_dir_of


def _wrote_nothing(run_id: str, seed: int) -> dict:
    rec = synthetic_record(run_id, seed=seed)
    rec["outputs"]["files"] = {}
    rec["metrics"] = {"final": {}, "steps": None, "file": None}
    return rec


def test_a_sweep_whose_members_wrote_nothing_is_flagged():
    flags = group_flags([_wrote_nothing("20261129-214500-aaaaaa", 0), _wrote_nothing("20261129-214600-bbbbbb", 1)])
    assert [f.split(":")[0] for f in flags] == ["nothing to compare", "the script used no seed"]
    assert "no member wrote an output file or logged a metric" in flags[0]
    # one member with a file is something to compare: no such flag
    some = _wrote_nothing("20261129-214600-bbbbbb", 1)
    some["outputs"]["files"] = {"model.pt": {"sha256": "0" * 64, "size": 1}}
    assert not any(f.startswith("nothing to compare") for f in group_flags([_wrote_nothing("x", 0), some]))


def test_what_resuming_from_a_run_that_did_not_succeed_means():
    empty_failed = ResumeSource(Path("runs/r1"), {}, frozenset(), "failed", 1)
    [w] = empty_failed.warnings()
    assert w == ("--resume-from r1: that run failed (exit 1) and left no outputs: there is nothing to resume from, "
                 "so this run starts as a fresh one would (resume from a run that wrote a checkpoint, or run the "
                 "earlier step again)")
    partial = ResumeSource(Path("runs/r2"), {"ckpt.pt": {"sha256": "0" * 64, "size": 1}}, frozenset(),
                           "interrupted", None)
    assert partial.warnings() == ["--resume-from r2: that run interrupted: its 1 output are what it had written "
                                  "when it stopped, perhaps a partial checkpoint; this run starts from them"]
    assert ResumeSource(Path("runs/r3"), {"a": {}}, frozenset()).warnings() == []
    assert "succeeded and left no outputs" in ResumeSource(Path("runs/r4"), {}, frozenset()).warnings()[0]


@pytest.mark.docker
def test_a_print_only_sweep_and_a_resume_from_a_failed_run_say_what_they_mean(project):
    (project / "prints.py").write_text("print('hello')\n")
    proc = run_cli("run", "--seeds", "2", "prints.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "hermetic: warning: nothing to compare: no member wrote an output file or logged a metric" in proc.stderr
    assert "compare members' outputs" not in proc.stdout  # there are none
    (project / "fails.py").write_text("import sys\nsys.exit(3)\n")
    _, failed = hermetic_run(project, "fails.py", expect=3)
    assert failed["outputs"]["files"] == {}
    proc = run_cli("run", "--resume-from", failed["record"]["run_id"], "prints.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert (f"hermetic: warning: --resume-from {failed['record']['run_id']}: that run failed (exit 3) and left no "
            "outputs: there is nothing to resume from") in proc.stderr


@pytest.mark.docker
def test_a_cuda_torchvision_beside_the_cpu_torch_is_warned_about_at_build_and_run(tmp_path, use_session_cache,
                                                                                  base_ref, isolated_pip,
                                                                                  monkeypatch):
    from buildsupport import make_project
    from wheelfactory import make_index, make_wheel

    src = tmp_path / "wheels"
    files = {"torch": make_wheel(src, "torch", "2.13.0+cpu"), "torchvision": make_wheel(src, "torchvision", "0.28.0")}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    proj = make_project(tmp_path / "p", base_ref, files)
    warning = ("hermetic: warning: torchvision 0.28.0 is a CUDA build (PyPI's Linux wheels are), but torch "
               "2.13.0+cpu is the CPU build: it will not import; pin torchvision==0.28.0+cpu")
    first = run_cli("build", "-C", str(proj))
    assert first.returncode == 0, first.stderr
    assert warning in first.stderr
    again = run_cli("build", "-C", str(proj))  # a no-op says it again
    assert again.returncode == 0 and "up to date" in again.stdout and warning in again.stderr, again.stderr
    doc = json.loads(run_cli("build", "-C", str(proj), "--json").stdout)
    assert any("torchvision 0.28.0 is a CUDA build" in n for n in doc["notes"])
    (proj / "hello.py").write_text("print('no torchvision imported here')\n")
    run = run_cli("run", "hello.py", cwd=proj)
    assert run.returncode == 0, run.stderr  # a warning: a script that never imports torchvision works
    assert warning in run.stderr
    assert run.stderr.index(warning) < run.stderr.index("hermetic: run ")  # said before the container starts
