"""sha256 of many files on every core: the batches, and the threads that take them.

Threads: the C loop (and hashlib's large updates) let go of the GIL, so ``workers`` threads hash side by side
and write digests and stat keys at each file's index in one buffer. Small jobs are hashed in this thread.
Threads the account's limits refuse are done without.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from hermetic.core import workers as procs
from hermetic.data.hashing import DIGEST_BYTES, KEY_BYTES, Errors, Hashed, hash_span
from hermetic.core.errors import ReadError

_BATCH_MAX_FILES = 2000
_INLINE_MAX_BYTES = 32 << 20
_INLINE_MAX_FILES = 1000
_INLINE_SPAN = 1000  # files between progress updates when hashing in-process
_MAX_BATCHES = 512  # bounds the batches, and so the planning and the hand-out

# (packed keys, digests, errors) for one batch
_Result = tuple[bytes, bytes, Errors]


def hash_files(
    paths: Sequence[str],
    sizes: Sequence[int] | None = None,
    *,
    workers: int | None = None,
    progress_label: str | None = None,
    while_hashing: Callable[[], None] | None = None,
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
            keys, digests, errors = _hash_threaded(paths, batches, min(workers, len(batches)), bar, while_hashing)
    finally:
        bar.close()
    vanished = [i for i, msg in errors if msg is None]
    failed = [(i, msg) for i, msg in errors if msg is not None]
    if failed:
        i, msg = min(failed)
        raise ReadError(f"{paths[i]}: cannot read: {msg}")
    return Hashed(keys, digests, sorted(vanished))


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


# ---------------------------------------------------------------- threads


def _hash_threaded(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
                   while_hashing: Callable[[], None] | None) -> _Result:
    """``workers - 1`` threads and this one take the batches. Threads the account's limits refuse are done
    without; on an error or Ctrl-C, no batch starts and a large file being read ends."""
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
