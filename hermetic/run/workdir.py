"""The working directory: a writable copy of the code snapshot, and what the script left in it.

Scripts written before hermetic write ``model.pt`` or ``out/ckpt.pt`` where
they stand. The container's working directory is therefore a scratch copy
of the snapshot (the snapshot in the run directory stays as it was), and
after the run every file that is new or changed there, and matches
``run.outputs``, is moved into ``runs/<id>/outputs/`` at the same relative
path, where it is hashed and compared like anything written to /outputs.
Caches (``__pycache__/``, ``*.pyc``) never count, nor the datasets mounted
inside the directory. How much the directory may grow is bounded by
``run.workdir_size``: a watcher stops the container when it grows past it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hermetic.containerpaths import glob_match
from hermetic.fsutil import sha256_file

CACHE_DIRS = ("__pycache__",)
CACHE_SUFFIXES = (".pyc",)
WATCH_INTERVAL_S = 1.0


@dataclass
class WorkdirResult:
    collected: list[str] = field(default_factory=list)  # moved into outputs/, relative paths
    deleted: list[str] = field(default_factory=list)  # snapshot files the script removed
    conflicts: list[str] = field(default_factory=list)  # written both here and to /outputs, with other bytes

    def section(self) -> dict:
        return {"collected": self.collected, "deleted": self.deleted}


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (symlinks not followed)."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:  # a directory the script removed while we looked
            continue
    return total


class SizeWatch:
    """Polls the working directory while the container runs; says why to stop it once it grew past the limit."""

    def __init__(self, root: Path, limit_bytes: int, limit_text: str):
        self.root = root
        self.limit = limit_bytes
        self.limit_text = limit_text
        self.start = tree_bytes(root)
        self.exceeded: str | None = None

    def check(self) -> str | None:
        grown = tree_bytes(self.root) - self.start
        if grown > self.limit and self.exceeded is None:
            self.exceeded = (f"the working directory grew by {grown / 2**20:.0f} MiB, past run.workdir_size "
                             f"({self.limit_text}); write large outputs to /outputs, or raise run.workdir_size")
        return self.exceeded

    def run_until(self, stop: threading.Event, on_exceeded: Callable[[str], None]) -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            reason = self.check()
            if reason:
                on_exceeded(reason)
                return


def _is_cache(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in CACHE_DIRS for p in parts[:-1]) or rel.endswith(CACHE_SUFFIXES)


def _wanted(rel: str, include: list[str], exclude: list[str]) -> bool:
    return any(glob_match(g, rel) for g in include) and not any(glob_match(g, rel) for g in exclude)


def _file_digest(path: Path) -> str:
    if path.is_symlink():
        # as the snapshot identifies a symlink: by its target text
        return hashlib.sha256(b"symlink:" + os.readlink(path).encode("utf-8", "surrogateescape")).hexdigest()
    return sha256_file(path)


def collect(workspace: Path, snapshot_files: dict[str, str], outputs: Path, *, include: list[str],
            exclude: list[str], skip: list[str]) -> WorkdirResult:
    """Move what the script created or changed in ``workspace`` into ``outputs`` (same relative paths).

    ``snapshot_files`` maps the snapshot's paths to their sha256 (the code
    section); ``skip`` are directories inside the workspace that are not the
    script's (the datasets' mount points).
    """
    result = WorkdirResult()
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(workspace):
        rel_dir = os.path.relpath(dirpath, workspace)
        rel_dir = "" if rel_dir == "." else rel_dir
        kept = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)  # a symlink to a directory is a file-like entry
            elif rel not in skip and d not in CACHE_DIRS:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = Path(dirpath) / name
            seen.add(rel)
            if _is_cache(rel) or not (path.is_file() or path.is_symlink()):
                continue
            if rel in snapshot_files and _file_digest(path) == snapshot_files[rel]:
                continue  # unchanged code
            if not _wanted(rel, include, exclude):
                continue
            dest = outputs / rel
            if dest.exists() or dest.is_symlink():
                if not dest.is_symlink() and not path.is_symlink() and _file_digest(dest) == _file_digest(path):
                    continue  # the same bytes written to both places
                result.conflicts.append(rel)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(dest))
            result.collected.append(rel)
    result.deleted = sorted(p for p in snapshot_files
                            if p not in seen and not _is_cache(p) and not any(p.startswith(s + "/") for s in skip))
    return result
