"""The in-image probe. probe.py is a standalone script (standard library only,
Python 3.8+) copied into images; ``probe_source()`` gives its bytes."""

from __future__ import annotations

from pathlib import Path

PROBE_PATH = Path(__file__).resolve().parent / "probe.py"


def probe_source() -> bytes:
    """The probe script's bytes, for the builder to place in an image layer."""
    return PROBE_PATH.read_bytes()
