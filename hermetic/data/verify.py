"""Verifying a dataset directory against its manifest (missing, extra, changed files), and making manifests.
The stat cache (hermetic.data.statcache) supplies the digests of unchanged files; ``full=True`` re-hashes all."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import os
import stat as statmod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from hermetic.data.hashfiles import hash_files
from hermetic.data.hashing import Hashed
from hermetic.data.identity import DatasetIdentity, identity_of
from hermetic.data.manifest import (
    Manifest, first_names, make_manifest, parse_columns, parse_manifest, read_manifest_bytes,
)
from hermetic.data.scan import Tree, TreeError, resolve_root, scan_tree
from hermetic.data.statcache import StatCache
from hermetic.core.errors import HermeticError, UsageError

Mode = Literal["stat-cache", "full"]
# Stat-cache note meaning "these digests matched the manifest with this sha256".
_OK_NOTE = b"verified-manifest-sha256:"


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_dataset`` found. ``file_count``/``total_bytes``: the directory as scanned (not the
    manifest's own file); when ``ok``, the dataset's bytes.count (BagIt Payload-Oxum)."""

    root: str
    manifest_path: str
    manifest_sha256: str
    mode: Mode
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # (path, expected, actual)
    file_count: int = 0
    total_bytes: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    cached_files: int = 0
    seconds: float = 0.0
    # The manifest's bytes exactly as verified: what a run keeps as its copy (never re-read from disk).
    manifest_bytes: bytes = field(default=b"", repr=False, compare=False)
    # What not everyone may read (scan.Tree.restricted; hermetic.data.access); None in full mode.
    restricted: tuple[tuple[str, int, int, int], ...] | None = field(default=None, repr=False, compare=False)
    # Each file's stat key as verified (hermetic.data.identity): what `hermetic run` checks after the container.
    identity: DatasetIdentity | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed)

    @property
    def oxum(self) -> str:
        return f"{self.total_bytes}.{self.file_count}"

    def summary(self) -> str:
        """One line: 'OK ...' or the counts of each kind of problem, naming the first few."""
        if self.ok:
            return (f"{self.root}: OK, {self.file_count} files, {self.total_bytes} bytes "
                    f"(manifest sha256 {self.manifest_sha256[:12]}, {self.mode})")
        kinds = (("changed", [p for p, _, _ in self.changed]), ("missing", self.missing), ("extra", self.extra))
        parts = [f"{len(paths)} {kind} ({first_names(paths)})" for kind, paths in kinds if paths]
        return f"{self.root} does not match {self.manifest_path}: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "root": self.root, "manifest": self.manifest_path,
            "manifest_sha256": self.manifest_sha256, "mode": self.mode,
            "file_count": self.file_count, "total_bytes": self.total_bytes, "oxum": self.oxum,
            "missing": self.missing, "extra": self.extra,
            "changed": [{"path": p, "expected": e, "actual": a} for p, e, a in self.changed],
            "hashed_files": self.hashed_files, "hashed_bytes": self.hashed_bytes,
            "cached_files": self.cached_files, "seconds": round(self.seconds, 3),
        }


def verify_dataset(
    root: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    *,
    full: bool = False,
    progress: bool = False,
    stat_cache: StatCache | None = None,
    workers: int | None = None,
) -> VerifyReport:
    """Compare ``root`` with its manifest: mismatches are reported; a malformed manifest (ManifestError) or a
    tree that cannot be described safely (TreeError: escaping links, FIFOs, NFC/NFD twins) raised."""
    started = time.perf_counter()
    recorded_ns = time.time_ns()  # before any stat: the racy-clean reference time
    with _gc_paused():
        manifest_bytes = read_manifest_bytes(manifest_path)
        real_root = resolve_root(root)
        exclude = _inside(real_root, manifest_path)
        cache = stat_cache if stat_cache is not None else StatCache.for_tree(real_root)
        label = _label(real_root) if progress else None
        restricted = None
        root_st = os.stat(real_root)
        root_key = (root_st.st_dev, root_st.st_ino)
        tree = scan_tree(real_root, exclude=exclude, stat=not full)
        job = _Job(real_root, manifest_path, manifest_bytes, tree, cache, recorded_ns, workers, label)
        if full:
            report = job.full()
            identity = identity_of(real_root, root_key, job.seen[0], job.seen[1], recorded_ns, exclude)
        else:
            restricted = tuple(tree.restricted)
            report = job.with_stat_cache()
            identity = identity_of(real_root, root_key, tree.paths, tree.keys, recorded_ns, exclude)
    return dataclasses.replace(report, seconds=time.perf_counter() - started, manifest_bytes=manifest_bytes,
                               restricted=restricted, identity=identity)


