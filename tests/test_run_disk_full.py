"""A script that fills the disk under runs/: one line, exit 73, the container gone, the record sealed.

runs/ is a real, small tmpfs. The script writes /outputs until the disk is
full, then a file in its working directory (which hermetic must copy across
file systems into runs/<id>/outputs: that copy fails too) and exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from conftest import run_cli
from run_support import labelled_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]


@pytest.fixture
def small_runs(project):
    runs = project / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(runs)], check=True)
    yield runs
    subprocess.run(["umount", "-l", str(runs)], check=False)


def test_a_full_disk_under_runs_seals_the_record(project, small_runs, docker_client):
    (project / "filler.py").write_text(textwrap.dedent("""
        import os
        open("/outputs/first.txt", "w").write("kept\\n")
        n = 0
        try:
            with open("/outputs/fill.bin", "wb") as f:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
                    n += 1
        except OSError as e:
            print("the script saw:", e.strerror, flush=True)
        os.unlink("/outputs/fill.bin")  # room for the workdir copy's first bytes, not for all of it
        with open("/outputs/fill2.bin", "wb") as f:
            try:
                while True:
                    f.write(b"y" * 65536)
                    f.flush()
            except OSError:
                pass
        open("big-in-workdir.bin", "wb").write(os.urandom(2 << 20))
        print("done", flush=True)
    """))
    proc = run_cli("run", "filler.py", cwd=project, timeout=400)
    assert proc.returncode == 73, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic: error: ")]
    assert len(errors) == 1 and "big-in-workdir.bin" in errors[0] and "No space left" in errors[0], proc.stderr
    (run_id,) = [p for p in os.listdir(small_runs) if not p.startswith(".")]
    rec = json.loads((small_runs / run_id / "run.json").read_text())
    assert rec["record"]["finished_at"] is not None and rec["record"]["status"] == "failed"
    assert rec["record"]["exit_code"] == 0 and rec["record"]["hermetic_exit_code"] == 73
    assert "first.txt" in rec["outputs"]["files"]  # what was written and collected is kept and hashed
    assert not (small_runs / run_id / ".space-reserve").exists()
    assert labelled_containers(docker_client, run_id) == []  # stopped and removed


def test_a_script_that_catches_a_full_disk_and_exits_0_fails_naming_the_filesystem(project, small_runs):
    """Issue 40, item 8: the script fills runs/'s filesystem, catches ENOSPC and exits 0 (nothing hermetic
    writes after it fails): the record and the last line say the filesystem was full and what was lost."""
    (project / "catcher.py").write_text(textwrap.dedent("""
        try:
            with open("/outputs/fill.bin", "wb") as f:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
        except OSError as e:
            print("caught:", e.strerror, flush=True)
    """))
    proc = run_cli("run", "catcher.py", cwd=project, timeout=400)
    assert proc.returncode == 73, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hermetic: error: ") and f"the filesystem at {small_runs} (tmpfs) was full" in last, last
    assert "what it wrote to outputs/ after that was lost" in last, last
    (run_id,) = [p for p in os.listdir(small_runs) if not p.startswith(".")]
    rec = json.loads((small_runs / run_id / "run.json").read_text())
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 0
    assert rec["record"]["hermetic_exit_code"] == 73 and f"{small_runs} (tmpfs) was full" in rec["record"]["reason"]
