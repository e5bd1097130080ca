"""The record's worker: a child process `hermetic run` forks as it starts, which checks its records and draws
the last one's figure, so that the run's own process imports neither pydantic nor Pillow.

Forked before the run's heavy work (`warm_up`, by the console script itself: hermetic.entry), it imports
the record schema (pydantic: ~0.1 s of CPU) on the core the run's own start leaves idle, then answers over a
pipe: ``validate`` a record (the schema's verdict, or its RecordError's message; ~1 ms once imported), any
number of times, then ``draw`` the final record's figure, its last job (hermetic.record.figure). Pillow, its
fonts and the figure's modules are imported after the first answer (the early record's), while the script
runs: an engine that starts the container only once that record is written (Podman, Charliecloud) waits for
the schema alone. On two cores this takes the schema's import off the critical path twice: before the run's
container is started, and beside its start, where the early record is checked (hermetic.run.runner). A
worker that died or was never there changes nothing but the speed: the caller validates or draws in its
own process.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

_QUIT_CODE = 4  # the worker's exit code when it was never sent a figure to draw


class WorkerGone(Exception):
    """The worker is not there to answer (killed, its start failed): the caller does the work itself."""


class RecordWorker:
    """The parent's handle on the worker: a request pipe, an answer pipe, its pid."""

    def __init__(self, pid: int, send_fd: int, answer_fd: int) -> None:
        self.pid = pid
        self._send_fd: int | None = send_fd
        self._answer_fd: int | None = answer_fd
        self.parent = os.getpid()  # a process forked from this one inherits the object, not the worker

    @classmethod
    def fork(cls) -> "RecordWorker | None":
        fds: list[int] = []
        try:
            req_r, req_w = os.pipe()
            fds += [req_r, req_w]
            ans_r, ans_w = os.pipe()
            fds += [ans_r, ans_w]
            pid = os.fork()
        except OSError:
            for fd in fds:
                os.close(fd)
            return None
        if pid == 0:  # the worker: never returns into the run's code, nor runs its exit handlers
            code = 1
            try:
                os.close(req_w)
                os.close(ans_r)
                code = _serve(req_r, ans_w)
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(ans_w)
        return cls(pid, req_w, ans_r)

    def _send(self, request: tuple[Any, ...]) -> None:
        if self._send_fd is None:
            raise WorkerGone("no request pipe")
        data = _message(request)
        try:
            _write_all(self._send_fd, data)
        except OSError:
            self.close()
            raise WorkerGone("it died") from None
        except BaseException:  # interrupted (Ctrl-C) part-way: the pipe holds half a request, so it is done
            self.close()
            raise

    def validate(self, record: dict[str, Any], *, source: str, sealed: bool,
                 draw: tuple[str, list[dict[str, Any]] | None] | None = None) -> str | None:
        """The schema's verdict on ``record``: None (valid) or RecordError's message; WorkerGone when it
        cannot answer. ``draw`` (the run directory, the series): a final record's figure, drawn by the worker
        as its last job once it found the record valid (``pid`` to wait for), in one exchange instead of two."""
        self._send(("validate", record, source, sealed, draw))
        try:
            answer = _read_message(self._answer_fd) if self._answer_fd is not None else None
        except BaseException:  # interrupted (Ctrl-C): its answer, unread, must never be taken for the next request's
            self.close()
            raise
        if answer is None:
            self.close()
            raise WorkerGone("it died")
        kind, message = answer
        if kind == "crashed":  # the schema failed to import there: the caller's own validation says why
            self.close()
            raise WorkerGone(message)
        if kind == "invalid":
            return message
        if draw is not None:  # drawing: its last job, whose end it says on the answer pipe (``drawn``)
            self._close_fd("_send_fd")
        return None

    def drawn(self) -> bool | None:
        """After ``validate(..., draw=...)``: wait for the worker to say it has drawn; whether it drew a figure
        (None: it died first). It exits after saying so (``reap_later``)."""
        try:
            answer = _read_message(self._answer_fd) if self._answer_fd is not None else None
        finally:
            self.close()  # also when interrupted: asked once (FigureDrawing.join), then the pid is waited for
        return None if answer is None else answer[1] == 0

    def draw(self, run_dir: str | Path, record: dict[str, Any], series: list[dict[str, Any]] | None) -> int:
        """Send the final record (and its series) to be drawn, the worker's last job; its pid, to wait for
        (hermetic.record.figure.FigureDrawing)."""
        self._send(("draw", str(run_dir), record, series))
        self.close()
        return self.pid

    def close(self) -> None:
        """Close this side's pipes: a worker with nothing (more) to do ends at their end of file."""
        for attr in ("_send_fd", "_answer_fd"):
            self._close_fd(attr)

    def _close_fd(self, attr: str) -> None:
        fd = getattr(self, attr)
        if fd is not None:
            setattr(self, attr, None)
            try:
                os.close(fd)
            except OSError:
                pass


