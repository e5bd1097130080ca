"""Filesystem edges: atomic writes, locks a fork does not share, temp files tied
to their writer, stat keys with git's racy-clean rule, streaming hashes.

Nothing hermetic writes is ever half there: content goes to a temporary file in
the destination's directory and is renamed into place (rename is atomic on
POSIX within one filesystem), so an interrupted process leaves either the old
state or the new one -- plus, if it was killed, its temporary file. Each such
file is tied to its writer: the writer holds an flock on it for as long as it
writes, the kernel drops that lock when the writer dies, so the next writer
(``sweep_dead``) can tell a dead writer's leftover from a live writer's work
without guessing by age.

Locks (``file_lock``, and the locks on temp files) belong to the process that
took them alone. flock locks belong to an open file, which a fork shares: a
worker forked while a lock is held would keep it after the holder dies. So
every lock descriptor is close-on-exec (a program we start never gets it), and
a forked child lets go of its copies at once (``os.register_at_fork``): a
SIGKILLed holder never leaves a stale lock behind, whatever it started.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator

# Read once: os.umask can only be read by setting it, which is not thread-safe.
_UMASK = os.umask(0o022)
os.umask(_UMASK)

# 1 MiB reads: large enough that hashlib releases the GIL and syscalls are few.
READ_SIZE = 1 << 20


def sha256_file(path: str | os.PathLike[str], *, chunk: int = READ_SIZE) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


# ---------------------------------------------------------------- stat keys

StatKey = tuple[int, int, int, int, int]
_COARSE_CLOCK_NS = 50_000_000
SAFE_AGE_NS = 2 * 1_000_000_000 + _COARSE_CLOCK_NS  # enough for any timestamp granularity up to 1 s


def stat_key(st: os.stat_result) -> StatKey:
    """(dev, ino, size, mtime_ns, ctime_ns): what says a file was not touched since."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_racy(mtime_ns: int, ctime_ns: int, recorded_ns: int) -> bool:
    """Git's racy-clean rule (Documentation/technical/racy-git.txt).

    A file changed in the same timestamp tick as the stat that recorded it
    keeps the same mtime and ctime, so a record made at ``recorded_ns`` is
    trusted only when the file's mtime and ctime are strictly older than it
    minus a slack: twice the timestamp granularity (inferred from the
    timestamp's trailing zeros: whole seconds on FAT/HFS+/ext3, nanoseconds on
    ext4/xfs/btrfs) plus 50 ms for the kernel's coarse clock, which stamps
    files up to one tick behind ``time.time_ns()``. True: do not trust it.
    """
    newest = mtime_ns if mtime_ns > ctime_ns else ctime_ns
    if newest + SAFE_AGE_NS < recorded_ns:
        return False  # the common case, decided without looking at granularity
    granularity = 1
    while granularity < 1_000_000_000 and newest % (granularity * 10) == 0:
        granularity *= 10
    return newest + 2 * granularity + _COARSE_CLOCK_NS >= recorded_ns


# ---------------------------------------------------------------- filesystems that refuse (issue 38)
# A cache or project on a filesystem that lacks what a local Linux one has ends in one line naming the path,
# the filesystem and what to do: no file locks (NFS without its lock daemon, Lustre without -o flock), no
# writes (a store every node mounts read-only; another user's cache; root on an NFS export that maps root
# to nobody, root_squash), one rename across two filesystems (a part of the cache mounted or symlinked
# elsewhere). What such a filesystem merely lacks (permission bits, hard links, xattrs, O_TMPFILE, which
# hermetic's stores do not use) is no error: set_mode leaves the bits to the mount.

from hermetic.errors import CannotCreate, HermeticError, Unavailable  # noqa: E402

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
            below = real == point or real.startswith(point.rstrip("/") + "/")
            if below and (best is None or len(point) >= len(best[0])):
                best = (point, rparts[0])
    return best


def _on(path: str | os.PathLike[str]) -> str:
    found = filesystem_of(path)
    return f"{found[1]} at {found[0]}" if found is not None else "a filesystem not in /proc/self/mountinfo"


def _in_cache(path: str | os.PathLike[str]) -> bool:
    from hermetic.paths import cache_root

    root, real = str(cache_root()), os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


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

    def __reduce__(self):  # across a process pool (layer workers): OSError's own pickling would drop the rest
        return (_rebuild_not_writable, (self.message, self.hint, self.errno, self.filename))


