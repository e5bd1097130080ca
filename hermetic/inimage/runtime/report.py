"""What the runtime applied, written where `hermetic run` collects it.

When $HERMETIC_RUNTIME_REPORT names a file, each call that applies something
(seeds, determinism flags, DataLoader seeding, a resume) merges its section
into that JSON document: read, deep-merge, write to a temp file, rename. A
lock on the directory serializes processes (ranks of one job). Ranks other
than 0 write under ``ranks.<rank>`` so they never overwrite rank 0.

Nothing in the report varies between two identical runs (no times, no pids),
so two records of the same run compare equal. Failing to write the report
warns and carries on: a read-only path must not stop training.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any, Dict, Mapping, Optional

from ._env import REPORT_ENV, determinism_env, resolve_rank
from ._io import atomic_writer, directory_lock, warn
from ._optional import distribution_version

SCHEMA = "hermetic-runtime-report/1"
RUNTIME_VERSION = "1"


def report_path() -> Optional[str]:
    return os.environ.get(REPORT_ENV, "").strip() or None


def deep_merge(base: Dict[str, Any], update: Mapping[str, Any]) -> Dict[str, Any]:
    """``update`` into a copy of ``base``: mappings merge key by key, any
    other value (lists included) replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = deep_merge({}, value)
        else:
            out[key] = value
    return out


def merge_into_file(path: str, sections: Mapping[str, Any], rank: int = 0) -> Dict[str, Any]:
    """Merge ``sections`` into the JSON file at ``path`` atomically; returns
    the document written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with directory_lock(directory):
        doc: Dict[str, Any] = {}
        try:
            with open(path, "rb") as f:
                loaded = json.loads(f.read().decode("utf-8"))
            if isinstance(loaded, dict):
                doc = loaded
            else:
                warn(f"{path}: not a JSON object; starting the runtime report afresh")
        except FileNotFoundError:
            pass
        except (ValueError, UnicodeDecodeError):
            warn(f"{path}: not valid JSON; starting the runtime report afresh")
        update: Dict[str, Any] = dict(sections)
        if rank != 0:
            update = {"ranks": {str(rank): update}}
        doc = deep_merge(doc, update)
        doc["schema"] = SCHEMA
        doc["runtime_version"] = RUNTIME_VERSION
        data = (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with atomic_writer(path, "wb") as f:
            f.write(data)
    return doc


def record(**sections: Any) -> None:
    """Merge sections into the run's runtime report; silently nothing when
    $HERMETIC_RUNTIME_REPORT is unset. The versions and environment seen are
    refreshed on every write."""
    path = report_path()
    if path is None:
        return
    update = dict(sections)
    update["versions"] = library_versions()
    update["env"] = determinism_env()
    try:
        rank = resolve_rank(None)
    except ValueError:
        rank = 0
    try:
        merge_into_file(path, update, rank)
    except (OSError, TypeError, ValueError) as e:
        warn(f"cannot write the runtime report {path}: {e}")


def library_versions() -> Dict[str, Any]:
    """Python and the numeric libraries as installed (none imported here)."""
    versions: Dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
    for dist in ("numpy", "torch", "jax", "jaxlib"):
        versions[dist] = distribution_version(dist)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            versions["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001 - a CPU build or a broken cuDNN: record absence
            versions["cudnn"] = None
    return versions
