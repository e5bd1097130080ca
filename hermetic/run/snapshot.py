"""The code that ran: git state plus a normalized tar of the source tree.

In git: tracked files and untracked ones git does not ignore, with commit, branch, dirty flag and diff. Outside
git: every file but those .gitignore ignores. The run directory, datasets and .git stay out; a link must stay
inside the project. The tar is normalized like an image layer (same source, same sha256) and is what the
container sees, read-only, at /workspace.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.core.errors import DataError
from hermetic.hostfs.fsutil import sha256_file

if TYPE_CHECKING:
    from hermetic.builder.tarlayer import Entry  # imported by take_snapshot: the links check lists files only

SNAPSHOT_FILE = "code/source.tar"
DIFF_FILE = "code/diff.patch"


@dataclass
class Snapshot:
    """The code snapshot taken for a run: its files' hashes, its tar, and the git state when there is one."""

    git: dict[str, Any] | None
    files: dict[str, str]  # relpath -> sha256
    tar_sha256: str
    tar_path: Path
    total_bytes: int
    warnings: list[str] = field(default_factory=list)

    def section(self) -> dict[str, Any]:
        return {"git": self.git, "snapshot": {"file": SNAPSHOT_FILE, "sha256": self.tar_sha256, "files": self.files}}


def _git(root: Path, *args: str) -> str | None:
    """git's stdout, or None when git is missing or the command fails (not a repository)."""
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=False)
    except FileNotFoundError:
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "surrogateescape")


def _excluded(rel: str, excludes: list[str]) -> bool:
    return any(rel == e or rel.startswith(e + "/") for e in excludes)


def _exclude_specs(excludes: list[str]) -> list[str]:
    """git pathspecs that keep the excluded trees (runs/, the datasets) out of git's own walk: what a script
    left there (a FIFO named .gitignore would block git's read of it) is never opened, not just filtered."""
    return [f":(exclude,literal){e}" for e in excludes if e not in ("", ".")]


def list_source_files(root: Path, excludes: list[str], use_git: bool = True) -> tuple[list[str], bool]:
    """(relative paths, in_git). Paths are files or symlinks, sorted."""
    # One git question: ls-files fails outside a work tree. Its paths are relative to ``root`` (git's current
    # directory), not to the work tree's top.
    out = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".",
               *_exclude_specs(excludes)) if use_git else None
    if out is not None:
        paths = []
        for rel in out.split("\0"):
            if not rel or _excluded(rel, excludes) or not os.path.lexists(root / rel):
                continue  # deleted in the work tree: not part of the code now
            if (root / rel).is_dir() and not (root / rel).is_symlink():
                continue  # a submodule: recorded by git, not snapshotted
            paths.append(rel)
        return sorted(set(paths), key=lambda s: s.encode("utf-8", "surrogateescape")), True
    ignored_aware = _not_ignored_outside_git(root, excludes) if use_git else None
    if ignored_aware is not None:
        paths = []
        for rel in ignored_aware:
            if (root / rel).is_dir() and not (root / rel).is_symlink():  # a repository of its own inside
                paths += [f"{rel}/{p}" for p in _walk(root / rel, [])]
            elif not _excluded(rel, excludes) and not _is_cache(rel):
                paths.append(rel)
        paths = [p for p in paths if not _excluded(p, excludes)]
        return sorted(set(paths), key=lambda s: s.encode("utf-8", "surrogateescape")), False
    return sorted(_walk(root, excludes), key=lambda s: s.encode("utf-8", "surrogateescape")), False


def _is_cache(rel: str) -> bool:
    return rel.endswith(".pyc") or "__pycache__" in rel.split("/")


def _walk(root: Path, excludes: list[str]) -> list[str]:
    """Every file under ``root`` (no .git, no caches), relative to it."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")
                       and not _excluded(f"{rel_dir}/{d}".lstrip("/"), excludes)]
        for name in filenames:
            rel = f"{rel_dir}/{name}".lstrip("/")
            if not _excluded(rel, excludes) and not name.endswith(".pyc"):
                paths.append(rel)
    return paths


def _not_ignored_outside_git(root: Path, excludes: list[str]) -> list[str] | None:
    """The files under ``root`` (not a git work tree) that its .gitignore files do not ignore, as git says
    (``ls-files --others --exclude-standard`` against an empty repository made for the question), or None
    when git cannot answer (not installed)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hermetic-gitignore-") as empty:
        # what git takes for a repository (HEAD, objects/, refs/): `git init` would also write its sample
        # hooks and config, time at every run's start for a question about .gitignore files
        os.mkdir(os.path.join(empty, "objects"))
        os.mkdir(os.path.join(empty, "refs"))
        with open(os.path.join(empty, "HEAD"), "w") as f:
            f.write("ref: refs/heads/main\n")
        # the excluded trees (datasets, runs/) are not walked at all
        out = _git(root, f"--git-dir={empty}", f"--work-tree={root}", "ls-files", "-z", "--others",
                   "--exclude-standard", "--", ".", *_exclude_specs(excludes))
    if out is None:
        return None
    return [p.rstrip("/") for p in out.split("\0") if p and os.path.lexists(root / p.rstrip("/"))]


