"""hermetic's exit codes, and the exception types the CLI turns into a one-line error and one of them.

A failure a user can cause is a HermeticError subclass whose class gives its exit code (sysexits' 64-78: no clash
with a script's own codes, which `hermetic run` passes through); anything else is a bug (70, with its traceback).
The table is README.md's ("Exit codes"): a test keeps the two in step."""

from __future__ import annotations

import copyreg
import errno as _errno
from typing import Any

# Verdicts, not errors: `hermetic diff`, `replay` and `verify` compared something and say what they found.
EXIT_OK = 0
EXIT_DIFFERENT = 1       # the runs (or groups, or rebuilt image) differ, like diff(1) and cmp(1)
# hermetic's own failures (sysexits.h).
EXIT_USAGE = 64          # EX_USAGE: the command line is wrong (unknown option, bad value, conflicting flags)
EXIT_DATAERR = 65        # EX_DATAERR: an input is not what it claims or what was recorded: a digest mismatch,
                         # a lock without hashes, a dataset that changed, a tampered record; the run was refused
EXIT_NOINPUT = 66        # EX_NOINPUT: a named thing does not exist (run, image, base, file); nothing was compared
EXIT_UNAVAILABLE = 69    # EX_UNAVAILABLE: a service or tool is missing or unreachable (Docker Engine, GPU runtime,
                         # registry, MLflow, mmdebstrap, an optional extra), or the GPU cannot run the image
EXIT_SOFTWARE = 70       # EX_SOFTWARE: a bug in hermetic, or an incomplete installation (traceback printed)
EXIT_OSERR = 71          # EX_OSERR: no process, thread or descriptor to be had (ulimit -u, -n), or a worker died
EXIT_CANTCREAT = 73      # EX_CANTCREAT: an output cannot be created or kept: a file exists (--force), the disk
                         # (or the quota) is full, or hermetic failed a run the script finished (limit broken,
                         # outputs not kept as written)
EXIT_IOERR = 74          # EX_IOERR: a file could not be read
EXIT_TEMPFAIL = 75       # EX_TEMPFAIL: waited and gave up (runs wait --timeout); try again later
EXIT_PROTOCOL = 76       # EX_PROTOCOL: the registry answered outside the protocol
EXIT_NOPERM = 77         # EX_NOPERM: the registry refused the credentials (or there were none)
EXIT_CONFIG = 78         # EX_CONFIG: hermetic.yaml (or a recipe, catalog, CI template) is invalid
# Signals, as a shell reports them.
EXIT_INTERRUPTED = 130   # 128 + SIGINT: Ctrl-C
EXIT_BROKEN_PIPE = 141   # 128 + SIGPIPE: the reader of our output went away (| head)

EXIT_NOTHING_COMPARED = EXIT_NOINPUT  # neither run has an output file or a metric: nothing was compared

class HermeticError(Exception):
    """A user-facing failure: one line, names the culprit, nonzero exit.

    Raise a subclass (its exit code says what kind of failure it is); the base
    class's own code is EXIT_SOFTWARE, so an uncategorized error reads as the bug it is."""

    exit_code: int = EXIT_SOFTWARE

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None,
                 details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])  # lines printed before the error line (e.g. each changed file)
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # across a process pool: every attribute kept (an OSError's errno and filename too)
        state = {**vars(self), "args": self.args}
        if isinstance(self, OSError):
            state.update(errno=self.errno, filename=self.filename)
        return copyreg.__newobj__, (type(self),), state


class UsageError(HermeticError, exit_code=EXIT_USAGE):
    """The command line is wrong: an unknown option, a bad value, flags that conflict."""


class ConfigError(HermeticError, exit_code=EXIT_CONFIG):
    """hermetic.yaml (or a base recipe, the base catalog, a CI template) is unreadable or invalid."""


class DataError(HermeticError, exit_code=EXIT_DATAERR):
    """An input is not what it claims or what was recorded; nothing was built or run from it."""


class LockError(DataError):
    """A lockfile cannot be trusted as written (missing hash, not pinned, sdist only...)."""


