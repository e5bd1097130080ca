"""Whether a run is still going, and which process drives it.

The driver holds an flock on ``runs/<id>/.running.lock`` for the run's life (the kernel drops it however the
process dies) and writes its pid beside it. ``driver_token``/``driver_gone`` tell whether a container's driver
(host, pid, start time) has ended, for hermetic.run.orphans.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from hermetic.hostfs.filelocks import file_lock, is_locked
from hermetic.core.workers import pid_alive, proc_stat_fields

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


# ---------------------------------------------------------------- which process drives a container


@dataclass(frozen=True)
class Driver:
    """A process, named so that it stays named once its pid is reused: host, pid, start time."""

    host: str
    pid: int
    start: str  # /proc/PID/stat field 22 (clock ticks after boot); "" where there is no /proc

    def token(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"


def process_start(pid: int) -> str:
    fields = proc_stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def this_driver() -> Driver:
    """This process, as a container's label names it."""
    pid = os.getpid()
    return Driver(socket.gethostname(), pid, process_start(pid))


def driver_token() -> str:
    return this_driver().token()


def parse_driver(token: str) -> Driver | None:
    host, _, rest = token.partition(":")
    pid, _, start = rest.partition(":")
    if not host or not pid.isdigit():
        return None
    return Driver(host, int(pid), start)


def driver_gone(driver: Driver) -> bool:
    """Whether the process ``driver`` names has ended: it is of this host, and its pid is free, a zombie,
    or another process's now (another start time). A driver on another host is never judged gone."""
    if driver.host != socket.gethostname():
        return False
    fields = proc_stat_fields(driver.pid)
    if fields is None:
        return not pid_alive(driver.pid)  # no /proc: the pid alone says
    if fields[0] in ("Z", "X"):  # dead, not yet reaped by its parent
        return True
    return bool(driver.start) and len(fields) > 19 and fields[19] != driver.start
