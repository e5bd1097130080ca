"""What a run produced: output file hashes and the metrics summary."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Protocol

from hermetic.hostfs import safetree
from hermetic.hostfs.fsutil import stat_key
from hermetic.core.canonical import sha256_hex
from hermetic.core.errors import DataError

# JSON has no NaN or infinities and canonical JSON refuses them, yet a diverged
# loss is NaN: such values are recorded as these strings.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
MAX_METRICS_LINE = 1 << 20  # characters in one metrics.jsonl line
MAX_NESTING = 8  # objects within a metrics.jsonl line that name metrics (``val.acc``: 1)
# Keys of a metrics line that say *when*, not *what*: never summarized as metrics
# (a wall-clock time would make every pair of runs differ).
NON_METRIC_KEYS = frozenset({"step", "time", "timestamp", "wall_time", "_time", "_timestamp"})


def encode_number(value: float | int) -> float | int | str:
    """A metric value as the record stores it (non-finite floats become strings; an integer past 64 bits a
    float, past a float's range an infinity)."""
    if isinstance(value, int) and abs(value) >= 1 << 63:
        value = float(value) if value.bit_length() <= 1023 else (math.inf if value > 0 else -math.inf)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def decode_number(value: Any) -> float | int:
    """The inverse of encode_number: a stored metric value as a Python number."""
    if isinstance(value, str):
        return NONFINITE[value]
    return value


def nan_key(v: float) -> Any:
    """A metric value as a set member or dict key: NaN (never equal to itself) as the string ``nan``."""
    return "nan" if v != v else v


def volatile_globs(config: dict[str, Any]) -> list[str]:
    """``run.outputs.volatile`` of a run's resolved config (``invocation.config``; hermetic.config.OutputsConfig);
    none for older records."""
    run = config.get("run") or {}
    return list((run.get("outputs") or {}).get("volatile") or [])


def volatile_paths(paths: Iterable[str], globs: list[str]) -> list[str]:
    """The output paths that match a volatile glob, sorted."""
    from hermetic.config.containerpaths import glob_match

    return sorted(p for p in paths if any(glob_match(g, p) for g in globs))


def compared_files(record: dict[str, Any]) -> dict[str, str]:
    """Output path -> sha256 of the files diff compares: every output but the volatile ones, and
    logs/stdout.log when it is an output (run.outputs.stdout)."""
    skip = set(record["outputs"].get("volatile") or [])
    files = {p: f["sha256"] for p, f in record["outputs"]["files"].items() if p not in skip}
    stdout = record["outputs"].get("stdout")
    if stdout:
        files[stdout["file"]] = stdout["sha256"]
    return files


def hash_outputs(outputs_dir: str | os.PathLike[str], notes: list[str] | None = None) -> dict[str, Any]:
    """``{"files": {relpath: {"sha256", "size", ...}}}`` for everything under ``outputs_dir``.

    Walked through hermetic.hostfs.safetree, names as record names. A regular file by its bytes; a link by its
    target text (``"symlink"``); a FIFO, socket or device by its kind (``"type"``, sha256 of ``"<kind>:"``, size 0),
    never opened. Directories deeper than safetree.MAX_DEPTH are not entered; ``notes`` is told of them.
    """
    try:
        rootfd = safetree.open_root(outputs_dir)
    except (FileNotFoundError, NotADirectoryError):
        return {"files": {}}
    try:
        return hash_outputs_at(rootfd, notes)
    finally:
        os.close(rootfd)


class DigestCache(Protocol):
    """What hash_outputs_at may ask before it hashes a regular file (hermetic.record.verify's stat cache)."""

    def get(self, rel: str, key: tuple[int, int, int, int, int]) -> str | None:
        """The sha256 of the file recorded as ``rel`` if it was hashed with this very stat key and can be
        trusted (git's racy-clean rule), else None."""

    def put(self, rel: str, key: tuple[int, int, int, int, int], sha256: str) -> None:
        """``rel``, whose stat key was ``key`` before and after it was read, hashed to ``sha256``."""


def hash_outputs_at(rootfd: int, notes: list[str] | None = None, cache: DigestCache | None = None) -> dict[str, Any]:
    """hash_outputs of the directory ``rootfd`` (opened by the caller, perhaps before a privilege drop).

    ``cache``: a regular file whose (dev, ino, size, mtime_ns, ctime_ns) it
    knows is not read again (the same walk, the same record either way)."""
    files: dict[str, dict[str, Any]] = {}

    def too_deep(rel: str) -> None:
        if notes is not None:
            notes.append(f"outputs/{safetree.record_name(rel)}: nested deeper than {safetree.MAX_DEPTH} "
                         "directories; not recorded")

    for dirfd, name, e in safetree.walk_at(rootfd, on_too_deep=too_deep):
        rel = safetree.record_name(e.rel)
        if e.kind == "dir":
            continue
        if e.kind == "symlink":
            data = os.fsencode(e.target or "")
            files[rel] = {"sha256": sha256_hex(data), "size": len(data),
                          "symlink": safetree.record_name(e.target or "")}
        elif e.kind == "file":
            key = stat_key(e.st)
            known = cache.get(rel, key) if cache is not None else None
            if known is not None:
                files[rel] = {"sha256": known, "size": e.st.st_size}
                continue
            fd = safetree.open_regular_at(dirfd, name, e.st, rel=e.rel)
            try:
                digest, size = safetree.hash_fd(fd)
                if cache is not None and size == e.st.st_size and key == stat_key(os.fstat(fd)):
                    cache.put(rel, key, digest)
            finally:
                os.close(fd)
            files[rel] = {"sha256": digest, "size": size}
        else:
            files[rel] = special_entry(e.kind)
    return {"files": dict(sorted(files.items()))}


UNSAFE_MODE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH
MAX_MODES = 100  # paths whose cleared modes the record lists


def clear_unsafe_modes_at(rootfd: int, notes: list[str]) -> dict[str, str]:
    """Take world-write, setuid, setgid and sticky off every file and directory under ``rootfd`` (and itself):
    ``{path: the mode the script set, in octal}`` for the record (``.`` is outputs/ itself), at most MAX_MODES
    (a note counts the rest). Never through a link: each entry is changed by a descriptor of what was walked."""
    cleared: dict[str, str] = {}
    more = 0

    def walked():  # each entry's directory descriptor is valid until the next is walked
        yield rootfd, ".", ".", os.fstat(rootfd)
        yield from ((d, n, e.rel, e.st) for d, n, e in safetree.walk_at(rootfd) if e.kind in ("file", "dir"))

    for dirfd, name, rel, st in walked():
        if not st.st_mode & UNSAFE_MODE:
            continue
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            try:
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(now.st_mode) & ~UNSAFE_MODE)
            finally:
                os.close(fd)
        except OSError as e:
            notes.append(f"outputs/{safetree.record_name(rel)}: its mode {stat.S_IMODE(st.st_mode):04o} was kept: "
                         f"{e.strerror}")
            continue
        if len(cleared) < MAX_MODES:
            cleared[safetree.record_name(rel)] = f"{stat.S_IMODE(st.st_mode):04o}"
        else:
            more += 1
    if more:
        notes.append(f"{more} more outputs lost world-write, setuid, setgid or sticky bits (not listed)")
    return cleared


