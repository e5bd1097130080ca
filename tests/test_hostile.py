"""Hostile training scripts on the real Docker Engine: the host never trusts what a script wrote.

Each test runs a script that attacks hermetic's host-side collection (links out
of /outputs and the working directory, a linked metrics file and runtime report,
FIFOs and sockets, names that are not UTF-8, a resealed record with a directory
link for --resume-from) against the numpy example's image. A canary file and a
sentinel directory outside the run directory, in a place only the host has,
prove that nothing was read or written there; every record is sealed with the
right status and exit code; nothing hangs (each run under a timeout).
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from run_support import hermetic_run, run_dir_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

CANARY_TEXT = '{"auths": {"registry.example": {"auth": "c2VjcmV0OnNlY3JldA=="}}, "value": 4711}\n'


@pytest.fixture
def host(tmp_path) -> Path:
    """Host-only paths (the container never sees them): a canary JSON file and an empty sentinel directory."""
    h = tmp_path / "host-only"
    (h / "sentinel").mkdir(parents=True)
    (h / "canary.json").write_text(CANARY_TEXT)
    return h


def assert_untouched(host: Path, project: Path) -> None:
    assert sorted(os.listdir(host / "sentinel")) == [], "something was written into the host's sentinel directory"
    assert (host / "canary.json").read_text() == CANARY_TEXT
    for p in (project.parent, project.parent.parent):
        assert not (p / "PWNED.txt").exists(), f"written outside the run directory: {p / 'PWNED.txt'}"


def write_script(project: Path, name: str, body: str) -> str:
    (project / name).write_text(textwrap.dedent(body))
    return name


def sealed(run_dir: Path) -> dict:
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["record"]["finished_at"] is not None, "the record was not sealed"
    assert rec["record"]["record_sha256"]
    return rec


def no_host_bytes(run_dir: Path) -> None:
    """Nothing of the canary's content anywhere in the run directory (record, outputs, logs)."""
    for p in run_dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert b"c2VjcmV0OnNlY3JldA==" not in p.read_bytes(), f"host bytes in {p}"


def test_links_out_of_outputs_are_never_written_through(project, host):
    """/outputs/victimdir -> a host directory, /outputs/escdir -> ../../../..: the working directory's
    victimdir/PWNED.txt and escdir/PWNED.txt are not collected through them."""
    script = write_script(project, "hostile.py", f"""
        import os
        os.symlink({str(host / "sentinel")!r}, "/outputs/victimdir")
        os.symlink("../../../..", "/outputs/escdir")
        for d in ("victimdir", "escdir"):
            os.makedirs(d + "/sub", exist_ok=True)
            open(d + "/PWNED.txt", "w").write("pwned")
            open(d + "/sub/PWNED.txt", "w").write("pwned")
        open("/outputs/model.bin", "wb").write(b"weights")
    """)
    proc, rec = hermetic_run(project, script, expect=None, timeout=300)
    run_dir = run_dir_of(project, rec)
    assert_untouched(host, project)
    rec = sealed(run_dir)
    files = rec["outputs"]["files"]
    assert files["victimdir"]["symlink"] == str(host / "sentinel")
    assert files["escdir"]["symlink"] == "../../../.."
    assert files["model.bin"]["size"] == 7
    assert not any(p.startswith(("victimdir/", "escdir/")) for p in files)
    # the outputs were not kept as the script wrote them: hermetic fails the run, and says why
    assert rec["record"]["status"] == "failed" and proc.returncode == 73, proc.stderr
    assert "victimdir/PWNED.txt" in rec["record"]["reason"]
    assert rec["record"]["exit_code"] == 0  # the script's own code is kept


def test_linked_metrics_and_runtime_report_are_not_read(project, host):
    """/outputs/metrics.jsonl -> a host file, and the runtime's report -> host JSON: neither reaches the record."""
    (host / "metrics.jsonl").write_text('{"step": 1, "stolen": 4711}\n')
    script = write_script(project, "hostile.py", f"""
        import os
        os.symlink({str(host / "metrics.jsonl")!r}, "/outputs/metrics.jsonl")
        report = os.environ["HERMETIC_RUNTIME_REPORT"]
        if os.path.lexists(report):
            os.remove(report)
        os.symlink({str(host / "canary.json")!r}, report)
        os._exit(0)  # skip the runtime's own report at exit: the link stays
    """)
    proc, rec = hermetic_run(project, script, expect=0, timeout=300)
    run_dir = run_dir_of(project, rec)
    rec = sealed(run_dir)
    assert rec["record"]["status"] == "succeeded"
    assert rec["metrics"]["final"] == {} and rec["metrics"]["file"] is None
    assert "4711" not in json.dumps(rec["seed"]) and "auths" not in json.dumps(rec)
    assert rec["outputs"]["files"]["metrics.jsonl"]["symlink"] == str(host / "metrics.jsonl")
    assert any("metrics.jsonl" in n for n in rec["outputs"]["notes"])
    no_host_bytes(run_dir)
    # later readers do not follow it either
    shown = run_cli("runs", "show", str(run_dir), "--json", cwd=project)
    assert shown.returncode == 0 and "4711" not in shown.stdout
    assert_untouched(host, project)


