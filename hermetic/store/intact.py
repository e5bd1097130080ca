"""Is a stored blob still what its name says? Answered from a stat where that is safe.

Each blob has a note ``.verified/<hex>``: its stat key when its bytes last hashed right. An unchanged stat key is
trusted without reading the blob, under git's racy-clean rule (a note within a timestamp tick of the change is
not); ``seal`` re-dates notes as writing git's index does. What a stat cannot see is ``hermetic cache verify``'s;
a note that does not parse is no note.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from hermetic.hostfs.fsutil import READ_SIZE, StatKey, atomic_write_bytes, is_racy, stat_key

NOTES_DIR = ".verified"
REPAIR = "hermetic cache verify --repair"  # the fix every refusal names


def notes_dir(store_root: Path) -> Path:
    return store_root / NOTES_DIR


def _note_path(store_root: Path, hexdigest: str) -> Path:
    return store_root / NOTES_DIR / hexdigest


def _read_note(path: Path) -> tuple[StatKey, int] | None:
    try:
        fields = path.read_bytes().split()
        if len(fields) != 6:
            return None
        ints = [int(f) for f in fields]
    except (OSError, ValueError):
        return None
    return (ints[0], ints[1], ints[2], ints[3], ints[4]), ints[5]


def write_note(store_root: Path, hexdigest: str, st: os.stat_result, noted_ns: int) -> None:
    """Note that the blob, with stat ``st`` taken after ``noted_ns``, hashed to its name."""
    text = " ".join(str(v) for v in (*stat_key(st), noted_ns)) + "\n"
    try:
        # No fsync: a note lost in a crash costs one rehash, never a wrong answer.
        atomic_write_bytes(_note_path(store_root, hexdigest), text.encode(), fsync=False)
    except OSError:
        pass


def forget(store_root: Path, hexdigest: str) -> None:
    try:
        os.unlink(_note_path(store_root, hexdigest))
    except FileNotFoundError:
        pass


def noted_intact(store_root: Path, blob: Path, hexdigest: str, size: int | None = None) -> bool:
    """True when the blob's note vouches for it from its stat alone (module doc); False: it must be hashed
    (``blob_intact``, or a reader that hashes it on its way and then calls ``note_hashed``)."""
    try:
        st = os.stat(blob)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if size is not None and st.st_size != size:
        return False
    note = _read_note(_note_path(store_root, hexdigest))
    return note is not None and note[0] == stat_key(st) and not is_racy(st.st_mtime_ns, st.st_ctime_ns, note[1])


def note_hashed(store_root: Path, hexdigest: str, before: os.stat_result, after: os.stat_result,
                noted_ns: int) -> None:
    """Note a blob whose bytes were just hashed and found right: ``before``/``after`` its stat around the
    reading, ``noted_ns`` the time before the first stat. A blob written to while it was read is not noted."""
    if stat_key(before) == stat_key(after):
        write_note(store_root, hexdigest, after, noted_ns)


def blob_intact(store_root: Path, blob: Path, hexdigest: str, size: int | None = None) -> bool:
    """True when ``blob`` is there and its bytes hash to ``hexdigest`` (and are ``size`` long).

    From the stat alone when the note allows (module doc); else rehashed, and
    noted when right.
    """
    if noted_intact(store_root, blob, hexdigest, size):
        return True
    noted_ns = time.time_ns()  # before the stat of the bytes hashed (a later change is newer than this)
    h = hashlib.sha256()
    try:
        with open(blob, "rb", buffering=0) as f:
            before = os.fstat(f.fileno())
            if size is not None and before.st_size != size:
                return False
            buf = bytearray(READ_SIZE)
            view = memoryview(buf)
            while n := f.readinto(buf):
                h.update(view[:n])
            after = os.fstat(f.fileno())
    except OSError:
        return False
    if h.hexdigest() != hexdigest or (size is not None and after.st_size != size):
        forget(store_root, hexdigest)
        return False
    note_hashed(store_root, hexdigest, before, after, noted_ns)
    return True


def seal(store_root: Path, blobs: dict[str, Path]) -> None:
    """Re-date the notes of these blobs (hex -> path) whose stat is unchanged since noted and
    that are no longer racy now: from now on they are trusted from their stat."""
    now = time.time_ns()
    for hexdigest, blob in blobs.items():
        note = _read_note(_note_path(store_root, hexdigest))
        if note is None:
            continue
        try:
            st = os.stat(blob)
        except FileNotFoundError:
            continue
        if note[0] != stat_key(st) or not is_racy(st.st_mtime_ns, st.st_ctime_ns, note[1]):
            continue  # changed (the next check rehashes it), or trusted already
        if not is_racy(st.st_mtime_ns, st.st_ctime_ns, now):
            write_note(store_root, hexdigest, st, now)
