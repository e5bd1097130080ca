"""Issue 40's leftovers: a record's JSON nested past Python's limit, a wrong type in hardware.gpus, hostile text in
a run's README.md, TensorBoard tags without bound, and a replay or a Slurm submission of a record whose paths lie
outside the project."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli_in_process as cli
from synthetic_records import synthetic_record, write_synthetic_run

A, B = "20261129-214500-aaaaaa", "20261129-214500-bbbbbb"
DEEP = "[" * 100_000 + "]" * 100_000



@pytest.fixture()
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "runs"
    write_synthetic_run(root, synthetic_record(A))
    write_synthetic_run(root, synthetic_record(B, seed=1))
    return root


@pytest.mark.parametrize("name", ["run.json", "group.json"])
def test_a_record_nested_too_deeply_is_a_record_error_naming_it(tmp_path: Path, name: str) -> None:
    from hermetic.record.rundir import load_json_doc
    from hermetic.record.schema import RecordError

    path = tmp_path / name
    path.write_text('{"record": ' + DEEP + "}")
    with pytest.raises(RecordError) as e:
        load_json_doc(path, "run")
    assert e.value.exit_code == 65 and e.value.message == f"{path}: not valid JSON: nested too deeply"


def test_runs_lists_a_run_nested_too_deeply_as_unreadable(runs: Path) -> None:
    """`hermetic runs` reads every run.json (and the index) it has not indexed: one too deep is a row, not a crash."""
    (runs / A / "run.json").write_text('{"record": ' + DEEP + "}")
    (runs / ".index.jsonl").write_text('{"v": 1, "id": "x", "deep": ' + DEEP + "}\n")
    code, out, err = cli("runs", "--runs-dir", str(runs), "--json")
    assert code == 0 and "Traceback" not in err, err[-2000:]
    status = {e["id"]: e["status"] for e in json.loads(out)}
    assert status[A] == "unreadable" and B in status and "x" not in status


@pytest.mark.parametrize("gpus", [-1, "x", [1], {"0": {}}])
def test_a_wrong_type_in_hardware_gpus_is_refused_by_the_loader_naming_the_key(runs: Path, gpus: object) -> None:
    from hermetic.core.canonical import pretty_json
    from hermetic.record.seal import seal

    rec = synthetic_record(A)
    rec["hardware"]["gpus"] = gpus
    (runs / A / "run.json").write_text(pretty_json(seal(rec)))
    for argv in (("runs", "--runs-dir", str(runs), "show", A), ("diff", "--runs-dir", str(runs), A, B)):
        code, _, err = cli(*argv)
        assert code == 65 and err.startswith(f"hermetic: error: {runs / A / 'run.json'}: hardware.gpus"), err


HOSTILE = "\x1b]0;owned\x07\r\n# forged `x` [click](javascript:alert(1))"


def test_a_hostile_record_renders_a_readme_with_no_raw_control_and_no_broken_code_span() -> None:
    import re

    from hermetic.record.readme import render_readme
    from hermetic.record.seal import seal

    rec = synthetic_record(A)
    rec["record"]["tool"] = "hermetic " + HOSTILE
    rec["invocation"]["config"]["runs_dir"] = "runs" + HOSTILE
    rec["invocation"]["user"] = "1000:1000" + HOSTILE
    rec["invocation"]["args"] = [HOSTILE]
    rec["image"]["base"] = "python:3.11" + HOSTILE
    rec["image"]["repo_digests"] = ["reg/x@sha256:" + HOSTILE]
    rec["code"]["git"].update(commit="c" + HOSTILE, branch="main" + HOSTILE, dirty=True)
    name, ds = next(iter(rec["data"].items()))
    rec["data"] = {name + HOSTILE: {**ds, "path": "data" + HOSTILE, "mounts": ["/data" + HOSTILE],
                                    "manifest_file": "data/m" + HOSTILE}}
    rec["env"]["passed"] = {"K" + HOSTILE: "v" + HOSTILE}
    rec["env"]["secrets"] = ["S" + HOSTILE]
    text = render_readme(seal(rec))
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", text), [ln for ln in text.splitlines() if "owned" in ln]
    assert "# forged" in text and not re.search("^ *# forged", text, re.M)
    for line in text.splitlines():
        assert line.count("`") % 2 == 0 or line.startswith("    "), line  # code blocks may hold any
        prose = re.sub("`[^`]*`", "", line) if not line.startswith("    ") else ""
        assert not re.search(r"(?<!\\)\]\(", prose), line


def test_tensorboard_tags_are_capped_and_what_was_left_out_is_in_the_record(tmp_path: Path) -> None:
    """1,200 scalar tags, one of 300 characters, and more points than the reader's budget: at most 1,000 tags are
    read, the long one never, and metrics.left_out counts the values of the others and the points past the budget."""
    pytest.importorskip("tensorboard")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_metrics_sources import collect, event_file, run_dir_with

    from hermetic.inimage import tb_scalars
    from hermetic.record import metrics as mx

    scalars = {f"t{i:04d}": [(1, float(i))] for i in range(1200)}
    scalars["L" * 300] = [(1, 1.0)]
    scalars["t0000"] = [(s, float(s)) for s in range(1, 11)]
    run_dir = run_dir_with(tmp_path, {})
    path = event_file(run_dir / "outputs" / "tb", scalars)
    doc = tb_scalars.read_scalars(str(path), 1005)
    assert len(doc["tags"]) == 1000 and "L" * 300 not in doc["tags"]
    assert doc["left_out"] == {"other_names": 201, "points": 3}  # t0000: steps 1-6 and 10 kept, 7-9 not
    assert doc["tags"]["t0000"][-1] == [10, 10.0]
    kept = mx.Kept()
    mx.event_part("tb/x", doc, kept)
    assert kept.left_out["other_names"] >= 201 and kept.left_out["points"] >= 3
    got = collect(run_dir)
    assert got.metrics["left_out"]["other_names"] >= 201 and len(got.metrics["final"]) <= 1000


OUTSIDE = [("lock", "/etc/hermetic.lock"), ("runs_dir", "../elsewhere"), ("datasets", "/etc")]


def _outside(config: dict, key: str, value: str) -> None:
    if key == "datasets":
        config["datasets"][0]["path"] = value
    else:
        config[key] = value


@pytest.mark.parametrize("key,value", OUTSIDE)
def test_a_replayed_record_whose_config_names_a_path_outside_the_project_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HERMETIC_ALLOW_PATHS", raising=False)
    rec = synthetic_record(A)
    rec["image"]["repo_digests"] = []
    _outside(rec["invocation"]["config"], key, value)
    runs = tmp_path / "project" / "runs"
    write_synthetic_run(runs, rec)
    code, _, err = cli("replay", str(runs / A))
    assert code == 78 and len(err.splitlines()) == 1, err
    assert err.startswith(f"hermetic: error: {runs / A / 'run.json'}: invocation.config: {key}") and value in err
    assert "HERMETIC_ALLOW_PATHS" in err
    monkeypatch.setenv("HERMETIC_ALLOW_PATHS", f"/etc:{tmp_path.parent}")  # allowed: on to the image, not stored
    code, _, err = cli("replay", str(runs / A))
    assert code not in (0, 78), err


@pytest.mark.parametrize("key,value", OUTSIDE)
def test_a_submission_whose_config_names_a_path_outside_the_project_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    from hermetic.core.errors import ConfigError
    from hermetic.slurm.submission import Submission

    monkeypatch.delenv("HERMETIC_ALLOW_PATHS", raising=False)
    config = synthetic_record(A)["invocation"]["config"]
    _outside(config, key, value)
    project = tmp_path / "project"
    sub = Submission(kind="run", submission_id=A, project_root=project, runs_dir=project / "runs", config=config,
                     request={}, members=[], image={}, repo_digests=[], container="docker", partition="p", nnodes=1,
                     node_cache=None, python="python3", seed_policy="config")
    with pytest.raises(ConfigError) as e:
        sub.loaded_config()
    assert e.value.exit_code == 78
    assert e.value.message.startswith(f"{project / 'runs' / A / 'slurm' / 'submit.json'}: config: {key}")
    monkeypatch.setenv("HERMETIC_ALLOW_PATHS", f"/etc:{tmp_path}")
    assert sub.loaded_config().root == project


def test_a_replayed_records_dataset_path_must_be_where_its_config_leads(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's own data.<name>.path is read again only where the recorded hermetic.yaml's dataset path
    leads, or where HERMETIC_ALLOW_PATHS allows: a crafted record cannot have root hash /etc."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HERMETIC_ALLOW_PATHS", raising=False)
    rec = synthetic_record(A)
    rec["image"]["repo_digests"] = []
    name = next(iter(rec["data"]))
    rec["data"][name]["path"] = "/etc"
    runs = tmp_path / "project" / "runs"
    write_synthetic_run(runs, rec)
    code, _, err = cli("replay", str(runs / A))
    assert code == 78 and len(err.splitlines()) == 1, err
    assert f"data.{name}.path: /etc is not where the recorded hermetic.yaml's dataset {name} leads" in err
    assert f"--data {name}=PATH" in err and "HERMETIC_ALLOW_PATHS" in err
    monkeypatch.setenv("HERMETIC_ALLOW_PATHS", "/etc")  # allowed: on to the image (not stored here)
    code, _, err = cli("replay", str(runs / A))
    assert code not in (0, 78), err