class _Job:
    """One verification: the manifest bytes, the cache, the scanned tree."""

    def __init__(self, real_root: str, manifest_path: str | os.PathLike[str], manifest_bytes: bytes,
                 tree: Tree, cache: StatCache, recorded_ns: int, workers: int | None, label: str | None):
        self.root, self.manifest_path, self.manifest_bytes = real_root, str(manifest_path), manifest_bytes
        self.tree, self.cache, self.recorded_ns = tree, cache, recorded_ns
        self.workers, self.label = workers, label
        self._sha256: str | None = None  # the manifest's; parsing computes it too, so it is taken from there
        # (paths, stat keys) of the files ``full`` hashed, each key its worker's fstat: the identity
        self.seen: tuple[list[str], list[Any]] = ([], [])

    @property
    def manifest_sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.manifest_bytes).hexdigest()
        return self._sha256

    @property
    def ok_note(self) -> bytes:
        return _OK_NOTE + self.manifest_sha256.encode()

    def parse(self) -> dict[str, str]:
        return parse_manifest(self.manifest_bytes, self.manifest_path).entries

    def report(self, mode: Mode, **kw: Any) -> VerifyReport:
        return VerifyReport(root=self.root, manifest_path=self.manifest_path,
                            manifest_sha256=self.manifest_sha256, mode=mode, **kw)

    def with_stat_cache(self) -> VerifyReport:
        tree, cache = self.tree, self.cache
        paths, keys, abs_paths = tree.paths, tree.keys, tree.abs_paths
        total_bytes = tree.total_bytes
        if cache.note == self.ok_note and cache.digests_if_unchanged(abs_paths, keys) is not None:
            # The last verify found these very digests equal to this very manifest, and
            # nothing in the tree moved since: same answer, without even parsing it.
            return self.report("stat-cache", file_count=len(paths), total_bytes=total_bytes,
                               cached_files=len(paths))
        expected = self.parse()
        extra, missing, checked = _partition(paths, expected)
        c_paths = paths if checked is None else [paths[i] for i in checked]
        c_keys = keys if checked is None else [keys[i] for i in checked]
        c_abs = abs_paths if checked is None else [abs_paths[i] for i in checked]
        hashed_files = hashed_bytes = 0
        digests = cache.get_many(c_abs, c_keys)
        todo = [j for j, d in enumerate(digests) if d is None]
        if todo:
            hashed = hash_files([c_abs[j] for j in todo], [c_keys[j][2] for j in todo],
                                workers=self.workers, progress_label=self.label)
            gone = set(hashed.vanished)
            if len(todo) == len(c_paths) and checked is None and not gone:
                cache.replace(c_abs, hashed.keys_little_endian(), self.recorded_ns, hashed.digests)
            else:
                done = [(k, j) for k, j in enumerate(todo) if k not in gone]
                cache.put_many([c_abs[j] for _, j in done], [hashed.key(k) for k, _ in done],
                               [hashed.hex(k) for k, _ in done], self.recorded_ns)
                lost = {todo[k] for k in gone}
                cache.retain([a for j, a in enumerate(c_abs) if j not in lost])
            for k, j in enumerate(todo):
                if k in gone:  # deleted while we were hashing
                    missing.append(c_paths[j])
                    digests[j] = None
                else:
                    digests[j] = hashed.hex(k)
            hashed_files = len(todo) - len(gone)
            hashed_bytes = sum(c_keys[j][2] for k, j in enumerate(todo) if k not in gone)
        else:
            cache.retain(c_abs)
        changed = [(p, expected[p], d) for p, d in zip(c_paths, digests) if d is not None and d != expected[p]]
        if not (missing or extra or changed):
            cache.set_note(self.ok_note)
        cache.save()
        return self.report("stat-cache", missing=sorted(missing), extra=sorted(extra), changed=sorted(changed),
                           file_count=len(paths), total_bytes=total_bytes, hashed_files=hashed_files,
                           hashed_bytes=hashed_bytes, cached_files=len(c_paths) - hashed_files)

    def full(self) -> VerifyReport:
        """Hash every file; meanwhile parse the manifest and line its digests up with the scan, so that one
        bytes comparison settles the usual case."""
        ready: dict[str, Any] = {}

        def parse() -> None:
            ready["columns"] = columns = parse_columns(self.manifest_bytes, self.manifest_path)
            self._sha256 = columns.sha256

        def line_up(tree: Tree) -> None:  # in this process, while the workers hash
            expected = ready["columns"].digests
            if len(tree.paths) == len(expected):
                with contextlib.suppress(KeyError):  # (a file the manifest does not list)
                    ready["expected"] = b"".join(map(expected.__getitem__, tree.paths))
                    # Freed now, while the workers hash, rather than after them; a dataset
                    # that turns out to differ has its manifest parsed again, to say how.
                    del ready["columns"]

        tree = self.tree

        def meanwhile() -> None:
            parse()
            line_up(tree)

        hashed = hash_files(tree.abs_paths, None, workers=self.workers, progress_label=self.label,
                            while_hashing=meanwhile)
        paths = tree.paths
        gone = set(hashed.vanished)
        keep = [i for i in range(len(paths)) if i not in gone] if gone else range(len(paths))
        if not gone and hashed.digests == ready.get("expected"):  # the usual case, in one comparison
            extra: list[str] = []
            missing: list[str] = []
            changed: list[tuple[str, str, str]] = []
        else:
            expected = (ready.get("columns") or parse_columns(self.manifest_bytes, self.manifest_path)).digests
            extra = [paths[i] for i in keep if paths[i] not in expected]
            present = {paths[i] for i in keep}
            missing = [p for p in expected if p not in present]
            changed = []
            for i in keep:
                want = expected.get(paths[i])
                if want is not None and hashed.digests[i * 32:i * 32 + 32] != want:
                    changed.append((paths[i], want.hex(), hashed.hex(i)))
        self._record(tree, hashed, keep, ok=not (missing or extra or changed))
        flat = memoryview(hashed.keys).cast("q")
        every = list(zip(*[iter(flat)] * 5))  # each file's key as a tuple, at C speed
        self.seen = ((paths, every) if not gone else ([paths[i] for i in keep], [every[i] for i in keep]))
        total = sum(hashed.sizes())
        return self.report("full", missing=sorted(missing), extra=sorted(extra), changed=sorted(changed),
                           file_count=len(keep), total_bytes=total, hashed_files=len(keep),
                           hashed_bytes=total, cached_files=0)

    def _record(self, tree: Tree, hashed: Hashed, keep: Sequence[int], *, ok: bool) -> None:
        """Put what ``full`` hashed in the stat cache."""
        cache = self.cache
        if len(keep) == len(tree.paths):
            cache.replace(tree.abs_paths, hashed.keys_little_endian(), self.recorded_ns, hashed.digests)
        else:
            abs_paths = tree.abs_paths
            cache.put_many([abs_paths[i] for i in keep], [hashed.key(i) for i in keep],
                           [hashed.hex(i) for i in keep], self.recorded_ns)
            cache.retain([abs_paths[i] for i in keep])
        if ok:
            cache.set_note(self.ok_note)
        cache.save()


