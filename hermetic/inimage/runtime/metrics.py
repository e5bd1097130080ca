"""Metrics as JSON lines in the outputs directory.

One line per call: ``{"step": N, <names in sorted order>...}``. Floats are
written with Python's repr (the shortest text that reads back to the same
float64), so equal values are equal bytes and nothing is lost: a float32 is
widened exactly and reads back to the same float32. NaN and infinities,
which JSON lacks, are written as the strings "nan", "inf" and "-inf". No
timestamps: two identical runs write identical files.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from ._env import outputs_dir_path
from ._io import atomic_write_bytes

METRICS_FILENAME = "metrics.jsonl"


def outputs_dir() -> Path:
    """$HERMETIC_OUTPUTS, else /outputs (created if missing)."""
    from .distributed import rank_outputs_dir

    path = Path(rank_outputs_dir() or outputs_dir_path())  # ranks > 0 of a multi-process run: their own
    path.mkdir(parents=True, exist_ok=True)
    return path


def metrics_path() -> Path:
    return outputs_dir() / METRICS_FILENAME


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(value[k], f"{where}.{k}") for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # numpy scalars and 0-d arrays, one-element torch tensors: .item() gives a
    # Python int/float/bool holding the same value exactly.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _plain(item(), where)
        except (ValueError, RuntimeError):
            pass
    raise TypeError(f"log_metrics: {where}: cannot write a {type(value).__name__} as JSON")


def format_metrics_line(step: int, values: Mapping[str, Any]) -> str:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"log_metrics: step must be a non-negative integer, got {step!r}")
    doc = {"step": step}
    for key in sorted(values):
        doc[key] = _plain(values[key], key)
    return json.dumps(doc, ensure_ascii=False, allow_nan=False) + "\n"


def log_metrics(step: int, **values: Any) -> None:
    """Append ``{"step": step, **values}`` as one line to
    $HERMETIC_OUTPUTS/metrics.jsonl (default /outputs/metrics.jsonl)."""
    data = format_metrics_line(step, values).encode("utf-8")
    # One write() on an O_APPEND descriptor: lines from several processes
    # never interleave within a line.
    fd = os.open(metrics_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def trim_metrics(after_step: int, path: "Optional[os.PathLike[str] | str]" = None) -> int:
    """Drop lines with a step greater than ``after_step`` (and a torn last
    line), atomically; returns how many lines were dropped. A resumed run calls
    it with the checkpoint's step so lines logged after the checkpoint by the
    interrupted run are not written twice."""
    p = Path(path) if path is not None else metrics_path()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return 0
    kept = []
    dropped = 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            dropped += 1  # torn by a crash mid-write
            continue
        try:
            step = json.loads(line.decode("utf-8")).get("step")
        except (ValueError, UnicodeDecodeError, AttributeError):
            kept.append(line)  # not ours to judge
            continue
        if isinstance(step, int) and step > after_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        atomic_write_bytes(str(p), b"".join(kept))
    return dropped
