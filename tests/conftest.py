"""Shared fixtures: isolated caches, the CLI as a subprocess, the real Docker Engine,
and a bootstrapped base image shared by the whole session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SESSION_CACHE_ENV = "HERMETIC_TEST_SESSION_CACHE"
pytest_plugins = ("buildsupport", "run_support", "slurm_support", "frameworks_support")  # shared fixtures: registry, built example projects, Slurm, the framework image


def pytest_configure(config):
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh HERMETIC_CACHE for one test."""
    d = tmp_path / "cache"
    monkeypatch.setenv("HERMETIC_CACHE", str(d))
    return d


@pytest.fixture
def isolated_pip(monkeypatch, tmp_path) -> None:
    """Hide the machine's pip configuration (find-links, mirrors) from the test."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `hermetic ARGS` as users do (a new process), capturing text output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "hermetic", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def assert_clean_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """Nonzero exit with the given code, one-line message naming the culprit, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic: error: ")]
    assert len(errors) == 1, proc.stderr
    for n in needles:
        assert n in errors[0], (n, proc.stderr)


def tree_digest(root: Path) -> dict[str, int]:
    """Path -> size of every file under root (to assert a store is unchanged)."""
    out = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = p.stat().st_size
    return out


@pytest.fixture(scope="session")
def docker_client():
    """The real engine. Not skipped: `make test` starts one (scripts/ensure-docker)."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as e:  # pragma: no cover - environment failure
        pytest.fail(f"no Docker Engine answers ({e}); run scripts/ensure-docker")
    return client


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A cache shared by the session's slow tests (base image, wheels, torch layers).

    HERMETIC_TEST_SESSION_CACHE reuses one across sessions when set (local
    development); CI starts from nothing.
    """
    env = os.environ.get(SESSION_CACHE_ENV)
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return tmp_path_factory.mktemp("session-cache")


@pytest.fixture(scope="session")
def base_ref(session_cache) -> str:
    """The default bootstrapped base (mmdebstrap), in the session cache."""
    proc = run_cli("base", "bootstrap", "--json", env={"HERMETIC_CACHE": str(session_cache)}, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["reference"]


@pytest.fixture
def use_session_cache(session_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HERMETIC_CACHE", str(session_cache))
    return session_cache
