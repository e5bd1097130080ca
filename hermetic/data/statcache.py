"""A stat cache: skip re-hashing files whose (dev, ino, size, mtime_ns, ctime_ns) have not changed.

An entry holds the key, the sha256 and the time taken before the stat; it is trusted only when the file's
mtime and ctime are older than that time minus a slack (git's racy-clean rule, hermetic.hostfs.fsutil.is_racy).
Blind to changes that leave all five equal (docs/data.md); ``--full`` re-hashes everything. Storage: one binary
file written atomically, columns in the order of the last ``retain`` (so an unchanged tree is settled by whole
column comparisons); a file that does not parse is an empty cache.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

from hermetic.hostfs.fsutil import SAFE_AGE_NS, StatKey, is_racy, stat_key  # noqa: F401 (stat_key: re-exported)

_MAGIC = b"hermetic-statcache\x00v2\n"
# entry count, note length, newest mtime/ctime of any entry, oldest recorded time: the
# last two decide "every entry trusted" without going through 100,000 entries.
_HEADER = struct.Struct("<QQqq")
_KEY_INTS = 5  # dev, ino, size, mtime_ns, ctime_ns
_DIGEST = 32
# The stat key and git's racy-clean rule live in fsutil: the OCI store's blob check uses them too.
_SAFE_AGE_NS = SAFE_AGE_NS


def _pack_keys(keys: Sequence[StatKey]) -> bytes:
    a = array("q", list(chain.from_iterable(keys)))
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _ints(data: bytes) -> array:
    a = array("q")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


class StatCache:
    """path -> (stat key, sha256, recorded time); loaded lazily, saved atomically (only if changed)."""

    def __init__(self, file: str | os.PathLike[str]):
        self.file = Path(file)
        self._reset()

    def _reset(self) -> None:
        self._loaded = False
        self._paths: list[str] = []
        self._keys = b""  # packed int64 x 5 per entry
        self._recorded = array("q")
        self._digests = b""
        self._index_cache: dict[str, int] | None = None
        self._stored_ints: tuple[bytes, array] | None = None  # (the _keys it was unpacked from, the ints)
        self._new: dict[str, tuple[StatKey, int, bytes]] = {}
        self._order: list[str] | None = None
        self._dirty = False
        self._note = b""
        self._newest = self._oldest = 0  # from the file's header (see _HEADER)

    @property
    def note(self) -> bytes:
        self._load()
        return self._note

    @classmethod
    def for_tree(cls, root: str) -> "StatCache":
        """The cache file for one dataset root (one per root: a load costs that dataset, not all)."""
        from hermetic.core.paths import cache_paths

        name = hashlib.sha256(os.fsencode(root)).hexdigest()[:32]
        return cls(cache_paths().statcache / f"{name}.bin")

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        self._load()
        index = self._index()
        return len(self._paths) + sum(1 for p in self._new if p not in index)

    def get(self, path: str, key: StatKey) -> str | None:
        """The cached sha256 of ``path`` if ``key`` matches and the entry is trusted."""
        return self.get_many([path], [key])[0]

    def get_many(self, paths: Sequence[str], keys: Sequence[StatKey]) -> list[str | None]:
        """``get`` for many files at once."""
        raw = self.digests_if_unchanged(paths, keys)
        if raw is not None:
            h = raw.hex()
            return [h[i:i + 64] for i in range(0, len(h), 64)]
        self._load()
        index, new, recorded, digests = self._index(), self._new, self._recorded, self._digests
        stored = self._stored()
        out: list[str | None] = []
        append = out.append
        for path, key in zip(paths, keys):
            rec = new.get(path) if new else None
            if rec is not None:
                trusted = rec[0] == key and not is_racy(key[3], key[4], rec[1])
                append(rec[2].hex() if trusted else None)
                continue
            i = index.get(path)
            if i is None:
                append(None)
                continue
            b = i * _KEY_INTS
            if (stored[b + 1] == key[1] and stored[b + 3] == key[3] and stored[b + 4] == key[4]
                    and stored[b + 2] == key[2] and stored[b] == key[0]
                    and not is_racy(key[3], key[4], recorded[i])):
                append(digests[i * _DIGEST:(i + 1) * _DIGEST].hex())
            else:
                append(None)
        return out

    def digests_if_unchanged(self, paths: Sequence[str], keys: Sequence[StatKey]) -> bytes | None:
        """All digests, raw, if the cache holds exactly ``paths`` in this order with these keys, every entry
        trusted (a warm verify, by whole-column comparisons); else None (use ``get_many``)."""
        self._load()
        if self._new or not paths or len(paths) != len(self._paths) or list(paths) != self._paths:
            return None
        if _pack_keys(keys) != self._keys:
            return None
        if self._newest + _SAFE_AGE_NS >= self._oldest:  # (the stored keys are these very keys)
            return None  # some entry may be racy: let get_many decide one by one
        return self._digests

    # ------------------------------------------------------------ updates

    def put(self, path: str, key: StatKey, sha256_hex: str, recorded_ns: int) -> None:
        """Remember that ``path`` with stat ``key`` (taken after ``recorded_ns``) hashed to ``sha256_hex``."""
        self._new[path] = (tuple(key), recorded_ns, bytes.fromhex(sha256_hex))  # type: ignore[assignment]
        self._dirty = True
        self._note = b""

    def put_many(self, paths: Sequence[str], keys: Sequence[StatKey], sha256_hexes: Sequence[str],
                 recorded_ns: int) -> None:
        """``put`` for many files recorded at the same time."""
        new = self._new
        for path, key, digest in zip(paths, keys, sha256_hexes):
            new[path] = (key, recorded_ns, bytes.fromhex(digest))
        if paths:
            self._dirty = True
            self._note = b""

    def replace(self, paths: Sequence[str], packed_keys: bytes, recorded_ns: int, digests: bytes) -> None:
        """Make the cache exactly these entries, in this order: 5 little-endian int64 keys and 32 raw digest
        bytes per path."""
        n = len(paths)
        if len(packed_keys) != n * _KEY_INTS * 8 or len(digests) != n * _DIGEST:
            raise ValueError("replace: keys and digests do not match the paths")
        self._reset()
        self._loaded = True
        self._paths = list(paths)
        self._keys = packed_keys
        self._recorded = array("q", [recorded_ns]) * n
        self._digests = digests
        self._newest, self._oldest = _newest_stamp(packed_keys), recorded_ns if n else 0
        self._dirty = True

    def retain(self, paths: Iterable[str]) -> None:
        """Keep only entries for ``paths`` (files that still exist), stored in this order."""
        self._load()
        order = list(paths)
        if order != self._paths:
            self._dirty = True
            self._note = b""
        self._order = order

    def set_note(self, note: bytes) -> None:
        """Caller data (verify: the manifest the digests matched) that a later change of the entries clears."""
        self._load()
        if note != self._note:
            self._note = note
            self._dirty = True

    def save(self) -> None:
        """Write the cache atomically if it changed. Failure to write is not an error."""
        if not self._dirty:
            return
        self._load()
        if not self._new and (self._order is None or self._order == self._paths):
            # Only the note changed, or replace() set whole columns: write them as they are.
            self._write(self._paths, self._keys, self._recorded, self._digests, (self._newest, self._oldest))
            return
        index = self._index()
        if self._order is not None:
            order = self._order
        else:
            order = self._paths + [p for p in self._new if p not in index]
        new, stored = self._new, self._stored()
        paths, keys, recorded, digests = [], [], [], []
        for path in order:
            rec = new.get(path)
            if rec is not None:
                keys.extend(rec[0])
                recorded.append(rec[1])
                digests.append(rec[2])
            else:
                i = index.get(path)
                if i is None:
                    continue
                keys.extend(stored[i * _KEY_INTS:(i + 1) * _KEY_INTS])
                recorded.append(self._recorded[i])
                digests.append(self._digests[i * _DIGEST:(i + 1) * _DIGEST])
            paths.append(path)
        key_arr = array("q", keys)
        if sys.byteorder != "little":
            key_arr.byteswap()
        self._write(paths, key_arr.tobytes(), array("q", recorded), b"".join(digests))

    def _write(self, paths: Sequence[str], packed_keys: bytes, recorded: array, digests: bytes,
               newest_oldest: tuple[int, int] | None = None) -> None:
        newest, oldest = newest_oldest or (_newest_stamp(packed_keys), min(recorded, default=0))
        rec = recorded
        if sys.byteorder != "little":
            rec = array("q", recorded)
            rec.byteswap()
        blob = "\0".join(paths).encode("utf-8", "surrogateescape")
        header = _HEADER.pack(len(paths), len(self._note), newest, oldest)
        data = b"".join((_MAGIC, header, self._note, packed_keys, rec.tobytes(), digests, blob))
        from hermetic.hostfs.fsutil import atomic_write_bytes  # (imports tempfile: only when writing)

        try:
            # No fsync: a cache lost in a crash costs one re-hash, never a wrong answer
            # (a torn file fails the length checks in _parse and is ignored).
            atomic_write_bytes(self.file, data, fsync=False)
        except OSError:
            return
        self._reset()  # re-read lazily if used again

    # ------------------------------------------------------------ storage

    def _stored(self) -> array:
        """The stored keys as ints, unpacked once (``get`` one file at a time stays O(1) per lookup)."""
        if self._stored_ints is None or self._stored_ints[0] is not self._keys:
            self._stored_ints = (self._keys, _ints(self._keys))
        return self._stored_ints[1]

    def _index(self) -> dict[str, int]:
        if self._index_cache is None:
            self._index_cache = dict(zip(self._paths, range(len(self._paths))))
        return self._index_cache

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            data = self.file.read_bytes()
        except OSError:
            return
        parsed = _parse(data)
        if parsed is None:
            self._dirty = True  # rewrite the unreadable file at the next save
            return
        self._note, self._paths, self._keys, self._recorded, self._digests, self._newest, self._oldest = parsed


def _newest_stamp(packed_keys: bytes) -> int:
    """The latest mtime or ctime among little-endian packed keys (0 for none)."""
    if not packed_keys:
        return 0
    # A view where little-endian is native, rather than a copy of 100,000 keys.
    stamps = memoryview(packed_keys).cast("q") if sys.byteorder == "little" else _ints(packed_keys)
    return max(max(stamps[3::_KEY_INTS]), max(stamps[4::_KEY_INTS]))


def _parse(data: bytes) -> tuple[bytes, list[str], bytes, array, bytes, int, int] | None:
    head = len(_MAGIC) + _HEADER.size
    if not data.startswith(_MAGIC) or len(data) < head:
        return None
    count, note_len, newest, oldest = _HEADER.unpack_from(data, len(_MAGIC))
    note = data[head:head + note_len]
    head += note_len
    keys_end = head + count * _KEY_INTS * 8
    rec_end = keys_end + count * 8
    dig_end = rec_end + count * _DIGEST
    if len(data) < dig_end:
        return None
    try:
        paths = data[dig_end:].decode("utf-8", "surrogateescape").split("\0") if count else []
    except UnicodeDecodeError:
        return None
    if len(paths) != count:
        return None
    return note, paths, data[head:keys_end], _ints(data[keys_end:rec_end]), data[rec_end:dig_end], newest, oldest
