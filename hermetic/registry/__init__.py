"""OCI Distribution API: push and pull by digest, and the CI build cache.

``auth`` (credentials), ``deadlines`` (limits and their watchdog), ``transport`` (HTTP under them), ``tokens`` (the
registry's challenge), ``client`` (blobs, uploads, manifests), ``locations`` (where images were pushed), ``push`` /
``pull``, ``cache``; the public entry points are re-exported here (docs/architecture.md)."""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it; imported on first use (PEP 562): the client imports requests and
# urllib3, which a `hermetic run` that only reads where its image was pushed never needs.
_EXPORTS = {
    "RegistryCache": "cache", "cache_fetch": "cache", "cache_lookup": "cache", "cache_publish": "cache",
    "cache_tag": "cache", "repo_digests": "locations", "PullResult": "pull", "ensure_image": "pull",
    "pull_image": "pull", "resolve_tag": "pull", "PushResult": "push", "push_image": "push",
}

__all__ = sorted([*_EXPORTS, "pull_base"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def pull_base(store: Any, ref: str) -> str:
    """A build's ``pull_base``: a base the store lacks, pulled from its registry (the client is imported only
    when a base is missing)."""
    from hermetic.registry.pull import ensure_image

    return ensure_image(store, ref)
