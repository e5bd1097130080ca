"""The gate a run's container waits at while the run's last steps are done beside its start (engines.base.Gate).

hermetic starts the training container early (Docker's create and start take ~0.2 s) with its command held
at a FIFO, makes the record, the code snapshot and the probe meanwhile, and only then lets the command run.
What must hold: nothing of the script runs before the gate opens; a gate closed unopened (the run failed,
or hermetic died) ends the container without running anything; the script, once through, is exactly the
command it would have been (arguments, environment); a run that fails before opening it
leaves no container and no run directory behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from run_support import containers_created_since, labelled_containers, run_dirs

from hermetic.engines.base import GATE_FIFO, Gate, gate_program


def _gated(gate: Gate, command: list[str]) -> subprocess.Popen:
    """The gate's code run by this machine's Python, as the image's runs it (the FIFO at its host path)."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", gate_program(), str(gate.directory / GATE_FIFO), *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_command_runs_only_once_the_gate_opens_and_then_is_exactly_itself(tmp_path):
    gate = Gate(tmp_path)
    try:
        proc = _gated(gate, [sys.executable, "-c", "import os, sys; print(os.getppid(), sys.argv[1:])", "a b", "c"])
        time.sleep(0.5)
        assert proc.poll() is None  # waiting at the gate
        gate.open()
        out, err = proc.communicate(timeout=30)
    finally:
        gate.close()
    assert proc.returncode == 0, err
    pid, argv = out.decode().split(" ", 1)
    assert int(pid) == proc.pid  # the gate's child: it watches the FIFO while the script runs
    assert argv.strip() == "['a b', 'c']"
    assert (tmp_path / GATE_FIFO).stat().st_mode & 0o777 == 0o444  # only hermetic's descriptor writes


def test_a_gate_closed_unopened_ends_the_command_unrun(tmp_path):
    marker = tmp_path / "ran"
    gate = Gate(tmp_path)
    proc = _gated(gate, [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    time.sleep(0.3)
    gate.close()  # what a failed run does, and what a dead hermetic's closed descriptor does
    proc.communicate(timeout=30)
    assert proc.returncode == 70 and not marker.exists()


def test_a_gate_opened_before_the_command_reaches_it_still_lets_it_through(tmp_path):
    """The engine may start the command after the run opened the gate: the byte waits in the FIFO, which
    hermetic holds open until the run ends."""
    gate = Gate(tmp_path)
    try:
        gate.open()
        proc = _gated(gate, [sys.executable, "-c", "print('through')"])
        out, _ = proc.communicate(timeout=30)
    finally:
        gate.close()
    assert proc.returncode == 0 and out.decode().strip() == "through"


def test_the_gate_descriptor_is_not_inherited_by_what_hermetic_runs(tmp_path):
    gate = Gate(tmp_path)
    try:
        listed = subprocess.run(["ls", "-l", "/proc/self/fd"], capture_output=True, text=True).stdout
    finally:
        gate.close()
    assert str(tmp_path / GATE_FIFO) not in listed


@pytest.mark.docker
def test_a_docker_container_waits_at_its_gate_and_a_closed_one_runs_nothing(docker_client, tmp_path, logreg_built):
    """On the engine: started (running, behind the gate) before the gate opens, nothing printed; opened, the
    command runs; closed unopened, the container ends with 70 and printed nothing."""
    from hermetic.engines.dockerclient import engine_client
    from hermetic.engines.base import ContainerSpec
    from hermetic.engines.dockercontainer import DockerLaunch

    image_id = logreg_built[1]["image_id"]
    outcomes = {}
    for opened in (True, False):
        where = tmp_path / f"gate-{opened}"
        where.mkdir()
        os.chmod(where, 0o755)
        gate = Gate(where)
        command = gate.command("/opt/venv/bin/python", ["/opt/venv/bin/python", "-c", "print('ran')"])
        spec = ContainerSpec(image_id=image_id, command=command, mounts=[gate.mount()], env={}, user="1000:1000",
                             labels={"org.hermetic.test": "gate"})
        logs = tmp_path / f"logs-{opened}"
        launched = DockerLaunch(engine_client(), spec, logs, echo=False)
        try:
            deadline = time.monotonic() + 60
            while launched.container is None or not (docker_client.api.inspect_container(launched.container.id)
                                                     ["State"]["Running"]):
                assert time.monotonic() < deadline, "the container never started"
                time.sleep(0.05)
            time.sleep(0.5)
            assert docker_client.api.logs(launched.container.id) == b""  # behind the gate: nothing ran
            gate.open() if opened else gate.close()
            outcomes[opened] = launched.finish()
        finally:
            launched.cancel()
            launched.close()  # the removal finish began: done when close returns
            gate.close()
        assert (logs / "stdout.log").read_bytes() == (b"ran\n" if opened else b"")
        assert not [c for c in docker_client.api.containers(all=True, filters={"id": launched.container.id})]
    assert outcomes[True].exit_code == 0 and outcomes[False].exit_code == 70


@pytest.mark.docker
def test_a_run_that_fails_before_its_gate_leaves_no_container_and_no_run_directory(docker_client, project):
    """The script is ignored by git and untracked, so the code snapshot (made beside the container's start)
    does not hold it: the run is refused then, its container (created, behind the gate) removed unrun."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (project / ".gitignore").write_text("ignored.py\nruns/\n")
    (project / "ignored.py").write_text("print('should never run')\n")
    before = run_dirs(project)
    since = time.time()
    proc = run_cli("run", "--name", "gate-refused", "ignored.py", cwd=project, timeout=300)
    assert_clean_error(proc, 66, "ignored.py: not in the source snapshot")
    assert run_dirs(project) == before
    created = containers_created_since(docker_client, since, "-gate-refused")
    assert len(created) == 1, "the container is started before the snapshot: it was created"
    assert not labelled_containers(docker_client, created[0])  # and removed