def _rebuild_not_writable(message: str, hint: str | None, errno: int, filename: str | None) -> NotWritable:
    return NotWritable(message, hint=hint, errno=errno, filename=filename)


def not_writable(e: OSError, directory: str | os.PathLike[str]) -> NotWritable:
    """The one-line error for a refused write (errno EROFS, EACCES or EPERM) in ``directory``."""
    where = Path(directory)
    found = filesystem_of(where)
    fs = f"{found[1]} at {found[0]}" if found is not None else "a filesystem not in /proc/self/mountinfo"
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
    if _in_cache(where):
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


# flock's answers where the filesystem has no locks: NFS without its lock daemon (ENOLCK), Lustre mounted
# without -o flock (ENOSYS), a filesystem without the operation (EOPNOTSUPP).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})


def _flock(fd: int, operation: int, path: str | os.PathLike[str]) -> None:
    try:
        fcntl.flock(fd, operation)
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise
        raise NoLocks(f"{path}: cannot lock it ({os.strerror(e.errno)}; {_on(path)}): hermetic's stores need "
                      "file locks", hint="on NFS, run its lock daemon (rpc.statd; NFSv4 has locks built in), or mount "
                      "with local_lock=flock where one machine uses it; on Lustre, mount with -o flock; or keep the "
                      "directory on a local filesystem (HERMETIC_CACHE for the cache)") from None


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


