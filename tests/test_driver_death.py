"""A container never outlives its driver by more than a few seconds (issue 40, item 7).

`kill -9` of a real `hermetic run` mid-run on each engine: its container (Docker's, Podman's) or its
processes (Charliecloud's) are gone within a few seconds, nothing writes into the run any more, and the
next hermetic command seals the record `interrupted` as before. Docker and Podman: the gate
(hermetic.inimage.gate) reads end of file on the FIFO only its driver held and stops the script's process
group (SIGTERM, SIGKILL after its grace); Charliecloud: PR_SET_PDEATHSIG. Then the gate on its own, with
this machine's Python: what it passes on, how it ends, and that a script deaf to SIGTERM is still ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_cli
from kill_support import processes_running, sigkill, start_hermetic, wait_for
from run_support import run_dirs

from hermetic.engines.base import GATE_FIFO, Gate, gate_program

WRITER = ("import time\nprint('started', flush=True)\ni = 0\nwhile True:\n    i += 1\n"
          "    open(f'/outputs/tick-{i:05d}.txt', 'w').write(str(i))\n    time.sleep(0.2)\n")
GONE_WITHIN = 10.0  # seconds: the gate's grace, and the engine's time to tear the container down


def unique() -> str:
    return "d" + uuid.uuid4().hex[:10]


def ticks(run_dir: Path) -> int:
    return len(list((run_dir / "outputs").glob("tick-*")))


def running_containers(engine: str, run_id: str) -> list[str]:
    """The engine's running containers of ``run_id`` (Charliecloud: the script's processes)."""
    if engine == "charliecloud":
        return [str(p) for p in processes_running(run_id)]
    return subprocess.run([engine, "ps", "-q", "--filter", f"label=org.hermetic.run-id={run_id}"],
                          capture_output=True, text=True, check=True).stdout.split()


def eventually(check, what: str, within: float = GONE_WITHIN) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# Every `hermetic runs` reaps the orphans it finds: beside another worker's, it would take theirs.
@pytest.mark.serial
@pytest.mark.docker
@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine", ["docker", pytest.param("podman", marks=pytest.mark.engines),
                                    pytest.param("charliecloud", marks=pytest.mark.engines)])
def test_a_killed_drivers_container_ends_within_seconds_and_the_next_command_seals_it(project, engine):
    script = f"writer_{unique()}.py"
    (project / script).write_text(WRITER)
    name = unique()
    p = start_hermetic("run", "--engine", engine, "--name", name, script, cwd=project)
    found: list[Path] = []

    def writing() -> bool:
        rd = next((project / "runs" / r for r in run_dirs(project) if r.endswith(name)), None)
        if rd is not None and ticks(rd) >= 3:
            found.append(rd)
            return True
        return False

    wait_for(p, writing, "the script's third file", timeout=240)
    run_dir = found[0]
    assert running_containers(engine, run_dir.name if engine != "charliecloud" else script)
    pid = sigkill(p)
    eventually(lambda: not running_containers(engine, run_dir.name if engine != "charliecloud" else script),
               f"the {engine} container outlived its killed driver")
    eventually(lambda: not processes_running(script), "the script outlived its killed driver")
    n = ticks(run_dir)
    time.sleep(0.6)
    assert ticks(run_dir) == n  # nothing writes there any more

    proc = run_cli("runs", "--json", cwd=project)
    assert proc.returncode == 0, proc.stderr
    (row,) = [e for e in json.loads(proc.stdout) if e["id"] == run_dir.name]
    assert row["status"] == "interrupted"
    rec = json.loads((run_dir / "run.json").read_text())["record"]
    assert rec["status"] == "interrupted"
    if engine != "charliecloud":  # the reaper found its (ended) container and sealed the record
        assert rec["finished_at"] and f"its driver (hermetic, pid {pid}) died" in rec["reason"]
        assert "the container stopped the script itself when it saw its driver gone" in rec["reason"], rec["reason"]
        assert f"run {run_dir.name}: its driver" in proc.stderr
        left = subprocess.run([engine, "ps", "-a", "-q", "--filter", f"label=org.hermetic.run-id={run_dir.name}"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert left == []
        assert (run_dir / "logs" / "stdout.log").read_text() == "started\n"  # the engine's copy, kept


# ---------------------------------------------------------------- the gate itself, without an engine


def _driver(directory: Path) -> subprocess.Popen:
    """A process that makes the gate, opens it and waits: the driver to kill."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom hermetic.engines.base import Gate\n"
            "g = Gate(Path(sys.argv[1]))\ng.open()\nprint('open', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "open\n"
    return p


def _gated(directory: Path, script: str, marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", gate_program(), str(directory / GATE_FIFO),
                             sys.executable, "-c", script, marker], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# The script starts a worker (as a DataLoader does) and says so; both sleep.
SLEEPER = ("import subprocess, sys, time\n"
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1] + '-worker'])\n"
           "{setup}print('ready', flush=True)\ntime.sleep(600)\n")


@pytest.mark.parametrize("deaf,code", [(False, 128 + signal.SIGTERM), (True, 128 + signal.SIGKILL)])
def test_the_gate_ends_the_scripts_group_when_its_driver_is_killed(tmp_path, deaf, code):
    """SIGTERM to the script's group; one that ignores it is killed after the gate's grace."""
    marker = unique()
    setup = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if deaf else ""
    driver = _driver(tmp_path)
    gated = _gated(tmp_path, SLEEPER.format(setup=setup), marker)
    try:
        assert gated.stdout is not None and gated.stdout.readline() == b"ready\n"
        eventually(lambda: len(processes_running(marker)) == 3, "no worker")  # the gate, the script, its worker
        driver.kill()
        driver.wait()
        gated.wait(timeout=60)
        assert gated.returncode == code
        eventually(lambda: not processes_running(marker), "the script's worker outlived the driver")
        assert b"the process that drove this run is gone" in gated.stderr.read()
    finally:
        for p in (driver, gated):
            if p.poll() is None:
                p.kill()
        for pid in processes_running(marker):
            os.kill(pid, signal.SIGKILL)


def test_the_gate_passes_signals_on_and_ends_as_the_script_does(tmp_path):
    """SIGTERM sent to the gate (docker stop's, through the container's init) reaches the script, whose end
    is the gate's: its exit code, or 128+N for a signal N; stdin is what the gate was given."""
    gate = Gate(tmp_path)
    try:
        gate.open()
        script = ("import signal, sys, time\n"
                  "print(sys.stdin.read() == '', flush=True)\n"
                  "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
                  "print('ready', flush=True)\ntime.sleep(600)\n")
        gated = subprocess.Popen([sys.executable, "-I", "-S", "-c", gate_program(), str(tmp_path / GATE_FIFO),
                                  sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert gated.stdout is not None and gated.stdout.readline() == b"True\n"
        assert gated.stdout.readline() == b"ready\n"
        gated.send_signal(signal.SIGTERM)
        assert gated.wait(timeout=60) == 7
        killed = subprocess.Popen([sys.executable, "-I", "-S", "-c", gate_program(), str(tmp_path / GATE_FIFO),
                                   sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"])
        gate.open()
        assert killed.wait(timeout=60) == 128 + signal.SIGUSR1
    finally:
        gate.close()
