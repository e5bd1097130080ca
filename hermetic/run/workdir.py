"""The working directory: a writable copy of the code snapshot, and what the script left in it.

After the run, new or changed files matching ``run.outputs`` move to ``runs/<id>/outputs/`` (caches and mounted
datasets never count); ``run.workdir_size`` bounds how much the directory may grow.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hermetic.hostfs import safetree
from hermetic.config.containerpaths import glob_match

CACHE_DIRS = ("__pycache__",)
CACHE_SUFFIXES = (".pyc",)
WATCH_INTERVAL_S = 1.0


@dataclass
class WorkdirResult:
    collected: list[str] = field(default_factory=list)  # moved into outputs/, relative paths (record names)
    deleted: list[str] = field(default_factory=list)  # snapshot files the script removed
    conflicts: list[str] = field(default_factory=list)  # not kept as written: other bytes in /outputs, a link in the way
    errors: list[str] = field(default_factory=list)  # could not be moved (no space left…): "PATH: why"

    def section(self) -> dict:
        return {"collected": self.collected, "deleted": self.deleted}

    def to_json(self) -> dict:
        return {"collected": self.collected, "deleted": self.deleted, "conflicts": self.conflicts,
                "errors": self.errors}

    @classmethod
    def from_json(cls, doc: dict) -> "WorkdirResult":
        return cls(list(doc["collected"]), list(doc["deleted"]), list(doc["conflicts"]), list(doc["errors"]))


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (no link followed, at any depth: hermetic.hostfs.safetree)."""
    try:
        fd = safetree.open_root(root)
    except OSError:
        return 0
    try:
        return safetree.tree_bytes(fd)
    finally:
        os.close(fd)


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


def entry_digest(dirfd: int, name: str, entry: safetree.Entry) -> str | None:
    """As the snapshot identifies a file: a regular file by its bytes, a symlink by its target text;
    None for anything else (never opened)."""
    if entry.kind == "symlink":
        return hashlib.sha256(b"symlink:" + os.fsencode(entry.target or "")).hexdigest()
    if entry.kind != "file":
        return None
    fd = safetree.open_regular_at(dirfd, name, entry.st, rel=entry.rel)
    try:
        return safetree.hash_fd(fd)[0]
    finally:
        os.close(fd)


def _dest_digest(outfd: int, rel: str) -> str | None | bool:
    """What is at ``rel`` in outputs: its digest (a regular file), None (nothing there), or False (something
    that cannot be compared: a link, a FIFO, a directory, or a link on the way)."""
    try:
        st = safetree.lstat_beneath(outfd, rel)
    except safetree.UnsafePath:
        return False
    if st is None:
        return None
    if safetree.kind_of(st.st_mode) != "file":
        return False
    fd = safetree.open_regular(outfd, rel)
    try:
        return safetree.hash_fd(fd)[0]
    finally:
        os.close(fd)


def collect(workspace: Path, snapshot_files: dict[str, str], outputs: Path, *, include: list[str],
            exclude: list[str], skip: list[str]) -> WorkdirResult:
    """Move what the script created or changed in ``workspace`` into ``outputs`` (same relative paths).

    ``snapshot_files``: snapshot path -> sha256; ``skip``: directories that are not the script's (dataset mounts).
    Through safetree; a destination taken by other bytes or behind a link is a conflict and stays. Record names.
    """
    wsfd = safetree.open_root(workspace)
    try:
        outfd = safetree.open_root(outputs)
        try:
            return collect_at(wsfd, snapshot_files, outfd, include=include, exclude=exclude, skip=skip)
        finally:
            os.close(outfd)
    finally:
        os.close(wsfd)


def collect_at(wsfd: int, snapshot_files: dict[str, str], outfd: int, *, include: list[str],
               exclude: list[str], skip: list[str]) -> WorkdirResult:
    """collect, for the directories ``wsfd`` (the working directory) and ``outfd`` (outputs)."""
    result = WorkdirResult()
    seen: set[str] = set()
    skip_set = set(skip)

    def prune(rel: str) -> bool:
        return rel in skip_set or rel.rsplit("/", 1)[-1] in CACHE_DIRS

    moves = []
    for dirfd, name, e in safetree.walk_at(wsfd, prune=prune):
        if e.kind == "dir":
            continue
        rel = safetree.record_name(e.rel)
        seen.add(e.rel)  # the snapshot's keys are file system names
        if _is_cache(rel) or e.kind not in ("file", "symlink", "fifo", "socket"):
            continue
        if e.rel in snapshot_files and entry_digest(dirfd, name, e) == snapshot_files[e.rel]:
            continue  # unchanged code
        if not _wanted(rel, include, exclude):
            continue
        have = _dest_digest(outfd, e.rel)
        if have is not None:
            if have is not False and e.kind == "file" and entry_digest(dirfd, name, e) == have:
                continue  # the same bytes written to both places
            result.conflicts.append(rel)
            continue
        moves.append((e.rel, rel))
    for fs_rel, rel in moves:  # after the walk: moving while walking would change what it lists
        try:
            safetree.move(wsfd, fs_rel, outfd, fs_rel)
        except (safetree.UnsafePath, FileExistsError):
            result.conflicts.append(rel)
            continue
        except OSError as e:  # ENOSPC/EDQUOT copying across file systems, EIO: the rest is still kept
            result.errors.append(f"{rel}: {e.strerror or e}")
            continue
        result.collected.append(rel)
    result.deleted = sorted(p for p in snapshot_files
                            if p not in seen and not _is_cache(p) and not any(p.startswith(s + "/") for s in skip))
    return result
