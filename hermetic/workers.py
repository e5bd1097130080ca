"""Worker processes that never outlive the command that started them.

A process killed with SIGKILL runs no cleanup, so its workers must not rely
on it: each worker asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, Linux), then checks that the parent it was started
for is still there (it may have died before the request was made). Workers
started from a fork server have the server as their parent, which exits when
the command does; the check then looks at the command's own pid.

Locks are the other half: fsutil's locks are never shared with a worker (see
its module doc), so even a worker that lived on could not hold one.

An account may be refused another worker where root never is: at its limit
of processes (``ulimit -u``, which counts threads too) or of open files
(``ulimit -n``: each worker costs its parent a pipe). ``no_more_workers``
says so of an error, and a command that wanted helpers goes on with those it
got (hashing: with its own process at least); one that cannot do without
says so in one line (``limit_reached``).
"""

from __future__ import annotations

import errno
import os
import signal

from hermetic.errors import EXIT_OSERR, HermeticError

# What fork(2), pipe(2) and a new thread meet at those limits (EAGAIN: processes; EMFILE, ENFILE: descriptors,
# the account's or the machine's), or when the machine has no memory for another process (ENOMEM).
_NO_MORE = frozenset({errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM})

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl_pdeathsig(sig: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def proc_stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # the command name (field 2) may hold spaces and parentheses


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended. A zombie (ended, its parent has not reaped it
    yet: a SIGKILLed command whose shell has not looked) is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = proc_stat_fields(pid)
    if fields is None:  # no /proc: the pid alone says
        return True
    return not fields or fields[0] not in ("Z", "X")


def die_with_parent(owner_pid: int) -> None:
    """Call first thing in a worker: SIGKILL when the parent dies; exit now if ``owner_pid``
    (the command that wanted this worker) is already gone."""
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != owner_pid and not pid_alive(owner_pid):
        os._exit(1)


def no_more_workers(e: BaseException) -> bool:
    """Whether ``e``, raised by starting a worker (a fork, its pipe, a thread), says that no further one can be
    had now: the caller goes on with the workers it has."""
    if isinstance(e, OSError):
        return e.errno in _NO_MORE
    return isinstance(e, RuntimeError) and str(e) == "can't start new thread"  # threading's words for EAGAIN


def limit_reached(e: BaseException, doing: str) -> HermeticError | None:
    """The one-line error (exit EX_OSERR: sysexits' "cannot fork, cannot create pipe") for ``e`` raised while
    ``doing`` where ``no_more_workers(e)``, naming the limit and what to do; None for any other error."""
    import resource

    if not no_more_workers(e):
        return None
    if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return HermeticError(f"{doing}: too many open files (this process's `ulimit -n` is {_limit(soft)}, or the "
                             "machine's limit)", hint="raise `ulimit -n` (e.g. `ulimit -n 4096`) and run the command "
                             "again", exit_code=EXIT_OSERR)
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return HermeticError(f"{doing}: no process or thread could be started (this account's `ulimit -u` is "
                         f"{_limit(soft)}, counting every process and thread it runs; or the machine is out of "
                         "memory)", hint="end some of this account's processes, or raise `ulimit -u`, and run the "
                         "command again", exit_code=EXIT_OSERR)


def _limit(n: int) -> str:
    import resource

    return "unlimited" if n == resource.RLIM_INFINITY else str(n)
