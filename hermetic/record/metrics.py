"""Metrics from what the script already writes (``run.metrics``: ``auto``, ``none`` or a list of sources).

Sources under outputs/: ``metrics.jsonl``, TensorBoard event files, Lightning's ``metrics.csv``, the Trainer's
``trainer_state.json`` and ``*_results.json``. Read within the caps below, once, and written to
``runs/<id>/metrics/series.jsonl``, whose sha256 the record keeps. Wall-clock figures are never compared.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from hermetic.hostfs import safetree
from hermetic.core.errors import DataError, IntegrityError
from hermetic.record.outputs import NONFINITE, decode_number, encode_number

JSONL = "metrics.jsonl"
TENSORBOARD = "tensorboard"
LIGHTNING = "lightning"
TRAINER = "trainer"
SOURCES = (JSONL, TENSORBOARD, LIGHTNING, TRAINER)
JSONL_FILE = "metrics.jsonl"  # at the top of outputs/
SERIES_FILE = "metrics/series.jsonl"  # in the run directory, written by hermetic

# Bounds on what the script's files may make hermetic read and keep (hermetic run stays within 300 MB).
MAX_FILE_BYTES = 16 << 20  # one trainer_state.json or *_results.json (parsed whole)
MAX_CSV_BYTES = 64 << 20  # read of one metrics.csv (streamed)
MAX_CSV_LINE = 4 << 20  # characters of one metrics.csv line
MAX_EVENT_FILE_BYTES = 256 << 20  # one TensorBoard event file
MAX_EVENT_BYTES = 1 << 30  # all of a run's event files together
MAX_FILES = 256  # files of one source
MAX_METRICS = 1000  # metric names of a run
MAX_NAME = 200  # characters of one metric name
MAX_COLUMNS = 1000  # columns of one metrics.csv
MAX_POINTS = 100_000  # points kept of one metric's series (its final value is the last one, always)
MAX_TOTAL_POINTS = 500_000  # points kept in all

_RESULTS = re.compile(r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*_results\.json$")  # all_results.json, eval_results.json
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_WALL_CLOCK = re.compile(r"(?:^|_)(?:runtime|time|timestamp|walltime|duration|elapsed|seconds|secs)(?:_|$)"
                         r"|_per_sec(?:ond)?$")
COUNTERS = frozenset({"epoch", "batch", "iteration", "global_step", "step"})  # logged beside metrics


def is_wall_clock(name: str) -> bool:
    """Whether a framework's metric is a wall-clock figure (never compared): a time or a rate per second."""
    return bool(_WALL_CLOCK.search(re.split(r"[/.]", name)[-1].lower()))


def is_counter(name: str) -> bool:
    """``epoch``, ``tensorboard/epoch``...: a count logged beside the metrics (plots leave them out)."""
    return re.split(r"[/.]", name)[-1] in COUNTERS


def enabled_sources(setting: Any) -> tuple[str, ...]:
    """``run.metrics`` as the sources to read: ``auto`` (or absent) every one, ``none`` none, a list those named."""
    if setting in (None, "auto"):
        return SOURCES
    if setting == "none":
        return ()
    return tuple(s for s in SOURCES if s in setting)


# ---------------------------------------------------------------- finding the files


@dataclass
class Found:
    """Each source's files (record names, relative to outputs/), and what was passed over."""

    files: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def source_of_file(rel: str) -> str | None:
    base = rel.rsplit("/", 1)[-1]
    if rel == JSONL_FILE:
        return JSONL
    if base.startswith("events.out.") and "tfevents" in base:  # TensorBoard's own test (IsSummaryEventsFile)
        return TENSORBOARD
    if base == "metrics.csv":
        return LIGHTNING
    if base == "trainer_state.json" or _RESULTS.match(base):
        return TRAINER
    return None


