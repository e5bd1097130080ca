"""``hermetic cache verify`` and ``hermetic cache gc``: keep the stores honest and small.

verify rehashes every blob and wheel, checks every kept image is complete, and lists dead writers'
temp files (dead by their lock, fsutil.OwnedTemp, never by age); --repair removes what is bad.
gc keeps every ref but the older build-key refs (``NAME:bk-…``), what running processes claim, and
the attestations of what it keeps; the rest goes. Both hold the gc lock (builds hold it shared).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hermetic.core.canonical import is_sha256_hex
from hermetic.hostfs.fsutil import Leftovers, is_atomic_temp, sweep_dead, sweep_dead_once
from hermetic.core.paths import CachePaths
from hermetic.store import intact
from hermetic.store.inuse import claimed_images, collecting
from hermetic.store.oci import OciStore
from hermetic.store.wheels import WheelStore


def dead_temp_files(paths: CachePaths, *, remove: bool, once: bool = False) -> Leftovers:
    """Dead writers' temp files anywhere in the cache (removed, or with ``remove=False`` only
    counted): every file in the tmp/ directories, atomic writes' ``.NAME.*.tmp`` elsewhere.
    ``once`` (a build's sweep): the tmp/ directories count as this process's one sweep of them
    (fsutil.sweep_dead_once), so the stores' first writers do not sweep them again."""
    found = Leftovers()
    tmp_dirs = [paths.oci / "tmp", paths.wheels / "tmp", paths.tmp]
    for d in tmp_dirs:
        match = _not_held_by_a_container(d) if d == paths.tmp else None
        found.add(sweep_dead_once(d, match) if remove and once else sweep_dead(d, match, remove=remove))
    others = [paths.root, paths.oci, intact.notes_dir(paths.oci)]
    if paths.root.is_dir():
        others += sorted(p for p in paths.root.iterdir() if p.is_dir() and p not in tmp_dirs and p != paths.oci)
    for d in others:
        found.add(sweep_dead(d, is_atomic_temp, remove=remove))
    return found


def _not_held_by_a_container(directory: Path) -> Callable[[str], bool]:
    """A sweep_dead filter for the cache's tmp/: a run's working directory (an owned_temp_dir there) is left
    alone while a container holds it (engines.base.HOLDS_LABEL), even when the run's driver is dead and the
    lock free: a killed driver's container may still write there, until hermetic.run.orphans stops it. When
    no engine answers, no owned directory is swept (whose container is running cannot be told)."""
    from hermetic.engines import held_paths

    held: list[set[str] | None] = []

    def keep_out(name: str) -> bool:
        owned = directory / name.removesuffix(".lock")
        if not name.endswith(".lock") or not owned.is_dir():
            return True
        if not held:
            held.append(held_paths())  # asked once, and only when an owned directory's owner is in question
        return held[0] is not None and os.path.realpath(owned) not in held[0]

    return keep_out


@dataclass(frozen=True)
class BadBlob:
    name: str  # the file's name under blobs/sha256 (a digest's hex, or whatever is there)
    path: str  # the file, with the error when it could not be read
    reason: str


@dataclass(frozen=True)
class MissingBlob:
    """A blob a kept image needs that the store lacks."""

    ref: str  # the store ref that names the image
    image: str  # the manifest (or index) digest the ref names
    role: str  # "config", "layer 2", "manifest sha256:…", ...
    digest: str

    def __str__(self) -> str:
        return f"image {self.ref} ({self.image}): {self.role} blob {self.digest} is missing from the store"


@dataclass
class VerifyReport:
    """Both stores checked: what ``cache verify`` and ``doctor`` report."""

    rehashed: bool = True  # False: listed only (doctor --quick), nothing read
    blobs: int = 0
    blob_bytes: int = 0
    bad_blobs: list[BadBlob] = field(default_factory=list)
    missing: list[MissingBlob] = field(default_factory=list)  # blobs kept images need, not in the store
    wheels: int = 0
    wheel_problems: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    leftovers: Leftovers = field(default_factory=Leftovers)  # dead writers' temp files (gc removes them)

    @property
    def incomplete_refs(self) -> list[str]:
        """Refs whose image lacks a blob."""
        return sorted({m.ref for m in self.missing})

    @property
    def problems(self) -> list[str]:
        return ([f"blob {b.name}: {b.reason}" for b in self.bad_blobs] + [str(m) for m in self.missing]
                + [f"wheel {p}" for p in self.wheel_problems])

    @property
    def ok(self) -> bool:
        return not self.problems


REBUILD_HINT = ("build it again (`hermetic build` in its project), pull it again (`hermetic pull REF@DIGEST`), "
                "or bootstrap the base again (`hermetic base bootstrap`)")


def verify(paths: CachePaths, *, repair: bool = False, rehash: bool = True,
           on_blob: Callable[[int], None] | None = None,
           on_wait: Callable[[list[int]], None] | None = None) -> VerifyReport:
    """Rehash every OCI blob and stored wheel (``rehash=False``: only list them), and check that
    every kept image is complete.

    ``on_blob(size)`` after each blob, for progress. With ``repair`` a corrupt
    entry is deleted, and the cache entries that point at it, so the next
    build or fetch recreates it; so is the ref of an incomplete image. A
    repair holds the gc lock (``on_wait(pids)`` when it waits for builds).
    """
    store = OciStore(paths.oci)
    repair = repair and store.root.is_dir()
    rep = VerifyReport(rehashed=rehash)
    with collecting(store, on_wait) if repair else contextlib.nullcontext():
        _verify_blobs(store, rep, repair=repair, on_blob=on_blob)
        if store.index_path.exists():
            for ref, desc in sorted(store.refs().items()):
                rep.missing += missing_blobs(store, ref, desc.digest)
            if repair:
                for ref in rep.incomplete_refs:
                    store.remove_ref(ref)
                    rep.removed.append(f"ref {ref} (incomplete: {REBUILD_HINT})")
        wheels = WheelStore(paths.wheels)
        rep.wheels = sum(1 for _ in wheels.entries())
        if rehash:
            for p in wheels.verify():
                rep.wheel_problems.append(p)
                if repair:
                    sha = Path(p.split(":")[0]).parent.name
                    wheels.remove(sha)
                    rep.removed.append(f"wheel {sha}")
        if repair and rep.removed:
            _drop_dangling_entries(paths, store)
        rep.leftovers = dead_temp_files(paths, remove=False)
        return rep


def missing_blobs(store: OciStore, ref: str, digest: str) -> list[MissingBlob]:
    """What the image ``ref`` names (``digest``: its manifest or index) and the store lacks (OciStore.walk:
    of a referrers index, every manifest it lists, as the store writes them all)."""
    from hermetic.store.referrers import subject_of_tag

    every_child = subject_of_tag(ref) is not None
    return [MissingBlob(ref, digest, role, d) for role, d, present in store.walk(digest, every_child=every_child)
            if not present]


def _verify_blobs(store: OciStore, rep: VerifyReport, *, repair: bool,
                  on_blob: Callable[[int], None] | None) -> None:
    root = store.root / "blobs" / "sha256"
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        rep.blobs += 1
        path, size = str(entry), 0
        if not is_sha256_hex(entry.name):
            rep.bad_blobs.append(BadBlob(entry.name, f"{entry} (not a sha256 name)", "not a sha256 name"))
            continue
        digest = "sha256:" + entry.name
        try:
            size = entry.stat().st_size
            matches = store.verify_blob(digest) if rep.rehashed else True
        except OSError as e:  # a directory or an unreadable file where a blob should be
            matches, path = False, f"{entry} ({e.__class__.__name__})"
        rep.blob_bytes += size
        if not matches:
            rep.bad_blobs.append(BadBlob(digest, path, "content does not match its digest"))
            if repair:
                if entry.is_file() or entry.is_symlink():
                    store.remove_blob(digest)  # the file and what intact knew of it
                else:  # a directory where a blob should be
                    shutil.rmtree(entry, ignore_errors=True)
                    intact.forget(store.root, entry.name)
                rep.removed.append(digest)
        if on_blob is not None:
            on_blob(size)


def _drop_dangling_entries(paths: CachePaths, store: OciStore) -> int:
    n = 0
    for d, key in ((paths.layers, "descriptor"), (paths.builds, None)):
        if not d.is_dir():
            continue
        for f in d.glob("*.json"):
            try:
                entry = json.loads(f.read_text())
            except ValueError:
                f.unlink(missing_ok=True)
                n += 1
                continue
            if key:
                complete = store.has_blob(entry[key]["digest"])
            else:  # a build entry: its whole image (a no-op would otherwise trust a partial one)
                manifest = entry.get("manifest_digest", "")
                complete = bool(manifest) and store.has_image(manifest)
            if not complete:
                f.unlink(missing_ok=True)
                n += 1
    return n


@dataclass
class GcReport:
    kept_refs: list[str]
    dropped_refs: list[str]
    removed_blobs: int
    freed_bytes: int  # of the blobs
    removed_entries: int
    temp_files: int = 0  # dead writers' temp files
    temp_bytes: int = 0


def gc(paths: CachePaths, *, keep_builds: int = 10, dry_run: bool = False,
       on_wait: Callable[[list[int]], None] | None = None) -> GcReport:
    """Remove what no kept image needs (module doc), holding the gc lock: it waits for running
    builds (``on_wait(pids)`` first, when there are any), and no build starts until it is done."""
    store = OciStore(paths.oci)
    if not store.root.is_dir():
        temp = dead_temp_files(paths, remove=not dry_run)
        return GcReport([], [], 0, 0, 0, temp.count, temp.bytes)
    with collecting(store, on_wait):
        refs = store.refs() if store.index_path.exists() else {}
        build_refs = [n for n in refs if ":bk-" in n]
        mtime = {}
        for n in build_refs:
            prefix = n.split(":bk-", 1)[1]
            hits = list(paths.builds.glob(f"{prefix}*.json")) if paths.builds.is_dir() else []
            mtime[n] = max((h.stat().st_mtime for h in hits), default=0.0)
        build_refs.sort(key=lambda n: mtime[n], reverse=True)
        dropped = build_refs[keep_builds:]
        from hermetic.store.referrers import referrers_to_keep, subject_of_tag

        kept = [n for n in refs if n not in dropped and subject_of_tag(n) is None]
        live: set[str] = set()
        for n in kept:
            live |= store.live_blobs_from(refs[n].digest)
        # Images running processes use (a run's), named by a ref or not.
        for digest in claimed_images(store, sweep=not dry_run):
            live |= store.live_blobs_from(digest)
        # Attestations (OCI 1.1 referrers) live exactly as long as the image they are about (not reported as refs).
        attached, orphaned = referrers_to_keep(store, refs, live)
        live |= attached
        removed = freed = 0
        if not dry_run:
            for n in dropped + orphaned:
                store.remove_ref(n)
        for digest in list(store.iter_blobs()):
            if digest in live:
                continue
            p = store.blob_path(digest)
            try:
                freed += p.stat().st_size
            except FileNotFoundError:
                continue
            removed += 1
            if not dry_run:
                store.remove_blob(digest)
        entries = 0
        if not dry_run:
            entries = _drop_dangling_entries(paths, store)
            notes = intact.notes_dir(store.root)  # intact.py's notes of blobs that are gone
            for note in notes.iterdir() if notes.is_dir() else ():
                if is_sha256_hex(note.name) and not store.has_blob("sha256:" + note.name):
                    note.unlink(missing_ok=True)
                    entries += 1
        temp = dead_temp_files(paths, remove=not dry_run)
        return GcReport(sorted(kept), sorted(dropped), removed, freed, entries, temp.count, temp.bytes)
