"""sha256 of many files on every core.

Worker *processes*, not threads: hashlib releases the GIL on large buffers,
so threads would do for big files, but a dataset of small files spends its
time in per-file Python work (open, read, digest) that holds the GIL, and
measured here two threads were 2x *slower* than one on 20,000 8 KiB files
while two forked processes were 2x faster. Files go to workers in contiguous
batches (many small files, or one large one), largest first, so the cores
finish together. Each worker reads with one reused 1 MiB buffer
(``os.readv``): large reads, no allocation per file.

A worker ``fstat``s each file it opened before reading it and returns that
stat key with the digest, packed (40 + 32 bytes per file): the key is exactly
that of the bytes hashed, the main process need not stat files it hands out,
and it merges results without touching them one by one.

Workers are forked when this process has a single thread (instant, nothing
re-imported), else started from a fork server (forking a threaded process can
deadlock in a lock another thread held). Small jobs are hashed in-process:
starting workers would cost more than it saves.
"""

from __future__ import annotations

import hashlib
import os
import stat as statmod
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hermetic.errors import HermeticError

READ_SIZE = 1 << 20
_BATCH_MAX_FILES = 2000
_INLINE_MAX_BYTES = 32 << 20
_INLINE_MAX_FILES = 1000
_REPORT_EVERY = 8 << 20  # bytes between a worker's progress updates
_KEY_BYTES = 5 * 8
_DIGEST = 32
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open

_worker_state: dict[str, Any] = {}
# (packed keys, digests, [(index, error message, or None when the file vanished)])
_Result = tuple[bytes, bytes, list[tuple[int, Optional[str]]]]


@dataclass
class Hashed:
    """Results in the order of the paths given: packed stat keys and raw digests.

    ``keys``: 5 int64 per file (dev, ino, size, mtime_ns, ctime_ns, native
    order), from ``fstat`` of the opened file before it was read. ``digests``:
    32 bytes per file. Files in ``vanished`` (indices) were gone when their turn
    came; their slots hold zeros.
    """

    keys: bytes
    digests: bytes
    vanished: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.digests) // _DIGEST

    def hex(self, i: int) -> str:
        return self.digests[i * _DIGEST:(i + 1) * _DIGEST].hex()

    def hexes(self) -> list[str]:
        h = self.digests.hex()
        return [h[i:i + 64] for i in range(0, len(h), 64)]

    def key(self, i: int) -> tuple[int, int, int, int, int]:
        a = array("q")
        a.frombytes(self.keys[i * _KEY_BYTES:(i + 1) * _KEY_BYTES])
        return tuple(a)  # type: ignore[return-value]

    def sizes(self) -> array:
        a = array("q")
        a.frombytes(self.keys)
        return a[2::5]

    def keys_little_endian(self) -> bytes:
        if sys.byteorder == "little":
            return self.keys
        a = array("q")
        a.frombytes(self.keys)
        a.byteswap()
        return a.tobytes()


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def hash_files(
    paths: Sequence[str],
    sizes: Sequence[int] | None = None,
    *,
    workers: int | None = None,
    progress_label: str | None = None,
    while_hashing: Callable[[], None] | None = None,
    start_method: str | None = None,
) -> Hashed:
    """sha256 and stat key of each file, on all cores.

    ``sizes`` (from a scan), when known, balance the batches by bytes and
    size the progress bar; without them batches are balanced by count.
    ``while_hashing`` runs in this process while the workers hash (it would
    otherwise sit idle). ``progress_label`` shows a bar with bytes/s on stderr
    if the work lasts more than half a second. A file that cannot be read
    raises HermeticError naming it, after all work is done.
    """
    from hermetic.data.progress import ByteProgress

    n = len(paths)
    workers = workers or available_cpus()
    total = sum(sizes) if sizes is not None else None
    bar = ByteProgress(progress_label, total, n)
    try:
        small = (total is not None and total <= _INLINE_MAX_BYTES and n <= _INLINE_MAX_FILES) or n <= 64
        batches = [] if workers <= 1 or small else _plan(sizes, n, workers)
        if len(batches) <= 1:
            if while_hashing is not None:
                while_hashing()
            keys, digests, errors = _hash_range(paths, bar, None, None)
        else:
            keys, digests, errors = _hash_pool(paths, batches, min(workers, len(batches)), bar,
                                               while_hashing, start_method)
    finally:
        bar.close()
    vanished = [i for i, msg in errors if msg is None]
    failed = [(i, msg) for i, msg in errors if msg is not None]
    if failed:
        i, msg = min(failed)
        raise HermeticError(f"{paths[i]}: cannot read: {msg}")
    return Hashed(keys, digests, sorted(vanished))


