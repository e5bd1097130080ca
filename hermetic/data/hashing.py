"""sha256 of many files on every core.

Worker *processes*, not threads: hashlib releases the GIL on large buffers,
so threads would do for big files, but a dataset of small files spends its
time in per-file Python work (open, read, digest) that holds the GIL, and
measured here two threads were 2x *slower* than one on 20,000 8 KiB files
while two forked processes were 2x faster.

When this process has a single thread, workers are *forked* (instant,
nothing re-imported, nothing pickled): they inherit the list of paths, take
batches as (start, end) records from one pipe (``feed``/``drain``: each
record goes to exactly one reader, so the cores finish together), and write
digests and stat keys straight into shared memory at each file's index.
The calling process hashes batches too once its own side work
(``while_hashing``) is done, so ``workers`` processes hash in all and none
waits idle. Only per-file errors (rare) travel back, over a pipe, at the end.
A process with other threads starts workers from a fork server instead
(forking a threaded process can deadlock in a lock another thread held),
and batches of paths travel there and back pickled. Small jobs are hashed
in-process: starting workers would cost more than it saves. (treehash.py
builds ``verify --full`` on the same pieces, with the scan in a worker too.)

Per file: ``open``, ``fstat``, one ``read`` of exactly the file's size plus
one byte (a short read of exactly ``st_size`` bytes is the whole file as of
the fstat, so no second read to see EOF) and one sha256: small files on a VM
are mostly syscalls, and this is the fewest there are. Larger files are read
in 1 MiB chunks into a reused buffer. The ``fstat`` key is exactly that of the
bytes hashed, so the caller need not stat files it hands out.

An account's limits bound the workers: no more than a quarter of ``ulimit -n``
(each costs this process a pipe), and where a fork, a pipe or the pool's
start is refused (``ulimit -u``: hermetic.workers.no_more_workers) the work
goes on with the workers already started, or in this process alone.

That loop runs in C (``_filehash.c``, built by setup.py where a compiler and
OpenSSL's headers are found) for every file up to _NATIVE_MAX bytes: on
100,000 files of 1-16 KiB the Python version spends about as long in
interpreter work as in the hash, and the C one only the syscalls and the hash;
where intel-ipsec-mb was found at build time the C loop also hashes files
under 64 KiB many at a time in SIMD lanes, which on the development machine
cut ``verify --full`` of those files from 1.7 to 1.1 CPU seconds
(docs/benchmarks.md). Larger files, and every file when the extension is
missing or HERMETIC_PURE_PYTHON is set, go through the same loop in Python
(``_hash_span_py``), which reports progress inside a large file and can stop
midway; tests/test_data_native.py holds the two to one contract.
"""

from __future__ import annotations

import hashlib
import os
import resource
import stat as statmod
import struct
import sys
import threading
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hermetic.errors import ReadError, WorkerDied
from hermetic.workers import no_more_workers

_native: Any
try:  # the C loop, built with the package where a compiler and OpenSSL's headers were found (setup.py)
    if os.environ.get("HERMETIC_PURE_PYTHON"):
        raise ImportError("HERMETIC_PURE_PYTHON is set")
    from hermetic.data import _filehash as _native
except ImportError:
    _native = None

READ_SIZE = 1 << 20
_ONE_READ_MAX = 128 << 10  # larger files: chunked reads into a reused buffer
_BATCH_MAX_FILES = 2000
_INLINE_MAX_BYTES = 32 << 20
_INLINE_MAX_FILES = 1000
_INLINE_SPAN = 1000  # files between progress updates when hashing in-process
_REPORT_EVERY = 8 << 20  # bytes of one large file between progress updates
# Batches are (start, end) records of 8 bytes, all written to a pipe before they are
# taken: 512 of them fill 4 KiB, the least a pipe holds (one page), so the writer
# never waits for a reader.
_MAX_BATCHES = 512
_KEY_BYTES = 5 * 8
_DIGEST = 32
_NATIVE_MAX = _REPORT_EVERY  # the C loop reads files up to this size whole, no progress inside one
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open
_ZERO_KEY = (0, 0, 0, 0, 0)
_ZERO_DIGEST = bytes(_DIGEST)
_COUNTERS = struct.Struct("qq")  # per hashing process: bytes done, files done
_KEY = struct.Struct("5q")  # dev, ino, size, mtime_ns, ctime_ns (native order)
_RECORD = struct.Struct("=II")  # a batch in the pipe: (start, end)

