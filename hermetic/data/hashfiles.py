"""sha256 of many files on every core: the batches, the processes that take them, the shared results.

Processes, not threads: small files are per-file Python work that holds the GIL. A single-threaded process
forks its workers (hermetic.core.workers.start): they take (start, end) batches from one pipe and write
digests and stat keys into shared memory at each file's index; this process hashes too once ``while_hashing``
is done. A process with other threads (where a fork could deadlock) hashes in threads. Small jobs are hashed
in-process. The account's limits bound the workers; where a fork is refused, those
started (or this process alone) do the work.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any, Callable, Sequence

from hermetic.core import workers as procs
from hermetic.data.hashing import DIGEST_BYTES, KEY_BYTES, Errors, Hashed, hash_span
from hermetic.core.errors import ReadError

_BATCH_MAX_FILES = 2000
_INLINE_MAX_BYTES = 32 << 20
_INLINE_MAX_FILES = 1000
_INLINE_SPAN = 1000  # files between progress updates when hashing in-process
# Batches are (start, end) records of 8 bytes, all written to a pipe before they are
# taken: 512 of them fill 4 KiB, the least a pipe holds (one page), so the writer
# never waits for a reader.
_MAX_BATCHES = 512
_COUNTERS = struct.Struct("qq")  # per hashing process: bytes done, files done
_RECORD = struct.Struct("=II")  # a batch in the pipe: (start, end)

# (packed keys, digests, errors) for one batch
_Result = tuple[bytes, bytes, Errors]


def hash_files(
    paths: Sequence[str],
    sizes: Sequence[int] | None = None,
    *,
    workers: int | None = None,
    progress_label: str | None = None,
    while_hashing: Callable[[], None] | None = None,
    start_method: str | None = None,
) -> Hashed:
    """sha256 and stat key of each file, on all cores. ``sizes`` (from a scan) balance the batches by bytes;
    ``while_hashing`` runs here meanwhile; ``progress_label`` shows a bar on stderr. A file that cannot be
    read raises ReadError naming it, after all work is done."""
    from hermetic.data.progress import ByteProgress

    n = len(paths)
    workers = procs.affordable(workers or procs.available_cpus())
    total = sum(sizes) if sizes is not None else None
    bar = ByteProgress(progress_label, total, n)
    try:
        small = (total is not None and total <= _INLINE_MAX_BYTES and n <= _INLINE_MAX_FILES) or n <= 64
        batches = [] if workers <= 1 or small else plan(sizes, n, workers)
        if len(batches) <= 1:
            if while_hashing is not None:
                while_hashing()
            keys, digests, errors = _hash_inline(paths, bar)
        else:
            workers = min(workers, len(batches))
            method = start_method or default_start_method()
            if method == "fork":
                keys, digests, errors = _hash_forked(paths, batches, workers, bar, while_hashing)
            else:
                keys, digests, errors = _hash_threaded(paths, batches, workers, bar, while_hashing)
    finally:
        bar.close()
    vanished = [i for i, msg in errors if msg is None]
    failed = [(i, msg) for i, msg in errors if msg is not None]
    if failed:
        i, msg = min(failed)
        raise ReadError(f"{paths[i]}: cannot read: {msg}")
    return Hashed(keys, digests, sorted(vanished))


def default_start_method() -> str:
    return "fork" if threading.active_count() == 1 and hasattr(os, "fork") else "thread"


def plan(sizes: Sequence[int] | None, n: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) ranges, at most _MAX_BATCHES: by count, small batches (a small tail); by
    bytes, roughly equal bytes, a large file a batch of its own, the biggest first (LPT)."""
    if sizes is None:
        per = max(16, min(256, n // (workers * 32)), -(-n // _MAX_BATCHES))
        return [(s, min(s + per, n)) for s in range(0, n, per)]
    total = sum(sizes)
    # Batches close at `target` bytes or `max_files` files, and a file of `target`
    # bytes or more is one batch: at most 2*total/target + n/max_files + 1 of them.
    target = max(min(max(total // (workers * 8), 1 << 20), 64 << 20), 4 * total // _MAX_BATCHES + 1)
    max_files = max(_BATCH_MAX_FILES, 4 * n // _MAX_BATCHES + 1)
    batches: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if size >= target:  # a large file is a batch of its own
            if start < i:
                batches.append((start, i))
            batches.append((i, i + 1))
            start, acc = i + 1, 0
            continue
        acc += size
        if acc >= target or i + 1 - start >= max_files:
            batches.append((start, i + 1))
            start, acc = i + 1, 0
    if start < n:
        batches.append((start, n))
    batches.sort(key=lambda b: -sum(sizes[b[0]:b[1]]))
    return batches


# ---------------------------------------------------------------- the per-file loop


def _hash_inline(paths: Sequence[str], bar: Any) -> _Result:
    """Everything in this process, in spans between progress updates."""
    n = len(paths)
    digests, keys = bytearray(n * DIGEST_BYTES), bytearray(n * KEY_BYTES)
    errors: Errors = []
    done = 0
    for start in range(0, n, _INLINE_SPAN):
        end = min(start + _INLINE_SPAN, n)
        nbytes, errs = hash_span(paths, start, end, digests, keys, None)
        errors += errs
        done += nbytes
        bar.update(done, end)
    return bytes(keys), bytes(digests), errors


# ---------------------------------------------------------------- forked workers


class Control:
    """(bytes, files) done per hashing process, for the progress bar: shared memory made before the fork."""

    def __init__(self, slots: int):
        import mmap

        self.slots = slots
        self.mm = mmap.mmap(-1, slots * _COUNTERS.size)

    def report(self, slot: int, nbytes: int, files: int) -> None:
        _COUNTERS.pack_into(self.mm, slot * _COUNTERS.size, nbytes, files)

    def progress(self) -> tuple[int, int]:
        nbytes = files = 0
        for slot in range(self.slots):
            b, f = _COUNTERS.unpack_from(self.mm, slot * _COUNTERS.size)
            nbytes += b
            files += f
        return nbytes, files

    def close(self) -> None:
        self.mm.close()


def feed(queue_w: int, batches: list[tuple[int, int]]) -> None:
    """Write the batches as (start, end) uint32 records, at most PIPE_BUF bytes of whole records a write (so
    every 8-byte read gets one whole record), then close the pipe."""
    import select

    records = b"".join(_RECORD.pack(start, end) for start, end in batches)
    step = max(_RECORD.size, getattr(select, "PIPE_BUF", 512) // _RECORD.size * _RECORD.size)
    for at in range(0, len(records), step):
        view = memoryview(records[at:at + step])
        while view:
            view = view[os.write(queue_w, view):]
    os.close(queue_w)


def drain(paths: Sequence[str], queue: int, control: Control, slot: int, digests_out: Any, keys_out: Any,
          after_batch: Callable[[], None] | None = None) -> Errors:
    """Take (start, end) records from the ``queue`` pipe until it is empty; hash each."""
    errors: Errors = []
    done_bytes = done_files = 0
    in_batch = 0

    def on_bytes(n: int) -> bool:  # progress inside a large file
        nonlocal in_batch
        in_batch += n
        control.report(slot, done_bytes + in_batch, done_files)
        return False

    while True:
        data = os.read(queue, _RECORD.size)
        if not data:
            break
        start, end = _RECORD.unpack(data)
        in_batch = 0
        nbytes, errs = hash_span(paths, start, end, digests_out, keys_out, on_bytes)
        errors += errs
        done_bytes += nbytes
        done_files += end - start
        control.report(slot, done_bytes, done_files)
        if after_batch is not None:
            after_batch()
    return errors


def _drain_in_child(queue_w: int, args: tuple) -> Errors:
    os.close(queue_w)  # (so that the queue ends when the feeder closes it)
    return drain(*args)


def _hash_forked(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
                 while_hashing: Callable[[], None] | None) -> _Result:
    """``workers - 1`` forked children and this process take batches from one pipe."""
    import mmap

    n = len(paths)
    control = Control(workers)
    out = mmap.mmap(-1, n * (DIGEST_BYTES + KEY_BYTES))
    digests_out, keys_out = memoryview(out)[:n * DIGEST_BYTES], memoryview(out)[n * DIGEST_BYTES:]
    queue, queue_w = os.pipe()
    children: list[procs.Worker] = []

    def tick() -> None:
        bar.update(*control.progress())

    try:
        for slot in range(1, workers):
            try:
                children.append(procs.start("a hashing worker process", _drain_in_child, queue_w,
                                            (paths, queue, control, slot, digests_out, keys_out)))
            except OSError as e:
                if not procs.no_more_workers(e):
                    raise
                break  # at the account's limit: those started, and this process, take every batch
        feed(queue_w, batches)
        queue_w = -1
        if while_hashing is not None:
            while_hashing()
        errors = drain(paths, queue, control, 0, digests_out, keys_out, tick)
        for child in children:
            errors += [(i, msg) for i, msg in child.result(tick)]  # (lists, made tuples again)
        tick()
        return bytes(keys_out), bytes(digests_out), errors
    finally:
        if queue_w != -1:  # first: a child waiting for a batch sees the end
            os.close(queue_w)
        for child in children:
            child.stop()  # (one that answered is gone already; any other is ended now)
        os.close(queue)
        digests_out.release()
        keys_out.release()
        out.close()
        control.close()


# ---------------------------------------------------------------- threads


def _hash_threaded(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
                   while_hashing: Callable[[], None] | None) -> _Result:
    """``workers - 1`` threads and this one take the batches, where other threads make a fork unsafe (the C
    loop and hashlib's large updates let go of the GIL). Threads the account's limits refuse are done without;
    on an error or Ctrl-C, no batch starts and a large file being read ends."""
    n = len(paths)
    digests, keys = bytearray(n * DIGEST_BYTES), bytearray(n * KEY_BYTES)
    todo = iter(batches)
    lock = threading.Lock()
    stop = threading.Event()
    done = [0, 0]  # bytes, files: for the progress bar
    answers: list[Errors | BaseException] = []

    def take() -> Errors:
        errors: Errors = []
        reported = 0

        def on_bytes(nbytes: int) -> bool:  # progress inside a large file
            nonlocal reported
            reported += nbytes
            with lock:
                done[0] += nbytes
            return stop.is_set()

        while not stop.is_set():
            with lock:
                start, end = next(todo, (0, 0))
            if start == end:
                break
            reported = 0
            nbytes, errs = hash_span(paths, start, end, digests, keys, on_bytes)
            errors += errs
            with lock:
                done[0] += nbytes - reported
                done[1] += end - start
            if threading.current_thread() is threading.main_thread():
                bar.update(*done)
        return errors

    def thread_main() -> None:
        try:
            answers.append(take())
        except BaseException as e:  # raised in the caller's thread
            stop.set()
            answers.append(e)

    threads: list[threading.Thread] = []
    try:
        for _ in range(workers - 1):
            t = threading.Thread(target=thread_main, name="hermetic-hash", daemon=True)
            try:
                t.start()
            except RuntimeError:  # at the account's limit: those started, and this thread, do it all
                break
            threads.append(t)
        if while_hashing is not None:
            while_hashing()
        errors = take()
    except BaseException:
        stop.set()
        raise
    finally:
        for t in threads:
            t.join()
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        errors += answer
    bar.update(*done)
    return bytes(keys), bytes(digests), errors
