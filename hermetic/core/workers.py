"""Worker processes that never outlive the command that started them.

``start`` forks a worker: it asks for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``) and checks the
parent is still there; ``fn(*args)``'s result and its HermeticError come back through a pipe as JSON
(never pickle: the child may have dropped root). A child closes its copies of the other workers' pipes,
so a reader never waits for a dead worker. An account at its limit of processes or open files gets fewer
workers (``affordable``, ``no_more_workers``, ``limit_reached``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
from typing import Any, Callable

from hermetic.core.errors import EXIT_OSERR, HermeticError, WorkerDied

# What fork(2), pipe(2) and a new thread meet at those limits (EAGAIN: processes; EMFILE, ENFILE: descriptors,
# the account's or the machine's), or when the machine has no memory for another process (ENOMEM).
_NO_MORE = frozenset({errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM})

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or no prctl
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
    files = isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE if files else resource.RLIMIT_NPROC)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if files:
        return HermeticError(f"{doing}: too many open files (this process's `ulimit -n` is {limit}, or the "
                             "machine's limit)", hint="raise `ulimit -n` (e.g. `ulimit -n 4096`) and run the command "
                             "again", exit_code=EXIT_OSERR)
    return HermeticError(f"{doing}: no process or thread could be started (this account's `ulimit -u` is "
                         f"{limit}, counting every process and thread it runs; or the machine is out of "
                         "memory)", hint="end some of this account's processes, or raise `ulimit -u`, and run the "
                         "command again", exit_code=EXIT_OSERR)


def available_cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def affordable(workers: int) -> int:
    """``workers``, or fewer where ``ulimit -n`` is low: each costs this process a descriptor (its pipe), and
    three quarters of the limit stay for the files the work opens and the rest of the command."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return workers if soft == resource.RLIM_INFINITY else max(1, min(workers, soft // 4))


# ---------------------------------------------------------------- forked workers and their answers

_plumbing: set[int] = set()  # this process's ends of worker pipes: a child it forks closes its copies first


class Worker:
    """The parent's side of a child that ``start`` forked: its answers, then its end.

    A context manager: leaving the block ends the child (``stop``) unless its
    result was read, so an error or Ctrl-C in the parent never waits for it."""

    def __init__(self, pid: int, fd: int, what: str):
        self.pid, self.what = pid, what
        self._fd = fd
        self._status: int | None = None  # set once reaped

    def result(self, tick: Callable[[], None] | None = None) -> Any:
        """What the child's function returned; the child is reaped. Its HermeticError is raised here as the same
        class, a bug's traceback as a RuntimeError (exit 70), and WorkerDied (exit 71) where it ended without an
        answer (killed, out of memory). ``tick`` is called at each short poll while waiting (a progress bar)."""
        return self._end(_read_answer(self._fd, tick))

    def stop(self) -> None:
        """End the child now (SIGKILL) if it was not reaped yet, and let go of its pipe."""
        if self._status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            finally:
                self._reap()
        self._close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _end(self, doc: dict[str, Any] | None) -> Any:
        """Reap the child; ``doc``'s value, or the error it carries (``result``)."""
        self._close()
        self._reap()
        if doc is None:
            status = self._status or 0
            how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit {os.WEXITSTATUS(status)}")
            raise WorkerDied(f"{self.what} ended without an answer ({how})",
                             hint="the machine may be out of memory (`dmesg` names what the kernel killed)")
        if "ok" in doc:
            return doc["ok"]
        if "error" in doc:
            raise _rebuild(doc["error"])
        raise RuntimeError(f"in {self.what}:\n{doc.get('bug')}")

    def _reap(self) -> None:
        if self._status is None:
            self._status = os.waitpid(self.pid, 0)[1]

    def _close(self) -> None:
        if self._fd >= 0:
            _plumbing.discard(self._fd)
            os.close(self._fd)
            self._fd = -1


def start(what: str, fn: Callable[..., Any], *args: Any) -> Worker:
    """Fork a child that runs ``fn(*args)`` (module doc); ``what`` names it in errors ("a hashing worker process").

    Where the pipe or the fork is refused (an OSError: ``no_more_workers``, ``limit_reached``) nothing is left
    open. What ``fn`` returns must be JSON (lists come back for tuples)."""
    owner = os.getpid()
    r, w = os.pipe()
    try:
        sys.stdout.flush()  # (else the child's copy of the buffers would print them again)
        sys.stderr.flush()
        pid = os.fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:
        _child(owner, r, w, fn, args)  # never returns
    os.close(w)
    _plumbing.add(r)
    return Worker(pid, r, what)


def _child(owner: int, r: int, w: int, fn: Callable[..., Any], args: tuple) -> None:
    code = 1
    try:
        die_with_parent(owner)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends its workers
        os.close(r)
        for fd in _plumbing:  # its parent's pipes: its siblings', and the parent's own answer pipe
            os.close(fd)
        _plumbing.clear()
        _plumbing.add(w)
        try:
            data = json.dumps({"ok": fn(*args)})
        except HermeticError as e:
            data = json.dumps({"error": _describe(e)})
        except BaseException:
            import traceback

            data = json.dumps({"bug": traceback.format_exc()})
        with os.fdopen(w, "wb") as f:
            f.write(data.encode())
        code = 0
    finally:
        os._exit(code)


def _read_answer(fd: int, tick: Callable[[], None] | None) -> dict[str, Any] | None:
    """The JSON document the child wrote before its end of the pipe closed; None where it wrote none, or half
    of one. ``tick`` at each short poll while waiting, if given."""
    import select

    chunks: list[bytes] = []
    while True:
        if tick is not None and not select.select([fd], [], [], 0.1)[0]:
            tick()
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def _describe(e: HermeticError) -> dict[str, Any]:
    """``e`` as JSON: its classes (the nearest first) by module and name, and what it says."""
    classes = [[c.__module__, c.__name__] for c in type(e).__mro__ if issubclass(c, HermeticError)]
    return {"classes": classes, "message": e.message, "hint": e.hint, "details": e.details,
            "exit_code": e.exit_code}


def _rebuild(e: dict[str, Any]) -> HermeticError:
    """The error ``_describe`` wrote, as the nearest of its classes this process has loaded (looked up, never
    imported: the child may have dropped root and is not trusted to name code to run)."""
    cls: type[HermeticError] = HermeticError
    for module, name in e["classes"]:
        found = getattr(sys.modules.get(module), name, None) if str(module).startswith("hermetic.") else None
        if isinstance(found, type) and issubclass(found, HermeticError):
            cls = found
            break
    try:
        exc = cls(e["message"], hint=e.get("hint"), details=e.get("details"))
    except TypeError:  # a subclass with its own constructor
        exc = HermeticError(e["message"], hint=e.get("hint"), details=e.get("details"), exit_code=e["exit_code"])
    exc.exit_code = e["exit_code"]
    return exc
