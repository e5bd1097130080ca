"""Normalized layer tars: the same tree gives the same bytes, anywhere, any day.

Entries come from a model, never from ``stat()``: sorted, parents explicit, integer mtime, uid/gid 0
unless a base's ownership is kept, modes 0644/0755, hardlinks as files, no xattrs, no devices.
"""

from __future__ import annotations

import io
import stat
import tarfile
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Literal

from hermetic.core.errors import DataError

COPY_BUFSIZE = 1 << 20
DIR_MODE = 0o755


@dataclass(frozen=True)
class DirAttrs:
    mode: int = DIR_MODE
    uid: int = 0
    gid: int = 0


@dataclass
class Entry:
    """One tar member to be. ``open`` supplies a regular file's bytes."""

    path: str  # relative POSIX path, no leading '/', no trailing '/', no '.' or '..'
    kind: Literal["file", "dir", "symlink"]
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    size: int = 0
    linkname: str = ""
    open: Callable[[], BinaryIO] | None = None

    def __post_init__(self) -> None:
        p = self.path
        if not p or p.startswith("/") or p.endswith("/") or any(part in ("", ".", "..") for part in p.split("/")):
            raise DataError(f"invalid path in layer: {p!r}")


def normalized_mode(st_mode: int) -> int:
    """0755 for anything executable by its owner, else 0644 (Jib/ko's rule)."""
    return 0o755 if st_mode & stat.S_IXUSR else 0o644


def _tarinfo(e: Entry, mtime: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(e.path)
    ti.mtime = mtime
    ti.uid, ti.gid = e.uid, e.gid
    ti.uname = ti.gname = ""
    ti.mode = e.mode
    if e.kind == "dir":
        ti.type = tarfile.DIRTYPE
    elif e.kind == "symlink":
        ti.type = tarfile.SYMTYPE
        ti.linkname = e.linkname
    else:
        ti.type = tarfile.REGTYPE
        ti.size = e.size
    return ti


def complete_parents(entries: Iterable[Entry], parent_attrs: dict[str, DirAttrs] | None = None) -> list[Entry]:
    """Add missing parent dirs; sort by byte path; refuse duplicates.

    ``parent_attrs`` gives the attributes of directories that already exist
    below this layer (the base image), so a synthesized parent does not
    change them.
    """
    parent_attrs = parent_attrs or {}
    by_path: dict[str, Entry] = {}
    for e in entries:
        if e.path in by_path:
            prev = by_path[e.path]
            if prev.kind == "dir" and e.kind == "dir":
                continue
            raise DataError(f"two entries for {e.path!r} in one layer")
        by_path[e.path] = e
    for path in list(by_path):
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in by_path:
                a = parent_attrs.get(parent, DirAttrs())
                by_path[parent] = Entry(parent, "dir", a.mode, a.uid, a.gid)
            elif by_path[parent].kind != "dir":
                raise DataError(f"{path!r} is inside {parent!r}, which is not a directory")
    return [by_path[p] for p in sorted(by_path, key=lambda s: s.encode("utf-8", "surrogateescape"))]


class _CountingWriter(io.RawIOBase):
    def __init__(self, sink) -> None:
        self._sink = sink
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self._sink.write(b)
        n = len(b)
        self.count += n
        return n

    def tell(self) -> int:
        return self.count


def write_layer(entries: list[Entry], sink, *, mtime: int) -> int:
    """Write a normalized tar of ``entries`` (already completed and sorted) to ``sink``.

    Returns the number of bytes written. ``sink`` needs only ``write``.
    """
    raw = _CountingWriter(sink)
    buffered = io.BufferedWriter(raw, buffer_size=COPY_BUFSIZE)
    tf = tarfile.TarFile(fileobj=buffered, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8")
    tf.copybufsize = COPY_BUFSIZE  # type: ignore[attr-defined]
    try:
        for e in entries:
            ti = _tarinfo(e, mtime)
            if e.kind == "file":
                if e.open is None:
                    raise DataError(f"{e.path}: no content source")
                with e.open() as f:
                    tf.addfile(ti, f)
            else:
                tf.addfile(ti)
    finally:
        tf.close()
        buffered.flush()
    return raw.count
