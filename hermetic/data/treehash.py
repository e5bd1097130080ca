"""Scan a dataset directory and hash every file in worker processes, while the caller works.

What ``verify --full`` runs. The first worker is forked *before* the scan and
does the scan itself, so that the caller parses the manifest meanwhile instead
of after; the worker then hands the list of paths over (one NUL-separated blob
in a shared in-memory file), plans the batches and starts hashing; the caller
lines the manifest up with the paths and joins in (hashing.drain). Forked
before the caller's heap holds 100,000 paths, the worker shares almost no
pages with it: neither pays copy-on-write faults for the other's reference
counting. Both open files relative to the root's descriptor, so nobody builds
100,000 absolute paths.

Digests and stat keys go straight into the shared file, at each file's index,
as in hashing.py. A scan that fails reports its TreeError to the caller, who
raises it -- before any error of its own, as if the scan had come first.
Where the account's limits refuse the scanning worker (hermetic.workers), the
scan runs here and hash_files takes over; where they refuse a helper, those
started do the hashing.
"""

from __future__ import annotations

import contextlib
import marshal
import mmap
import os
import struct
from typing import Callable, Iterable

from hermetic.data.hashing import (
    OUTPUT_BYTES_PER_FILE, Control, Hashed, _default_start_method, _plan, _write_all, affordable_workers,
    available_cpus, drain, feed, fork_child, hash_files, output_views, read_all, reap, start_worker,
)
from hermetic.data.scan import Tree, TreeError, scan_tree
from hermetic.errors import ReadError, WorkerDied
from hermetic.workers import no_more_workers

_READY, _REFUSED, _DONE = b"R", b"T", b"D"  # message kinds, worker -> caller
_HEADER = struct.Struct("=cQ")  # kind, payload length
_COUNTS = struct.Struct("=QQ")  # files, bytes of the path blob


def scan_and_hash(
    real_root: str,
    *,
    exclude: Iterable[str] = (),
    workers: int | None = None,
    progress_label: str | None = None,
    while_scanning: Callable[[], None] | None = None,
    while_hashing: Callable[[Tree], None] | None = None,
) -> tuple[Tree, Hashed]:
    """``scan_tree(real_root, stat=False)``, then ``hash_files`` of its paths -- overlapped.

    ``while_scanning()`` runs here while a worker scans; ``while_hashing(tree)``
    once the paths are known, while the workers hash. Raises what those two
    functions raise. With one CPU, or with threads running (no fork), scans
    and then hashes as they do.
    """
    workers = affordable_workers(workers or available_cpus())
    exclude = set(exclude)
    if workers > 1 and _default_start_method() == "fork":
        with contextlib.ExitStack() as stack:
            try:
                pipeline = _Pipeline(real_root, exclude, workers, stack)
                pid = fork_child(pipeline.worker, pipeline.control)
            except OSError as e:
                if not no_more_workers(e):
                    raise
            else:
                return pipeline.run(pid, progress_label, while_scanning, while_hashing)
    # One CPU, threads running (no fork), or no worker to be had: scan, then hash as hash_files does.
    tree = scan_tree(real_root, exclude=exclude, stat=False)

    def meanwhile() -> None:
        if while_scanning is not None:
            while_scanning()
        if while_hashing is not None:
            while_hashing(tree)

    return tree, hash_files(tree.abs_paths, None, workers=workers, progress_label=progress_label,
                            while_hashing=meanwhile)


