"""Worker processes that never outlive the command that started them.

A process killed with SIGKILL runs no cleanup, so its workers must not rely
on it: each worker asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, Linux), then checks that the parent it was started
for is still there (it may have died before the request was made). Workers
started from a fork server have the server as their parent, which exits when
the command does; the check then looks at the command's own pid.

Locks are the other half: fsutil's locks are never shared with a worker (see
its module doc), so even a worker that lived on could not hold one.
"""

from __future__ import annotations

import os
import signal

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
