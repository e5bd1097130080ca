"""Atomic file writes and a directory lock, standard library only.

(hermetic.fsutil does the same on the host; this copy exists because the
runtime is shipped into images without the rest of hermetic.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str, mode: str = "wb") -> Iterator[IO]:
    """Write to a temp file beside ``path``; rename over it only on success."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            # mkstemp makes 0600; outputs are read by the host user too.
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def directory_lock(directory: str) -> Iterator[None]:
    """flock on the directory itself: serializes read-modify-write of a file
    that is replaced by rename (locking the file would lock the old inode),
    and leaves no lock file behind. A no-op where flock is unavailable."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def warn(message: str) -> None:
    """One line on stderr; the runtime never uses the warnings filter, which
    a training script may have silenced."""
    import sys

    sys.stderr.write("hermetic_runtime: warning: " + message + "\n")
    sys.stderr.flush()
