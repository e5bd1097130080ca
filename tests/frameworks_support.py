"""The framework tests' one image: CPU torch, Lightning, transformers and accelerate, TensorBoard, scikit-learn.

tests/frameworks/project is a hermetic project (its lock made by `hermetic lock`, every wheel on PyPI and
torch's CPU build in this machine's find-links) holding the scripts the framework tests run unmodified:
a tiny LightningModule (lightning_train.py), a tiny GPT-2 trained by the Trainer (trainer_gpt2.py). The
image is built once per test session, in the session cache (its torch layer is the torch example's), by
hermetic's own lock, fetch and build; each test gets a private copy of the project that uses it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from run_support import copy_project, pin_base

FRAMEWORKS_PROJECT = REPO / "tests" / "frameworks" / "project"


@pytest.fixture(scope="session")
def frameworks_built(tmp_path_factory, session_cache, base_ref) -> Path:
    """tests/frameworks/project, copied, pinned to the session's base, its image built (once a session)."""
    proj = tmp_path_factory.mktemp("frameworks") / "frameworks"
    shutil.copytree(FRAMEWORKS_PROJECT, proj, ignore=shutil.ignore_patterns("runs", "__pycache__", "*.pyc"))
    pin_base(proj, base_ref)
    proc = run_cli("build", "-C", str(proj), "--json", env={"HERMETIC_CACHE": str(session_cache)}, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proj


@pytest.fixture
def frameworks(frameworks_built, tmp_path, session_cache, monkeypatch) -> Path:
    """A private checkout of the built framework project (the same image), HERMETIC_CACHE the session's."""
    monkeypatch.setenv("HERMETIC_CACHE", str(session_cache))
    return copy_project(frameworks_built, tmp_path / "frameworks")