def find_sources(files: dict[str, dict[str, Any]], enabled: Sequence[str]) -> Found:
    """The files of each enabled source among the recorded outputs: regular files only (a link or FIFO is noted)."""
    found = Found()
    for rel in sorted(files):
        source = source_of_file(rel)
        if source is None or source not in enabled:
            continue
        entry = files[rel]
        if entry.get("symlink") is not None or entry.get("type"):
            kind = "link" if entry.get("symlink") is not None else entry["type"]
            found.notes.append(f"outputs/{rel}: a {kind}, not a regular file: its metrics were not read")
            continue
        found.files.setdefault(source, []).append(rel)
    for source, rels in found.files.items():
        if len(rels) > MAX_FILES:
            found.notes.append(f"{source}: more than {MAX_FILES} files; only the first {MAX_FILES} were read")
            del rels[MAX_FILES:]
    if TRAINER in found.files:
        found.files[TRAINER] = _latest_trainer_states(found.files[TRAINER])
    return found


def _run_dir_of(rel: str) -> str:
    """The directory a file's metrics belong to: a Trainer checkpoint's is its parent's."""
    d = posixpath.dirname(rel)
    if _CHECKPOINT.match(posixpath.basename(d)):
        d = posixpath.dirname(d)
    return d


def _latest_trainer_states(rels: list[str]) -> list[str]:
    """``*_results.json`` and, per run directory, one trainer_state.json: its own, else the newest checkpoint's."""
    states: dict[str, tuple[int, str]] = {}
    kept = []
    for rel in rels:
        m = _CHECKPOINT.match(posixpath.basename(posixpath.dirname(rel)))
        if posixpath.basename(rel) != "trainer_state.json":
            if not m:
                kept.append(rel)  # a checkpoint holds no results files of its own; if one does, it is stale
            continue
        rank = 1 << 62 if m is None else int(m.group(1))  # the run directory's own state is the final one
        run = _run_dir_of(rel)
        if run not in states or rank > states[run][0]:
            states[run] = (rank, rel)
    return sorted(kept + [rel for _, rel in states.values()])


# ---------------------------------------------------------------- reading (in the collection child)


class Kept:
    """What a run's readers keep across files, within MAX_METRICS, MAX_NAME, MAX_POINTS and MAX_TOTAL_POINTS;
    ``left_out`` counts the rest (``points``, ``other_names``, ``values``, ``columns``, ``bytes``).
    """

    def __init__(self, parts: Iterable[dict[str, Any]] = (), left_out: dict[str, int] | None = None):
        parts = list(parts)
        self.names = {(p["source"], k) for p in parts for k in p["series"]}
        self.points = sum(len(v) for p in parts for v in p["series"].values())
        self.left_out: dict[str, int] = dict(left_out or {})
        self.cut: dict[str, int] = {}  # metric -> points it had past MAX_POINTS (or the total)
        self.said: list[str] = []

    def skip(self, what: str, n: int = 1) -> None:
        self.left_out[what] = self.left_out.get(what, 0) + n

    def add(self, source: str, series: dict[str, list[list[Any]]], name: str, step: int, value: Any) -> None:
        points = series.get(name)
        if points is None:
            if (source, name) not in self.names:
                if len(name) > MAX_NAME or len(self.names) >= MAX_METRICS:
                    return self.skip("other_names")
                self.names.add((source, name))
            points = series[name] = []
        value = _number(value)
        if value is None:
            return self.skip("values")
        if len(points) >= MAX_POINTS or self.points >= MAX_TOTAL_POINTS:
            self.skip("points")
            self.cut[name] = self.cut.get(name, len(points)) + 1
            if points:
                points[-1] = [step, value]  # the final value stays the last one written
            return None
        points.append([step, value])
        self.points += 1
        return None

    def notes(self) -> list[str]:
        return self.said + [f"{name}: {n} points; the series keeps the first {MAX_POINTS - 1} and the last"
                            for name, n in sorted(self.cut.items())]


def _number(v: Any) -> float | int | str | None:
    """A number the record can hold (huge int as float, non-finite by name); None for a boolean or anything else."""
    if isinstance(v, str):
        return v if v in NONFINITE else None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    return encode_number(v)