def links_out(root: Path, paths: list[str]) -> list[tuple[str, str]]:
    """(path, target) of each symbolic link among the source tree's ``paths`` (list_source_files) that the
    snapshot could not hold: an absolute target, or one that leads out of the project (extracting it is
    refused: tarfile's ``data`` filter)."""
    out = []
    for rel in paths:
        full = root / rel
        if not full.is_symlink():
            continue
        target = os.readlink(full)
        lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if target.startswith("/") or lexical == ".." or lexical.startswith("../"):
            out.append((rel, target))
    return out


def git_state(root: Path, run_dir: Path, untracked_hashes: dict[str, str],
              excludes: list[str]) -> dict[str, Any] | None:
    head = _git(root, "rev-parse", "HEAD", "--abbrev-ref", "HEAD")  # one git for the two
    if head is None:
        if _git(root, "rev-parse", "--show-toplevel") is None:  # fails outside a work tree
            return None
        commit_s, branch = None, None  # a repository with no commits yet
    else:
        commit_s, branch = ([*head.split("\n"), ""])[:2]
        commit_s, branch = commit_s.strip(), branch.strip() or None
    diff = _git(root, "diff", "--binary", "HEAD", "--", ".") if commit_s else ""
    diff = diff or ""
    untracked_out = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".",
                         *_exclude_specs(excludes)) or ""
    # relative to root (git's current directory), as the snapshot's
    untracked = {p: untracked_hashes[p] for p in untracked_out.split("\0") if p in untracked_hashes}
    dirty = bool(diff) or bool(untracked)
    diff_sha = diff_file = None
    if diff:
        data = diff.encode("utf-8", "surrogateescape")
        (run_dir / DIFF_FILE).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / DIFF_FILE).write_bytes(data)
        diff_sha = hashlib.sha256(data).hexdigest()
        diff_file = DIFF_FILE
    return {"commit": commit_s, "branch": branch if branch != "HEAD" else None, "dirty": dirty,
            "diff_sha256": diff_sha, "diff_file": diff_file, "untracked": dict(sorted(untracked.items()))}


def take_snapshot(root: Path, run_dir: Path, excludes: list[str], *, use_git: bool = True,
                  listed: tuple[list[str], bool] | None = None) -> Snapshot:
    """The snapshot of ``root``'s code; ``listed``: list_source_files' answer for the same root and excludes
    when the caller has it (`hermetic run` lists once, for the links check and the snapshot)."""
    from hermetic.builder.tarlayer import Entry, complete_parents, normalized_mode, write_layer

    paths, in_git = listed if listed is not None else list_source_files(root, excludes, use_git)
    entries: list[Entry] = []
    files: dict[str, str] = {}
    total = 0
    for rel in paths:
        full = root / rel
        try:
            st = os.lstat(full)
        except FileNotFoundError:  # gone since it was listed: an atomic write's temp file (hermetic.image.json's)
            continue
        if os.path.islink(full):
            target = os.readlink(full)
            entries.append(Entry(rel, "symlink", 0o777, linkname=target))
            # A symlink is identified by its target text (hashed, so every value is hex).
            files[rel] = hashlib.sha256(b"symlink:" + target.encode("utf-8", "surrogateescape")).hexdigest()
            continue
        if not os.path.isfile(full):
            continue
        files[rel] = sha256_file(full)
        total += st.st_size
        entries.append(Entry(rel, "file", normalized_mode(st.st_mode), size=st.st_size,
                             open=(lambda f=full: open(f, "rb"))))
    tar_path = run_dir / SNAPSHOT_FILE
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with open(tar_path, "wb") as f:
        write_layer(complete_parents(entries), f, mtime=0)
    warnings = []
    if total > 200 * 1024 * 1024:
        warnings.append(f"the source snapshot is {total / 1e6:.0f} MB; large data belongs in a dataset (hermetic.yaml datasets:)")
    git = git_state(root, run_dir, files, excludes) if in_git else None
    return Snapshot(git, files, sha256_file(tar_path), tar_path, total, warnings)


def extract_snapshot(tar_path: Path, dest: Path) -> None:
    import tarfile

    from hermetic.hostfs.tarextract import extract_all

    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tar_path) as tf:
            extract_all(tf, dest)
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{tar_path}: cannot extract the source snapshot: {e}") from None
