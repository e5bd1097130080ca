"""Shared fixtures: isolated caches, the CLI as a subprocess, the real Docker Engine,
and a bootstrapped base image shared by the whole session."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SESSION_CACHE_ENV = "HERMETIC_TEST_SESSION_CACHE"
# shared fixtures: the registry, the built example projects, Slurm, MLflow
pytest_plugins = ("buildsupport", "run_support", "slurm_support", "mlflow_support")


def pytest_configure(config):
    # No __pycache__ in the tree or in the projects the tests copy, but bytecode all the same: each
    # `hermetic` a test starts would compile the package again without it (~0.3 s of CPU each).
    if not os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ["PYTHONPYCACHEPREFIX"] = str(REPO / ".cache" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# What a shared fixture needs, as the marker it gives every test that uses it (directly or through
# another fixture): a test is marked by what it uses, so `make test-quick` ("not integration") cannot
# pick up one that needs the engine or a service because its author forgot a marker. Only the shared
# definitions count (this file and its pytest_plugins): a module's own `project` may need nothing.
SHARED_FIXTURE_MODULES = {"conftest", "buildsupport", "run_support", "slurm_support", "mlflow_support"}
FIXTURE_MARKS = {
    "docker_client": "docker", "module_cache": "docker", "use_session_cache": "docker",
    "logreg_built": "docker", "logreg": "docker", "project": "docker",
    "torch_built": "slow", "torch_project": "slow",
    "session_cache": "base", "base_ref": "base",
    "registry": "registry", "slurm_cluster": "slurm", "mlflow_server": "mlflow",
}
# Markers of what lies outside one process: each makes a test an integration test.
OUTSIDE = ("docker", "registry", "slow", "slurm", "mlflow", "base", "network")


def _shared_fixture_marks(item) -> list[str]:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    marks = []
    for name in getattr(item, "fixturenames", ()):
        if name in FIXTURE_MARKS and defs.get(name):
            if getattr(defs[name][-1].func, "__module__", "") in SHARED_FIXTURE_MODULES:
                marks.append(FIXTURE_MARKS[name])
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in _shared_fixture_marks(item):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)
        if outside := next((m for m in OUTSIDE if item.get_closest_marker(m)), None):
            item.add_marker(pytest.mark.integration(outside))


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


def run_root(tmp_path_factory) -> Path:
    """The directory of this run of the suite: the session's own, or, under pytest-xdist, the one
    that every worker's session shares (the parent of each worker's basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def run_once(tmp_path_factory, name: str) -> Iterator[Path]:
    """A file of this run's, ``name``, under a lock: what one session (worker) made, the others find.

    Yields the path; whoever finds it missing makes it while the others wait.
    """
    path = run_root(tmp_path_factory) / name
    with open(path.with_name(name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A cache shared by the run's slow tests (base image, wheels, the examples' layers and images);
    under pytest-xdist, one for every worker (hermetic's own locks keep a store whole).

    HERMETIC_TEST_SESSION_CACHE reuses one across sessions when set (local
    development); CI starts from nothing.
    """
    env = os.environ.get(SESSION_CACHE_ENV)
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    d = run_root(tmp_path_factory) / "session-cache"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def base_ref(tmp_path_factory, session_cache) -> str:
    """The default bootstrapped base (mmdebstrap), in the session cache: bootstrapped once per run."""
    with run_once(tmp_path_factory, "base-ref") as known:
        if known.exists():
            return known.read_text()
        proc = run_cli("base", "bootstrap", "--json", env={"HERMETIC_CACHE": str(session_cache)}, timeout=900)
        assert proc.returncode == 0, proc.stderr
        ref = json.loads(proc.stdout)["reference"]
        known.write_text(ref)
        return ref


@pytest.fixture
def use_session_cache(session_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HERMETIC_CACHE", str(session_cache))
    return session_cache
