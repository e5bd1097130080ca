"""A run keeps its promises when the terminal goes away (issue 14): closed pipes, hang-ups, --detach,
logs -f, runs wait, stop; and a replay re-applies every variable the run was given."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import assert_clean_error, run_cli
from run_support import hermetic_run, labelled_containers, run_dirs

CHATTY = "import time\nfor i in range(200):\n    print('line', i, flush=True)\n    time.sleep(0.01)\n" \
         "open('/outputs/done.txt', 'w').write('done')\n"
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"


def unique() -> str:
    return "t" + uuid.uuid4().hex[:10]


def _record(project, name):
    (rd,) = [project / "runs" / r for r in run_dirs(project) if r.endswith(name)]
    return rd, json.loads((rd / "run.json").read_text())


@pytest.mark.docker
def test_replay_of_a_run_given_a_knob_is_bitwise_identical_and_the_probe_saw_it(project):
    _, rec = hermetic_run(project, "--env", "OMP_NUM_THREADS=2", "train.py")
    assert rec["env"]["determinism"]["OMP_NUM_THREADS"] == "2"
    assert rec["software"]["env"]["OMP_NUM_THREADS"] == "2"  # the probe ran with what training had
    proc = run_cli("replay", "--json", rec["record"]["run_id"], cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["diff"]["verdict"]["kind"] == "identical", out["diff"]["verdict"]


@pytest.mark.docker
def test_a_closed_pipe_does_not_stop_the_run(project):
    (project / "chatty.py").write_text(CHATTY)
    name = unique()
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m hermetic run --name {name} chatty.py 2>&1 | head -1"],
                          cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1
    rd, rec = _record(project, name)
    assert rec["record"]["status"] == "succeeded" and "done.txt" in rec["outputs"]["files"]
    assert len((rd / "logs" / "stdout.log").read_text().splitlines()) == 200


@pytest.mark.docker
def test_a_hang_up_does_not_stop_the_run(project, docker_client):
    (project / "slow.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(3)\n"
                                     "open('/outputs/done.txt', 'w').write('done')\n")
    name = unique()
    p = subprocess.Popen([sys.executable, "-m", "hermetic", "run", "--name", name, "slow.py"], cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not [c for c in labelled_containers(docker_client, name)
                                                   if c.status == "running"]:
            time.sleep(0.1)
        p.send_signal(signal.SIGHUP)  # what closing the terminal sends
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    _, rec = _record(project, name)
    assert rec["record"]["status"] == "succeeded" and "done.txt" in rec["outputs"]["files"]


@pytest.mark.docker
def test_detach_returns_at_once_then_logs_wait_and_stop_follow_the_run(project):
    (project / "sleeper.py").write_text(SLEEPER)
    t = time.monotonic()
    proc = run_cli("run", "--detach", "--name", "bg", "sleeper.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert run_id.endswith("-bg") and time.monotonic() - t < 60
    listed = json.loads(run_cli("runs", "--json", cwd=project).stdout)
    assert next(e for e in listed if e["id"] == run_id)["status"] == "running"
    # Ctrl-C on `logs -f` stops the following, not the run
    follow = subprocess.Popen([sys.executable, "-m", "hermetic", "logs", "-f", run_id], cwd=project,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    seen = b""
    while b"started" not in seen and time.monotonic() < deadline:
        seen += follow.stdout.read1(100) if hasattr(follow.stdout, "read1") else follow.stdout.read(1)
    follow.send_signal(signal.SIGINT)
    assert follow.wait(timeout=30) == 130
    assert b"started" in seen
    assert run_cli("runs", "wait", run_id, "--timeout", "1", cwd=project).returncode == 75  # still going
    stopped = run_cli("stop", run_id, cwd=project)
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"{run_id}: interrupted", stopped.stderr
    waited = run_cli("runs", "wait", run_id, cwd=project)
    assert waited.returncode == 143
    rec = json.loads((project / "runs" / run_id / "run.json").read_text())
    assert rec["record"]["status"] == "interrupted" and rec["record"]["finished_at"]
    assert (project / "runs" / run_id / "logs" / "stdout.log").read_text() == "started\n"
    assert_clean_error(run_cli("stop", run_id, cwd=project), 66, "not running")


@pytest.mark.docker
def test_a_detached_run_refused_before_it_starts_says_so_where_it_was_started(project):
    data = project / "data" / "train-x.f32"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 1
    data.write_bytes(bytes(raw))
    before = run_dirs(project)
    proc = run_cli("run", "--detach", "train.py", cwd=project)
    assert_clean_error(proc, 65, "train-x.f32", "no container was started")
    assert run_dirs(project) == before
