"""The dataset manifest copies a run keeps in data/<name>.sha256, for per-file data diffs.

Parsed by hermetic.data.manifest; a missing or malformed copy is None (the digests are compared without detail).
"""

from __future__ import annotations

from pathlib import Path

from hermetic.data.manifest import ManifestError, read_manifest


def read_manifest_file(path: Path) -> dict[str, str] | None:
    """``{path: sha256 hex}`` from a manifest copy, or None when it is missing or malformed."""
    try:
        return read_manifest(path).entries
    except ManifestError:
        return None


def compare_manifests(a: dict[str, str], b: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(only in a, only in b, changed) paths, each sorted."""
    only_a = sorted(a.keys() - b.keys())
    only_b = sorted(b.keys() - a.keys())
    changed = sorted(p for p in a.keys() & b.keys() if a[p] != b[p])
    return only_a, only_b, changed