class _Pipeline:
    def __init__(self, real_root: str, exclude: set[str], workers: int, stack: contextlib.ExitStack):
        self.root, self.exclude, self.workers = real_root, exclude, workers
        self.stack = stack  # closes everything opened here, last first
        self.control = Control(workers)
        stack.callback(self.control.close)
        try:
            self.root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise TreeError(f"{real_root}: cannot open directory: {e.strerror}") from None
        stack.callback(os.close, self.root_fd)
        self.shared = _shared_file(stack)
        self.pipe_ends: set[int] = set()  # those still open here
        stack.callback(self._close_pipes)
        self.messages, self.messages_w = self._pipe()
        self.queue, self.queue_w = self._pipe()

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.pipe_ends.update((r, w))
        return r, w

    def _close(self, fd: int) -> None:
        self.pipe_ends.discard(fd)
        os.close(fd)

    def _close_pipes(self) -> None:
        for fd in self.pipe_ends:
            os.close(fd)

    def run(self, pid: int, label: str | None, while_scanning: Callable[[], None] | None,
            while_hashing: Callable[[Tree], None] | None) -> tuple[Tree, Hashed]:
        """The caller's side, once ``pid`` (forked to run ``worker``) is scanning."""
        from hermetic.data.progress import ByteProgress

        control = self.control
        self._close(self.messages_w)  # (the worker's now: EOF when it exits)
        self._close(self.queue_w)
        try:
            try:
                if while_scanning is not None:
                    while_scanning()
            except Exception:
                self._ready()  # the scan's own error, if any, comes first
                raise
            n, blob_len = self._ready()
            tree = Tree(self.root)
            views = None
            if n:
                out = mmap.mmap(self.shared, n * OUTPUT_BYTES_PER_FILE + blob_len)
                self.stack.callback(out.close)
                with memoryview(out)[n * OUTPUT_BYTES_PER_FILE:] as blob:  # (decoded in place: no copy)
                    tree.paths = str(blob, "utf-8", "surrogateescape").split("\0")
                views = output_views(out, n)
                for view in views:
                    self.stack.callback(view.release)
            if while_hashing is not None:
                while_hashing(tree)
            bar = ByteProgress(label, None, n)
            self.stack.callback(bar.close)

            def tick() -> None:
                bar.update(*control.progress())

            errors = drain(tree.paths, self.queue, control, 0, views[0], views[1], tick, self.root_fd) if views else []
            kind, data = _receive(self.messages, tick)
            if kind != _DONE:
                raise WorkerDied(f"{self.root}: the scanning worker process stopped unexpectedly")
            reap(pid)
            pid = 0
            errors += marshal.loads(data)
            tick()
            keys, digests = (bytes(views[1]), bytes(views[0])) if views else (b"", b"")
        except BaseException:
            control.stop()
            if pid:  # it holds nothing that needs cleaning up: do not wait for its scan to end
                import signal

                os.kill(pid, signal.SIGKILL)
            raise
        finally:
            if pid:
                os.waitpid(pid, 0)
        vanished = sorted(i for i, msg in errors if msg is None)
        failed = [(i, msg) for i, msg in errors if msg is not None]
        if failed:
            i, msg = min(failed)
            raise ReadError(f"{self.root}/{tree.paths[i]}: cannot read: {msg}")
        return tree, Hashed(keys, digests, vanished)

    def _ready(self) -> tuple[int, int]:
        """Wait for the scan: (files, blob length), or raise its TreeError."""
        kind, data = _receive(self.messages, None)
        if kind == _REFUSED:
            raise TreeError(data.decode("utf-8", "surrogateescape"))
        if kind != _READY:
            raise WorkerDied(f"{self.root}: the scanning worker process stopped unexpectedly")
        return _COUNTS.unpack(data)

    # ------------------------------------------------------------ in the forked worker

    def worker(self) -> None:
        """Scan, hand the paths over, fork the other helpers, hash, report errors."""
        control, messages_w, queue, queue_w = self.control, self.messages_w, self.queue, self.queue_w
        os.close(self.messages)
        try:
            tree = scan_tree(self.root, exclude=self.exclude, stat=False)
        except TreeError as e:
            _send(messages_w, _REFUSED, e.message.encode("utf-8", "surrogateescape"))
            return
        n = len(tree.paths)
        if not n:
            _send(messages_w, _READY, _COUNTS.pack(0, 0))
            _send(messages_w, _DONE, marshal.dumps([]))
            return
        blob = "\0".join(tree.paths).encode("utf-8", "surrogateescape")
        at = n * OUTPUT_BYTES_PER_FILE
        os.ftruncate(self.shared, at + len(blob))
        out = mmap.mmap(self.shared, at + len(blob))
        out[at:] = blob
        _send(messages_w, _READY, _COUNTS.pack(n, len(blob)))
        digests_out, keys_out = output_views(out, n)
        helpers: dict[int, int] = {}  # pid -> read end of its error pipe
        for slot in range(2, self.workers):
            def helper(err_w: int, slot: int = slot) -> None:
                os.close(queue_w)
                os.close(messages_w)
                for sibling in helpers.values():  # its elder siblings' pipes, copied by the fork
                    os.close(sibling)
                errors = drain(tree.paths, queue, control, slot, digests_out, keys_out, None, self.root_fd)
                _write_all(err_w, marshal.dumps(errors))

            try:
                pid, err_r = start_worker(helper, control)
            except OSError as e:
                if not no_more_workers(e):
                    raise
                break  # at the account's limit: those started, the caller and this worker do it all
            helpers[pid] = err_r
        feed(queue_w, _plan(None, n, self.workers))
        errors = drain(tree.paths, queue, control, 1, digests_out, keys_out, None, self.root_fd)
        for pid, err_r in helpers.items():
            errors += marshal.loads(read_all(err_r, lambda: None))
            reap(pid)
        _send(messages_w, _DONE, marshal.dumps(errors))


def _shared_file(stack: contextlib.ExitStack) -> int:
    """A descriptor of a file in memory (memfd), or else of an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            fd = os.memfd_create("hermetic-hash", os.MFD_CLOEXEC)
            stack.callback(os.close, fd)
            return fd
    import tempfile

    return stack.enter_context(tempfile.TemporaryFile()).fileno()


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    _write_all(fd, _HEADER.pack(kind, len(payload)) + payload)


def _receive(fd: int, tick: Callable[[], None] | None) -> tuple[bytes, bytes]:
    """One message, or (b"", b"") if the worker closed its end without sending one."""
    header = _read_exactly(fd, _HEADER.size, tick)
    if len(header) < _HEADER.size:
        return b"", b""
    kind, size = _HEADER.unpack(header)
    return kind, _read_exactly(fd, size, tick)


def _read_exactly(fd: int, size: int, tick: Callable[[], None] | None) -> bytes:
    """``size`` bytes, fewer at EOF; ``tick`` every 0.1 s while waiting, if given."""
    import select

    chunks: list[bytes] = []
    left = size
    while left:
        if tick is not None and not select.select([fd], [], [], 0.1)[0]:
            tick()
            continue
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