def special_entry(kind: str) -> dict[str, Any]:
    """How an output that is neither a file nor a link is recorded (hash_outputs)."""
    return {"sha256": sha256_hex(f"{kind}:".encode()), "size": 0, "type": kind}


def metrics_summary(metrics_jsonl_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarize a metrics.jsonl: the last value of each metric and the step count.

    Numbers (not booleans) are metrics, nested objects flatten to dotted names, ``step`` and time keys are not
    metrics. ``steps``: the largest ``step``, else the number of lines. A truncated last line is ignored, any other
    malformed line is an error naming the file and line. ``{"final": {}, "steps": None}`` without a file.
    """
    path = Path(metrics_jsonl_path)
    if not is_regular_file(path):
        return {"final": {}, "steps": None}
    final: dict[str, Any] = {}
    max_step: int | None = None
    count = 0
    for count, step, values in metric_lines(path):
        if step is not None:
            max_step = step if max_step is None else max(max_step, step)
        for name, value in values:
            final[name] = encode_number(value)
    return {"final": dict(sorted(final.items())), "steps": max_step if max_step is not None else count}


def metrics_series(metrics_jsonl_path: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Every metric's ``(step, value)`` points in file order, read as metrics_summary reads them (a line
    without an integer ``step`` at its line count); ``{}`` when the file does not exist.
    """
    path = Path(metrics_jsonl_path)
    series: dict[str, list[tuple[int, float]]] = {}
    if not is_regular_file(path):
        return series
    for count, step, values in metric_lines(path):
        for name, value in values:
            series.setdefault(name, []).append((count if step is None else step, float(value)))
    return dict(sorted(series.items()))


def metric_lines(path: Path):  # -> Iterator[(line count, step or None, [(name, number)])]
    """The parsed lines of a metrics.jsonl (see metrics_summary for the rules).

    The script wrote the file: it is opened without following a link (a link is
    not a metrics file: ``{}``), streamed line by line, never read whole."""
    try:
        fd = safetree.open_regular_path(path)
    except (OSError, safetree.UnsafePath):
        return
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="\n") as f:
        yield from _parse_metric_lines(path, f)


def _parse_metric_lines(path: Path, f):
    count = 0
    for lineno, line in enumerate(iter(lambda: f.readline(MAX_METRICS_LINE + 1), ""), 1):
        complete = line.endswith("\n")
        if not complete and len(line) > MAX_METRICS_LINE:
            raise DataError(f"{path}:{lineno}: a line longer than {MAX_METRICS_LINE} characters")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # ValueError: also an integer of too many digits
            if not complete:
                break  # the writer died mid-line (only the last line can lack its newline)
            raise DataError(f"{path}:{lineno}: not a JSON object: {getattr(e, 'msg', None) or e}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: not a JSON object")
        count += 1
        step = obj.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        yield count, step, list(_flatten_numbers(obj))


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file itself (a link to one is not: the script may have made it)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _flatten_numbers(obj: dict[str, Any], prefix: str = "", depth: int = 0):
    for key, value in obj.items():
        if not prefix and key in NON_METRIC_KEYS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < MAX_NESTING:  # deeper objects are no metrics
            yield from _flatten_numbers(value, name + ".", depth + 1)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, value