def read_jsonl_part(outputs_fd: int, kept: Kept, label: str = "outputs/metrics.jsonl") -> dict[str, Any]:
    """metrics.jsonl as a part: every metric's points in file order, steps as metrics_summary counts them."""
    from hermetic.record.outputs import _parse_metric_lines

    fd = safetree.open_regular(outputs_fd, JSONL_FILE)
    series: dict[str, list[list[Any]]] = {}
    count = 0
    max_step = None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="\n") as f:
        for n, step, values in _parse_metric_lines(Path(label), f):
            count = n
            if step is not None:
                max_step = step if max_step is None else max(max_step, step)
            for name, value in values:
                kept.add(JSONL, series, name, n if step is None else step, value)
    return {"source": JSONL, "file": JSONL_FILE, "series": series, "final": {},
            "steps": max_step if max_step is not None else count}


def _csv_lines(f: io.TextIOBase, kept: Kept, label: str) -> Iterable[str]:
    """The lines of a metrics.csv up to MAX_CSV_BYTES (the rest counted in ``left_out.bytes``)."""
    total = 0
    while line := f.readline(MAX_CSV_LINE + 1):
        if len(line) > MAX_CSV_LINE:
            raise DataError(f"{label}: a line longer than {MAX_CSV_LINE} characters")
        total += len(line)
        if total > MAX_CSV_BYTES:
            kept.skip("bytes", max(os.fstat(f.fileno()).st_size - total + len(line), 1))
            kept.said.append(f"{label}: only its first {MAX_CSV_BYTES >> 20} MiB were read")
            return
        yield line


def read_lightning_csv(f: io.TextIOBase, label: str, kept: Kept) -> dict[str, list[list[Any]]]:
    """Lightning's CSVLogger metrics.csv: a header and a row per logging call; ``step`` (else the row number)."""
    reader = csv.reader(_csv_lines(f, kept, label))
    try:
        header = next(reader)
    except StopIteration:
        return {}
    except csv.Error as e:
        raise DataError(f"{label}:1: not CSV: {e}") from None
    if len(header) > MAX_COLUMNS:
        kept.skip("columns", len(header) - MAX_COLUMNS)
        header = header[:MAX_COLUMNS]
    header = [h.strip() for h in header]
    step_col = header.index("step") if "step" in header else None
    series: dict[str, list[list[Any]]] = {}
    try:
        for rowno, row in enumerate(reader, 1):
            step = rowno
            if step_col is not None and step_col < len(row):
                try:
                    step = int(float(row[step_col]))
                except (ValueError, OverflowError):
                    pass
            for col, cell in zip(header, row):
                if col == "step" or not col or not cell.strip():
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue  # a text column: not a metric
                kept.add(LIGHTNING, series, col, step, value)
    except csv.Error as e:
        raise DataError(f"{label}:{reader.line_num}: not CSV: {e}") from None
    return series


def read_trainer_state(data: bytes, label: str, kept: Kept) -> tuple[dict[str, list[list[Any]]], int | None]:
    """trainer_state.json's ``log_history``: every number but ``step`` is a point at that step.
    Returns (series, the last step: ``global_step``, else the largest).
    """
    doc = _json_object(data, label)
    history = doc.get("log_history")
    if not isinstance(history, list):
        raise DataError(f"{label}: no log_history list (not a Trainer's state)")
    series: dict[str, list[list[Any]]] = {}
    last = None
    for entry in history:
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or abs(step) >= 1 << 63:
            continue
        last = step if last is None else max(last, step)
        for key, value in entry.items():
            if key != "step" and _number(value) is not None and not isinstance(value, str):
                kept.add(TRAINER, series, str(key), step, value)
    gs = doc.get("global_step")
    if isinstance(gs, int) and not isinstance(gs, bool) and abs(gs) < 1 << 63:
        last = gs if last is None else max(last, gs)
    return series, last


def read_results(data: bytes, label: str, kept: Kept) -> dict[str, Any]:
    """A ``*_results.json`` (the Trainer's ``save_metrics``): its top-level numbers."""
    final: dict[str, Any] = {}
    for k, v in _json_object(data, label).items():
        if _number(v) is not None and not isinstance(v, str):
            kept.add(TRAINER, final, k, 0, v)
    return {k: v[-1][1] for k, v in final.items()}


def _json_object(data: bytes, label: str) -> dict[str, Any]:
    try:  # NaN, Infinity, -Infinity: what Python's json writes for them
        doc = json.loads(data.decode("utf-8", errors="replace"), parse_constant=NONFINITE.__getitem__)
    except (ValueError, RecursionError) as e:
        raise DataError(f"{label}: not JSON: {getattr(e, 'msg', e)}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{label}: not a JSON object")
    return doc


