"""What the filesystem under a path is, and the one-line errors for one that refuses what hermetic needs.

No file locks, no writes (read-only, another user's, root_squash), a rename across filesystems, no FIFOs or file
owners for a run's scratch space, a full disk: one line naming the path, the filesystem and what to do. What a
filesystem merely lacks (permission bits, hard links, xattrs) is no error."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator

from hermetic.core.errors import CannotCreate, DiskFull, HermeticError, Unavailable, disk_full, is_disk_full
from hermetic.core.paths import cache_root, inside

# Filesystems that are, by their nature, mounted by more than one machine.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "fuse.beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs",
    "cifs", "smb3", "fuse.sshfs", "panfs", "wekafs", "orangefs", "pvfs2", "fuse.juicefs", "virtiofs", "9p",
})


def filesystem_of(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding ``path`` (/proc/self/mountinfo); None where unknown."""
    real = os.path.realpath(path)
    best: tuple[str, str] | None = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) >= 5 and rparts:
            point = parts[4].replace("\\040", " ")
            if inside(real, point) and (best is None or len(point) >= len(best[0])):
                best = (point, rparts[0])
    return best


def _on(path: str | os.PathLike[str], found: tuple[str, str] | None = None) -> str:
    """The filesystem of ``path`` for a message (``found``: its ``filesystem_of``, when the caller has it)."""
    found = found or filesystem_of(path)
    return f"{found[1]} at {found[0]}" if found is not None else "a filesystem not in /proc/self/mountinfo"


_REFUSED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class NotWritable(CannotCreate, OSError):
    """A directory hermetic must write in refuses it (read-only filesystem, permission denied): one line,
    exit 73. Also an OSError with the original errno, so that code which takes a failed write as "not kept"
    (a cache note, a claim on a read-only store) goes on doing so, as with errors.DiskFull."""

    def __init__(self, message: str, *, hint: str | None = None, errno: int = errno.EACCES,
                 filename: str | None = None):
        super().__init__(message, hint=hint)
        self.errno = errno
        self.filename = filename


def not_writable(e: OSError, directory: str | os.PathLike[str]) -> NotWritable:
    """The one-line error for a refused write (errno EROFS, EACCES or EPERM) in ``directory``."""
    where = Path(directory)
    found = filesystem_of(where)
    fs = _on(where, found)
    owner = None
    if e.errno == errno.EROFS:
        reason = f"read-only file system ({fs})"
    else:
        probe = where  # the directory, or its nearest parent that exists (the one that refused)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            st = probe.stat()
            owner = st.st_uid
            fs += f"; {probe} is uid {st.st_uid}'s, mode {st.st_mode & 0o7777:04o}"
        except OSError:
            pass
        if os.geteuid() == 0:
            if found is not None and found[1] in NETWORK_FS:
                fs += "; a network filesystem that maps root to nobody, as NFS's root_squash does"
            reason = f"permission denied, even to root ({fs})"
        else:
            reason = f"permission denied to uid {os.geteuid()} ({fs})"
    hint = "make it writable for this user, or work in a copy that is"
    if inside(os.path.realpath(where), str(cache_root())):
        hint = ("set HERMETIC_CACHE to a directory of this user's on a writable local filesystem (the cache's "
                "stores, locks and scratch space are written there)")
    if owner is not None and owner != os.geteuid():
        hint = f"run hermetic as its owner (uid {owner}), or {hint}"
    return NotWritable(f"{where}: {reason}: hermetic cannot write there", hint=hint,
                       errno=e.errno or errno.EACCES, filename=str(where))


@contextlib.contextmanager
def naming_unwritable(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a write refused in the block (EROFS, EACCES, EPERM) into ``NotWritable`` naming ``directory``."""
    try:
        yield
    except OSError as e:
        if e.errno not in _REFUSED or isinstance(e, HermeticError):
            raise
        raise not_writable(e, directory) from None


class NoLocks(Unavailable):
    """The filesystem cannot lock files (flock): hermetic's stores need locks, so this is one line, exit 69."""


def no_locks(e: OSError, path: str | os.PathLike[str]) -> NoLocks:
    """The one-line error for an flock the filesystem of ``path`` cannot take (hermetic.hostfs.filelocks)."""
    return NoLocks(f"{path}: cannot lock it ({os.strerror(e.errno)}; {_on(path)}): hermetic's stores need file "
                   "locks", hint="on NFS, run its lock daemon (rpc.statd; NFSv4 has locks built in), or mount with "
                   "local_lock=flock where one machine uses it; on Lustre, mount with -o flock; or keep the directory "
                   "on a local filesystem (HERMETIC_CACHE for the cache)")


def not_one_filesystem(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> CannotCreate:
    """The one-line error for a rename that crossed filesystems (EXDEV): a store's tmp/ and what it keeps apart."""
    return CannotCreate(f"{dst}: cannot be renamed into place from {src}: they are on different filesystems "
                        f"({_on(dst)}; {_on(src)})",
                        hint="keep the whole cache on one filesystem (each store writes in its tmp/ and renames "
                        "into place): move all of it and set HERMETIC_CACHE there, instead of mounting or "
                        "symlinking a part of it elsewhere")


def unfit_for_runs(path: str | os.PathLike[str], what: str, e: OSError) -> CannotCreate:
    """The one-line error for a run's scratch space on a filesystem that cannot hold it: no FIFOs (the gate)
    or no owners to give (FAT and exFAT; root on an export that maps root to nobody, as root_squash does)."""
    return CannotCreate(f"{path}: cannot {what}: {os.strerror(e.errno or errno.EPERM)} ({_on(path)}): a run's "
                        "scratch space (in the cache's tmp/) needs FIFOs and file owners",
                        hint="set HERMETIC_CACHE to a directory on a local Linux filesystem (ext4, xfs, tmpfs), "
                        "not FAT or exFAT, nor an export that maps root to nobody")


@contextlib.contextmanager
def naming_full_disk(path: str | os.PathLike[str], what: str | None = None, *,
                     needed: int | None = None) -> Iterator[None]:
    """Turn ENOSPC or EDQUOT raised in the block into ``errors.DiskFull`` naming ``path``.

    For the writers (and, wrapped around a whole command, as the last resort): an OSError that names its own file
    keeps that name (it is the more precise one), a DiskFull raised deeper passes unchanged, any other error is left
    alone. The block's own cleanup (temp files, ``finally``) has run by then."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise disk_full(e, e.filename if e.filename is not None else path, what=what, needed=needed) from None