# [(index, error message, or None when the file vanished)]
_Errors = list[tuple[int, Optional[str]]]
# (packed keys, digests, errors) for one batch
_Result = tuple[bytes, bytes, _Errors]


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

    def sizes(self) -> Sequence[int]:
        """Each file's size (0 for a vanished one), as a view of ``keys``: no copy."""
        if not self.keys:
            return []
        return memoryview(self.keys).cast("q")[2::5]

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


def affordable_workers(workers: int) -> int:
    """``workers``, or fewer where ``ulimit -n`` is low: each costs this process a descriptor (its pipe), and
    three quarters of the limit stay for the files being hashed and the rest of the command."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return workers if soft == resource.RLIM_INFINITY else max(1, min(workers, soft // 4))


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
    if the work lasts more than half a second. ``start_method`` ("fork" or
    "forkserver") overrides the choice described in the module doc. A file
    that cannot be read raises HermeticError naming it, after all work is done.
    """
    from hermetic.data.progress import ByteProgress

    n = len(paths)
    workers = affordable_workers(workers or available_cpus())
    total = sum(sizes) if sizes is not None else None
    bar = ByteProgress(progress_label, total, n)
    try:
        small = (total is not None and total <= _INLINE_MAX_BYTES and n <= _INLINE_MAX_FILES) or n <= 64
        batches = [] if workers <= 1 or small else _plan(sizes, n, workers)
        if len(batches) <= 1:
            if while_hashing is not None:
                while_hashing()
            keys, digests, errors = _hash_inline(paths, bar)
        else:
            workers = min(workers, len(batches))
            method = start_method or _default_start_method()
            if method == "fork":
                keys, digests, errors = _hash_forked(paths, batches, workers, bar, while_hashing)
            else:
                pooled = _hash_pool(paths, batches, workers, bar, while_hashing, method)
                if pooled is None:  # no worker could be started: all of it here
                    if while_hashing is not None:
                        while_hashing()
                    pooled = _hash_inline(paths, bar)
                keys, digests, errors = pooled
    finally:
        bar.close()
    vanished = [i for i, msg in errors if msg is None]
    failed = [(i, msg) for i, msg in errors if msg is not None]
    if failed:
        i, msg = min(failed)
        raise ReadError(f"{paths[i]}: cannot read: {msg}")
    return Hashed(keys, digests, sorted(vanished))


def _default_start_method() -> str:
    return "fork" if threading.active_count() == 1 and hasattr(os, "fork") else "forkserver"


