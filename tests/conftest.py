"""Shared fixtures: isolated caches, the CLI as a subprocess, the real Docker Engine,
and a bootstrapped base image shared by the whole session."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SESSION_CACHE_ENV = "HERMETIC_TEST_SESSION_CACHE"
# shared fixtures: the registry, the built example projects, Slurm, MLflow, the framework image
pytest_plugins = ("buildsupport", "run_support", "slurm_support", "mlflow_support", "frameworks_support")


_xdist_controller = False


def pytest_configure(config):
    global _xdist_controller
    _xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not os.environ.get("PYTEST_XDIST_WORKER")
    # No __pycache__ in the tree or in the projects the tests copy, but bytecode all the same: each
    # `hermetic` a test starts would compile the package again without it (~0.3 s of CPU each).
    if not os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ["PYTHONPYCACHEPREFIX"] = str(REPO / ".cache" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# What a shared fixture needs, as the marker it gives every test that uses it (directly or through
# another fixture): a test is marked by what it uses, so `make test-quick` ("not integration") cannot
# pick up one that needs the engine or a service because its author forgot a marker. Only the shared
# definitions count (this file and its pytest_plugins): a module's own `project` may need nothing.
SHARED_FIXTURE_MODULES = {"conftest", "buildsupport", "run_support", "slurm_support", "mlflow_support",
                          "frameworks_support"}
FIXTURE_MARKS = {
    "docker_client": "docker", "module_cache": "docker", "use_session_cache": "docker",
    "logreg_built": "docker", "logreg": "docker", "project": "docker",
    "torch_built": "slow", "torch_project": "slow", "frameworks_built": "slow", "frameworks": "slow",
    "session_cache": "base", "base_ref": "base",
    "registry": "registry", "slurm_cluster": "slurm", "mlflow_server": "mlflow",
}
# Markers of what lies outside one process: each makes a test an integration test.
OUTSIDE = ("docker", "registry", "slow", "slurm", "mlflow", "base", "network", "engines", "mounts")


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
    # The others first (in their order): they fail fast, and they run while the integration tests'
    # base image, example images and services are made (pytest_collection_finish). Then the integration
    # modules that need no base (nor an example built on it), which need not wait for it either; a module
    # stays in one piece, so that its module-scoped fixtures are made once.
    # Within each, the longest modules first (make test passes --no-loadscope-reorder, so pytest-xdist hands
    # the workers whole modules in this order): the longest last would leave the other workers idle at the end.
    integration = {id(item) for item in items if item.get_closest_marker("integration") is not None}
    on_base = {item.module.__name__ for item in items
               if id(item) in integration and "base_ref" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: (id(item) in integration, item.module.__name__ in on_base,
                                 LONGEST_FIRST.get(item.module.__name__, len(LONGEST_FIRST))))


# The modules that take longest on their worker, longest first (seconds on 3 Dec 2026, HERMETIC_TEST_TIMELINE:
# docs/testing.md). Only an order: a module missing here, or a figure out of date, costs balance, never a test.
LONGEST_FIRST = {name: rank for rank, name in enumerate([
    "test_frameworks",  # 264 s: the framework image, Lightning (a group and a replay), the Trainer
    "test_ci_templates",  # 122: the first GitLab pipeline bootstraps a base
    "test_ddp",  # 102
    "test_build",  # 101: a second bootstrap, checkouts, caches, time zones
    "test_examples",  # 97
    "test_rootless",  # 92
    "test_runtime",  # 85
    "test_verify",  # 79
    "test_store_faults",  # 75
    "test_mlflow_export",  # 74
    "test_byo_script",  # 73
    "test_kill_build",  # 67
    "test_run",  # 45
    "test_slurm_submit",  # 40
    "test_bounds",  # 39
    "test_slurm_engines",  # 36
])}


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



def cli_in_process(*argv: str) -> tuple[int, str, str]:
    """``hermetic ARGV`` in this process, as the console entry point runs it (hermetic.cli.main):
    (exit code, stdout, stderr). What a command writes as bytes (`hermetic logs`) is in stdout too."""
    import contextlib
    import io

    from hermetic.cli import main

    out, err = io.StringIO(), io.StringIO()
    out.buffer = io.BytesIO()  # type: ignore[attr-defined]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
    text = out.getvalue() + out.buffer.getvalue().decode(errors="replace")  # type: ignore[attr-defined]
    return code, text, err.getvalue()


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 900, base_env: dict[str, str] | None = None,
            whole_env: bool = False) -> subprocess.CompletedProcess:
    """Run `hermetic ARGS` as users do (a new process), capturing text output.

    The environment is this process's (or ``base_env``: what work started early runs with, since
    a test's monkeypatch may change this process's meanwhile) updated with ``env``; with
    ``whole_env``, ``env`` alone. The process is a fork of the CLI zygote where it can be
    (tests/cli_zygote.py), else a new interpreter."""
    full_env = {} if whole_env else dict(os.environ if base_env is None else base_env)
    if env:
        full_env.update(env)
    if base_env is None:
        zygote = _cli_zygote()
        if zygote is not None and zygote.serves(full_env):
            return zygote.run(list(args), cwd=cwd, env=full_env, timeout=timeout)
        return subprocess.run([sys.executable, "-m", "hermetic", *args], cwd=cwd, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
    with subprocess.Popen([sys.executable, "-m", "hermetic", *args], cwd=cwd, env=full_env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) as p:
        _early_procs.add(p)  # ended by pytest_unconfigure if the run ends first
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            _early_procs.discard(p)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


_zygote = None  # cli_zygote.Zygote, once started
NO_ZYGOTE_ENV = "HERMETIC_TEST_NO_ZYGOTE"  # =1: every run_cli a new interpreter (cli_zygote.py)


def _cli_zygote():
    """This process's CLI zygote (tests/cli_zygote.py), started on first use; None when turned off."""
    global _zygote
    if _zygote is None and os.environ.get(NO_ZYGOTE_ENV) != "1":
        from cli_zygote import Zygote

        _zygote = Zygote()
    return _zygote


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