def replace_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace``; across two filesystems, ``not_one_filesystem``."""
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        raise not_one_filesystem(src, dst) from None


# ---------------------------------------------------------------- locks a fork does not share

_held: set[int] = set()  # descriptors through which this process holds flock locks
_held_mu = threading.Lock()  # held from open() until the fd is in _held, and across fork()


def _open_held(path: Path, flags: int, mode: int = 0o644) -> int:
    """open() a descriptor that will carry a lock; no fork can copy it before it is known."""
    with _held_mu:
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        _held.add(fd)
    return fd


def _close_held(fd: int) -> None:
    _held.discard(fd)
    os.close(fd)


def _before_fork() -> None:
    _held_mu.acquire()


def _after_fork_in_parent() -> None:
    _held_mu.release()


def _after_fork_in_child() -> None:
    """A forked child lets go of the parent's locks: its copies of their descriptors now
    point at /dev/null (dup2, not close: objects it inherited may still close those numbers)."""
    global _held_mu
    _held_mu = threading.Lock()
    if _held:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        for fd in _held:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
        os.close(null)
        _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the block's duration.

    The kernel drops it when the holder dies, and no other process ever
    shares it (close-on-exec, and let go of in forked children: module doc),
    so a SIGKILLed holder never leaves a stale lock behind, even while
    workers it forked are still alive.
    """
    fd = _flock_fd(Path(path))
    try:
        _flock(fd, fcntl.LOCK_EX, path)
        yield
    finally:
        _close_held(fd)  # closing the only descriptor of the open file releases the lock


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds ``path``'s file_lock now (False when there is no such file)."""
    try:
        fd = _open_held(Path(path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        _flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path)
    except BlockingIOError:
        return True
    finally:
        _close_held(fd)
    return False


# ---------------------------------------------------------------- temp files tied to their writer


class OwnedTemp:
    """A new temporary file in ``directory`` that this process holds an flock on.

    ``fd`` is open for reading and writing and carries the lock until
    ``close()`` (after the file was renamed into place) or ``discard()`` (the
    file is removed). If the writer dies first, the kernel drops the lock and
    the file is a dead writer's leftover for ``sweep_dead`` to remove.
    """

    def __init__(self, directory: str | os.PathLike[str], prefix: str, suffix: str = "", *, mode: int = 0o600):
        directory = Path(directory)
        with naming_unwritable(directory):  # a read-only store, another user's: one line (NotWritable)
            directory.mkdir(parents=True, exist_ok=True)
        while True:
            path = directory / f"{prefix}{os.urandom(6).hex()}{suffix}"
            try:
                with naming_unwritable(directory):
                    fd = _open_held(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                continue
            try:
                _flock(fd, fcntl.LOCK_EX, path)  # at most a sweeper's instant (see sweep_dead)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                _close_held(fd)
                raise
            if os.fstat(fd).st_nlink:
                break
            _close_held(fd)  # a sweeper took it between create and lock: it is gone, make another
        self.fd = fd
        self.path = path

    def open(self, mode: str = "wb", **kwargs) -> IO:
        """A file object on ``fd`` (closing it leaves the descriptor and the lock)."""
        return os.fdopen(self.fd, mode, closefd=False, **kwargs)

    def close(self) -> None:
        if self.fd >= 0:
            _close_held(self.fd)
            self.fd = -1

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # while still locked: no sweeper sees it unowned first
        self.close()

    def __enter__(self) -> "OwnedTemp":
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


@contextlib.contextmanager
def owned_temp_dir(directory: str | os.PathLike[str], prefix: str) -> Iterator[Path]:
    """A new directory ``directory/PREFIXxxxx``, removed on exit, tied to this process by
    ``PREFIXxxxx.lock`` beside it (an OwnedTemp): a dead owner's directory is swept with its
    lock file."""
    with OwnedTemp(directory, prefix, ".lock") as owner:
        d = owner.path.with_suffix("")
        d.mkdir(mode=0o700)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)


@dataclass
class Leftovers:
    """Dead writers' temporary files found (and removed, unless only listed)."""

    count: int = 0
    bytes: int = 0
    paths: list[str] = field(default_factory=list)

    def add(self, other: "Leftovers") -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.paths += other.paths


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _if_dead(path: str, remove: bool) -> int | None:
    """Bytes of ``path`` (and of the directory it owns) if its writer is dead, else None.

    Test-and-remove under the file's own lock: a live writer holds it, so the
    non-blocking attempt fails; a writer that created the file but has not
    locked it yet blocks on our lock, then finds the file unlinked and makes
    another (OwnedTemp); a file renamed into place meanwhile is no longer at
    ``path`` and is left alone.
    """
    # Open for writing where it may be: over NFS, flock is a lock on the server's byte ranges, and an
    # exclusive one needs a file open for writing (flock(2)). Read-only where not (another user's claim,
    # a read-only store): then a lock that cannot be had there leaves the file as it is.
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = _open_held(Path(path), flags | os.O_NOFOLLOW)
            break
        except OSError:
            continue
    if fd is None:
        return None  # gone, or not a file we may read
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # its writer is alive (EWOULDBLOCK), or no lock tells here (EBADF, ENOLCK): left alone
        st = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            return None
        if not st.st_nlink or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return None
        size = st.st_size
        owned_dir = path[:-len(".lock")] if path.endswith(".lock") else None
        if owned_dir and os.path.isdir(owned_dir) and not os.path.islink(owned_dir):
            size += _tree_bytes(owned_dir)
            if remove:
                shutil.rmtree(owned_dir, ignore_errors=True)
        if remove:
            try:
                os.unlink(path)
            except OSError:
                return None  # removed by another sweeper, or a store this process may not change
        return size
    finally:
        _close_held(fd)


def sweep_dead(directory: str | os.PathLike[str], match: Callable[[str], bool] | None = None, *,
               remove: bool = True) -> Leftovers:
    """Dead writers' temp files in ``directory`` (those ``match`` accepts, default all regular
    files): removed, or with ``remove=False`` only counted. A live writer's file is never touched."""
    found = Leftovers()
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False) or (match is not None and not match(entry.name)):
                continue
        except OSError:
            continue
        size = _if_dead(entry.path, remove)
        if size is not None:
            found.count += 1
            found.bytes += size
            found.paths.append(entry.path)
    return found


_swept_once: set[str] = set()  # directories this process has swept (sweep_dead_once)


def sweep_dead_once(directory: str | os.PathLike[str], match: Callable[[str], bool] | None = None) -> Leftovers:
    """``sweep_dead(directory, match)`` the first time this process asks for ``directory``; nothing after.

    The first writer of a process sweeps its store's tmp/ (a killed writer's
    leftovers go before new ones are made); a build's sweep of the whole
    cache (builder/gc.py dead_temp_files) counts as that first sweep, so no
    directory is swept twice in one process."""
    key = os.path.realpath(directory)
    if key in _swept_once:
        return Leftovers()
    _swept_once.add(key)
    return sweep_dead(directory, match)


