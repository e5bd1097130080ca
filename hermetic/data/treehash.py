"""``verify --full``: scan a dataset and hash every file in worker processes, while the caller works.

The first worker is forked before the scan and scans (so the caller parses the manifest meanwhile, and shares
no pages of 100,000 paths with it), hands the paths over in a shared in-memory file, and starts hashing; the
caller joins in (hashfiles.drain). Files are opened relative to the root's descriptor; digests and keys go to
the shared file. A failed scan is the worker's answer, raised first. Where the account's limits refuse the
worker, the scan runs here and hash_files takes over.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Callable, Iterable

from hermetic.core import workers as procs
from hermetic.data.hashfiles import (
    OUTPUT_BYTES_PER_FILE, Control, answered_errors, default_start_method, drain, feed, hash_files, output_views,
    plan, start_drainer,
)
from hermetic.data.hashing import Errors, Hashed
from hermetic.data.scan import Tree, TreeError, scan_tree
from hermetic.core.errors import ReadError


def scan_and_hash(
    real_root: str,
    *,
    exclude: Iterable[str] = (),
    workers: int | None = None,
    progress_label: str | None = None,
    while_scanning: Callable[[], None] | None = None,
    while_hashing: Callable[[Tree], None] | None = None,
) -> tuple[Tree, Hashed]:
    """``scan_tree(real_root, stat=False)`` and ``hash_files`` of its paths, overlapped: ``while_scanning()``
    runs here while a worker scans, ``while_hashing(tree)`` while the workers hash."""
    workers = procs.affordable(workers or procs.available_cpus())
    exclude = set(exclude)
    if workers > 1 and default_start_method() == "fork":
        with contextlib.ExitStack() as stack:
            try:
                pipeline = _Pipeline(real_root, exclude, workers, stack)
                scanner = stack.enter_context(procs.start(f"{real_root}: the scanning worker process",
                                                          pipeline.worker))
            except OSError as e:
                if not procs.no_more_workers(e):
                    raise
            else:
                return pipeline.run(scanner, progress_label, while_scanning, while_hashing)
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
        self.queue, self.queue_w = os.pipe()
        stack.callback(os.close, self.queue)
        stack.callback(self._close_queue_w)

    def _close_queue_w(self) -> None:
        if self.queue_w != -1:
            os.close(self.queue_w)
            self.queue_w = -1

    def run(self, scanner: procs.Worker, label: str | None, while_scanning: Callable[[], None] | None,
            while_hashing: Callable[[Tree], None] | None) -> tuple[Tree, Hashed]:
        """The caller's side, once ``scanner`` (forked to run ``worker``) is scanning. Leaving the caller's
        ExitStack ends the scanner if it has not answered (an error, Ctrl-C): it holds nothing to clean up."""
        from hermetic.data.progress import ByteProgress

        control = self.control
        self._close_queue_w()  # (the scanner's now: it feeds the queue)
        try:
            if while_scanning is not None:
                while_scanning()
        except Exception:
            scanner.receive()  # the scan's own error, if any, comes first
            raise
        n, blob_len = scanner.receive()
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
        errors += answered_errors(scanner, tick)
        tick()
        keys, digests = (bytes(views[1]), bytes(views[0])) if views else (b"", b"")
        vanished = sorted(i for i, msg in errors if msg is None)
        failed = [(i, msg) for i, msg in errors if msg is not None]
        if failed:
            i, msg = min(failed)
            raise ReadError(f"{self.root}/{tree.paths[i]}: cannot read: {msg}")
        return tree, Hashed(keys, digests, vanished)

    # ------------------------------------------------------------ in the forked worker

    def worker(self) -> Errors:
        """Scan (its TreeError is the answer), send (files, blob length), start the other helpers, hash; the
        answer is the errors of every file."""
        control, queue, queue_w = self.control, self.queue, self.queue_w
        tree = scan_tree(self.root, exclude=self.exclude, stat=False)
        n = len(tree.paths)
        if not n:
            procs.send((0, 0))
            return []
        blob = "\0".join(tree.paths).encode("utf-8", "surrogateescape")
        at = n * OUTPUT_BYTES_PER_FILE
        os.ftruncate(self.shared, at + len(blob))
        out = mmap.mmap(self.shared, at + len(blob))
        out[at:] = blob
        procs.send((n, len(blob)))
        digests_out, keys_out = output_views(out, n)
        with contextlib.ExitStack() as helpers:  # (ended on an error: nothing waits for them)
            started: list[procs.Worker] = []
            for slot in range(2, self.workers):
                try:
                    helper = start_drainer(queue_w, tree.paths, queue, control, slot, digests_out, keys_out, None,
                                           self.root_fd)
                except OSError as e:
                    if not procs.no_more_workers(e):
                        raise
                    break  # at the account's limit: those started, the caller and this worker do it all
                started.append(helpers.enter_context(helper))
            feed(queue_w, plan(None, n, self.workers))
            errors = drain(tree.paths, queue, control, 1, digests_out, keys_out, None, self.root_fd)
            for helper in started:
                errors += answered_errors(helper)
        return errors


def _shared_file(stack: contextlib.ExitStack) -> int:
    """A descriptor of a file in memory (memfd), or else of an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            fd = os.memfd_create("hermetic-hash", os.MFD_CLOEXEC)
            stack.callback(os.close, fd)
            return fd
    import tempfile

    return stack.enter_context(tempfile.TemporaryFile()).fileno()