def _plan(sizes: Sequence[int] | None, n: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) ranges, at most _MAX_BATCHES of them.

    By count: small batches (~1/32 of a worker's share, at most 256 files),
    since workers take the next one as they finish: the tail is one small
    batch. By bytes: roughly equal bytes, a large file a batch of its own,
    the biggest first (LPT).
    """
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


def _hash_span(paths: Sequence[str], start: int, end: int, digests_out: Any, keys_out: Any,
               on_bytes: Callable[[int], bool] | None, dir_fd: int | None = None) -> tuple[int, _Errors]:
    """Hash ``paths[start:end]`` (relative to ``dir_fd`` if given); write each digest and key
    at its index in the outputs.

    Returns (bytes hashed, [(index, error or None if vanished)]). ``on_bytes``
    hears of progress inside large files and answers True to stop.

    The C loop (``_filehash``, when built) takes every file up to _NATIVE_MAX
    bytes, with the GIL released; it hands larger ones back, and the Python
    loop reads those in chunks, reporting progress as it goes.
    """
    if _native is None:
        return _hash_span_py(paths, start, end, digests_out, keys_out, on_bytes, dir_fd)
    nbytes, errors, deferred = _native.hash_span(
        paths if type(paths) is list else list(paths), start, end, digests_out, keys_out,
        -1 if dir_fd is None else dir_fd, _NATIVE_MAX)
    for i in deferred:
        more, errs = _hash_span_py(paths, i, i + 1, digests_out, keys_out, on_bytes, dir_fd)
        nbytes += more
        errors += errs
    if len(errors) > 1 and deferred:
        errors.sort()
    return nbytes, errors


def _hash_span_py(paths: Sequence[str], start: int, end: int, digests_out: Any, keys_out: Any,
                  on_bytes: Callable[[int], bool] | None, dir_fd: int | None = None) -> tuple[int, _Errors]:
    """``_hash_span`` in Python: the same contract as the C loop, which is tested against it."""
    # Everything the loop touches is a local: at 100,000 files, lookups add up.
    sha256, fstat, read, close, open_ = hashlib.sha256, os.fstat, os.read, os.close, os.open
    is_reg, one_read_max, flags = statmod.S_ISREG, _ONE_READ_MAX, _OPEN_FLAGS
    put_key = _KEY.pack_into  # (half the cost of an array of tuples: the ns stamps are big ints)
    digests: list[bytes] = []
    add_digest = digests.append
    errors: _Errors = []
    nbytes = 0
    for i in range(start, end):
        try:
            fd = open_(paths[i], flags, dir_fd=dir_fd)
        except OSError as e:
            errors.append((i, None if isinstance(e, FileNotFoundError) else (e.strerror or str(e))))
            add_digest(_ZERO_DIGEST)
            put_key(keys_out, i * _KEY_BYTES, *_ZERO_KEY)
            continue
        try:
            st = fstat(fd)
            size = st.st_size
            if not is_reg(st.st_mode):
                raise OSError(0, "no longer a regular file")
            if size <= one_read_max:
                data = read(fd, size + 1)
                # Exactly st_size bytes: the whole file as of the fstat, whose key is recorded.
                digest = sha256(data).digest() if len(data) == size else _finish(fd, sha256(data), None)
            else:
                digest = _finish(fd, sha256(), on_bytes)
        except OSError as e:
            errors.append((i, e.strerror or str(e)))
            add_digest(_ZERO_DIGEST)
            put_key(keys_out, i * _KEY_BYTES, *_ZERO_KEY)
            continue
        finally:
            close(fd)
        add_digest(digest)
        put_key(keys_out, i * _KEY_BYTES, st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
        nbytes += size
    digests_out[start * _DIGEST:end * _DIGEST] = b"".join(digests)
    return nbytes, errors


_buffers = threading.local()  # one reused 1 MiB read buffer per thread


def _finish(fd: int, h: Any, on_bytes: Callable[[int], bool] | None) -> bytes:
    """Read the rest of ``fd`` into ``h`` through this thread's reused 1 MiB buffer."""
    bufs = getattr(_buffers, "bufs", None)
    if bufs is None:
        bufs = _buffers.bufs = [bytearray(READ_SIZE)]
    view = memoryview(bufs[0])
    pending = 0
    while True:
        n = os.readv(fd, bufs)
        if not n:
            return h.digest()
        h.update(view[:n])
        pending += n
        if on_bytes is not None and pending >= _REPORT_EVERY:
            if on_bytes(pending):
                raise OSError(0, "interrupted")
            pending = 0


def _hash_inline(paths: Sequence[str], bar: Any) -> _Result:
    """Everything in this process, in spans between progress updates."""
    n = len(paths)
    digests, keys = bytearray(n * _DIGEST), bytearray(n * _KEY_BYTES)
    errors: _Errors = []
    done = 0
    for start in range(0, n, _INLINE_SPAN):
        end = min(start + _INLINE_SPAN, n)
        nbytes, errs = _hash_span(paths, start, end, digests, keys, None)
        errors += errs
        done += nbytes
        bar.update(done, end)
    return bytes(keys), bytes(digests), errors


# ---------------------------------------------------------------- forked workers


class Control:
    """What forked hashing processes share besides their output: a stop flag and,
    per process ("slot"), (bytes, files) done. An anonymous shared mapping, so it
    must exist before the fork."""

    def __init__(self, procs: int):
        import mmap

        self.procs = procs
        self._stop_at = procs * _COUNTERS.size
        self.mm = mmap.mmap(-1, self._stop_at + 1)

    def report(self, slot: int, nbytes: int, files: int) -> None:
        _COUNTERS.pack_into(self.mm, slot * _COUNTERS.size, nbytes, files)

    def progress(self) -> tuple[int, int]:
        nbytes = files = 0
        for slot in range(self.procs):
            b, f = _COUNTERS.unpack_from(self.mm, slot * _COUNTERS.size)
            nbytes += b
            files += f
        return nbytes, files

    @property
    def stopped(self) -> bool:
        return self.mm[self._stop_at] != 0

    def stop(self) -> None:
        self.mm[self._stop_at] = 1

    def close(self) -> None:
        self.mm.close()


def output_views(mm: Any, n: int) -> tuple[memoryview, memoryview]:
    """(digests, keys) regions at the start of a mapping: n * 32 bytes, then n * 40."""
    view = memoryview(mm)
    return view[:n * _DIGEST], view[n * _DIGEST:n * (_DIGEST + _KEY_BYTES)]


OUTPUT_BYTES_PER_FILE = _DIGEST + _KEY_BYTES


def feed(queue_w: int, batches: list[tuple[int, int]]) -> None:
    """Write the batches as (start, end) uint32 records, then close the pipe.

    Each write is at most PIPE_BUF bytes of whole records, so it lands in the
    pipe in one piece, and every 8-byte read gets one whole record.
    """
    import select

    records = b"".join(_RECORD.pack(start, end) for start, end in batches)
    step = max(_RECORD.size, getattr(select, "PIPE_BUF", 512) // _RECORD.size * _RECORD.size)
    for at in range(0, len(records), step):
        _write_all(queue_w, records[at:at + step])
    os.close(queue_w)


def drain(paths: Sequence[str], queue: int, control: Control, slot: int, digests_out: Any, keys_out: Any,
          after_batch: Callable[[], None] | None = None, dir_fd: int | None = None) -> _Errors:
    """Take (start, end) records from the ``queue`` pipe until it is empty; hash each
    (``paths`` relative to ``dir_fd`` if given)."""
    errors: _Errors = []
    done_bytes = done_files = 0
    in_batch = 0

    def on_bytes(n: int) -> bool:  # progress inside a large file
        nonlocal in_batch
        in_batch += n
        control.report(slot, done_bytes + in_batch, done_files)
        return control.stopped

    while not control.stopped:
        data = os.read(queue, _RECORD.size)
        if not data:
            break
        start, end = _RECORD.unpack(data)
        in_batch = 0
        nbytes, errs = _hash_span(paths, start, end, digests_out, keys_out, on_bytes, dir_fd)
        errors += errs
        done_bytes += nbytes
        done_files += end - start
        control.report(slot, done_bytes, done_files)
        if after_batch is not None:
            after_batch()
    return errors


def fork_child(body: Callable[[], None], control: Control) -> int:
    """Fork; the child runs ``body`` and exits (0 if it returned, 1 if it raised). Returns the pid.

    The child dies with this process (hermetic.workers), even when this one is SIGKILLed.
    """
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        import signal

        from hermetic.workers import die_with_parent

        die_with_parent(parent)

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it raises the stop flag
        body()
        code = 0
    except BaseException:
        if not control.stopped:  # else the parent gave up on us: nothing to add
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def start_worker(body: Callable[[int], None], control: Control) -> tuple[int, int]:
    """A forked child running ``body(err_w)``, err_w the write end of a pipe for what it reports: (its pid, the
    read end). Where the pipe or the fork is refused (an OSError), nothing is left open."""
    err_r, err_w = os.pipe()
    try:
        pid = fork_child(lambda: body(err_w), control)
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(err_w)  # the child's
    return pid, err_r


def reap(pid: int) -> None:
    """Wait for a worker; HermeticError if it did not exit cleanly."""
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        raise WorkerDied(f"a hashing worker process failed (exit status {code}); is the machine out of memory?")


def _hash_forked(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
                 while_hashing: Callable[[], None] | None) -> _Result:
    """``workers - 1`` forked children and this process take batches from one pipe."""
    import marshal
    import mmap

    n = len(paths)
    control = Control(workers)
    out = mmap.mmap(-1, n * OUTPUT_BYTES_PER_FILE)
    digests_out, keys_out = output_views(out, n)
    queue, queue_w = os.pipe()
    children: dict[int, int] = {}  # pid -> read end of its error pipe, until reaped

    def tick() -> None:
        bar.update(*control.progress())

    try:
        for slot in range(1, workers):
            def body(err_w: int, slot: int = slot) -> None:
                os.close(queue_w)
                for sibling in children.values():  # its elder siblings' pipes, copied by the fork
                    os.close(sibling)
                errors = drain(paths, queue, control, slot, digests_out, keys_out)
                if errors:
                    _write_all(err_w, marshal.dumps(errors))

            try:
                pid, err_r = start_worker(body, control)
            except OSError as e:
                if not no_more_workers(e):
                    raise
                break  # at the account's limit: those started, and this process, take every batch
            children[pid] = err_r
        feed(queue_w, batches)
        queue_w = -1
        if while_hashing is not None:
            while_hashing()
        errors = drain(paths, queue, control, 0, digests_out, keys_out, tick)
        for pid in list(children):
            data = read_all(children[pid], tick)
            os.close(children.pop(pid))
            reap(pid)
            if data:
                errors += marshal.loads(data)
        tick()
        return bytes(keys_out), bytes(digests_out), errors
    except BaseException:
        control.stop()
        raise
    finally:
        if queue_w != -1:  # first: a child waiting for a batch sees the end (else both would wait forever)
            os.close(queue_w)
        for pid, err_r in children.items():
            os.close(err_r)  # a child blocked writing its errors gets EPIPE and exits
            os.waitpid(pid, 0)
        os.close(queue)
        digests_out.release()
        keys_out.release()
        out.close()
        control.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_all(fd: int, tick: Callable[[], None]) -> bytes:
    """Everything until EOF, calling ``tick`` every 0.1 s while waiting (the progress bar)."""
    import select

    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            tick()
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# ---------------------------------------------------------------- fork-server workers


_worker_state: dict[str, Any] = {}


def _init_worker(counter: Any, stop: Any, owner: int) -> None:
    import signal

    from hermetic.workers import die_with_parent

    die_with_parent(owner)  # (the fork server is its parent; it exits with ``owner``)
    # Ctrl-C is handled by the parent, which raises the stop flag.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_state.update(counter=counter, stop=stop)


def _hash_batch(paths: list[str]) -> _Result:
    counter, stop = _worker_state["counter"], _worker_state["stop"]
    if stop.value:
        raise OSError(0, "interrupted")

    reported = 0

    def on_bytes(n: int) -> bool:  # progress inside a large file
        nonlocal reported
        reported += n
        with counter.get_lock():
            counter.value += n
        return bool(stop.value)

    n = len(paths)
    digests, keys = bytearray(n * _DIGEST), bytearray(n * _KEY_BYTES)
    nbytes, errors = _hash_span(paths, 0, n, digests, keys, on_bytes)
    with counter.get_lock():
        counter.value += nbytes - reported
    return bytes(keys), bytes(digests), errors


def _hash_pool(paths: Sequence[str], batches: list[tuple[int, int]], workers: int, bar: Any,
               while_hashing: Callable[[], None] | None, method: str) -> _Result | None:
    """The batches hashed by a pool of ``workers`` processes; None where the pool could not start (the
    account's limits, hermetic.workers): then the caller hashes them all itself."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    parts: dict[int, tuple[bytes, bytes]] = {}
    errors: _Errors = []
    files_done = 0
    stop = ctx.RawValue("b", 0)
    ex = None
    try:
        # Each of these may start a process (the resource tracker, the fork server, a worker) or a thread.
        counter = ctx.Value("q", 0)
        ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(counter, stop, os.getpid()))
        futures = {ex.submit(_hash_batch, list(paths[s:e])): (s, e) for s, e in batches}
    except (OSError, RuntimeError, EOFError) as e:
        # (EOFError: the fork server, refused a fork, hung up without the worker's pid)
        if not (no_more_workers(e) or isinstance(e, EOFError)):
            raise
        stop.value = 1
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)
        return None
    try:
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
