"""Canonical JSON and digests: the identity of every document hermetic writes.

Sorted keys and compact separators make equal data equal bytes, so a digest of the bytes is a digest of the meaning
(design.md, "Identity")."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8 (not ASCII-escaped), no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_digest(data: bytes) -> str:
    """An OCI-style digest string, ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_sha256(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def pretty_json(value: Any) -> str:
    """Stable, human-readable JSON for files people diff (sorted keys, 2-space indent)."""
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


HEX = frozenset("0123456789abcdef")


def is_sha256_hex(text: str) -> bool:
    return len(text) == 64 and all(c in HEX for c in text)


def parse_digest(text: str) -> str:
    """``sha256:<hex>`` -> ``<hex>``; ValueError on anything else."""
    algo, sep, hexpart = text.partition(":")
    if sep != ":" or algo != "sha256" or not is_sha256_hex(hexpart):
        raise ValueError(f"not a sha256 digest: {text!r}")
    return hexpart