def _partition(paths: list[str], expected: dict[str, str]) -> tuple[list[str], list[str], list[int] | None]:
    """(extra, missing, indices of paths in the manifest -- None meaning all of them)."""
    if len(paths) == len(expected) and expected.keys() == set(paths):
        return [], [], None  # the usual case, decided by one set comparison
    checked: list[int] = []
    extra: list[str] = []
    for i, p in enumerate(paths):
        if p in expected:
            checked.append(i)
        else:
            extra.append(p)
    missing: list[str] = []
    if len(checked) != len(expected):
        present = set(paths)
        missing = [p for p in expected if p not in present]
    return extra, missing, (None if len(checked) == len(paths) else checked)


def build_manifest(
    root: str | os.PathLike[str],
    *,
    exclude: Sequence[str | os.PathLike[str]] = (),
    progress: bool = False,
    stat_cache: StatCache | None = None,
    workers: int | None = None,
) -> Manifest:
    """Hash every file under ``root`` into a Manifest, but ``exclude`` (the manifest's own file) and the file
    stdout is redirected to; the digests go to the stat cache, so the first ``verify`` afterwards is fast."""
    recorded_ns = time.time_ns()
    real_root = resolve_root(root)
    skip: set[str] = set()
    for path in [*exclude, *_stdout_file()]:
        skip |= _inside(real_root, path)
    with _gc_paused():
        tree = scan_tree(real_root, exclude=skip, stat=False)
        abs_paths = tree.abs_paths
        hashed = hash_files(abs_paths, None, workers=workers,
                            progress_label=_label(real_root) if progress else None)
        if hashed.vanished:
            gone = tree.paths[hashed.vanished[0]]
            raise TreeError(f"{real_root}/{gone}: disappeared while hashing; is something writing to the dataset?")
        manifest = make_manifest(dict(zip(tree.paths, hashed.hexes())), sum(hashed.sizes()))
        cache = stat_cache if stat_cache is not None else StatCache.for_tree(real_root)
        cache.replace(abs_paths, hashed.keys_little_endian(), recorded_ns, hashed.digests)
        cache.set_note(_OK_NOTE + manifest.sha256.encode())
        cache.save()
        return manifest


