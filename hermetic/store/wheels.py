"""The wheel store: ``<root>/sha256/<hex>/<original filename>``, a file admitted through a locked temp file and an
atomic rename only after the sha256 of the bytes written is one allowed, so a wrong file never appears; a dead
download's temp file is swept, a full disk removes it at once (DiskFull).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from hermetic.core.canonical import is_sha256_hex
from hermetic.core.errors import IntegrityError, disk_full, is_disk_full
from hermetic.hostfs.filesystems import naming_full_disk
from hermetic.lock.model import LockedWheel, ResolvedWheel
from hermetic.hostfs.fsutil import READ_SIZE, OwnedTemp, replace_file, set_mode, sha256_file, sweep_dead_once



@dataclass(frozen=True)
class StoredWheel:
    sha256: str
    path: Path

    def resolved(self, locked: LockedWheel) -> ResolvedWheel:
        """The lock's pin as this file."""
        return ResolvedWheel(locked, self.path.name, self.sha256, self.path.stat().st_size, str(self.path))


class WheelStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def _dir(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def get(self, sha256: str) -> StoredWheel | None:
        d = self._dir(sha256)
        try:
            names = [n for n in os.listdir(d) if n.endswith(".whl")]
        except FileNotFoundError:
            return None
        if len(names) != 1:
            return None
        return StoredWheel(sha256, d / names[0])

    def find_any(self, sha256s: Iterable[str]) -> list[StoredWheel]:
        return [w for h in sha256s if (w := self.get(h)) is not None]

    def admit_stream(self, read: Callable[[int], bytes], filename: str, allowed: frozenset[str] | set[str],
                     *, what: str = "", on_bytes: Callable[[int], None] | None = None,
                     size: int | None = None) -> StoredWheel:
        """Copy a stream into the store if its sha256 is one of ``allowed``. ``size``: the file's
        size where known (a download's Content-Length), for the message when the disk is full."""
        if "/" in filename or not filename.endswith(".whl"):
            raise IntegrityError(f"{what or filename}: refusing to store {filename!r}: not a wheel file name")
        sweep_dead_once(self.tmp)  # the first writer of this process removes dead writers' files
        with naming_full_disk(self.root, filename, needed=size):
            owner = OwnedTemp(self.tmp, "wheel.")
        tmp = owner.path
        h = hashlib.sha256()
        written = 0
        try:
            with owner.open("wb") as f:
                while chunk := read(READ_SIZE):
                    f.write(chunk)
                    written += len(chunk)
                    h.update(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
                f.flush()
                os.fsync(f.fileno())
            actual = h.hexdigest()
            if actual not in allowed:
                expected = ", ".join(sorted(allowed)[:2]) + (" ..." if len(allowed) > 2 else "")
                raise IntegrityError(
                    f"{what or filename}: sha256 mismatch for {filename}: expected {expected}, got {actual}; not stored"
                )
            existing = self.get(actual)
            if existing is not None:
                owner.discard()
                return existing
            d = self._dir(actual)
            d.mkdir(parents=True, exist_ok=True)
            set_mode(owner.fd, 0o644)
            dest = d / filename
            replace_file(tmp, dest)
            owner.close()
            return StoredWheel(actual, dest)
        except BaseException as e:
            owner.discard()
            if is_disk_full(e):
                raise disk_full(e, self.root, what=filename, written=written, needed=size) from None  # type: ignore[arg-type]
            raise

    def admit_file(self, src: Path, allowed: frozenset[str] | set[str], *, what: str = "",
                   on_bytes: Callable[[int], None] | None = None) -> StoredWheel:
        with open(src, "rb") as f:
            return self.admit_stream(f.read, src.name, allowed, what=what, on_bytes=on_bytes,
                                     size=os.fstat(f.fileno()).st_size)

    def entries(self) -> Iterator[StoredWheel]:
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for d in sorted(base.iterdir()):
            w = self.get(d.name)
            if w is not None:
                yield w

    def verify(self) -> list[str]:
        """Rehash every stored wheel; one problem string per bad entry."""
        problems = []
        base = self.root / "sha256"
        if not base.is_dir():
            return problems
        for d in sorted(base.iterdir()):
            if not is_sha256_hex(d.name):
                problems.append(f"{d}: not a sha256 directory name")
                continue
            w = self.get(d.name)
            if w is None:
                if any(True for _ in d.iterdir()):
                    problems.append(f"{d}: expected exactly one .whl file")
                continue
            actual = sha256_file(w.path)
            if actual != d.name:
                problems.append(f"{w.path}: content hashes to {actual}, not {d.name}")
        return problems

    def remove(self, sha256: str) -> None:
        shutil.rmtree(self._dir(sha256), ignore_errors=True)
