"""Filesystem edges: atomic writes and streaming hashes.

Nothing hermetic writes is ever half there: content goes to a temporary file in
the destination's directory and is renamed into place (rename is atomic on
POSIX within one filesystem), so an interrupted process leaves either the old
state or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

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


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb", *, fsync: bool = True) -> Iterator[IO]:
    """Write to a temp file beside ``path``; rename over it only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; the result should read like any new file
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    with atomic_writer(path, "wb", fsync=fsync) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the block's duration.

    The kernel drops it when the process dies, so a SIGKILLed holder never
    leaves a stale lock behind.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
