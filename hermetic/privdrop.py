"""Run a function as another user: a forked child that gave up root before it touched anything.

hermetic often runs as root; what a training script left behind is handled
(hermetic.safetree) without following links, and, as a second wall, by a
child process that runs as the container's uid and gid with no supplementary
groups (``setgroups([])``, ``setresgid``, ``setresuid``): even a bug in the
first wall cannot write where that user cannot. With ``read_any`` the child
keeps one capability, CAP_DAC_READ_SEARCH (read and search any file, nothing
else), for reading what an earlier run sealed as the invoking user
(``--resume-from``); it still writes only as the container's user.

The child answers through a pipe with JSON: the function's result, or the
HermeticError it raised (re-raised here as the same class), or a bug's
traceback (a RuntimeError here, exit 70). It dies with the parent
(PR_SET_PDEATHSIG). When hermetic is not root, or the target is root, the
function simply runs in this process (there is nothing to drop).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from typing import Any, Callable, Sequence

from hermetic import errors
from hermetic.errors import HermeticError, WorkerDied

_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_DAC_READ_SEARCH = 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def will_drop(uid: int) -> bool:
    """Whether call_as(uid, ...) runs in a child as ``uid`` (hermetic is root and ``uid`` is not)."""
    return os.geteuid() == 0 and uid != 0


def call_as(uid: int, gid: int, fn: Callable[..., Any], *args: Any, open_dirs: Sequence[str] = (),
            read_any: bool = False) -> Any:
    """``fn(dirfds, *args)`` run as ``uid:gid`` (module doc); its result must be JSON-serializable.

    ``open_dirs`` are opened (``O_DIRECTORY | O_NOFOLLOW``) before the user
    changes, and ``dirfds`` maps each to its descriptor: the function works
    beneath them, so it needs no right to search their parents (a project in
    a 0700 home, a cache under /root)."""
    fds = _open_dirs(open_dirs)  # here, as root: the child inherits them
    try:
        if not will_drop(uid):
            return fn(fds, *args)
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(r)
            _child(w, uid, gid, read_any, fn, args, fds)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            payload = f.read()
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in fds.values():
            os.close(fd)
    if not payload:
        how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
               else f"exit {os.WEXITSTATUS(status)}")
        raise WorkerDied(f"the process collecting as uid {uid} ended without an answer ({how})")
    doc = json.loads(payload)
    if "ok" in doc:
        return doc["ok"]
    if "error" in doc:
        e = doc["error"]
        cls = getattr(errors, e["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, HermeticError)):
            cls = HermeticError
        exc = _rebuild(cls, e)
        raise exc
    raise RuntimeError(f"in the process collecting as uid {uid}:\n{doc.get('bug')}")


def _rebuild(cls: type[HermeticError], e: dict[str, Any]) -> HermeticError:
    try:
        exc = cls(e["message"], hint=e.get("hint"), details=e.get("details"))
    except TypeError:  # a subclass with its own constructor
        exc = HermeticError(e["message"], hint=e.get("hint"), details=e.get("details"), exit_code=e["exit_code"])
    exc.exit_code = e["exit_code"]
    return exc


def _open_dirs(paths: Sequence[str]) -> dict[str, int]:
    fds: dict[str, int] = {}
    try:
        for p in paths:
            fds[p] = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _child(w: int, uid: int, gid: int, read_any: bool, fn: Callable[..., Any], args: tuple,
           fds: dict[str, int]) -> None:
    code = 0
    try:
        try:
            try:
                _become(uid, gid, read_any)
            except OSError as e:  # never carry on as root
                raise HermeticError(f"cannot drop from root to uid {uid} gid {gid} before reading what the "
                                    f"script wrote: {e}", exit_code=errors.EXIT_OSERR) from None
            doc: dict[str, Any] = {"ok": fn(fds, *args)}
        except HermeticError as e:
            cls = type(e)
            name = cls.__name__ if getattr(errors, cls.__name__, None) is cls else _errors_base(cls).__name__
            doc = {"error": {"type": name, "message": e.message, "hint": e.hint, "details": e.details,
                             "exit_code": e.exit_code}}
        except BaseException:
            doc = {"bug": traceback.format_exc()}
        data = json.dumps(doc).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _errors_base(cls: type) -> type:
    """The nearest class of hermetic.errors that ``cls`` derives from (a module's own subclass travels as it)."""
    for base in cls.__mro__:
        if getattr(errors, base.__name__, None) is base:
            return base
    return HermeticError


def _become(uid: int, gid: int, read_any: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    if read_any:
        libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setresuid(uid, uid, uid)
    if read_any:
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = 1 << CAP_DAC_READ_SEARCH
        if libc.capset(ctypes.byref(header), data) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"capset: {os.strerror(e)}")
        libc.prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError("the user was not changed")  # never carry on as root
