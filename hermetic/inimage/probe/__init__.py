"""The in-image probe: probe.py and its sibling modules, standard library only (Python 3.8+).

They are not installed into images: the directory is mounted read-only into
the training image's container and ``probe.py`` runs there (hermetic.run.probe).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PROBE_DIR = Path(__file__).resolve().parent
PROBE_PATH = PROBE_DIR / "probe.py"  # the entry point


def probe_files() -> list[Path]:
    """Every file the probe runs: probe.py and its probe_*.py siblings, sorted."""
    return sorted(PROBE_DIR.glob("probe*.py"))


def probe_digest() -> str:
    """sha256 over the probe's files (names and bytes): part of the probe cache key."""
    h = hashlib.sha256()
    for p in probe_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()