@dataclass(frozen=True)
class DatasetReport:
    name: str
    mount: str
    report: VerifyReport


def verify_configured(
    cfg: Any, names: Sequence[str] | None = None, *, full: bool = False, progress: bool = False,
) -> list[DatasetReport]:
    """Verify the datasets a LoadedConfig declares (all, or ``names``); errors name the dataset."""
    declared = {d.name: d for d in cfg.model.datasets}
    if names:
        unknown = [n for n in names if n not in declared]
        if unknown:
            have = ", ".join(declared) or "none"
            raise UsageError(f"{cfg.path}: no dataset named {unknown[0]!r} (declared: {have})")
        chosen = [declared[n] for n in dict.fromkeys(names)]
    else:
        chosen = list(cfg.model.datasets)
    out = []
    for d in chosen:
        try:
            report = verify_dataset(cfg.resolve(d.path), cfg.resolve(d.manifest), full=full, progress=progress)
        except HermeticError as e:
            e.message = f"dataset {d.name!r} ({cfg.path}): {e.message}"
            e.args = (e.message,)
            raise
        out.append(DatasetReport(d.name, d.mount, report))
    return out


def _inside(real_root: str, path: str | os.PathLike[str]) -> set[str]:
    """{path relative to root} if ``path`` lies inside ``real_root``, else {}."""
    real = os.path.realpath(path)
    if real.startswith(real_root + "/"):
        return {real[len(real_root) + 1:]}
    return set()


def _stdout_file() -> list[str]:
    """The regular file stdout is redirected to, if any (``hermetic data manifest d > d/m.txt``)."""
    try:
        st = os.fstat(1)
        if not statmod.S_ISREG(st.st_mode):
            return []
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return []
    return [target] if target.startswith("/") else []


def _label(real_root: str) -> str:
    return f"hashing {Path(real_root).name}"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while building 100,000-element lists of tuples (it would re-scan them repeatedly)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def problem_lines(report: VerifyReport, label: str = "", per_kind: int = 20) -> list[str]:
    """One line per problem (``label`` first), at most ``per_kind`` of each kind, then how many more."""
    lines: list[str] = []
    shown: dict[str, int] = {}
    hidden: dict[str, int] = {}
    for kind, path, detail in iter_problems(report):
        shown[kind] = shown.get(kind, 0) + 1
        if shown[kind] > per_kind:
            hidden[kind] = hidden.get(kind, 0) + 1
            continue
        lines.append(f"{label}{kind:<8} {path}" + (f"  ({detail})" if detail else ""))
    lines += [f"{label}... and {n} more {kind} (--json lists all)" for kind, n in hidden.items()]
    return lines


def iter_problems(report: VerifyReport) -> Iterator[tuple[str, str, str]]:
    """(kind, path, detail) for each problem, changed first -- for printing."""
    for p, e, a in report.changed:
        yield "changed", p, f"expected {e}, got {a}"
    for p in report.missing:
        yield "missing", p, ""
    for p in report.extra:
        yield "extra", p, ""