def is_atomic_temp(name: str) -> bool:
    """The name of an ``atomic_writer`` temp file (``.NAME.xxxxxxxxxxxx.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


# ---------------------------------------------------------------- permission bits

# What chmod answers on a filesystem that keeps no permission bits of its own (vfat, exFAT, a FUSE
# filesystem without chmod, an SMB share without Unix extensions): refused or not implemented. There,
# a file's mode is whatever the mount gives every file, so there is nothing for hermetic to set.
_NO_MODES = frozenset({errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP})


def set_mode(file: int | str | os.PathLike[str], mode: int) -> None:
    """``os.chmod`` (or ``os.fchmod`` for a descriptor), left out where the filesystem keeps no modes."""
    try:
        if isinstance(file, int):
            os.fchmod(file, mode)
        else:
            os.chmod(file, mode)
    except OSError as e:
        if e.errno not in _NO_MODES:
            raise


# ---------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb", *, fsync: bool = True) -> Iterator[IO]:
    """Write to a temp file beside ``path`` (held by this process); rename over it only on success."""
    path = Path(path)
    tmp = OwnedTemp(path.parent, f".{path.name}.", ".tmp")
    try:
        set_mode(tmp.fd, 0o666 & ~_UMASK)  # the result should read like any new file
        with tmp.open(mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        replace_file(tmp.path, path)
        tmp.close()
    except BaseException as e:
        tmp.discard()
        if isinstance(e, OSError) and is_disk_full(e):
            raise disk_full(e, path) from None  # the file it was writing, not a nameless write()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    with atomic_writer(path, "wb", fsync=fsync) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_if_changed(path: str | os.PathLike[str], data: bytes) -> bool:
    """Atomically write ``data`` unless the file already holds exactly it; True when it wrote.

    For committed files hermetic regenerates (hermetic.image.json, hermetic.provenance.json):
    an unchanged build leaves their mtime alone, so make and git see nothing to do."""
    try:
        if Path(path).read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, data)
    return True


# ================================================================ full disks, and the shared lock
# (issue 24: a full disk ends in one line naming the path; `cache gc` waits for the store's writers)

from hermetic.errors import DiskFull, disk_full, is_disk_full  # noqa: E402 (re-exported: one place to import from)


@contextlib.contextmanager
def naming_full_disk(path: str | os.PathLike[str], what: str | None = None, *,
                     needed: int | None = None) -> Iterator[None]:
    """Turn ENOSPC or EDQUOT raised in the block into ``errors.DiskFull`` naming ``path``.

    For the writers (and, wrapped around a whole command, as the last resort):
    an OSError that names its own file keeps that name (it is the more precise
    one), a DiskFull raised deeper passes unchanged, any other error is left
    alone. The block's own cleanup (temp files, ``finally``) has run by then.
    """
    try:
        yield
    except DiskFull:
        raise
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise disk_full(e, e.filename if e.filename is not None else path, what=what, needed=needed) from None


def _flock_fd(path: Path) -> int:
    with naming_unwritable(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        return _open_held(path, os.O_RDWR | os.O_CREAT)


@contextlib.contextmanager
def shared_file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """A shared flock on ``path`` for the block: any number of holders together, none while
    ``exclusive_file_lock`` is held. Not shared with a fork, gone when the holder dies (file_lock)."""
    fd = _flock_fd(Path(path))
    try:
        _flock(fd, fcntl.LOCK_SH, path)
        yield
    finally:
        _close_held(fd)


@contextlib.contextmanager
def exclusive_file_lock(path: str | os.PathLike[str],
                        on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """``file_lock``, calling ``on_wait()`` once first when the lock is held by someone else (to say
    what it waits for) before it blocks."""
    fd = _flock_fd(Path(path))
    try:
        try:
            _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            _flock(fd, fcntl.LOCK_EX, path)
        yield
    finally:
        _close_held(fd)


def lock_holders(path: str | os.PathLike[str]) -> list[int]:
    """The pids that hold (or wait for) an flock on ``path``, from /proc/locks; [] where it cannot be read."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  READ  1234 08:01:5678 0 EOF" (a waiter's line starts "1: -> FLOCK ...")
        if "->" in fields:
            fields.remove("->")
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
            pid = int(fields[4])
            if pid != os.getpid() and pid not in pids:
                pids.append(pid)
    return sorted(pids)
