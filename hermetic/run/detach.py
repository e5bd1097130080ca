"""``hermetic run --detach``: the run goes on in a process of its own; the terminal gets its ID at once.

The same command is started again without ``--detach`` in a new session; once its run directory exists it
sends the ID through a pipe and logs to ``runs/<id>/logs/hermetic.log``. A refusal before that is printed and
exits with its code, as a foreground run would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hermetic.core.errors import EXIT_SOFTWARE, HermeticError

ANNOUNCE_ENV = "HERMETIC_ANNOUNCE_FD"
HERMETIC_LOG = "hermetic.log"  # in runs/<id>/logs/: what the detached process itself said


@dataclass(frozen=True)
class Announced:
    """What a detached `hermetic run` (or group) said it started: its kind, ID and directory."""

    kind: str  # "run" | "group"
    ident: str
    path: Path


class DetachedRunFailed(HermeticError):
    """The detached run was refused before it started; the message and code are the run's own."""


def announce(kind: str, ident: str, path: Path, log_dir: Path) -> bool:
    """In the detached process: tell the starting process the ID, then write to the run's log, not to it.

    Returns True when this process was started detached (its terminal output now goes to the log).
    """
    fd_text = os.environ.pop(ANNOUNCE_ENV, None)
    if fd_text is None:
        return False
    fd = int(fd_text)
    try:
        os.write(fd, f"{kind} {ident} {path}\n".encode())
    finally:
        os.close(fd)
    log_dir.mkdir(parents=True, exist_ok=True)
    out = os.open(log_dir / HERMETIC_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    return True


def start_detached(argv: list[str]) -> Announced:
    """Start ``hermetic ARGV`` detached; return what it announced, or raise the error it refused with."""
    import tempfile  # here: not on every run's start

    rfd, wfd = os.pipe()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermetic", *argv], stdin=subprocess.DEVNULL, stdout=errors, stderr=errors,
            env={**os.environ, ANNOUNCE_ENV: str(wfd)}, pass_fds=(wfd,), start_new_session=True, close_fds=True,
        )
        os.close(wfd)
        with os.fdopen(rfd, "rb") as r:
            line = r.readline().decode().strip()
        if line:
            kind, ident, path = line.split(" ", 2)
            return Announced(kind, ident, Path(path))
        code = proc.wait()
        errors.seek(0)
        text = errors.read().decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    said = [ln.removeprefix("hermetic: error: ") for ln in lines if ln.startswith("hermetic: error: ")]
    raise DetachedRunFailed(said[-1] if said else (lines[-1] if lines else f"the run exited {code} before it started"),
                            exit_code=code or EXIT_SOFTWARE, details=[ln.removeprefix("  ") for ln in lines
                                                          if not ln.startswith("hermetic: ")])
