"""What a registry's documents (manifest, index, referrers list) say, checked before anything acts on it: each
descriptor needs a media type, a ``sha256:<64 hex>`` digest and a whole size, else one line and 65."""

from __future__ import annotations

import json
from typing import Any

from hermetic.core.errors import IntegrityError
from hermetic.core.reference import check_digest, show_value
from hermetic.store.oci import Descriptor

MAX_BLOB_SIZE = 1 << 50  # 1 PiB: a size beyond it is not a blob anyone serves


def parse_document(body: bytes, what: str) -> dict[str, Any]:
    """A JSON object, or IntegrityError naming ``what``."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise IntegrityError(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise IntegrityError(f"{what} is not a JSON object")
    return doc


def descriptor(d: Any, what: str) -> Descriptor:
    """A descriptor from a registry's document, every field that is acted on checked."""
    if not isinstance(d, dict):
        raise IntegrityError(f"{what}: a descriptor that is not a JSON object ({show_value(d)})")
    digest = check_digest(d.get("digest"), f"{what} names a blob", IntegrityError)
    size = d.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BLOB_SIZE:
        raise IntegrityError(f"{what}: the size of {digest} is {show_value(size)}, not a number of bytes")
    media_type = d.get("mediaType")
    if not isinstance(media_type, str) or not media_type:
        raise IntegrityError(f"{what}: {digest} has no media type")
    annotations = d.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in annotations.items()):
        raise IntegrityError(f"{what}: the annotations of {digest} are not strings")
    platform = d.get("platform")
    if platform is not None and not isinstance(platform, dict):
        raise IntegrityError(f"{what}: the platform of {digest} is not a JSON object")
    return Descriptor(media_type, digest, size, dict(annotations), platform)


def image_blobs(doc: dict[str, Any], what: str) -> list[Descriptor]:
    """The config and layers of an image manifest, checked, each blob once."""
    config, layers = doc.get("config"), doc.get("layers")
    if config is None or not isinstance(layers, list):
        raise IntegrityError(f"{what} lacks a config or layers list")
    blobs = [descriptor(config, f"{what} (config)")]
    blobs += [descriptor(x, f"{what} (layer {i})") for i, x in enumerate(layers)]
    return list({b.digest: b for b in blobs}.values())