def session_cache_dir(tmp_path_factory) -> Path:
    env = os.environ.get(SESSION_CACHE_ENV)
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    d = run_root(tmp_path_factory) / "session-cache"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A cache shared by the run's slow tests (base image, wheels, the examples' layers and images);
    under pytest-xdist, one for every worker (hermetic's own locks keep a store whole).

    HERMETIC_TEST_SESSION_CACHE reuses one across sessions when set (local
    development); CI starts from nothing.
    """
    return session_cache_dir(tmp_path_factory)


BOOTSTRAPPED = "bootstrapped-base-ref"  # in a session cache: the base an earlier run bootstrapped into it


def bootstrap_once(tmp_path_factory, cache: Path, base_env: dict[str, str] | None = None) -> str:
    """`hermetic base bootstrap` into ``cache``, once per run; its reference. A session cache kept across
    runs (``HERMETIC_TEST_SESSION_CACHE``: `make test`'s two phases, local work) keeps its base: the
    reference is noted beside the store, and taken again while the store still holds that image."""
    with run_once(tmp_path_factory, "base-ref") as known:
        if known.exists():
            return known.read_text()
        noted = cache / BOOTSTRAPPED
        ref = noted.read_text().strip() if noted.is_file() else ""
        if not ref or not (cache / "oci" / "blobs" / "sha256" / ref.rpartition("@sha256:")[2]).is_file():
            proc = run_cli("base", "bootstrap", "--json", env={"HERMETIC_CACHE": str(cache)}, timeout=900,
                           base_env=base_env)
            assert proc.returncode == 0, proc.stderr
            ref = json.loads(proc.stdout)["reference"]
            noted.write_text(ref)
        known.write_text(ref)
        return ref


@pytest.fixture(scope="session")
def base_ref(tmp_path_factory, session_cache) -> str:
    """The default bootstrapped base (mmdebstrap), in the session cache: bootstrapped once per run
    (started when the run begins: see the early work below)."""
    return bootstrap_once(tmp_path_factory, session_cache)


# -- work started early -------------------------------------------------------------------------
# The tests that need nothing outside one process run first (pytest_collection_modifyitems); while
# they do, what the others will wait for is made on the side: the base is bootstrapped, the
# examples built, the MLflow server started. A fixture that finds its part done takes it (run_once's
# files; EARLY's futures); one that finds it failed does it again itself, and fails as it would have.
# Nothing of it touches the engine once the first integration test has begun: an example build
# under way then is waited for, and no other is started (the fixture builds it when asked).

EARLY: dict[str, Future] = {}
_early_pool: ThreadPoolExecutor | None = None
_early_procs: set[subprocess.Popen] = set()
_integration_began = threading.Event()
_early_building = threading.Lock()  # held by the early work while it builds an example


def _prepare_base_and_examples(tmp_path_factory, needed: set[str], base_env: dict[str, str]) -> None:
    from run_support import built_once

    cache = session_cache_dir(tmp_path_factory)
    ref = bootstrap_once(tmp_path_factory, cache, base_env)
    for example, fixture in (("numpy-logreg", "logreg_built"), ("torch-mlp", "torch_built")):
        if fixture in needed:
            with _early_building:
                if _integration_began.is_set():
                    return
                built_once(tmp_path_factory, cache, ref, example, base_env)


# HERMETIC_TEST_TIMELINE=FILE: one JSON line per test (worker, test, start, end: wall-clock seconds),
# appended, to see where a run's time goes and which worker waited (docs/testing.md).
TIMELINE_ENV = "HERMETIC_TEST_TIMELINE"
_started: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    # under pytest-xdist the controller hears of each test too, when a worker reports it: only workers time
    if os.environ.get(TIMELINE_ENV) and (os.environ.get("PYTEST_XDIST_WORKER") or not _xdist_controller):
        _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    path = os.environ.get(TIMELINE_ENV)
    if path and nodeid in _started:
        line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": nodeid,
                "start": round(_started.pop(nodeid), 3), "end": round(time.time(), 3)}
        with open(path, "a") as f:  # one short line per write: appends from several workers stay whole
            f.write(json.dumps(line) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not _integration_began.is_set() and item.get_closest_marker("integration") is not None:
        _integration_began.set()
        with _early_building:  # an example build under way ends first
            pass


_early_claim = None  # under pytest-xdist: the lock file of the worker that does the early work


def _claim_early_work(factory) -> bool:
    """Whether this session does the run's early work: always, but under pytest-xdist only the first
    worker to ask (the others find its results through run_once, as they would find each other's)."""
    global _early_claim
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    claim = open(run_root(factory) / "early.lock", "w")  # noqa: SIM115 - held until this process ends
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        claim.close()
        return False
    _early_claim = claim
    return True


def pytest_collection_finish(session):
    global _early_pool
    if session.config.option.collectonly or not session.items:
        return
    needed = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    factory = session.config._tmp_path_factory  # the session's tmp_path_factory, before any fixture
    run_root(factory)  # made here, in this thread, before another one asks
    if not _claim_early_work(factory):
        return
    base_env = dict(os.environ)  # as it is now, before any test's monkeypatch
    _early_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hermetic-tests-early")
    if "base_ref" in needed:
        EARLY["base"] = _early_pool.submit(_prepare_base_and_examples, factory, needed, base_env)
    if "mlflow_server" in needed:
        from mlflow_support import start_mlflow_server

        EARLY["mlflow"] = _early_pool.submit(start_mlflow_server, run_root(factory) / "mlflow", base_env=base_env)


def pytest_unconfigure(config):
    if _zygote is not None:
        _zygote.stop()
    if _early_pool is None:
        return
    for p in list(_early_procs):  # a run that ends (or is interrupted) before its early work did
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    _early_pool.shutdown(wait=True, cancel_futures=True)
    fut = EARLY.pop("mlflow", None)  # started, never taken by a test
    if fut is not None and fut.done() and fut.exception() is None:
        fut.result().stop()


def early(name: str):
    """The result of work started early under ``name``, or None (not started, or it failed)."""
    fut = EARLY.pop(name, None)
    if fut is None:
        return None
    try:
        return fut.result()
    except Exception:
        return None


@pytest.fixture
def use_session_cache(session_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HERMETIC_CACHE", str(session_cache))
    return session_cache
