"""Trees an untrusted process wrote, handled from the host without ever following a link.

Every operation starts from a directory descriptor and resolves one component at a time with ``O_NOFOLLOW``: a link
is an error, never a detour. Only regular files are read (``O_NONBLOCK``, checked with fstat); links are recorded by
their target, FIFOs, sockets and devices by kind. ``record_name`` writes a name in a record (``%XX`` for ``%``,
``\\``, controls and bytes that are not UTF-8); ``fs_name`` reverses it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Callable, Iterator
from urllib.parse import unquote_to_bytes

from hermetic.core.errors import DataError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 256  # directories nested deeper are not walked (each level holds a descriptor)
READ_SIZE = 1 << 20

KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo",
         stat.S_IFSOCK: "socket", stat.S_IFCHR: "chardev", stat.S_IFBLK: "blockdev"}


class UnsafePath(DataError):
    """A path in an untrusted tree runs through a link, or ends at something that is not what was asked."""


def kind_of(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "unknown")


# ---------------------------------------------------------------- names


def record_name(name: str) -> str:
    """A file system name (str, surrogate-escaped as os.listdir gives it) as a record writes it (module doc)."""
    out = []
    for ch in name:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte (PEP 383)
            out.append(f"%{o - 0xDC00:02X}")
        elif ch in "%\\" or o < 0x20 or 0x7F <= o < 0xA0:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
        else:
            out.append(ch)
    return "".join(out)


def fs_name(recorded: str) -> str:
    """The file system name (surrogate-escaped str) that ``record_name`` wrote as ``recorded``."""
    return os.fsdecode(unquote_to_bytes(recorded)) if "%" in recorded else recorded


display = record_name  # a name safe to print on one line (no control characters, no lone surrogates)


# ---------------------------------------------------------------- resolving, one component at a time


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"{display(rel)!r}: not a plain relative path")
    return parts


def open_root(path: str | os.PathLike[str]) -> int:
    """A directory hermetic made itself (runs/<id>/outputs, a workspace), opened without following its last
    component: the start of every walk."""
    return os.open(path, DIR_FLAGS)


def open_dir(dirfd: int, rel: str, *, create: bool = False) -> int:
    """The directory ``rel`` beneath ``dirfd`` (made, one component at a time, when ``create``).

    UnsafePath when a component is a link or not a directory."""
    cur = os.dup(dirfd)
    try:
        for p in _parts(rel) if rel else []:
            try:
                nxt = os.open(p, DIR_FLAGS, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p, 0o755, dir_fd=cur)
                nxt = os.open(p, DIR_FLAGS, dir_fd=cur)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{display(rel)}: {display(p)} is a link or not a directory") from None
                raise
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def split(rel: str) -> tuple[str, str]:
    head, _, tail = rel.rpartition("/")
    return head, tail


@contextlib.contextmanager
def _parent(dirfd: int, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The directory of ``rel`` beneath ``dirfd`` (opened; made first when ``create``), and ``rel``'s last name."""
    head, tail = split(rel)
    d = open_dir(dirfd, head, create=create)
    try:
        yield d, tail
    finally:
        os.close(d)


# ---------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    rel: str  # relative to the walk's root, '/'-separated, as the file system spells it (surrogate-escaped)
    kind: str  # file | dir | symlink | fifo | socket | chardev | blockdev | unknown
    st: os.stat_result  # lstat
    target: str | None = None  # a symlink's target text


def lstat_beneath(dirfd: int, rel: str) -> os.stat_result | None:
    """lstat of ``rel`` beneath ``dirfd``; None when it (or a directory on the way) does not exist.
    UnsafePath when a directory on the way is a link."""
    try:
        with _parent(dirfd, rel) as (d, tail):
            return os.stat(tail, dir_fd=d, follow_symlinks=False)
    except FileNotFoundError:
        return None


def walk(rootfd: int, *, prune: Callable[[str], bool] | None = None,
         on_too_deep: Callable[[str], None] | None = None) -> Iterator[Entry]:
    """Every entry under ``rootfd``, depth first, names sorted by their bytes; never through a link.

    ``prune(rel)`` True skips a directory's contents (the directory itself is still yielded). Directories nested
    deeper than MAX_DEPTH are yielded but not entered (``on_too_deep`` is told)."""
    yield from (entry for _dirfd, _name, entry in walk_at(rootfd, prune=prune, on_too_deep=on_too_deep))


