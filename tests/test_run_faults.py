"""A run keeps its promises when the terminal goes away (issue 14): closed pipes, hang-ups, --detach,
logs -f, runs wait, stop; and a replay re-applies every variable the run was given. Limits (issue 24,
item 5): a fork bomb fills its container's pids limit and ends the run, not the host; the limits are
applied, recorded and named by diff; an OOM kill is recorded with a hint naming run.memory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import assert_clean_error, run_cli
from run_support import diff_json, hermetic_run, labelled_containers, run_dir_of, run_dirs

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
    # SIGINT as a terminal gives it: a suite started in the background by a shell without job control
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it
    follow = subprocess.Popen([sys.executable, "-m", "hermetic", "logs", "-f", run_id], cwd=project,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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


def set_run_keys(project, **keys) -> None:
    """hermetic.yaml's run: section given these keys (the example has none)."""
    cfg = project / "hermetic.yaml"
    text = cfg.read_text()
    assert "\nrun:" not in text
    cfg.write_text(text + "run:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items()))


# Reads the container's own cgroup limits (cgroup v2, else v1) into /outputs/limits.json.
READ_LIMITS = """import json, pathlib
def first(*paths):
    for p in paths:
        try:
            return pathlib.Path(p).read_text().strip()
        except OSError:
            pass
json.dump({"pids": first("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
           "memory": first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")},
          open("/outputs/limits.json", "w"))
"""


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_fork_bomb_fills_its_containers_pids_limit_and_ends_the_run(project, docker_client):
    set_run_keys(project, pids=64)
    (project / "bomb.py").write_text("import os\nprint('forking', flush=True)\nwhile True:\n    os.fork()\n")
    name = unique()
    proc, rec = hermetic_run(project, "--name", name, "bomb.py", expect=1, timeout=240)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 1, rec["record"]
    assert rec["invocation"]["limits"] == {"pids": 64, "memory": None}
    err = (run_dir_of(project, rec) / "logs" / "stderr.log").read_text(errors="replace")
    assert "Resource temporarily unavailable" in err  # fork() refused: the limit, not the host, ran out
    assert labelled_containers(docker_client, name) == []


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_the_limits_are_applied_recorded_and_named_by_diff(project):
    (project / "limits.py").write_text(READ_LIMITS)
    _, rec = hermetic_run(project, "limits.py")
    assert rec["invocation"]["limits"] == {"pids": 4096, "memory": None}  # the defaults
    rd = run_dir_of(project, rec)
    assert json.loads((rd / "outputs" / "limits.json").read_text())["pids"] == "4096"
    assert "--pids-limit 4096" in (rd / "README.md").read_text()  # the by-hand docker run says it too
    (project / "same.py").write_text("open('/outputs/same.txt', 'w').write('same')\n")
    _, a = hermetic_run(project, "same.py")
    set_run_keys(project, pids=100, memory="256m")
    _, limited = hermetic_run(project, "limits.py")
    assert limited["invocation"]["limits"] == {"pids": 100, "memory": "256m"}
    seen = json.loads((run_dir_of(project, limited) / "outputs" / "limits.json").read_text())
    assert seen == {"pids": "100", "memory": str(256 << 20)}
    shown = run_cli("runs", "show", limited["record"]["run_id"], cwd=project)
    assert "pids 100, memory 256m (run.pids, run.memory)" in shown.stdout, shown.stdout
    _, b = hermetic_run(project, "same.py")
    code, diff = diff_json(run_dir_of(project, a), run_dir_of(project, b))
    # Both succeeded: the limits are listed, not a cause; the outputs are the same bits.
    assert code == 0 and diff["verdict"]["kind"] == "identical", diff["verdict"]
    (config,) = [sec for sec in diff["sections"] if sec["name"] == "config"]
    notes = {c["key"]: (c["note"], c["material"]) for c in config["changes"]}
    assert notes["run.pids"] == ("run.pids 4096 -> 100 (a limit: both runs succeeded within it)", False)
    assert notes["run.memory"][0].startswith("run.memory unset (no limit) -> 256m") and not notes["run.memory"][1]


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_an_oom_kill_is_recorded_as_such_with_a_hint_naming_run_memory(project):
    (project / "hog.py").write_text("hog = [bytearray(16 << 20) for _ in range(12)]\n"  # ~200 MB
                                    "open('/outputs/done.txt', 'w').write('done')\n")
    _, fine = hermetic_run(project, "hog.py")  # no memory limit by default
    set_run_keys(project, memory="64m")
    proc, rec = hermetic_run(project, "hog.py", expect=137)
    meta = rec["record"]
    assert meta["status"] == "failed" and meta["exit_code"] == 137, meta
    assert "ran out of memory" in meta["reason"] and "run.memory: 64m" in meta["reason"]
    assert "run.memory" in proc.stderr  # the reason is said where the run was started, too
    assert rec["invocation"]["limits"] == {"pids": 4096, "memory": "64m"}
    assert "done.txt" not in rec["outputs"]["files"]
    code, diff = diff_json(run_dir_of(project, fine), run_dir_of(project, rec))
    assert code == 1 and diff["verdict"]["kind"] == "inputs", diff["verdict"]
    assert "run.memory unset (no limit) -> 64m" in diff["verdict"]["line"]


# ---------------------------------------------------------------- limits, without an engine


def test_run_pids_and_run_memory_have_documented_defaults_and_clear_refusals(tmp_path):
    from hermetic.config.load import RunConfig, load_config
    from hermetic.engines.base import DEFAULT_PIDS_LIMIT

    assert (RunConfig().pids, RunConfig().memory) == (DEFAULT_PIDS_LIMIT, None) == (4096, None)
    base = "name: x\nbase: debian@sha256:" + "0" * 64 + "\nrun:\n"
    cfg = tmp_path / "hermetic.yaml"
    for value, error in [("pids: 4", "run.pids: must be at least 8"), ("memory: 1m", "run.memory: must be at least 6m"),
                         ("memory: 1.5g", "run.memory: must be a size"), ("pids: '64'", "run.pids:")]:
        cfg.write_text(base + f"  {value}\n")
        proc = run_cli("config", "show", "-C", str(cfg))
        assert_clean_error(proc, 78, error, "hermetic.yaml:4")
    cfg.write_text(base + "  pids: null\n  memory: 16g\n")
    run = load_config(cfg).model.run
    assert (run.pids, run.memory) == (None, "16g")


def test_the_container_gets_the_limits_with_swap_bounded_by_memory_and_a_dropped_limit_is_named():
    from hermetic.engines.base import ContainerSpec
    from hermetic.engines.dockercontainer import _dropped_limit, host_config

    spec = ContainerSpec(image_id="sha256:" + "0" * 64, command=["true"], mounts=[], env={}, user="1000:1000")
    hc = host_config(spec)
    assert hc["PidsLimit"] == 4096 and "Memory" not in hc and "MemorySwap" not in hc
    limited = ContainerSpec(image_id=spec.image_id, command=["true"], mounts=[], env={}, user="1000:1000",
                            pids_limit=64, memory="512m")
    hc = host_config(limited)
    assert (hc["PidsLimit"], hc["Memory"], hc["MemorySwap"]) == (64, 512 << 20, 512 << 20)
    none = ContainerSpec(image_id=spec.image_id, command=["true"], mounts=[], env={}, user="1000:1000", pids_limit=None)
    assert "PidsLimit" not in host_config(none)
    assert _dropped_limit({"PidsLimit": 64, "Memory": 512 << 20}, limited) is None
    assert _dropped_limit({"PidsLimit": None, "Memory": 512 << 20}, limited) == "pids limit (run.pids: 64)"
    assert _dropped_limit({"PidsLimit": 64, "Memory": 0}, limited) == "memory limit (run.memory: 512m)"


def test_the_record_keeps_the_limits_and_diff_makes_a_limit_a_cause_only_when_a_run_fell_short():
    import copy

    from hermetic.diff import diff_records
    from hermetic.record import validate_record
    from hermetic.record.schema import RecordError
    from synthetic_records import synthetic_record

    a = synthetic_record()
    a["invocation"]["config"]["run"] = {"pids": 4096, "memory": None}
    a["invocation"]["limits"] = {"pids": 4096, "memory": None}
    validate_record(a, sealed=False)
    bad = copy.deepcopy(a)
    bad["invocation"]["limits"]["pids"] = 0
    with pytest.raises(RecordError, match="invocation.limits.pids"):
        validate_record(bad, sealed=False)
    b = copy.deepcopy(a)
    b["record"]["run_id"] = "20261129-215000-2b3c4d"
    b["invocation"]["config"]["run"] = {"pids": 4096, "memory": "64m"}
    b["invocation"]["limits"] = {"pids": 4096, "memory": "64m"}
    both_fine = diff_records(a, b).verdict
    assert both_fine.kind == "identical", both_fine.line  # listed, not a cause
    b["record"].update(status="failed", exit_code=137, reason="the script ran out of memory ...")
    b["outputs"]["files"] = {}
    short = diff_records(a, b).verdict
    assert short.kind == "inputs" and short.causes[0] == "config", short.line
    assert "run.memory unset (no limit) -> 64m (the container's limit)" in short.line
