"""Run a function as another user: a forked child that gave up root before it touched anything.

The second wall behind hermetic.hostfs.safetree: a hermetic.core.workers child as the container's uid and gid, no
supplementary groups (``read_any``: keeping CAP_DAC_READ_SEARCH only, to read what an earlier run sealed). Its JSON
answer comes back through a pipe, its HermeticError as the same class, a bug as a RuntimeError. Not root, or a root
target: the function runs in this process."""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any, Callable, Sequence

from hermetic.core import errors, workers
from hermetic.core.errors import HermeticError

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

    ``open_dirs`` are opened (``O_DIRECTORY | O_NOFOLLOW``) before the user changes, and ``dirfds`` maps each to its
    descriptor: the function works beneath them, so it needs no right to search their parents (a project in a 0700
    home, a cache under /root)."""
    with contextlib.ExitStack() as opened:
        fds: dict[str, int] = {}
        for p in open_dirs:  # here, as root: the child inherits them
            fds[p] = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            opened.callback(os.close, fds[p])
        if not will_drop(uid):
            return fn(fds, *args)
        with workers.start(f"the process collecting as uid {uid}", _as_user, os.getpid(), uid, gid, read_any,
                           fn, fds, args) as child:
            return child.result()


def _as_user(owner: int, uid: int, gid: int, read_any: bool, fn: Callable[..., Any], fds: dict[str, int],
             args: tuple) -> Any:
    """In the child: become ``uid:gid``, then ``fn(fds, *args)``."""
    try:
        _become(uid, gid, read_any)
    except OSError as e:  # never carry on as root
        raise HermeticError(f"cannot drop from root to uid {uid} gid {gid} before reading what the "
                            f"script wrote: {e}", exit_code=errors.EXIT_OSERR) from None
    workers.die_with_parent(owner)  # again: a change of user clears the parent-death signal
    return fn(fds, *args)


def _become(uid: int, gid: int, read_any: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
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