def walk_at(rootfd: int, *, prune: Callable[[str], bool] | None = None,
            on_too_deep: Callable[[str], None] | None = None) -> Iterator[tuple[int, str, Entry]]:
    """As ``walk``, with each entry's parent directory descriptor and name (valid until the next item):
    what opening, hashing or chown-ing the entry needs without resolving its path again."""
    stack: list[tuple[int, str, Iterator[str]]] = []

    def push(fd: int, prefix: str) -> None:
        names = sorted(os.listdir(fd), key=os.fsencode)
        stack.append((fd, prefix, iter(names)))

    push(os.dup(rootfd), "")
    try:
        while stack:
            fd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            rel = prefix + name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            kind = kind_of(st.st_mode)
            if kind == "symlink":
                yield fd, name, Entry(rel, kind, st, os.readlink(name, dir_fd=fd))
            elif kind == "dir":
                yield fd, name, Entry(rel, kind, st)
                if prune is not None and prune(rel):
                    continue
                if len(stack) >= MAX_DEPTH:
                    if on_too_deep is not None:
                        on_too_deep(rel)
                    continue
                try:
                    sub = _open_subdir(fd, name)
                except FileNotFoundError:
                    continue
                try:
                    push(sub, rel + "/")
                except BaseException:
                    os.close(sub)
                    raise
            else:
                yield fd, name, Entry(rel, kind, st)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_subdir(fd: int, name: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except PermissionError:
        # A directory its owner made unreadable (chmod 000): as that owner (hermetic.hostfs.privdrop) we may give
        # ourselves access again; the result of the lstat above says it is a directory, not a link.
        os.chmod(name, 0o700, dir_fd=fd)
        return os.open(name, DIR_FLAGS, dir_fd=fd)


# ---------------------------------------------------------------- reading


def open_regular(dirfd: int, rel: str) -> int:
    """A descriptor for reading the regular file ``rel``; UnsafePath when it is anything else (a link, a
    FIFO, a device: none is ever opened for reading)."""
    with _parent(dirfd, rel) as (d, tail):
        return open_regular_at(d, tail, rel=rel)


def open_regular_at(dirfd: int, name: str, st: os.stat_result | None = None, *, rel: str | None = None) -> int:
    """``name`` in the directory ``dirfd`` opened for reading if it is a regular file (``st``: its lstat,
    when the caller has it); UnsafePath otherwise."""
    rel = rel or name
    if st is None:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{display(rel)}: a {kind_of(st.st_mode)}, not a regular file")
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dirfd)
    except PermissionError:
        os.chmod(name, (st.st_mode & 0o7777) | 0o400, dir_fd=dirfd)  # its owner's own file (see _open_subdir)
        fd = os.open(name, READ_FLAGS, dir_fd=dirfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{display(rel)}: became a link") from None
        raise
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafePath(f"{display(rel)}: changed while it was opened")
    return fd


def open_regular_path(path: str | os.PathLike[str]) -> int:
    """A descriptor for reading ``path``, a regular file whose last component is not followed if it is a
    link (for files in a sealed run directory, whose parents hermetic made)."""
    fd = os.open(path, READ_FLAGS)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(f"{path}: a {kind_of(st.st_mode)}, not a regular file")
    return fd


def hash_fd(fd: int) -> tuple[str, int]:
    """(sha256 hex, size) of what ``fd`` reads, from its current offset."""
    h = hashlib.sha256()
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    size = 0
    while True:
        n = os.readv(fd, [buf])
        if not n:
            break
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


def read_limited(dirfd: int, rel: str, limit: int) -> bytes:
    """The bytes of the regular file ``rel``; UnsafePath when it is not one or is larger than ``limit``."""
    with os.fdopen(open_regular(dirfd, rel), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnsafePath(f"{display(rel)}: {size} bytes, more than the {limit} allowed")
        data = f.read(limit + 1)  # it may have grown since
    if len(data) > limit:
        raise UnsafePath(f"{display(rel)}: more than the {limit} bytes allowed")
    return data


# ---------------------------------------------------------------- writing


def move(src_dirfd: int, src_rel: str, dst_dirfd: int, dst_rel: str) -> None:
    """Move ``src_rel`` (a file, link or FIFO) to ``dst_rel``, making the destination's directories; never
    through a link on either side, never over an existing entry (FileExistsError).

    rename(2) when both sides are on one file system; otherwise a copy
    (regular files, links, FIFOs) and the source removed."""
    with _parent(src_dirfd, src_rel) as (sd, s_tail), _parent(dst_dirfd, dst_rel, create=True) as (dd, d_tail):
        try:
            os.stat(d_tail, dir_fd=dd, follow_symlinks=False)
            raise FileExistsError(errno.EEXIST, "exists", dst_rel)
        except FileNotFoundError:
            pass
        try:
            os.rename(s_tail, d_tail, src_dir_fd=sd, dst_dir_fd=dd)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
        _copy_entry(sd, s_tail, dd, d_tail)
        os.unlink(s_tail, dir_fd=sd)


def _copy_entry(sd: int, s_name: str, dd: int, d_name: str, *, expect_sha256: str | None = None) -> str | None:
    st = os.stat(s_name, dir_fd=sd, follow_symlinks=False)
    kind = kind_of(st.st_mode)
    if kind == "symlink":
        os.symlink(os.readlink(s_name, dir_fd=sd), d_name, dir_fd=dd)
        return None
    if kind == "fifo":
        os.mkfifo(d_name, 0o644, dir_fd=dd)
        return None
    if kind != "file":
        raise UnsafePath(f"{display(s_name)}: a {kind}; only files, links and FIFOs are copied")
    h = hashlib.sha256()
    with os.fdopen(open_regular(sd, s_name), "rb", buffering=0) as fin:
        fout = os.fdopen(os.open(d_name, CREATE_FLAGS, (st.st_mode & 0o777) | 0o600, dir_fd=dd), "wb")
        try:
            with fout:
                while chunk := fin.read(READ_SIZE):
                    h.update(chunk)
                    fout.write(chunk)
        except BaseException:
            os.unlink(d_name, dir_fd=dd)  # ours, half written
            raise
    digest = h.hexdigest()
    if expect_sha256 is not None and digest != expect_sha256:
        os.unlink(d_name, dir_fd=dd)
        raise UnsafePath(f"{display(s_name)}: changed while it was copied")
    return digest


def copy(src_dirfd: int, src_rel: str, dst_dirfd: int, dst_rel: str, *, expect_sha256: str | None = None) -> None:
    """Copy a file, link or FIFO beneath one root to a new name beneath another (no link followed, nothing
    overwritten); a regular file's bytes are hashed as they are copied and must match ``expect_sha256``."""
    with _parent(src_dirfd, src_rel) as (sd, s_tail), _parent(dst_dirfd, dst_rel, create=True) as (dd, d_tail):
        _copy_entry(sd, s_tail, dd, d_tail, expect_sha256=expect_sha256)


def symlink(target: str, dst_dirfd: int, dst_rel: str) -> None:
    with _parent(dst_dirfd, dst_rel, create=True) as (dd, name):
        os.symlink(target, name, dir_fd=dd)


def mkfifo(dst_dirfd: int, dst_rel: str) -> None:
    with _parent(dst_dirfd, dst_rel, create=True) as (dd, name):
        os.mkfifo(name, 0o644, dir_fd=dd)


def lchown_tree(rootfd: int, uid: int, gid: int, *, skip: Callable[[str], bool] | None = None) -> None:
    """chown the root and everything beneath it, links themselves (never their targets); an entry for
    which ``skip(rel)`` is true is left as it is, and so is everything beneath it."""
    os.chown(rootfd, uid, gid)
    for dirfd, name, e in walk_at(rootfd, prune=skip):
        if skip is not None and skip(e.rel):
            continue
        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)


def tree_bytes(rootfd: int) -> int:
    """Bytes of the regular files beneath ``rootfd`` (links not followed); 0 for parts that vanish."""
    total = 0
    try:
        for e in walk(rootfd):
            if e.kind == "file":
                total += e.st.st_size
    except OSError:  # the writer removed or replaced a directory while we looked
        pass
    return total