def read_file_parts(outputs_fd: int, found: Found) -> tuple[list[dict[str, Any]], list[str], dict[str, int]]:
    """The parts of every source but TensorBoard's (``{"source", "file", "series", "final", "steps"}``), notes
    for files that cannot be read, and Kept's counts.
    """
    parts: list[dict[str, Any]] = []
    notes: list[str] = []
    kept = Kept()
    for source in (JSONL, LIGHTNING, TRAINER):
        for rel in found.files.get(source, []):
            label = f"outputs/{rel}"
            try:
                if source == JSONL:
                    parts.append(read_jsonl_part(outputs_fd, kept, label))
                elif source == LIGHTNING:
                    fd = safetree.open_regular(outputs_fd, safetree.fs_name(rel))
                    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as f:
                        series = read_lightning_csv(f, label, kept)
                    parts.append({"source": source, "file": rel, "series": series, "final": {},
                                  "steps": _max_step(series)})
                else:
                    data = safetree.read_limited(outputs_fd, safetree.fs_name(rel), MAX_FILE_BYTES)
                    if posixpath.basename(rel) == "trainer_state.json":
                        series, last = read_trainer_state(data, label, kept)
                        parts.append({"source": source, "file": rel, "series": series, "final": {}, "steps": last})
                    else:
                        parts.append({"source": source, "file": rel, "series": {},
                                      "final": read_results(data, label, kept), "steps": None})
            except (safetree.UnsafePath, OSError) as e:
                why = safetree.display(str(getattr(e, "message", None) or getattr(e, "strerror", None) or e))
                named = why.startswith(rel + ":")  # safetree's messages start with the path beneath outputs/
                notes.append(f"metrics not summarized: outputs/{why}" if named else
                             f"metrics not summarized: {label}: {why}")
            except DataError as e:  # its message names the file and line
                notes.append(f"metrics not summarized: {safetree.display(e.message)}")
    return parts, notes + kept.notes(), kept.left_out


def _max_step(series: dict[str, list[list[Any]]]) -> int | None:
    steps = [p[0] for pts in series.values() for p in pts]
    return max(steps) if steps else None


def event_part(rel: str, doc: dict[str, Any], kept: Kept) -> dict[str, Any]:
    """tb_scalars' answer for one event file as a part (validated: it came from the script's side)."""
    series: dict[str, list[list[Any]]] = {}
    tags = doc.get("tags") if isinstance(doc, dict) else None
    for tag, points in (tags.items() if isinstance(tags, dict) else ()):
        if not isinstance(tag, str) or not isinstance(points, list):
            continue
        for p in points:
            if isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and not isinstance(p[0], bool):
                kept.add(TENSORBOARD, series, safetree.display(tag), p[0], p[1])
    left = doc.get("left_out") if isinstance(doc, dict) else None
    for what, n in (left.items() if isinstance(left, dict) else ()):  # what the reader's own caps left out
        if what in ("points", "other_names") and isinstance(n, int) and not isinstance(n, bool) and n > 0:
            kept.skip(what, n)
    return {"source": TENSORBOARD, "file": rel, "series": series, "final": {}, "steps": _max_step(series)}


# ---------------------------------------------------------------- assembling (pure)


@dataclass
class Assembled:
    """The record's metrics section (the caller adds ``series``), the series file's lines, and notes."""

    section: dict[str, Any]
    series: list[dict[str, Any]]
    notes: list[str]


def _labels(dirs: Iterable[str]) -> dict[str, str]:
    """Each run directory's label in metric names: '' when there is one, else its path from their common parent."""
    dirs = sorted(set(dirs))
    if len(dirs) <= 1:
        return {d: "" for d in dirs}
    common = posixpath.commonpath(dirs) if all(dirs) else ""
    out = {}
    for d in dirs:
        rel = posixpath.relpath(d, common) if common else d
        out[d] = (posixpath.basename(d) or ".") if rel == "." else (rel or ".")
    return out