def test_a_dev_link_does_not_hang_the_host(project, host):
    """/outputs/devdir -> /dev and a working-directory devdir/zero: nothing reads the host's /dev/zero."""
    script = write_script(project, "hostile.py", """
        import os
        os.symlink("/dev", "/outputs/devdir")
        os.makedirs("devdir", exist_ok=True)
        open("devdir/zero", "w").write("z")
    """)
    proc, rec = hermetic_run(project, script, expect=None, timeout=240)
    rec = sealed(run_dir_of(project, rec))
    assert rec["record"]["status"] == "failed" and "devdir/zero" in rec["record"]["reason"]
    assert rec["outputs"]["files"]["devdir"]["symlink"] == "/dev"


def test_fifos_sockets_and_odd_names_are_recorded_and_the_record_seals(project):
    script = write_script(project, "hostile.py", """
        import os, socket
        os.mkfifo("/outputs/pipe")
        s = socket.socket(socket.AF_UNIX)
        s.bind("/outputs/sock")
        open(os.fsdecode(b"/outputs/odd\\xffname.txt"), "w").write("x")
        open(os.fsdecode(b"odd\\xfe-in-workdir.txt"), "w").write("y")
        open("/outputs/100%.txt", "w").write("z")
        os.mkfifo("workdir-pipe")
    """)
    proc, rec = hermetic_run(project, script, expect=0, timeout=240)
    run_dir = run_dir_of(project, rec)
    rec = sealed(run_dir)
    assert rec["record"]["status"] == "succeeded" and rec["record"]["exit_code"] == 0
    files = rec["outputs"]["files"]
    assert files["pipe"]["type"] == "fifo" and files["sock"]["type"] == "socket"
    assert files["odd%FFname.txt"]["size"] == 1 and files["100%25.txt"]["size"] == 1
    assert files["odd%FE-in-workdir.txt"]["size"] == 1  # collected from the working directory, escaped
    assert (run_dir / "outputs" / os.fsdecode(b"odd\xfe-in-workdir.txt")).read_text() == "y"
    # the record round-trips, and diff of the run with itself compares what it holds
    rc = run_cli("diff", str(run_dir), str(run_dir), cwd=project)
    assert rc.returncode == 0, rc.stdout + rc.stderr


def test_resume_from_a_resealed_record_with_a_directory_link_is_refused(project, host):
    from hermetic.record.seal import seal

    script = write_script(project, "first.py", """
        open("/outputs/ckpt.bin", "wb").write(b"ckpt")
    """)
    _, first = hermetic_run(project, script, expect=0, timeout=240)
    first_dir = run_dir_of(project, first)
    # The attacker adds a directory link to the earlier run's outputs and a file "under" it, and reseals.
    os.symlink(str(host / "sentinel"), first_dir / "outputs" / "victimdir")
    doc = json.loads((first_dir / "run.json").read_text())
    import hashlib

    target = str(host / "sentinel").encode()
    doc["outputs"]["files"]["victimdir"] = {"sha256": hashlib.sha256(target).hexdigest(), "size": len(target),
                                            "symlink": str(host / "sentinel")}
    doc["outputs"]["files"]["victimdir/PWNED.txt"] = {"sha256": hashlib.sha256(b"pwned").hexdigest(), "size": 5}
    doc["record"]["record_sha256"] = ""
    (first_dir / "run.json").write_text(json.dumps(seal(doc)))
    write_script(project, "second.py", "print('resumed')\n")
    before = set(os.listdir(project / "runs"))
    proc = run_cli("run", "--resume-from", first_dir.name, "second.py", cwd=project, timeout=240)
    assert_clean_error(proc, 65, "victimdir/PWNED.txt")
    assert_untouched(host, project)
    assert set(os.listdir(project / "runs")) == before  # refused before any run directory was made


@pytest.mark.skipif(os.geteuid() != 0, reason="the collection drops privileges only when hermetic is root")
def test_the_collection_cannot_write_where_the_container_user_cannot(tmp_path):
    """The second wall on its own: the collecting process is the container's user, so even a destination
    hermetic left root-owned (as a bug in the first wall might reach) is not writable by it."""
    from hermetic.run.collect import CollectPlan, collect_run

    run_dir = tmp_path / "run"
    (run_dir / "outputs").mkdir(parents=True)  # root-owned, 0755: not the container user's
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model.pt").write_bytes(b"m")
    os.chown(ws, 1000, 1000)
    os.chown(ws / "model.pt", 1000, 1000)
    got = collect_run(CollectPlan(run_dir=str(run_dir), runtime_dir=None, workspace=str(ws), include=["**"]),
                      uid=1000, gid=1000)
    assert got.workdir.collected == []
    assert got.workdir.errors and "Permission denied" in got.workdir.errors[0]
    assert not (run_dir / "outputs" / "model.pt").exists()
