"""Helpers for the tests that run real training containers (test_run, test_replay, test_examples).

Projects are copies of examples/ in tmp dirs, pinned to the session's
bootstrapped base; `hermetic` is always run as a new process (conftest.run_cli).
"""

from __future__ import annotations

import pytest

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import REPO, run_cli, run_once, run_root

EXAMPLES = REPO / "examples"
RUN_LABEL = "org.hermetic.run-id"
_COPY_IGNORE = shutil.ignore_patterns("runs", "data", "__pycache__", ".hermetic", "*.pyc")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pin_base(project: Path, base_ref: str) -> None:
    """Point hermetic.yaml's `base:` at the session's base (the examples' pin may be another)."""
    cfg = project / "hermetic.yaml"
    text, n = re.subn(r"(?m)^base: .*$", f"base: {base_ref}", cfg.read_text())
    assert n == 1, f"{cfg}: no single 'base:' line"
    cfg.write_text(text)


def copy_example(example: str, dest: Path, base_ref: str, base_env: dict[str, str] | None = None) -> Path:
    """examples/<example> -> dest (no runs/, no data/), base pinned, data made by its make_data.py."""
    shutil.copytree(EXAMPLES / example, dest, ignore=_COPY_IGNORE)
    pin_base(dest, base_ref)
    subprocess.run([sys.executable, str(dest / "make_data.py")], check=True, capture_output=True, timeout=120,
                   env=base_env)
    return dest


def copy_project(src: Path, dest: Path) -> Path:
    """Another checkout of a prepared project: code, config, lock and data, without its runs."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("runs", ".git", "__pycache__", "*.pyc"))
    return dest


def git_commit_all(root: Path, message: str = "snapshot") -> str:
    """git init (once), add everything not ignored, commit; returns HEAD."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout

    if not (root / ".git").exists():
        git("init", "-q", "-b", "main")
        (root / ".gitignore").write_text("data/\nruns/\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", message)
    return git("rev-parse", "HEAD").strip()


def build(project: Path, *args: str, env: dict[str, str] | None = None,
          base_env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = run_cli("build", "-C", str(project), "--json", *args, env=env, base_env=base_env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def hermetic_run(project: Path, *args: str, expect: int | None = 0, env: dict[str, str] | None = None,
                 timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """`hermetic run --json ARGS` in project; (process, the sealed record it printed)."""
    proc = run_cli("run", "--json", *args, cwd=project, env=env, timeout=timeout)
    if expect is not None:
        assert proc.returncode == expect, (proc.returncode, proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(proc.stdout)


def run_dir_of(project: Path, record: dict[str, Any]) -> Path:
    return project / "runs" / record["record"]["run_id"]


def run_dirs(project: Path) -> set[str]:
    runs = project / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()


def diff_json(a: Path, b: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli("diff", str(a), str(b), "--json", *args)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def material_causes(diff: dict[str, Any]) -> dict[str, list[str]]:
    """Section name -> notes of its material changes, for the sections that differ."""
    return {s["name"]: [c["note"] for c in s["changes"] if c["material"]]
            for s in diff["sections"] if s["differs"]}


def output_digests(run_dir: Path) -> dict[str, str]:
    out = run_dir / "outputs"
    return {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*")) if p.is_file()}


def labelled_containers(client, run_id_part: str) -> list[Any]:
    """Containers (any state) whose run-id label contains run_id_part. Listed without inspecting every
    run's container (docker-py's containers.list does): another run's, beside this test, may be removed
    between the listing and its inspection."""
    import docker.errors

    found = []
    for row in client.api.containers(all=True, filters={"label": RUN_LABEL}):
        if run_id_part in ((row.get("Labels") or {}).get(RUN_LABEL) or ""):
            try:
                found.append(client.containers.get(row["Id"]))
            except docker.errors.NotFound:  # ended and removed since
                pass
    return found


def containers_created_since(client, since: float, run_id_part: str) -> list[str]:
    """Run IDs of the containers created since `since` (epoch seconds) whose run-id label
    contains run_id_part: the engine's event log sees containers that are already gone."""
    events = client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "create", "label": RUN_LABEL})
    ids = [(e.get("Actor") or {}).get("Attributes", {}).get(RUN_LABEL, "") for e in events
           if e.get("timeNano", 0) >= since * 1e9]
    return [i for i in ids if run_id_part in i]


@pytest.fixture(scope="module")
def module_cache(session_cache):
    """The session cache for every `hermetic` a module starts (one base, one image per example)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HERMETIC_CACHE", str(session_cache))
    yield session_cache
    mp.undo()


# The examples are built once per run of the suite (in the session cache, so their layers and
# images are shared; started when the run begins: conftest's early work; under pytest-xdist by whichever
# worker asks first) and never handed to a test
# as they are: each module works in its own copy (`logreg`, `torch_project`), each test that adds
# or changes files in its own (`project`).

def built_once(tmp_path_factory, session_cache: Path, base_ref: str, example: str,
               base_env: dict[str, str] | None = None) -> tuple[Path, dict[str, Any]]:
    """examples/<example> copied, pinned to the session base, data made, image built: (project, build JSON)."""
    with run_once(tmp_path_factory, f"{example}.built.json") as known:
        if known.exists():
            got = json.loads(known.read_text())
            return Path(got["project"]), got["build"]
        dest = run_root(tmp_path_factory) / f"{example}-built"
        shutil.rmtree(dest, ignore_errors=True)  # what a failed attempt left
        proj = copy_example(example, dest / example, base_ref, base_env)
        out = build(proj, env={"HERMETIC_CACHE": str(session_cache)}, base_env=base_env)
        known.write_text(json.dumps({"project": str(proj), "build": out}))
        return proj, out


@pytest.fixture(scope="session")
def logreg_built(tmp_path_factory, session_cache, base_ref) -> tuple[Path, dict[str, Any]]:
    """examples/numpy-logreg, built once per run: (project, build JSON). Copy it, never change it."""
    return built_once(tmp_path_factory, session_cache, base_ref, "numpy-logreg")


@pytest.fixture(scope="session")
def torch_built(tmp_path_factory, session_cache, base_ref) -> tuple[Path, dict[str, Any]]:
    """examples/torch-mlp, built once per run (the suite's one cold torch build): (project, build JSON)."""
    return built_once(tmp_path_factory, session_cache, base_ref, "torch-mlp")


@pytest.fixture(scope="module")
def logreg(tmp_path_factory, module_cache, logreg_built) -> Path:
    """examples/numpy-logreg, copied, pinned to the session base, data made, image built: this module's checkout."""
    return copy_project(logreg_built[0], tmp_path_factory.mktemp("logreg") / "numpy-logreg")


@pytest.fixture
def project(logreg, tmp_path) -> Path:
    """A private checkout of the built project (same image), for tests that add or change files."""
    return copy_project(logreg, tmp_path / "numpy-logreg")


@pytest.fixture(scope="module")
def torch_project(tmp_path_factory, module_cache, torch_built) -> Path:
    """examples/torch-mlp, copied, pinned, data made, image built (once per run): this module's checkout."""
    return copy_project(torch_built[0], tmp_path_factory.mktemp("torch") / "torch-mlp")
