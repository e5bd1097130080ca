"""A killed driver leaves no orphan (issue 24, item 3): `kill -9` of a real `hermetic run` mid-run, then
`hermetic runs`, `hermetic stop` and the next `hermetic run` find the container whose driver died, stop and
remove it and seal the run's record `interrupted` with the reason; no sweep removes the working directory of
a container that still exists, and a live run is never taken for an orphan."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from kill_support import sigkill, start_hermetic, wait_for
from run_support import build

# Every `hermetic run` and `hermetic runs` on the machine reaps the orphans it finds: beside another
# worker's, the orphans these tests make (and look at before they are reaped) would be taken by it.
pytestmark = pytest.mark.serial

RUN_LABEL = "org.hermetic.run-id"
DRIVER_LABEL = "org.hermetic.driver"
HOLDS_LABEL = "org.hermetic.holds"

# Writes a file into /outputs and a line into its working directory every 0.2 s, until stopped.
WRITER = ("import time\n"
          "print('started', flush=True)\n"
          "i = 0\n"
          "while True:\n"
          "    i += 1\n"
          "    open(f'/outputs/tick-{i:05d}.txt', 'w').write(str(i))\n"
          "    with open('work.txt', 'a') as f:\n"
          "        f.write(f'{i}\\n')\n"
          "    time.sleep(0.2)\n")


# A container ends itself when its driver dies (its gate: test_driver_death.py), unless the gate cannot act:
# these scripts stop theirs (SIGSTOP to the script's parent), so that their containers outlive their driver,
# as a container of a hermetic from before the gate did: the reaper is what ends them then.
STOP_GATE = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"


def unique() -> str:
    return "o" + uuid.uuid4().hex[:10]


def run_dir_named(project: Path, name: str) -> Path | None:
    runs = project / "runs"
    found = [p for p in runs.iterdir() if p.name.endswith(name)] if runs.is_dir() else []
    return found[0] if found else None


def ticks(run_dir: Path) -> int:
    return len(list((run_dir / "outputs").glob("tick-*.txt")))


def containers_of(client, run_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})


def start_writer(project: Path, name: str, script: str = "writer.py",
                 stop_gate: bool = False) -> tuple[subprocess.Popen, Path]:
    """`hermetic run` of WRITER, until it wrote 3 files; (the driver, its run directory)."""
    (project / script).write_text((STOP_GATE if stop_gate else "") + WRITER)
    p = start_hermetic("run", "--name", name, script, cwd=project)
    found: list[Path] = []

    def writing() -> bool:
        rd = run_dir_named(project, name)
        if rd is not None and ticks(rd) >= 3:
            found.append(rd)
            return True
        return False

    wait_for(p, writing, "the script's third file", timeout=240)
    return p, found[0]


def killed_run(project: Path, client, name: str) -> tuple[Path, int, object]:
    """A run whose driver was SIGKILLed mid-run: (run dir, the driver's pid, its container, still running)."""
    p, run_dir = start_writer(project, name, stop_gate=True)
    pid = sigkill(p)
    (container,) = containers_of(client, run_dir.name)
    assert container.status == "running"
    assert container.labels[DRIVER_LABEL].startswith(f"{socket.gethostname()}:{pid}:")
    return run_dir, pid, container


def sealed_record(run_dir: Path) -> dict:
    proc = run_cli("runs", "show", "--json", str(run_dir))  # checks the seal
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_hermetic_runs_reaps_a_killed_runs_container_and_no_sweep_took_its_workdir_before(project, docker_client,
                                                                                        module_cache):
    from hermetic.builder.gc import dead_temp_files
    from hermetic.hostfs.fsutil import sweep_dead
    from hermetic.core.paths import CachePaths

    run_dir, pid, container = killed_run(project, docker_client, unique())
    workspace = Path(container.labels[HOLDS_LABEL])
    n = ticks(run_dir)
    time.sleep(1.0)
    assert ticks(run_dir) > n  # the orphan goes on writing, into a run whose record is the early one
    assert json.loads((run_dir / "run.json").read_text())["record"]["finished_at"] is None
    # Its driver is dead, so the working directory's lock is free: a plain sweep would take it ...
    lock_name = workspace.name + ".lock"
    assert sweep_dead(workspace.parent, lambda n: n == lock_name, remove=False).count == 1
    # ... but the sweep a build (and `cache gc`) makes leaves it while the container exists.
    dead_temp_files(CachePaths(module_cache), remove=True)
    assert (workspace / "work.txt").is_file() and (workspace.parent / lock_name).is_file()

    proc = run_cli("runs", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert f"run {run_dir.name}: its driver (hermetic, pid {pid}) died while the container ran" in proc.stderr
    (row,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(run_dir.name)]
    assert row.split()[3] == "interrupted", row
    assert containers_of(docker_client, run_dir.name) == []
    assert not workspace.exists() and not (workspace.parent / lock_name).exists()
    rec = sealed_record(run_dir)
    meta = rec["record"]
    assert meta["status"] == "interrupted" and meta["finished_at"] and meta["exit_code"] is None
    assert f"its driver (hermetic, pid {pid}) died" in meta["reason"] and "`hermetic runs` stopped it" in meta["reason"]
    kept = ticks(run_dir)
    assert len([f for f in rec["outputs"]["files"] if f.startswith("tick-")]) == kept
    time.sleep(0.6)
    assert ticks(run_dir) == kept  # nothing writes there any more
    assert (run_dir / "logs" / "stdout.log").read_text() == "started\n"  # the engine's copy, kept
    assert_clean_error(run_cli("stop", run_dir.name, cwd=project), 66, "not running")
    again = run_cli("runs", cwd=project)
    assert again.returncode == 0 and "note:" not in again.stderr  # reaped once


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_hermetic_stop_stops_a_killed_runs_container_and_seals_its_record(project, docker_client):
    run_dir, pid, _ = killed_run(project, docker_client, unique())
    assert run_cli("runs", "wait", run_dir.name, "--timeout", "0", cwd=project).returncode == 130  # not running
    proc = run_cli("stop", run_dir.name, cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"{run_dir.name}: interrupted (its hermetic process had died; its container was "
                                   "stopped and removed)")
    assert containers_of(docker_client, run_dir.name) == []
    meta = sealed_record(run_dir)["record"]
    assert meta["status"] == "interrupted" and meta["finished_at"]
    assert f"pid {pid}" in meta["reason"] and "`hermetic stop` stopped it" in meta["reason"]
    assert_clean_error(run_cli("stop", run_dir.name, cwd=project), 66, "not running")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_next_run_reaps_the_orphan_and_leaves_a_live_run_alone(project, docker_client):
    """An orphan and a live, long run of the same project; a third, short run starts: the orphan is reaped,
    the live run goes on untouched (its container, its working directory, its outputs) and, stopped after,
    keeps what it wrote in its working directory."""
    live, live_dir = start_writer(project, unique(), "long.py")
    try:
        orphan_dir, pid, _ = killed_run(project, docker_client, unique())  # (its own start reaps what is before)
        (live_container,) = containers_of(docker_client, live_dir.name)
        live_workspace = Path(live_container.labels[HOLDS_LABEL])
        (project / "short.py").write_text("open('/outputs/short.txt', 'w').write('ok')\n")
        proc = run_cli("run", "short.py", cwd=project, timeout=300)  # not --json: its notes are on stderr then
        assert proc.returncode == 0, proc.stderr
        assert f"run {orphan_dir.name}: its driver (hermetic, pid {pid}) died" in proc.stderr
        assert live_dir.name not in proc.stderr
        assert containers_of(docker_client, orphan_dir.name) == []
        assert sealed_record(orphan_dir)["record"]["reason"].count("`hermetic run` stopped it") == 1
        # the live run: untouched
        assert [c.status for c in containers_of(docker_client, live_dir.name)] == ["running"]
        assert (live_workspace / "work.txt").is_file()
        n = ticks(live_dir)
        time.sleep(1.0)
        assert ticks(live_dir) > n
        listed = json.loads(run_cli("runs", "--json", cwd=project).stdout)
        assert next(e for e in listed if e["id"] == live_dir.name)["status"] == "running"
        assert next(e for e in listed if e["id"] == orphan_dir.name)["status"] == "interrupted"
        stopped = run_cli("stop", live_dir.name, cwd=project)
        assert stopped.returncode == 0 and stopped.stdout.strip() == f"{live_dir.name}: interrupted", stopped.stderr
        assert live.wait(timeout=60) == 143
    finally:
        if live.poll() is None:
            live.kill()
    meta_files = sealed_record(live_dir)["outputs"]["files"]
    assert "work.txt" in meta_files  # its working directory was there to the end, and collected
    assert containers_of(docker_client, live_dir.name) == []


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_an_orphan_that_finished_by_itself_is_sealed_with_its_exit_and_all_its_output(project, docker_client):
    # its gate stopped, then let go (by a child of the script) once the script has exited
    (project / "brief.py").write_text(STOP_GATE + "import time\nprint('started', flush=True)\ntime.sleep(2)\n"
                                      "print('finished', flush=True)\nopen('/outputs/done.txt', 'w').write('done')\n"
                                      "me, gate = os.getpid(), os.getppid()\n"
                                      "if os.fork() == 0:\n"
                                      "    while open(f'/proc/{me}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
                                      "        time.sleep(0.05)\n"
                                      "    os.kill(gate, signal.SIGCONT)\n"
                                      "    os._exit(0)\n")
    name = unique()
    p = start_hermetic("run", "--name", name, "brief.py", cwd=project)
    wait_for(p, lambda: (rd := run_dir_named(project, name)) is not None
             and (rd / "logs" / "stdout.log").is_file() and "started" in (rd / "logs" / "stdout.log").read_text(),
             "the script's first line", timeout=240)
    pid = sigkill(p)
    run_dir = run_dir_named(project, name)
    deadline = time.monotonic() + 60
    while [c.status for c in containers_of(docker_client, run_dir.name)] != ["exited"]:
        assert time.monotonic() < deadline, "the script did not end by itself"
        time.sleep(0.2)
    proc = run_cli("runs", cwd=project)
    assert proc.returncode == 0 and f"run {run_dir.name}: its driver" in proc.stderr, proc.stderr
    rec = sealed_record(run_dir)
    assert rec["record"]["status"] == "interrupted"
    assert (f"its driver (hermetic, pid {pid}) died; the script went on and exited 0 unwatched"
            in rec["record"]["reason"])
    assert "done.txt" in rec["outputs"]["files"]
    assert (run_dir / "logs" / "stdout.log").read_text() == "started\nfinished\n"  # what it printed after, too
    assert containers_of(docker_client, run_dir.name) == []


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_only_containers_whose_driver_is_gone_are_reaped(logreg, docker_client, module_cache):
    """A probe-like container of a dead driver is removed; one of a live process, one of a reused pid (another
    start time: gone) and one of another host's process are told apart."""
    from hermetic.record.liveness import process_start
    from hermetic.run.orphans import find_orphans, reap_orphans

    image_id = build(logreg)["image_id"]
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    tag = unique()
    drivers = {"dead": f"{host}:{dead.pid}:1", "alive": f"{host}:{me}:{process_start(me)}",
               "reused": f"{host}:{me}:1", "elsewhere": f"not-{host}:{dead.pid}:1"}
    made = {k: docker_client.containers.create(image_id, command=["true"], labels={DRIVER_LABEL: v, "t": tag})
            for k, v in drivers.items()}
    try:
        gone = {o.id for o in find_orphans()}
        assert {k for k, c in made.items() if c.id in gone} == {"dead", "reused"}
        reaped = reap_orphans(by="a test")
        assert {r.container for r in reaped} >= {made["dead"].id[:12], made["reused"].id[:12]}
        left = {c.id for c in docker_client.containers.list(all=True, filters={"label": f"t={tag}"})}
        assert left == {made["alive"].id, made["elsewhere"].id}
    finally:
        for c in made.values():
            try:
                c.remove(force=True)
            except Exception:
                pass


# ---------------------------------------------------------------- without an engine


def test_a_driver_is_gone_when_its_pid_ended_is_a_zombie_or_is_another_process_now():
    from hermetic.record.liveness import Driver, driver_gone, parse_driver, process_start, this_driver

    me = this_driver()
    assert parse_driver(me.token()) == me and not driver_gone(me)
    assert driver_gone(Driver(me.host, me.pid, str(int(me.start) + 1)))  # the pid reused: another start time
    assert not driver_gone(Driver("not-" + me.host, 1 << 22, "1"))  # another host's: never judged from here
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = Driver(me.host, child.pid, process_start(child.pid))
        assert started.start and not driver_gone(started)
        child.kill()
        deadline = time.monotonic() + 10
        while not driver_gone(started):  # a zombie (not waited for yet) is gone already
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert driver_gone(started)
    assert parse_driver("") is None and parse_driver("host") is None and parse_driver("host:x:1") is None


def test_without_an_engine_the_sweep_leaves_every_owned_directory_in_the_cache_tmp(tmp_path, monkeypatch):
    """Whose container still writes in a dead driver's working directory cannot be told: it stays; a dead
    writer's plain temp file goes as before."""
    from hermetic.builder.gc import dead_temp_files
    from hermetic.engines import dockerclient as engine
    from hermetic.hostfs.fsutil import OwnedTemp
    from hermetic.core.paths import CachePaths

    monkeypatch.setattr(engine, "_client", None)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    paths = CachePaths(tmp_path)
    code = ("import os, sys\nfrom hermetic.hostfs.fsutil import OwnedTemp, owned_temp_dir\n"
            "t = OwnedTemp(sys.argv[1], 'blob.')\n"
            "with owned_temp_dir(sys.argv[1], 'workspace-x.') as d:\n"
            "    (d / 'work.txt').write_text('w')\n"
            "    os._exit(0)\n")  # dies holding both: their locks are free, nothing removed them
    subprocess.run([sys.executable, "-c", code, str(paths.tmpdir())], check=True, timeout=60)
    (ws,) = [p for p in paths.tmp.iterdir() if p.is_dir()]
    assert dead_temp_files(paths, remove=True).count == 1
    assert (ws / "work.txt").is_file() and ws.with_name(ws.name + ".lock").is_file()
    assert [p.name for p in paths.tmp.iterdir() if p.name.startswith("blob.")] == []
    monkeypatch.setattr(engine, "_client", None)
