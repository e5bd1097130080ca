"""The record's own digest: sha256 of its canonical JSON with the digest field blank (re-indenting keeps it)."""

from __future__ import annotations

import copy as _copy
from typing import Any

from hermetic.core.canonical import canonical_sha256


def record_digest(record: dict[str, Any]) -> str:
    """The value ``record.record_sha256`` must hold for ``record`` as it is."""
    meta = record.get("record")
    if not isinstance(meta, dict):
        raise ValueError("record: the 'record' section is missing or not a mapping")
    blank = dict(record)
    blank["record"] = {**meta, "record_sha256": ""}
    return canonical_sha256(blank)


def seal(record: dict[str, Any], *, copy: bool = True) -> dict[str, Any]:
    """A deep copy of ``record`` with ``record.record_sha256`` filled in (``copy=False``: ``record`` itself,
    for a caller whose record is its own copy already)."""
    sealed = _copy.deepcopy(record) if copy else record
    sealed["record"]["record_sha256"] = record_digest(sealed)
    return sealed


def verify_seal(record: dict[str, Any]) -> bool:
    """True when ``record.record_sha256`` matches the record's content."""
    try:
        return record["record"]["record_sha256"] == record_digest(record)
    except (KeyError, TypeError, ValueError):
        return False
