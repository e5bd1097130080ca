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


def stream_process(argv: Sequence[str], files: list[BinaryIO], *, stop: Callable[[subprocess.Popen], None],
                   echo: bool = True, watch: Watch | None = None, env: dict[str, str] | None = None) -> ProcessEnd:
    """Run ``argv`` to its end, its output teed into ``files`` (stdout.log, stderr.log, combined.log).

    ``stop(proc)`` ends the container (called on SIGINT/SIGTERM and when ``watch`` reports); it must make
    the process end. The handlers go in before the process exists."""
    out_f, err_f, all_f = files
    lock = threading.Lock()  # combined.log takes whole chunks, in arrival order
    counts = [0, 0]

    def teeing(i: int, own: BinaryIO, term: BinaryIO | None) -> Callable[[bytes], bool]:
        def sink(data: bytes) -> bool:
            counts[i] += len(data)
            with lock:
                tee(data, own, all_f, term)
            return True
        return sink

    terms = (sys.stdout.buffer, sys.stderr.buffer) if echo else (None, None)
    sinks = [teeing(0, out_f, terms[0]), teeing(1, err_f, terms[1])]
    stopped: list[str] = []
    done = threading.Event()
    proc: subprocess.Popen | None = None
    readers: list[threading.Thread] = []
    with interrupt_handlers():
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env)
            readers = _readers(proc, sinks)
            watch_beside(watch, done, lambda p=proc: stop(p), stopped)
            code = proc.wait()
            done.set()
            for t in readers:
                t.join()
            return ProcessEnd(code, False, None, stopped[0] if stopped else None,
                              (counts[0], counts[1]))
        except (Interrupted, KeyboardInterrupt) as e:
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            if proc is not None:
                with interrupt_handlers(signal.SIG_IGN):
                    stop(proc)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=60)
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    for t in readers:
                        t.join(timeout=10)
            return ProcessEnd(None, True, signal.Signals(signum).name, None, (counts[0], counts[1]))
        finally:
            done.set()
            if proc is not None:
                for stream in (proc.stdout, proc.stderr):
                    with contextlib.suppress(OSError, ValueError):
                        stream.close()  # type: ignore[union-attr]


def _readers(proc: subprocess.Popen, sinks: Sequence[Callable[[bytes], bool]]) -> list[threading.Thread]:
    """A thread each handing ``proc``'s stdout and stderr to ``sinks`` as they come: a sink that says False kills it."""
    def pump(stream: IO[bytes], sink: Callable[[bytes], bool]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(_READ), b""):  # type: ignore[attr-defined]
                if not sink(chunk):
                    proc.kill()
                    return

    readers = [threading.Thread(target=pump, args=(stream, sink), daemon=True, name="hermetic-pipe")
               for stream, sink in zip((proc.stdout, proc.stderr), sinks)]
    for t in readers:
        t.start()
    return readers


def capture_process(argv: Sequence[str], env: dict[str, str] | None, timeout: float | None,
                    what: str) -> tuple[int, bytes, bytes]:
    """A run_capture's process to its end: (status, stdout, stderr), each within CAPTURE_LIMIT (past it, killed:
    EngineError naming ``what``); TimeoutError after ``timeout`` seconds."""
    caps = [Capture(what, "stdout"), Capture(what, "stderr")]
    with subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env) as proc:
        readers = _readers(proc, [c.add for c in caps])
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise TimeoutError(f"{what} still running after {timeout} s") from None
        for t in readers:
            t.join()
    return code, caps[0].value(), caps[1].value()


def signal_exit_code(returncode: int) -> int:
    """A process's status as a shell gives it: 128+N for one killed by signal N (Popen says -N)."""
    return 128 - returncode if returncode < 0 else returncode