def _part_order(part: dict[str, Any]) -> tuple:
    """Sources in SOURCES order, files by name; a Trainer's state before its results files (whose finals win)."""
    base = posixpath.basename(part["file"])
    rank = 0 if base == "trainer_state.json" else (1 if base == "all_results.json" else 2)
    return (SOURCES.index(part["source"]), _run_dir_of(part["file"]), rank, part["file"])


def assemble(parts: list[dict[str, Any]], *, readers: dict[str, str] | None = None,
             left_out: dict[str, int] | None = None) -> Assembled:
    """The metrics section and series from the parts; ``readers``: how each source was read, ``left_out``: Kept's."""
    notes: list[str] = []
    left_out = dict(left_out or {})
    named: dict[str, dict[str, Any]] = {}  # name -> {"source", "points", "final"}
    sources: dict[str, dict[str, Any]] = {}
    steps_seen: list[int] = []
    jsonl_file = None
    parts = sorted(parts, key=_part_order)
    by_source: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_source.setdefault(p["source"], []).append(p)
    for source, its in by_source.items():
        info = sources.setdefault(source, {"files": [], "metrics": []})
        if readers and source in readers:
            info["reader"] = readers[source]
        labels = _labels(_run_dir_of(p["file"]) for p in its) if source != JSONL else {}
        run_last: dict[str, int] = {}
        for p in its:
            if p["steps"] is not None and p["source"] != JSONL:
                run = _run_dir_of(p["file"])
                run_last[run] = max(run_last.get(run, p["steps"]), p["steps"])
        for p in its:
            info["files"].append(p["file"])
            if source == JSONL:
                jsonl_file = "outputs/" + p["file"]
                prefix = ""
            else:
                label = labels[_run_dir_of(p["file"])]
                prefix = f"{source}/" + (f"{label}/" if label else "")
            if p["steps"] is not None:
                steps_seen.append(p["steps"])
            for key, points in p["series"].items():
                m = named.setdefault(prefix + key, {"source": source, "points": [], "final": None})
                if m["source"] != source:
                    continue  # a name metrics.jsonl already has (a "tensorboard/..." key of its own)
                m["points"].extend(points)
                if points:
                    m["final"] = points[-1][1]
            last = run_last.get(_run_dir_of(p["file"]))
            for key, value in p["final"].items():  # *_results.json: the final figures, at the last step
                m = named.setdefault(prefix + key, {"source": source, "points": [], "final": None})
                if m["source"] != source:
                    continue
                m["final"] = value
                if last is not None and not (m["points"] and m["points"][-1][0] == last
                                             and m["points"][-1][1] == value):
                    m["points"].append([last, value])
    if len(named) > MAX_METRICS:
        dropped = sorted(named)[MAX_METRICS:]
        notes.append(f"{len(named)} metrics; only the first {MAX_METRICS} by name were kept "
                     f"({dropped[0]} and after left out)")
        left_out["other_names"] = left_out.get("other_names", 0) + sum(len(named[k]["points"]) for k in dropped)
        named = {k: named[k] for k in sorted(named)[:MAX_METRICS]}
    final: dict[str, Any] = {}
    wall: dict[str, Any] = {}
    series: list[dict[str, Any]] = []
    budget = MAX_TOTAL_POINTS
    for name in sorted(named):
        m = named[name]
        clock = m["source"] != JSONL and is_wall_clock(name)
        if m["final"] is not None:
            (wall if clock else final)[name] = m["final"]
        points = m["points"]
        if len(points) > min(MAX_POINTS, budget):
            keep = max(min(MAX_POINTS, budget) - 1, 0)
            notes.append(f"{name}: {len(points)} points; the series keeps the first {keep} and the last")
            left_out["points"] = left_out.get("points", 0) + len(points) - keep - 1
            points = points[:keep] + points[-1:]
        budget -= len(points)
        if not clock:
            sources[m["source"]]["metrics"].append(name)
        entry = {"name": name, "source": m["source"], "points": points}
        if clock:
            entry["wall_clock"] = True
        series.append(entry)
    for source, info in sources.items():
        info["files"] = sorted(info["files"])
        clocked = [e["name"] for e in series if e["source"] == source and e.get("wall_clock")]
        if clocked:
            info["wall_clock"] = clocked
    steps_seen = [s for s in steps_seen if s >= 0]  # a negative step (a script's own count) says no more
    section: dict[str, Any] = {"final": final, "steps": max(steps_seen) if steps_seen else None, "file": jsonl_file}
    if sources:
        section["sources"] = dict(sorted(sources.items()))
    if wall:
        section["wall_clock"] = wall
    if any(left_out.values()):
        section["left_out"] = {k: v for k, v in sorted(left_out.items()) if v}
    return Assembled(section, series, notes)


