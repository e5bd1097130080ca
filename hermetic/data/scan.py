"""Walking a dataset directory: every regular file once, with its stat key (docs/data.md, "What is listed").

Listed: regular files, and relative links that stay inside the root and end at a regular file (with the
target's content, as ``sha256sum -c`` reads it). Refused: absolute or escaping links, links to directories,
devices, FIFOs, sockets, names that are not UTF-8 or that differ only by Unicode normalization. The walk
stats short names relative to each directory's descriptor (``os.scandir(fd)``).
"""

from __future__ import annotations

import functools
import os
import posixpath
import stat as statmod
from dataclasses import dataclass, field

from hermetic.core.errors import DataError

# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of the bytes a path reads.
StatKey = tuple[int, int, int, int, int]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


class TreeError(DataError):
    """The dataset directory holds something a manifest cannot describe safely."""


@dataclass
class Tree:
    """A scanned dataset: parallel lists, in walk order (not sorted)."""

    root: str  # absolute, symlinks resolved
    paths: list[str] = field(default_factory=list)
    keys: list[StatKey] = field(default_factory=list)  # empty when scanned with stat=False
    # What not everyone may read, from the same stats (stat=True only): (path, st_mode, st_uid, st_gid) of
    # each file (a symlink's target) without o+r and each directory ("" the root, "a/b/") without o+rx.
    # Usually empty; hermetic.data.access decides whether a given user can read them all the same.
    restricted: list[tuple[str, int, int, int]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(k[2] for k in self.keys)

    @functools.cached_property
    def abs_paths(self) -> list[str]:
        """root + "/" + path, for each path (built on first use: two C-speed string operations)."""
        if not self.paths:
            return []
        prefix = self.root + "/"
        return (prefix + ("\0" + prefix).join(self.paths)).split("\0")

    def abspath(self, rel: str) -> str:
        return self.root + "/" + rel


def resolve_root(root: str | os.PathLike[str]) -> str:
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        if not os.path.exists(real):
            raise TreeError(f"{root}: no such directory")
        raise TreeError(f"{root}: not a directory; a dataset is a directory", hint=(
            "move the file into a directory of its own and give that; or commit it with the code (a tracked file "
            "is part of the code snapshot), or pass it from one run to the next with --resume-from "
            "(docs/your-script.md)"))
    return real


def scan_tree(root: str | os.PathLike[str], *, exclude: frozenset[str] | set[str] = frozenset(),
              stat: bool = True) -> Tree:
    """Every file under ``root`` but ``exclude`` (relative paths: the manifest inside it). ``stat=False``: only
    listed (``keys`` empty), for a caller that takes each stat from the file it opens."""
    real_root = resolve_root(root)
    tree = Tree(real_root)
    paths, keys, restricted = tree.paths, tree.keys, tree.restricted
    try:
        root_fd = os.open(real_root, _DIR_FLAGS)
    except OSError as e:
        raise TreeError(f"{root}: cannot open directory: {e.strerror}") from None
    try:
        pending = [""]  # directories to list, relative ("" is the root, else "a/b/")
        while pending:
            rel = pending.pop()
            try:
                fd = os.open(rel, _DIR_FLAGS, dir_fd=root_fd) if rel else os.dup(root_fd)
            except OSError as e:
                raise TreeError(f"{real_root}/{rel}: cannot open directory: {e.strerror}") from None
            try:
                if stat:
                    d = os.fstat(fd)
                    if d.st_mode & 0o005 != 0o005:
                        restricted.append((rel, d.st_mode, d.st_uid, d.st_gid))
                with os.scandir(fd) as it:
                    entries = list(it)
                # Regular files (the common case) by comprehension: a 100,000-file walk
                # spends its time in per-entry Python work, not in getdents.
                files = [e for e in entries if e.is_file(follow_symlinks=False)]
                names = [e.name for e in files]
                paths += [rel + n for n in names] if rel else names
                if stat:
                    stats = [e.stat(follow_symlinks=False) for e in files]
                    keys += [(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats]
                    if not all([s.st_mode & 0o004 for s in stats]):  # the usual dataset: everyone may read it
                        restricted += [(rel + n, s.st_mode, s.st_uid, s.st_gid) for n, s in zip(names, stats)
                                       if not s.st_mode & 0o004]
                if len(files) != len(entries):
                    for entry in entries:
                        name = entry.name
                        if entry.is_file(follow_symlinks=False):
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(rel + name + "/")
                        elif entry.is_symlink():
                            st = _check_symlink(real_root, rel + name, fd, name)
                            paths.append(rel + name)
                            if stat:
                                keys.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
                                if not st.st_mode & 0o004:
                                    restricted.append((rel + name, st.st_mode, st.st_uid, st.st_gid))
                        else:
                            kind = _kind(entry.stat(follow_symlinks=False).st_mode)
                            raise TreeError(f"{real_root}/{rel}{name}: {kind}; a dataset holds regular files only")
            except PermissionError as e:
                raise TreeError(f"{real_root}/{rel}: cannot read: {e.strerror}") from None
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
    if exclude:
        keep = [i for i, p in enumerate(paths) if p not in exclude]
        if len(keep) != len(paths):
            tree.paths = [paths[i] for i in keep]
            tree.keys = [keys[i] for i in keep] if stat else []
            tree.restricted = [r for r in restricted if r[0] not in exclude]
            paths = tree.paths
    if not "".join(paths).isascii():  # one C-speed pass for the usual all-ASCII tree
        _check_names(real_root, [p for p in paths if not p.isascii()])
    return tree


def _check_symlink(real_root: str, rel: str, dir_fd: int, name: str) -> os.stat_result:
    where = f"{real_root}/{rel}"
    target = os.readlink(name, dir_fd=dir_fd)
    if target.startswith("/"):
        raise TreeError(
            f"{where}: symlink with an absolute target ({target}); it would not resolve where the "
            "dataset is mounted -- make it relative, or copy the file"
        )
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if lexical == ".." or lexical.startswith("../"):
        raise TreeError(f"{where}: symlink points outside the dataset root ({target})")
    try:
        st = os.stat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        raise TreeError(f"{where}: broken symlink ({target})") from None
    real = os.path.realpath(where)
    if not (real + "/").startswith(real_root + "/"):
        raise TreeError(f"{where}: symlink resolves outside the dataset root ({real})")
    if statmod.S_ISDIR(st.st_mode):
        raise TreeError(
            f"{where}: symlink to a directory ({target}); not followed -- list the directory itself"
        )
    if not statmod.S_ISREG(st.st_mode):
        raise TreeError(f"{where}: symlink to a {_kind(st.st_mode)}; a dataset holds regular files only")
    return st


def _check_names(real_root: str, non_ascii: list[str]) -> None:
    from hermetic.data.manifest import normalization_twin

    seen: dict[str, str] = {}
    for p in non_ascii:
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            shown = p.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise TreeError(f"{real_root}/{shown}: file name is not valid UTF-8; rename it") from None
        other = normalization_twin(seen, p)
        if other is not None:
            raise TreeError(
                f"{real_root}: {p!r} and {other!r} differ only by Unicode normalization (NFC/NFD); "
                "they are one file on some filesystems and two on others -- rename one"
            )


def _kind(mode: int) -> str:
    if statmod.S_ISFIFO(mode):
        return "a FIFO"
    if statmod.S_ISSOCK(mode):
        return "a socket"
    if statmod.S_ISCHR(mode) or statmod.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