def _plan(sizes: Sequence[int] | None, n: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) ranges of roughly equal work, the biggest first (LPT)."""
    if sizes is None:
        per = max(16, min(_BATCH_MAX_FILES, n // (workers * 8)))
        return [(s, min(s + per, n)) for s in range(0, n, per)]
    total = sum(sizes)
    target = min(max(total // (workers * 8), 1 << 20), 64 << 20)
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
        if acc >= target or i + 1 - start >= _BATCH_MAX_FILES:
            batches.append((start, i + 1))
            start, acc = i + 1, 0
    if start < n:
        batches.append((start, n))
    batches.sort(key=lambda b: -sum(sizes[b[0]:b[1]]))
    return batches


def _hash_range(paths: Sequence[str], bar: Any, counter: Any, stop: Any) -> _Result:
    """Hash ``paths`` in this process: (packed keys, digests, [(index, error or None if vanished)])."""
    if "buf" not in _worker_state:
        _worker_state["buf"] = bytearray(READ_SIZE)
        _worker_state["view"] = memoryview(_worker_state["buf"])
    buf, view = _worker_state["buf"], _worker_state["view"]
    bufs = [buf]
    keys = array("q")
    digests: list[bytes] = []
    errors: list[tuple[int, str | None]] = []
    pending = 0
    done = 0
    sha256, fstat, readv, close, open_ = hashlib.sha256, os.fstat, os.readv, os.close, os.open
    zero_key, zero_digest = (0, 0, 0, 0, 0), bytes(_DIGEST)
    for i, path in enumerate(paths):
        if stop is not None and not i & 63 and stop.value:
            errors.append((i, "interrupted"))
            keys.extend(zero_key)
            digests.append(zero_digest)
            continue
        try:
            fd = open_(path, _OPEN_FLAGS)
        except FileNotFoundError:
            errors.append((i, None))
            keys.extend(zero_key)
            digests.append(zero_digest)
            continue
        except OSError as e:
            errors.append((i, e.strerror or str(e)))
            keys.extend(zero_key)
            digests.append(zero_digest)
            continue
        try:
            st = fstat(fd)
            if not statmod.S_ISREG(st.st_mode):
                raise OSError(0, "no longer a regular file")
            h = sha256()
            nread = readv(fd, bufs)
            # A short read of exactly st_size bytes is the whole file as of the fstat
            # (whose key is what gets recorded): skip the extra read that would return 0.
            # Small files, on a VM where a syscall costs ~1 us, are mostly syscalls.
            more = nread != st.st_size or nread == READ_SIZE
            while nread:
                h.update(view[:nread])
                pending += nread
                if pending >= _REPORT_EVERY:
                    done += pending
                    if counter is not None:
                        with counter.get_lock():
                            counter.value += pending
                    else:
                        bar.update(done, i)
                    pending = 0
                    if stop is not None and stop.value:
                        raise OSError(0, "interrupted")
                nread = readv(fd, bufs) if more else 0
            keys.extend((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            digests.append(h.digest())
        except OSError as e:
            errors.append((i, e.strerror or str(e)))
            keys.extend(zero_key)
            digests.append(zero_digest)
        finally:
            close(fd)
    if counter is not None and pending:
        with counter.get_lock():
            counter.value += pending
    return keys.tobytes(), b"".join(digests), errors


# ---------------------------------------------------------------- worker processes


def _init_worker(counter: Any, stop: Any) -> None:
    import signal

    # Ctrl-C is handled by the parent, which raises the stop flag.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_state.update(counter=counter, stop=stop)


def _hash_batch(paths: list[str]) -> _Result:
    return _hash_range(paths, None, _worker_state["counter"], _worker_state["stop"])


def _hash_pool(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
               while_hashing: Callable[[], None] | None,
               start_method: str | None) -> _Result:
    import multiprocessing
    import threading
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    method = start_method or ("fork" if threading.active_count() == 1 else "forkserver")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    counter = ctx.Value("q", 0)
    stop = ctx.RawValue("b", 0)
    parts: dict[int, tuple[bytes, bytes]] = {}
    errors: list[tuple[int, str | None]] = []
    files_done = 0
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(counter, stop))
    try:
        futures = {ex.submit(_hash_batch, list(paths[s:e])): (s, e) for s, e in batches}
        if while_hashing is not None:
            while_hashing()
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            for f in done:
                start, end = futures.pop(f)
                keys, digests, errs = f.result()
                parts[start] = (keys, digests)
                errors.extend((start + i, msg) for i, msg in errs)
                files_done += end - start
            bar.update(counter.value, files_done)
    except BaseException:
        stop.value = 1
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)
    order = sorted(parts)
    return b"".join(parts[s][0] for s in order), b"".join(parts[s][1] for s in order), errors