# ---------------------------------------------------------------- the series file


def series_bytes(series: list[dict[str, Any]]) -> bytes:
    """One JSON line per metric, sorted by name, keys sorted: the same series, the same bytes."""
    return b"".join(json.dumps(e, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"
                    for e in sorted(series, key=lambda e: e["name"]))


def write_series(run_dir: str | os.PathLike[str], series: list[dict[str, Any]]) -> dict[str, Any]:
    """Write ``run_dir/metrics/series.jsonl`` (atomically, never through a link); return ``metrics.series``."""
    data = series_bytes(series)
    head, tail = SERIES_FILE.rsplit("/", 1)
    rootfd = safetree.open_root(run_dir)
    try:
        dirfd = safetree.open_dir(rootfd, head, create=True)
    finally:
        os.close(rootfd)
    tmp = f".{tail}.{os.getpid()}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)
        with os.fdopen(os.open(tmp, safetree.CREATE_FLAGS, 0o644, dir_fd=dirfd), "wb") as f:
            f.write(data)
        os.rename(tmp, tail, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
    finally:
        os.close(dirfd)
    return {"file": SERIES_FILE, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "metrics": len(series), "points": sum(len(e["points"]) for e in series)}


@dataclass
class RunSeries:
    """A run's metrics over steps, as the series file (or an older record's metrics.jsonl) holds them."""

    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    wall_clock: set[str] = field(default_factory=set)
    sources: dict[str, str] = field(default_factory=dict)  # metric name -> source

    def compared(self) -> dict[str, list[tuple[int, float]]]:
        """The series of metrics (wall-clock figures left out)."""
        return {k: v for k, v in self.series.items() if k not in self.wall_clock}


def load_series(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> RunSeries:
    """The run's series: ``metrics/series.jsonl`` checked against its recorded sha256 (IntegrityError, 65),
    or an older record's outputs/metrics.jsonl (no link followed); empty when the run logged nothing.
    """
    run_dir = Path(run_dir)
    metrics = record["metrics"]
    ref = metrics.get("series")
    if ref is None:
        if not metrics.get("file"):
            return RunSeries()
        from hermetic.record.outputs import metrics_series

        found = metrics_series(run_dir / metrics["file"])
        return RunSeries(found, set(), {k: JSONL for k in found})
    path = run_dir / ref["file"]
    try:
        rootfd = safetree.open_root(run_dir)
        try:
            data = safetree.read_limited(rootfd, ref["file"], max(int(ref["size"]), 0))
        finally:
            os.close(rootfd)
    except FileNotFoundError:
        raise IntegrityError(f"{path}: missing; the record holds its sha256 {ref['sha256'][:12]}",
                             hint=f"hermetic runs verify {run_dir.name}") from None
    except (OSError, safetree.UnsafePath) as e:
        raise IntegrityError(f"{path}: cannot be read: {getattr(e, 'message', None) or e}") from None
    if hashlib.sha256(data).hexdigest() != ref["sha256"]:
        raise IntegrityError(f"{path}: changed since the record was sealed (sha256 {ref['sha256'][:12]} "
                             f"recorded)", hint=f"hermetic runs verify {run_dir.name}")
    return run_series(json.loads(line) for line in data.splitlines())


def run_series(entries: Iterable[dict[str, Any]]) -> RunSeries:
    """The series file's entries (assemble's series) as the RunSeries load_series would read back."""
    out = RunSeries()
    for e in sorted(entries, key=lambda e: e["name"]):
        out.series[e["name"]] = [(int(s), float(decode_number(v))) for s, v in e["points"]]
        out.sources[e["name"]] = e["source"]
        if e.get("wall_clock"):
            out.wall_clock.add(e["name"])
    return out

