"""`hermetic ARGS` for the tests, forked from a process that has imported hermetic already.

Each `python -m hermetic …` a test starts spends 0.1-0.4 s of CPU starting the
interpreter and importing click, pydantic's schemas and hermetic's
own modules before it does anything; the suite starts a few thousand, which on
two cores is minutes. The zygote does that once: it is started (per pytest
process) with the test run's environment, imports hermetic's modules, and forks
one child per command. The child is a new process as a test needs one: its own
pid, working directory, environment, umask, fds 0-2 and exit status, the
signal dispositions a new interpreter has, ``sys.argv`` and ``__main__`` as
``-m hermetic`` sets them (runpy), and ``main()``'s own exit (hermetic.cli).

What a fork cannot give is what Python reads once at start-up: the variables
that configure the interpreter (``PYTHON*``) and the locale (``LANG``,
``LC_*``). A command whose environment differs from the zygote's there gets a
new interpreter, as before (conftest.run_cli); so does one with a ``base_env``
(the work started early).

Protocol (one Unix stream connection per command): the client sends a length-
prefixed JSON request with its stdin, stdout and stderr as SCM_RIGHTS fds; the
zygote answers the child's pid (8 bytes), then its exit status as
subprocess reports it (4 bytes, signed: -N for a signal). The zygote's loop has
no threads (a fork would inherit their locks held) and no signal handlers (its
children inherit the dispositions): it waits on the children's pidfds.
"""

from __future__ import annotations

import json
import locale
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REQUEST_MAX = 1 << 20
# What the interpreter reads once, at start-up: a fork keeps the zygote's.
STARTUP_PREFIXES = ("PYTHON", "LC_")
STARTUP_NAMES = ("LANG", "LANGUAGE")


def startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES}


# -- the zygote ---------------------------------------------------------------------------------

def _preload() -> None:
    """Import what commands import: the CLI and every command module (their module-level imports), and what
    they import later: the config and record schemas (pydantic, PyYAML). Imports only: no command's function
    runs, so no cache is filled from the zygote's environment."""
    import importlib

    from hermetic import cli

    for target in cli.COMMANDS.values():
        importlib.import_module(target.partition(":")[0])
    import hermetic.config.load  # noqa: F401
    import hermetic.record.schema  # noqa: F401


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, REQUEST_MAX, 3)
    (size,) = struct.unpack("!I", data[:4])
    body = bytearray(data[4:])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("request cut short")
        body += chunk
    return json.loads(body), fds


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m hermetic ARGS` and never return."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        os.umask(request["umask"])
        sys.path[0] = os.getcwd()  # as -m sets it (the zygote's own is tests/)
        sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first, as -m does
        import runpy

        try:
            runpy.run_module("hermetic", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:  # as the interpreter turns it into a status
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - an uncaught exception, reported as Python would
            import traceback

            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    finally:
        os._exit(code & 0xFF)


def serve(path: str) -> None:
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    sel.close()
                    for pidfd, (_, other) in children.items():
                        os.close(pidfd)
                        other.close()
                    _child(request, fds)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, pid)
                try:
                    conn.sendall(struct.pack("!q", pid))
                except OSError:
                    pass
            else:
                pidfd = key.fd
                pid, conn = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                conn.close()


# -- the client ---------------------------------------------------------------------------------

class Zygote:
    """The zygote of this pytest process: started on first use, ended with the process."""

    def __init__(self) -> None:
        # a short directory of its own: a Unix socket's path has at most 107 bytes
        self._dir = tempfile.mkdtemp(prefix="hermetic-zygote-")
        self.path = os.path.join(self._dir, "zygote.sock")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], env=self.env, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("the CLI zygote did not start")

    def serves(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and startup_env(env) == startup_env(self.env)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def run(self, args: list[str], *, cwd: Path | str | None, env: dict[str, str], timeout: float | None,
            new_session: bool = False) -> subprocess.CompletedProcess:
        """As subprocess.run([python, -m, hermetic, *args], capture_output=True, text=True, ...)."""
        cmd = [sys.executable, "-m", "hermetic", *args]
        deadline = None if timeout is None else time.monotonic() + timeout
        request = json.dumps({"args": list(args), "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(), "env": env,
                              "umask": _current_umask(), "new_session": new_session}).encode()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request_bytes = struct.pack("!I", len(request)) + request
            sent = socket.send_fds(conn, [request_bytes], [0, out_w, err_w])
            if sent < len(request_bytes):
                conn.sendall(request_bytes[sent:])
        finally:
            os.close(out_w)
            os.close(err_w)
        pid = struct.unpack("!q", _read_exactly(conn, 8))[0]
        out, err, status = bytearray(), bytearray(), bytearray()
        sel = selectors.DefaultSelector()
        sel.register(out_r, selectors.EVENT_READ, out)
        sel.register(err_r, selectors.EVENT_READ, err)
        sel.register(conn, selectors.EVENT_READ, status)
        try:
            while len(sel.get_map()):
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    _kill(pid, new_session)
                    raise subprocess.TimeoutExpired(cmd, timeout, _text(out), _text(err))
                for key, _ in sel.select(wait):
                    chunk = conn.recv(4 - len(status)) if key.data is status else os.read(key.fd, 65536)
                    if chunk:
                        key.data.extend(chunk)
                    if not chunk or (key.data is status and len(status) == 4):
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
            os.close(out_r)
            os.close(err_r)
            conn.close()
        if len(status) != 4:
            raise RuntimeError(f"the CLI zygote ended before `hermetic {' '.join(args)}` did")
        return subprocess.CompletedProcess(cmd, struct.unpack("!i", bytes(status))[0], _text(out), _text(err))


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise RuntimeError("the CLI zygote closed the connection")
        data += chunk
    return bytes(data)


def _kill(pid: int, group: bool) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _text(data: bytearray) -> str:
    # subprocess's text mode: the locale's encoding, universal newlines
    return bytes(data).decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    serve(sys.argv[1])
