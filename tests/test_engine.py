"""The real Docker Engine, reached through docker-py and started by the project's script."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.docker
def test_ensure_docker_is_a_no_op_when_the_engine_answers(docker_client):
    proc = subprocess.run([str(REPO / "scripts" / "ensure-docker")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "starting dockerd" not in proc.stderr


@pytest.mark.docker
def test_engine_runs_with_no_network(docker_client):
    info = docker_client.info()
    assert info["ServerVersion"]
    # hermetic's engine has no bridge: containers get network "none" by default in our runs.
    names = {n.name for n in docker_client.networks.list()}
    assert "none" in names


@pytest.mark.docker
def test_engine_client_gives_clear_error_without_daemon(monkeypatch):
    from hermetic.engines import dockerclient
    from hermetic.core.errors import EngineError

    monkeypatch.setattr(dockerclient, "_client", None)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineError, match=r"no Docker Engine answers at unix:///nonexistent/docker\.sock "
                                          r"\(FileNotFoundError\)") as e:
        dockerclient.engine_client()
    assert "scripts/ensure-docker" in (e.value.hint or "")
    monkeypatch.setattr(dockerclient, "_client", None)
