"""A verified dataset's identity by stat alone: the (dev, ino, size, mtime_ns, ctime_ns) of each file that
verification took anyway, the root's (dev, ino), and the time before the first stat. ``hermetic run`` checks
them after the container exits (one scan, no hashing): any write, rename, touch or chmod changes a key. Files
in git's racy-clean case (hermetic.hostfs.fsutil.is_racy) are hashed again and compared with the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from hermetic.data.scan import StatKey, TreeError, scan_tree
from hermetic.hostfs.fsutil import is_racy, sha256_file

NAMED = 100  # paths of each kind a change keeps by name (``count`` says how many there were)


@dataclass(frozen=True)
class DatasetIdentity:
    """What a dataset was when it was verified: parallel lists in scan order (``paths`` as the manifest
    writes them), the root's (dev, ino), and the wall-clock time taken before any of it was stat-ed."""

    root: str  # absolute, symlinks resolved: the directory that was verified (and is mounted)
    root_key: tuple[int, int]
    paths: list[str] = field(repr=False)
    keys: list[StatKey] = field(repr=False)
    recorded_ns: int = 0
    exclude: frozenset[str] = frozenset()  # the manifest itself, when it lies inside the dataset

    def racy(self) -> list[int]:
        """Indices of the files whose key may hide a change made in the tick they were stat-ed in."""
        t = self.recorded_ns
        return [i for i, k in enumerate(self.keys) if is_racy(k[3], k[4], t)]


@dataclass(frozen=True)
class IdentityChange:
    """How a dataset differs from its identity: files whose stat key changed (or, for a racy one, whose
    bytes no longer match the manifest), files gone, files added; ``error`` when it could not be looked at
    again (removed, replaced by another directory, holding something a manifest cannot describe)."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.added or self.error)

    @property
    def count(self) -> int:
        return len(self.changed) + len(self.missing) + len(self.added)

    def summary(self) -> str:
        """``1 changed (train-x.f32); 2 added (a, b)``, or the error."""
        if self.error:
            return self.error
        parts = []
        for kind, paths in (("changed", self.changed), ("missing", self.missing), ("added", self.added)):
            if paths:
                shown = ", ".join(paths[:3]) + (f", +{len(paths) - 3} more" if len(paths) > 3 else "")
                parts.append(f"{len(paths)} {kind} ({shown})")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The record's ``data.<name>.changed_during_run`` (at most NAMED paths of each kind)."""
        return {"changed": self.changed[:NAMED], "missing": self.missing[:NAMED], "added": self.added[:NAMED],
                "count": self.count, "error": self.error}


def identity_of(root: str, root_key: tuple[int, int], paths: Sequence[str], keys: Sequence[StatKey],
                recorded_ns: int, exclude: frozenset[str] | set[str] = frozenset()) -> DatasetIdentity:
    return DatasetIdentity(root, root_key, list(paths), list(keys), recorded_ns, frozenset(exclude))


def check_identity(ident: DatasetIdentity, manifest_bytes: bytes = b"") -> IdentityChange:
    """``ident`` against the dataset as it is now: one scan with stats; the racy files (see the module doc)
    hashed and compared with ``manifest_bytes``. Never raises for what it finds on disk."""
    try:
        st = os.stat(ident.root)
        tree = scan_tree(ident.root, exclude=ident.exclude, stat=True)
    except (TreeError, OSError) as e:
        why = getattr(e, "message", None) or (e.strerror if isinstance(e, OSError) else None) or str(e)
        if isinstance(e, FileNotFoundError):
            why = f"{ident.root}: no longer exists"
        return IdentityChange(error=_printable(f"cannot be checked again: {why}"))
    if (st.st_dev, st.st_ino) != ident.root_key:
        return IdentityChange(error=_printable(f"{ident.root} is another directory now (replaced while the run "
                                               "went)"))
    if tree.paths == ident.paths and tree.keys == ident.keys:  # the usual case: two C-speed list comparisons
        changed: list[str] = []
        missing: list[str] = []
        added: list[str] = []
    else:
        before = dict(zip(ident.paths, ident.keys))
        now = dict(zip(tree.paths, tree.keys))
        changed = sorted(p for p, k in now.items() if p in before and before[p] != k)
        missing = sorted(p for p in before if p not in now)
        added = sorted(p for p in now if p not in before)
    racy = [ident.paths[i] for i in ident.racy()]
    if racy:
        gone = set(changed) | set(missing)
        changed = sorted(set(changed) | _racy_changed([p for p in racy if p not in gone], ident, manifest_bytes))
    return IdentityChange(changed, missing, added)


def _racy_changed(paths: list[str], ident: DatasetIdentity, manifest_bytes: bytes) -> set[str]:
    """Those of ``paths`` whose bytes are not what the manifest says (or cannot be read)."""
    if not paths:
        return set()
    from hermetic.data.manifest import ManifestError, parse_manifest

    try:
        expected = parse_manifest(manifest_bytes).entries
    except ManifestError:
        return set(paths)
    out = set()
    for p in paths:
        try:
            if sha256_file(os.path.join(ident.root, p)) != expected.get(p):
                out.add(p)
        except OSError:
            out.add(p)
    return out


def _printable(text: str) -> str:
    """One line a record can hold: undecodable bytes and control characters escaped."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)
