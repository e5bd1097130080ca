"""File locks (flock) that belong to the process that took them alone.

A lock belongs to an open file, which a fork shares: so every lock descriptor is close-on-exec and a forked child
lets go of its copies at once (``os.register_at_fork``). A SIGKILLed holder never leaves a lock behind, so "held"
means "its holder lives" (fsutil's temp files rely on it)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

from hermetic.hostfs.filesystems import naming_unwritable, no_locks

# flock's answers where the filesystem has no locks: NFS without its lock daemon (ENOLCK), Lustre mounted
# without -o flock (ENOSYS), a filesystem without the operation (EOPNOTSUPP).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})


_held: set[int] = set()  # descriptors through which this process holds flock locks
_held_mu = threading.Lock()  # held from open() until the fd is in _held, and across fork()


def open_held(path: Path, flags: int, mode: int = 0o644) -> int:
    """open() a descriptor that will carry a lock; no fork can copy it before it is known (module doc)."""
    with _held_mu:
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        _held.add(fd)
    return fd


def close_held(fd: int) -> None:
    """Close a descriptor of ``open_held``: the lock it carries, if the only descriptor of its file, goes."""
    _held.discard(fd)
    os.close(fd)


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


os.register_at_fork(before=lambda: _held_mu.acquire(), after_in_parent=lambda: _held_mu.release(),
                    after_in_child=_after_fork_in_child)


def flock(fd: int, operation: int, path: str | os.PathLike[str]) -> None:
    """``fcntl.flock``; on a filesystem without locks, filesystems.NoLocks naming ``path``."""
    try:
        fcntl.flock(fd, operation)
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise
        raise no_locks(e, path) from None


@contextlib.contextmanager
def _locked(path: str | os.PathLike[str], operation: int, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An flock (``operation``: LOCK_EX or LOCK_SH) on ``path`` for the block, made if need be; ``on_wait()`` is
    called once first when someone else holds it (to say what it waits for) before it blocks."""
    path = Path(path)
    with naming_unwritable(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_held(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            flock(fd, operation | fcntl.LOCK_NB, path)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            flock(fd, operation, path)
        yield
    finally:
        close_held(fd)  # closing the only descriptor of the open file releases the lock


def file_lock(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """An exclusive advisory lock (flock) held for the block's duration.

    The kernel drops it when the holder dies, and no other process ever shares it (close-on-exec, and let go of in
    forked children: module doc), so a SIGKILLed holder never leaves a stale lock behind, even while workers it
    forked are still alive."""
    return _locked(path, fcntl.LOCK_EX)


def exclusive_file_lock(path: str | os.PathLike[str],
                        on_wait: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
    """``file_lock``, calling ``on_wait()`` once first when the lock is held by someone else (to say
    what it waits for) before it blocks."""
    return _locked(path, fcntl.LOCK_EX, on_wait)


def shared_file_lock(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """A shared flock on ``path`` for the block: any number of holders together, none while
    ``exclusive_file_lock`` is held. Not shared with a fork, gone when the holder dies (file_lock)."""
    return _locked(path, fcntl.LOCK_SH)


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds ``path``'s file_lock now (False when there is no such file)."""
    try:
        fd = open_held(Path(path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path)
    except BlockingIOError:
        return True
    finally:
        close_held(fd)
    return False


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
