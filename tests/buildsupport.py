"""Shared by the build tests: small projects on the session's base image."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from wheelfactory import requirements_lock, sha256_of


def make_project(root: Path, base: str, pins: dict[str, Path], *, extra: str = "", name: str = "demo") -> Path:
    """``name``: the image's, which names its tag in the engine too (hermetic/NAME:latest), one per engine: a
    module that asserts what that tag names gives its projects a name of its own."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "hermetic.yaml").write_text(f"name: {name}\nbase: {base}\n{extra}")
    rows = []
    for name, f in sorted(pins.items()):
        dist, version = f.name.split("-")[:2]
        rows.append((dist, version, [sha256_of(f)]))
    (root / "requirements.lock").write_text(requirements_lock(rows))
    return root


def build_json(proj: Path, *args: str, env: dict | None = None) -> dict:
    proc = run_cli("build", "-C", str(proj), "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def share_base(session_cache: Path, cache_dir: Path) -> None:
    """Give a fresh cache the session's bootstrapped base and nothing else of the session's store: the blobs
    its refs reach (hardlinked: the same digests) and its refs. (Not every blob of the session's store: a
    cache holding gigabytes of other images made each `cache verify` here rehash them all.)"""
    from hermetic.store.oci import OciStore

    src = OciStore(session_cache / "oci")
    dst = OciStore(cache_dir / "oci").ensure()
    for name, desc in src.refs().items():
        if not name.startswith("hermetic/"):
            continue
        for digest in sorted(src.live_blobs_from(desc.digest)):
            target = dst.blob_path(digest)
            if not target.exists():
                os.link(src.blob_path(digest), target)
        dst.set_ref(name, desc)


# What clone_cache leaves out: lock files (a hardlinked lock is the same lock), temporary and in-use
# markers, and Charliecloud's unpacked trees (a cache of the store, made again where wanted).
CLONE_SKIP = ("tmp", "in-use", "charliecloud")
CLONE_LINKED = (("oci", "blobs"), ("wheels", "sha256"))  # content-addressed, never written in place


def clone_cache(src: Path, dst: Path) -> Path:
    """A cache of its own holding what ``src`` holds: its blobs and wheels hardlinked (the same inodes,
    files hermetic only ever creates by rename), the rest copied. For a module whose writes to a store
    (where it pushed: pushed.json; a gc) must not reach the other modules' runs of the same images,
    which run beside it under pytest-xdist. Returns ``dst``."""
    for root, dirs, files in os.walk(src):
        here = Path(root)
        rel = here.relative_to(src)
        dirs[:] = [d for d in dirs if d not in CLONE_SKIP]
        (dst / rel).mkdir(parents=True, exist_ok=True)
        link = rel.parts[:2] in CLONE_LINKED
        for name in files:
            if name.endswith((".lock", ".tmp")):  # a lock, or a file being written (it is renamed when done)
                continue
            try:
                (os.link if link else shutil.copy2)(here / name, dst / rel / name)
            except FileNotFoundError:  # removed meanwhile by a writer beside this (a temporary, a gc)
                pass
    return dst


def serve_wheels(src: Path, monkeypatch, **versions: str) -> dict[str, Path]:
    """Wheels NAME==VERSION in a local PEP 503 index that pip's config points at."""
    from wheelfactory import make_index, make_wheel

    files = {name: make_wheel(src, name, version) for name, version in versions.items()}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    return files


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """A real registry (Debian's docker-registry) on a free 127.0.0.1 port, one for the whole run: each
    module pushes to repositories of its own names (a module that needs an empty or a faulty
    registry starts its own: test_registry.py)."""
    from registry_support import start_registry

    server = start_registry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()
