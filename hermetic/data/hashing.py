"""sha256 and stat key of each file in a span of a list: the loop every hashing thread runs.

Per file: open, fstat, one read of the size plus one byte (a short read is the whole file as of the fstat,
whose key is recorded), one sha256; larger files in 1 MiB chunks into a reused buffer. Results go at each
file's index in the caller's buffers. The loop runs in C (``_filehash.c``, built where a compiler and
OpenSSL's headers are found) for files up to _NATIVE_MAX bytes; larger files, and all with
HERMETIC_PURE_PYTHON, go through ``_hash_span_py`` (tests/test_data_native.py holds the two to one contract).
"""

from __future__ import annotations

import hashlib
import os
import stat as statmod
import struct
import sys
import threading
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

_native: Any
try:  # the C loop, built with the package where a compiler and OpenSSL's headers were found (setup.py)
    if os.environ.get("HERMETIC_PURE_PYTHON"):
        raise ImportError("HERMETIC_PURE_PYTHON is set")
    from hermetic.data import _filehash as _native
except ImportError:
    _native = None

READ_SIZE = 1 << 20
_ONE_READ_MAX = 128 << 10  # larger files: chunked reads into a reused buffer
_REPORT_EVERY = 8 << 20  # bytes of one large file between progress updates
KEY_BYTES = 5 * 8
DIGEST_BYTES = 32
_NATIVE_MAX = _REPORT_EVERY  # the C loop reads files up to this size whole, no progress inside one
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open
_ZERO_KEY = (0, 0, 0, 0, 0)
_ZERO_DIGEST = bytes(DIGEST_BYTES)
_KEY = struct.Struct("5q")  # dev, ino, size, mtime_ns, ctime_ns (native order)

# [(index, error message, or None when the file vanished)]
Errors = list[tuple[int, Optional[str]]]


@dataclass
class Hashed:
    """In the order of the paths given: 5 native int64 per file (dev, ino, size, mtime_ns, ctime_ns, from the
    fstat before the read) and 32-byte digests; ``vanished`` files' slots hold zeros."""

    keys: bytes
    digests: bytes
    vanished: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.digests) // DIGEST_BYTES

    def hex(self, i: int) -> str:
        return self.digests[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES].hex()

    def hexes(self) -> list[str]:
        h = self.digests.hex()
        return [h[i:i + 64] for i in range(0, len(h), 64)]

    def key(self, i: int) -> tuple[int, int, int, int, int]:
        a = array("q")
        a.frombytes(self.keys[i * KEY_BYTES:(i + 1) * KEY_BYTES])
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


# ---------------------------------------------------------------- the per-file loop


def hash_span(paths: Sequence[str], start: int, end: int, digests_out: Any, keys_out: Any,
              on_bytes: Callable[[int], bool] | None, dir_fd: int | None = None) -> tuple[int, Errors]:
    """Hash ``paths[start:end]`` (relative to ``dir_fd``), each digest and key at its index in the outputs:
    (bytes hashed, [(index, error or None if vanished)]). ``on_bytes`` hears of progress inside large files
    (the Python loop's) and answers True to stop."""
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
                  on_bytes: Callable[[int], bool] | None, dir_fd: int | None = None) -> tuple[int, Errors]:
    """``hash_span`` in Python: the same contract as the C loop, which is tested against it."""
    # Everything the loop touches is a local: at 100,000 files, lookups add up.
    sha256, fstat, read, close, open_ = hashlib.sha256, os.fstat, os.read, os.close, os.open
    is_reg, one_read_max, flags = statmod.S_ISREG, _ONE_READ_MAX, _OPEN_FLAGS
    put_key = _KEY.pack_into  # (half the cost of an array of tuples: the ns stamps are big ints)
    digests: list[bytes] = []
    add_digest = digests.append
    errors: Errors = []
    nbytes = 0
    for i in range(start, end):
        try:
            fd = open_(paths[i], flags, dir_fd=dir_fd)
        except OSError as e:
            errors.append((i, None if isinstance(e, FileNotFoundError) else (e.strerror or str(e))))
            add_digest(_ZERO_DIGEST)
            put_key(keys_out, i * KEY_BYTES, *_ZERO_KEY)
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
            put_key(keys_out, i * KEY_BYTES, *_ZERO_KEY)
            continue
        finally:
            close(fd)
        add_digest(digest)
        put_key(keys_out, i * KEY_BYTES, st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
        nbytes += size
    digests_out[start * DIGEST_BYTES:end * DIGEST_BYTES] = b"".join(digests)
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
