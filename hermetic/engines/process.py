"""A container that is a child process (podman, ch-run): its output teed to the log files, its stop on a signal.

Both streams are read in threads into their own log and combined.log (flushed as they come: ``hermetic logs
-f``) and echoed when asked. SIGINT and SIGTERM, or a ``watch``'s reason, stop it through the engine's
``stop``; the outcome says why.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, BinaryIO, Callable, Sequence

from hermetic.engines.base import Capture, Interrupted, Watch, interrupt_handlers, tee, watch_beside

_READ = 1 << 16


@dataclass
class ProcessEnd:
    returncode: int | None  # None: interrupted before it ended by itself
    interrupted: bool
    signal_name: str | None
    stopped_because: str | None
    streamed: tuple[int, int]  # bytes read from stdout, stderr


class _Tee:
    """One stream's bytes into its log, combined.log (one lock: whole chunks, in arrival order), the terminal."""

    def __init__(self, own: BinaryIO, combined: BinaryIO, lock: threading.Lock, term: BinaryIO | None) -> None:
        self.own, self.combined, self.lock, self.term = own, combined, lock, term
        self.count = 0

    def pump(self, stream: IO[bytes]) -> None:
        while True:
            try:
                data = stream.read1(_READ)  # type: ignore[attr-defined]
            except (OSError, ValueError):
                return
            if not data:
                return
            self.count += len(data)
            with self.lock:
                tee(data, self.own, self.combined, self.term)


def stream_process(argv: Sequence[str], files: list[BinaryIO], *, stop: Callable[[subprocess.Popen], None],
                   echo: bool = True, watch: Watch | None = None, env: dict[str, str] | None = None) -> ProcessEnd:
    """Run ``argv`` to its end, its output teed into ``files`` (stdout.log, stderr.log, combined.log).

    ``stop(proc)`` ends the container (called on SIGINT/SIGTERM and when ``watch`` reports); it must make
    the process end. The handlers go in before the process exists."""
    out_f, err_f, all_f = files
    lock = threading.Lock()
    tees = [_Tee(out_f, all_f, lock, sys.stdout.buffer if echo else None),
            _Tee(err_f, all_f, lock, sys.stderr.buffer if echo else None)]
    stopped: list[str] = []
    done = threading.Event()
    proc: subprocess.Popen | None = None
    readers: list[threading.Thread] = []
    with interrupt_handlers():
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env)
            for tee, stream in zip(tees, (proc.stdout, proc.stderr)):
                t = threading.Thread(target=tee.pump, args=(stream,), daemon=True, name="hermetic-tee")
                t.start()
                readers.append(t)
            watch_beside(watch, done, lambda p=proc: stop(p), stopped)
            code = proc.wait()
            done.set()
            for t in readers:
                t.join()
            return ProcessEnd(code, False, None, stopped[0] if stopped else None,
                              (tees[0].count, tees[1].count))
        except (Interrupted, KeyboardInterrupt) as e:
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            if proc is not None:
                with _ignoring_interrupts():
                    stop(proc)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=60)
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    for t in readers:
                        t.join(timeout=10)
            return ProcessEnd(None, True, signal.Signals(signum).name, None, (tees[0].count, tees[1].count))
        finally:
            done.set()
            if proc is not None:
                for stream in (proc.stdout, proc.stderr):
                    with contextlib.suppress(OSError, ValueError):
                        stream.close()  # type: ignore[union-attr]


def read_pipes(proc: subprocess.Popen, sinks: Sequence[Callable[[bytes], bool]], timeout: float | None = None) -> int:
    """Wait for ``proc``, its stdout and stderr handed as they come to ``sinks`` (a thread each): a sink that says
    False kills it. subprocess.TimeoutExpired after ``timeout`` seconds (it is killed)."""
    def pump(stream: IO[bytes], sink: Callable[[bytes], bool]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(_READ), b""):  # type: ignore[attr-defined]
                if not sink(chunk):
                    proc.kill()
                    return

    readers = [threading.Thread(target=pump, args=(stream, sink), daemon=True, name="hermetic-capture")
               for stream, sink in zip((proc.stdout, proc.stderr), sinks)]
    for t in readers:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    for t in readers:
        t.join()
    return code


def capture_process(argv: Sequence[str], env: dict[str, str] | None, timeout: float | None,
                    what: str) -> tuple[int, bytes, bytes]:
    """A run_capture's process to its end: (status, stdout, stderr), each within CAPTURE_LIMIT (past it, killed:
    EngineError naming ``what``); TimeoutError after ``timeout`` seconds."""
    caps = [Capture(what, "stdout"), Capture(what, "stderr")]
    with subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env) as proc:
        try:
            code = read_pipes(proc, [c.add for c in caps], timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{what} still running after {timeout} s") from None
    return code, caps[0].value(), caps[1].value()


@contextlib.contextmanager
def _ignoring_interrupts():
    """A second Ctrl-C while the container is being stopped does not leave it half-stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def signal_exit_code(returncode: int) -> int:
    """A process's status as a shell gives it: 128+N for one killed by signal N (Popen says -N)."""
    return 128 - returncode if returncode < 0 else returncode
