"""Start `hermetic` in its own session, wait for a moment worth killing it, SIGKILL it, and see
what of it survives (its session ID is its pid: whatever it started has that session too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def start_hermetic(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "hermetic", *args], env=full, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(p: subprocess.Popen, moment: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Poll until ``moment()``; fail (naming ``what``) if the process ended or time ran out first."""
    deadline = time.monotonic() + timeout
    while not moment():
        if p.poll() is not None:
            out, err = p.communicate()
            raise AssertionError(f"hermetic ended (exit {p.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.01)


def sigkill(p: subprocess.Popen) -> int:
    """SIGKILL the process itself (not its group: what it started is on its own). Returns its session ID."""
    assert p.poll() is None, "it ended before the kill"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    for pipe in (p.stdout, p.stderr):  # (not read to the end: a survivor would hold them open)
        if pipe is not None:
            pipe.close()
    return p.pid


def _processes() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, session) of every process."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.append((int(d.name), fields[0], int(fields[1]), int(fields[3])))
    return out


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    return [pid for pid, state, _ppid, session in _processes() if session == sid and state != "Z"]


def survivors(sid: int, grace: float = 10.0) -> list[int]:
    """What was still alive of session ``sid`` after ``grace`` seconds (it should be nothing, at
    once). Those are then SIGKILLed, so that a failing test leaves nothing behind."""
    deadline = time.monotonic() + grace
    while (left := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def children_of(pid: int) -> list[int]:
    return [p for p, state, ppid, _sid in _processes() if ppid == pid and state != "Z"]


def processes_running(needle: str) -> list[int]:
    """PIDs (not this process) whose command line holds ``needle``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found