def _message(obj: Any) -> bytes:
    """``obj`` framed for the pipe: its pickle's length (8 bytes), then the pickle (``_read_message``)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(8, "big") + data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        piece = os.read(fd, n - got)
        if not piece:
            return None
        chunks.append(piece)
        got += len(piece)
    return b"".join(chunks)


def _read_message(fd: int) -> Any:
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    body = _read_exactly(fd, int.from_bytes(head, "big"))
    return None if body is None else pickle.loads(body)


def _serve(req_fd: int, ans_fd: int) -> int:
    """In the worker: import, then answer until told to draw (its exit code: 0 drawn) or the pipe ends."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):  # not the run's handlers (they stop its container)
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal ends neither the run nor its worker
    schema_error = None
    try:
        from hermetic.record import schema
    except Exception as e:  # noqa: BLE001 - said to the caller, which validates itself
        schema, schema_error = None, f"{type(e).__name__}: {e}"
    try:  # imported (on the core the run's own start leaves idle): from now on the run and its container first
        os.nice(5)
    except OSError:
        pass
    drawing_ready = False
    while True:
        request = _read_message(req_fd)
        if request is None:
            return _QUIT_CODE
        if request[0] == "validate":
            _, record, source, sealed, draw = request
            if schema is None:
                answer: tuple[str, str | None] = ("crashed", schema_error)
            else:
                try:
                    schema.validate_record(record, source=source, sealed=sealed)
                    answer = ("valid", None)
                except schema.RecordError as e:
                    answer = ("invalid", e.message)
            _write_all(ans_fd, _message(answer))
            if draw is not None and answer[0] == "valid":  # its last job, begun as the caller writes the record
                code = _draw(draw[0], record, draw[1])
                try:  # said before the exit, which the caller need not wait for (~5 ms: the address space)
                    _write_all(ans_fd, _message(("drawn", code)))
                except OSError:
                    pass
                return code
            if not drawing_ready:  # after the run's first record, not before it: the script runs meanwhile
                drawing_ready = True
                _preload_drawing()
        elif request[0] == "draw":
            _, run_dir, record, series = request
            return _draw(run_dir, record, series)


def _draw(run_dir: str, record: dict[str, Any], series: list[dict[str, Any]] | None) -> int:
    """The worker's last job: the final record's figure; its exit code (0: drawn, 3: nothing drawn)."""
    from hermetic.record.drawing import write_metrics_figure

    return 0 if write_metrics_figure(run_dir, record, series=series) else 3


def _preload_drawing() -> None:
    """Pillow, its fonts and what drawing the figure imports (~50 ms), and a rehearsal of the drawing (its
    memory touched: ~60 ms), so that the final figure is drawn at once. Best effort: the drawing itself says
    whether it can draw."""
    try:
        from hermetic import plotting, rasterplot  # noqa: F401
        from hermetic.record import drawing, metrics  # noqa: F401

        rasterplot.preload()
        rasterplot.rehearse()
    except Exception:  # noqa: BLE001
        pass


_worker: RecordWorker | None = None
_exiting: list[int] = []  # workers that said they had drawn and are exiting: reaped once they have


def reap_later(pid: int) -> None:
    """Reap worker ``pid`` now if it has exited, else at the next ``warm_up`` of this process (a seed group's
    next run) or never, when the process ends first (its children go to init, which reaps them): a worker
    that said it had drawn only tears its address space down (~6 ms), which no run waits for."""
    _exiting.append(pid)
    _reap_exited()


def _reap_exited() -> None:
    for pid in list(_exiting):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid  # not ours (a forked copy of this process), or reaped already
        if done:
            _exiting.remove(pid)


def warm_up() -> None:
    """Have a worker ready for the run's records (called when `hermetic run` starts and when each run of it
    starts, before its threads): forked now unless one is waiting already."""
    global _worker
    _reap_exited()
    if _worker is not None and _worker.parent != os.getpid():
        _worker = None  # a process forked from the worker's parent: not its worker
    if _worker is None:
        _worker = RecordWorker.fork()


def current() -> RecordWorker | None:
    """The waiting worker of this process, if any."""
    return _worker if _worker is not None and _worker.parent == os.getpid() else None


def take() -> RecordWorker | None:
    """The waiting worker, taken for its last job (the next run gets one of its own)."""
    global _worker
    worker = current()
    _worker = None
    return worker


def discard(worker: RecordWorker) -> None:
    """Let go of a worker that cannot answer (WorkerGone): no longer this process's, its pipes closed, and
    reaped (at the end of its request pipe it exits, if it is not dead already)."""
    if current() is worker:
        take()
    worker.close()
    try:
        os.waitpid(worker.pid, 0)
    except ChildProcessError:
        pass


def validate_record(record: dict[str, Any], *, source: str, sealed: bool) -> None:
    """hermetic.record.schema.validate_record, answered by the waiting worker when there is one."""
    worker = current()
    if worker is not None:
        try:
            message = worker.validate(record, source=source, sealed=sealed)
        except WorkerGone:
            discard(worker)  # gone: the next run forks another
        else:
            if message is not None:
                from hermetic.record.errors import RecordError

                raise RecordError(message)
            return
    from hermetic.record.schema import validate_record as validate

    validate(record, source=source, sealed=sealed)
