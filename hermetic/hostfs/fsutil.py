"""Writing files so that nothing is ever half there: atomic writes, temp files tied to their writer, stat keys with
git's racy-clean rule, streaming hashes.

Content goes to a temporary file beside its destination, renamed into place. The writer holds an flock on it while
it writes (hermetic.hostfs.filelocks), so the next writer (``sweep_dead``) tells a dead writer's leftover from a
live writer's work without guessing by age."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator

from hermetic.core.errors import disk_full, is_disk_full
from hermetic.hostfs.filelocks import close_held, flock, open_held
from hermetic.hostfs.filesystems import naming_unwritable, not_one_filesystem

# Read once: os.umask can only be read by setting it, which is not thread-safe.
_UMASK = os.umask(0o022)
os.umask(_UMASK)

# 1 MiB reads: large enough that hashlib releases the GIL and syscalls are few.
READ_SIZE = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    from hermetic.hostfs.safetree import hash_fd  # (imported where a run's end needs it, not at its start)

    with open(path, "rb", buffering=0) as f:
        return hash_fd(f.fileno())[0]


# ---------------------------------------------------------------- stat keys

StatKey = tuple[int, int, int, int, int]
_COARSE_CLOCK_NS = 50_000_000
SAFE_AGE_NS = 2 * 1_000_000_000 + _COARSE_CLOCK_NS  # enough for any timestamp granularity up to whole seconds


def stat_key(st: os.stat_result) -> StatKey:
    """(dev, ino, size, mtime_ns, ctime_ns): what says a file was not touched since."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_racy(mtime_ns: int, ctime_ns: int, recorded_ns: int) -> bool:
    """Git's racy-clean rule (Documentation/technical/racy-git.txt).

    A file changed in the same timestamp tick as the stat that recorded it keeps the same mtime and ctime, so a
    record made at ``recorded_ns`` is trusted only when the file's mtime and ctime are strictly older than it minus
    a slack: twice the timestamp granularity (inferred from the timestamp's trailing zeros: whole seconds on
    FAT/HFS+/ext3, nanoseconds on ext4/xfs/btrfs) plus a tick of the kernel's coarse clock, which stamps files up to
    one tick behind ``time.time_ns()``. True: do not trust it."""
    newest = mtime_ns if mtime_ns > ctime_ns else ctime_ns
    if newest + SAFE_AGE_NS < recorded_ns:
        return False  # the common case, decided without looking at granularity
    granularity = 1
    while granularity < 1_000_000_000 and newest % (granularity * 10) == 0:
        granularity *= 10
    return newest + 2 * granularity + _COARSE_CLOCK_NS >= recorded_ns


# ---------------------------------------------------------------- temp files tied to their writer


class OwnedTemp:
    """A new temporary file in ``directory`` that this process holds an flock on.

    ``fd`` is open for reading and writing and carries the lock until ``close()`` (after the file was renamed into
    place) or ``discard()`` (the file is removed). If the writer dies first, the kernel drops the lock and the file
    is a dead writer's leftover for ``sweep_dead`` to remove."""

    def __init__(self, directory: str | os.PathLike[str], prefix: str, suffix: str = "", *, mode: int = 0o600):
        directory = Path(directory)
        with naming_unwritable(directory):  # a read-only store, another user's: one line (NotWritable)
            directory.mkdir(parents=True, exist_ok=True)
        while True:
            path = directory / f"{prefix}{os.urandom(6).hex()}{suffix}"
            try:
                with naming_unwritable(directory):
                    fd = open_held(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                continue
            try:
                flock(fd, fcntl.LOCK_EX, path)  # at most a sweeper's instant (see sweep_dead)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                close_held(fd)
                raise
            if os.fstat(fd).st_nlink:
                break
            close_held(fd)  # a sweeper took it between create and lock: it is gone, make another
        self.fd = fd
        self.path = path

    def open(self, mode: str = "wb", **kwargs) -> IO:
        """A file object on ``fd`` (closing it leaves the descriptor and the lock)."""
        return os.fdopen(self.fd, mode, closefd=False, **kwargs)

    def close(self) -> None:
        if self.fd >= 0:
            close_held(self.fd)
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
    """A new directory ``directory/PREFIXxxxx``, removed on exit, tied to this process by ``PREFIXxxxx.lock`` beside
    it (an OwnedTemp): a dead owner's directory is swept with its lock file."""
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

    Test-and-remove under the file's own lock: a live writer holds it, so the non-blocking attempt fails; a writer
    that created the file but has not locked it yet blocks on our lock, then finds the file unlinked and makes
    another (OwnedTemp); a file renamed into place meanwhile is no longer at ``path`` and is left alone."""
    # Open for writing where it may be: over NFS, flock is a lock on the server's byte ranges, and an
    # exclusive one needs a file open for writing (flock(2)). Read-only where not (another user's claim,
    # a read-only store): then a lock that cannot be had there leaves the file as it is.
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = open_held(Path(path), flags | os.O_NOFOLLOW)
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
        close_held(fd)


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

    The first writer of a process sweeps its store's tmp/ (a killed writer's leftovers go before new ones are made);
    a build's sweep of the whole cache (builder/gc.py dead_temp_files) counts as that first sweep, so no directory
    is swept twice in one process."""
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
        (os.fchmod if isinstance(file, int) else os.chmod)(file, mode)  # type: ignore[operator]
    except OSError as e:
        if e.errno not in _NO_MODES:
            raise


# ---------------------------------------------------------------- atomic writes


def replace_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace``; across two filesystems, ``not_one_filesystem``."""
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        raise not_one_filesystem(src, dst) from None


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
    with contextlib.suppress(FileNotFoundError):
        if Path(path).read_bytes() == data:
            return False
    atomic_write_bytes(path, data)
    return True
