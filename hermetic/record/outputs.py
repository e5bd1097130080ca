"""What a run produced: output file hashes and the metrics summary."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from hermetic.canonical import sha256_hex
from hermetic.errors import DataError
from hermetic.fsutil import sha256_file

# JSON has no NaN or infinities and canonical JSON refuses them, yet a diverged
# loss is NaN: such values are recorded as these strings.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Keys of a metrics line that say *when*, not *what*: never summarized as metrics
# (a wall-clock time would make every pair of runs differ).
NON_METRIC_KEYS = frozenset({"step", "time", "timestamp", "wall_time", "_time", "_timestamp"})


def encode_number(value: float | int) -> float | int | str:
    """A metric value as the record stores it (non-finite floats become strings)."""
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


def volatile_globs(record: dict[str, Any]) -> list[str]:
    """``run.outputs.volatile`` as the run had it (hermetic.config.OutputsConfig); none for older records."""
    run = ((record.get("invocation") or {}).get("config") or {}).get("run") or {}
    return list((run.get("outputs") or {}).get("volatile") or [])


def volatile_paths(paths: Iterable[str], globs: list[str]) -> list[str]:
    """The output paths that match a volatile glob, sorted."""
    from hermetic.containerpaths import glob_match

    return sorted(p for p in paths if any(glob_match(g, p) for g in globs))


def compared_files(record: dict[str, Any]) -> dict[str, str]:
    """Output path -> sha256 of the files diff compares: every output but the volatile ones."""
    skip = set(record["outputs"].get("volatile") or [])
    return {p: f["sha256"] for p, f in record["outputs"]["files"].items() if p not in skip}


def hash_outputs(outputs_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"files": {relpath: {"sha256", "size"}}}`` for everything under ``outputs_dir``.

    Paths are relative and '/'-separated. Symbolic links are not followed (an
    output must not pull in bytes from outside the run): a link is recorded
    with the sha256 and size of its target *text* and ``"symlink": target``.
    Other non-regular files (fifos, sockets) are refused.
    """
    root = Path(outputs_dir)
    files: dict[str, dict[str, Any]] = {}
    if not root.is_dir():
        return {"files": files}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        names = sorted(filenames) + sorted(d for d in dirnames if (base / d).is_symlink())
        for name in names:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = os.readlink(path)
                data = target.encode("utf-8", "surrogateescape")
                files[rel] = {"sha256": sha256_hex(data), "size": len(data), "symlink": target}
            elif path.is_file():
                files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
            else:
                raise DataError(f"{path}: not a regular file or symlink; outputs must be files")
    return {"files": dict(sorted(files.items()))}


def metrics_summary(metrics_jsonl_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarize a metrics.jsonl: the last value of each metric and the step count.

    Each line is a JSON object such as ``{"step": 3, "loss": 0.41, "val": {"acc": 0.9}}``.
    Numbers (not booleans) are metrics; nested objects flatten to dotted
    names (``val.acc``); ``step`` and time keys are not metrics. ``steps`` is
    the largest ``step`` seen, or the number of lines when no line has one.
    A truncated last line (no newline: the writer was killed) is ignored;
    any other malformed line is an error naming the file and line.
    Returns ``{"final": {}, "steps": None}`` when the file does not exist.
    """
    path = Path(metrics_jsonl_path)
    final: dict[str, Any] = {}
    if not path.is_file():
        return {"final": final, "steps": None}
    max_step: int | None = None
    count = 0
    for _, step, values in metric_lines(path):
        count += 1
        if step is not None:
            max_step = step if max_step is None else max(max_step, step)
        for name, value in values:
            final[name] = encode_number(value)
    return {"final": dict(sorted(final.items())), "steps": max_step if max_step is not None else count}


def metrics_series(metrics_jsonl_path: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Every metric's ``(step, value)`` points in file order, read as metrics_summary reads them.

    A line without an integer ``step`` takes its line count (1, 2, ...) as
    the step, the count metrics_summary reports as ``steps`` for such files.
    ``{}`` when the file does not exist.
    """
    path = Path(metrics_jsonl_path)
    series: dict[str, list[tuple[int, float]]] = {}
    if not path.is_file():
        return series
    for count, step, values in metric_lines(path):
        for name, value in values:
            series.setdefault(name, []).append((count if step is None else step, float(value)))
    return dict(sorted(series.items()))


def metric_lines(path: Path):  # -> Iterator[(line count, step or None, [(name, number)])]
    """The parsed lines of a metrics.jsonl (see metrics_summary for the rules)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete = text.endswith("\n")
    count = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not complete:
                break  # the writer died mid-line
            raise DataError(f"{path}:{lineno}: not a JSON object: {e.msg}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: not a JSON object")
        count += 1
        step = obj.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        yield count, step, list(_flatten_numbers(obj))


def _flatten_numbers(obj: dict[str, Any], prefix: str = ""):
    for key, value in obj.items():
        if not prefix and key in NON_METRIC_KEYS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten_numbers(value, name + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, value
