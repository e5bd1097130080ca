"""Whether a run is still going, and which process drives it.

The process that executes a run (``hermetic run`` in the foreground, or the
detached process of ``hermetic run --detach``) holds an flock on
``runs/<id>/.running.lock`` for as long as the run lives and writes its pid
beside it. The kernel drops the lock when that process dies, however it
dies, so "running" is known, never guessed from a record that says
``interrupted`` because its writer has not finished yet. ``hermetic logs
-f``, ``hermetic runs wait`` and ``hermetic stop`` read it; so does
``hermetic runs`` to show a live run as ``running``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Iterator

from hermetic.fsutil import file_lock, is_locked

LOCK_NAME = ".running.lock"
PID_NAME = ".running.pid"


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Mark ``run_dir`` as driven by this process until the block ends (or the process dies).

    Through fsutil.file_lock, so the workers a run forks (data hashing, layer builds) never carry the
    lock: a SIGKILLed driver's run stops being "running" at once, not when its last worker exits."""
    with file_lock(run_dir / LOCK_NAME):
        try:
            (run_dir / PID_NAME).write_text(f"{os.getpid()}\n")
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                (run_dir / PID_NAME).unlink()
            with contextlib.suppress(FileNotFoundError):
                (run_dir / LOCK_NAME).unlink()  # still held: no reader sees it free before it is gone


def is_running(run_dir: Path) -> bool:
    return is_locked(run_dir / LOCK_NAME)


def driver_pid(run_dir: Path) -> int | None:
    """The pid of the process driving a live run (None once it ended)."""
    if not is_running(run_dir):
        return None
    try:
        return int((run_dir / PID_NAME).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def stop(run_dir: Path) -> bool:
    """Ask the process driving the run to stop it (SIGTERM: its container is stopped, the record says
    interrupted). False when the run is not running."""
    pid = driver_pid(run_dir)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def wait(run_dir: Path, *, poll_s: float = 0.2, timeout_s: float | None = None) -> bool:
    """Block until the run has ended; False on timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while is_running(run_dir):
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