class IntegrityError(DataError):
    """Bytes did not match their expected digest."""


class NotFound(HermeticError, exit_code=EXIT_NOINPUT):
    """A named thing (run, image, base, file, metric) does not exist where it was looked for."""


class Unavailable(HermeticError, exit_code=EXIT_UNAVAILABLE):
    """A service or tool hermetic needs is missing, unreachable or failed to run."""


class EngineError(Unavailable):
    """The Docker Engine is missing, unreachable or lacks a needed runtime."""


class WorkerDied(HermeticError, exit_code=EXIT_OSERR):
    """A worker process stopped without answering (killed, out of memory)."""


class CannotCreate(HermeticError, exit_code=EXIT_CANTCREAT):
    """An output cannot be created or kept (it exists, or the run broke a limit)."""


class DiskFull(CannotCreate, OSError):
    """The filesystem, or the user's quota on it, is full (ENOSPC, EDQUOT): an output could not be written.

    Also an OSError with the original errno, so that code which already treats a failed write as "not kept"
    (``except OSError``: a cache note, a stat cache) goes on doing so; everywhere else it reaches the CLI as one
    line naming the path. Raised by ``disk_full`` (and filesystems.naming_full_disk)."""

    def __init__(self, message: str, *, hint: str | None = None, errno: int = _errno.ENOSPC,
                 filename: str | None = None, details: list[str] | None = None, needed: int | None = None):
        super().__init__(message, hint=hint, details=details)
        self.errno = errno
        self.filename = filename
        self.needed = needed  # bytes the write needed, when known


DISK_FULL_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT})
DISK_FULL_HINT = ("free space on that filesystem (`hermetic cache gc` removes what no kept image needs), "
                  "then run the command again: nothing half-written was kept")


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a write that failed because the disk or the quota is full."""
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def disk_full(e: OSError, path: object = None, *, what: str | None = None, written: int | None = None,
              needed: int | None = None, at_least: bool = False, hint: str | None = None) -> DiskFull:
    """The one-line error for a write that failed with ENOSPC or EDQUOT (``is_disk_full(e)``).

    It names ``path`` (the file or the store being written; the OSError's own filename when it has one and no path
    is given), what was being written, and how much was written and needed when known (``at_least``: ``needed`` is a
    lower bound). A DiskFull comes back as it is. The caller removes what it half wrote before raising it."""
    if isinstance(e, DiskFull):
        return e
    where = str(path) if path is not None else (str(e.filename) if e.filename is not None else None)
    reason = "disk quota exceeded" if e.errno == _errno.EDQUOT else "no space left on device"
    message = f"{where}: {reason}" if where else reason
    if what:
        message += f" while writing {what}"
    sizes = [f"{_size(written)} written" if written else "",
             f"{'at least ' if at_least else ''}{_size(needed)} needed" if needed else ""]
    if any(sizes):
        message += " (" + ", ".join(s for s in sizes if s) + ")"
    return DiskFull(message, hint=hint or DISK_FULL_HINT, errno=e.errno or _errno.ENOSPC,
                    filename=where, needed=needed)


class ReadError(HermeticError, exit_code=EXIT_IOERR):
    """A file could not be read (permissions, I/O error)."""


class TempFail(HermeticError, exit_code=EXIT_TEMPFAIL):
    """Waited and gave up; trying again later may succeed."""


class ProtocolError(HermeticError, exit_code=EXIT_PROTOCOL):
    """A registry (or another server) answered outside its protocol."""


class PermissionDenied(HermeticError, exit_code=EXIT_NOPERM):
    """Credentials were refused, missing or unreadable."""


class MissingExtra(Unavailable):
    """An optional feature's package is not installed: the message names the extra that
    brings it, e.g. ``pip install 'hermetic[plots]'``."""

    def __init__(self, feature: str, extra: str, module: str):
        super().__init__(f"{feature} needs {module}, which is not installed: pip install 'hermetic[{extra}]'")
        self.extra = extra
