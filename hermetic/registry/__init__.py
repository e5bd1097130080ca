"""OCI Distribution API: push and pull by digest, and the CI build cache.

One module per job:

- ``auth``: where credentials come from (environment, ~/.docker/config.json,
  credential helpers) and how a WWW-Authenticate challenge becomes a header.
- ``client``: one repository on one registry over HTTP (blobs, manifests,
  uploads), counting the bytes it sends.
- ``locations``: the small records in the store dir of where images and blobs
  were pushed or pulled from (repo digests for run records, mount sources).
- ``push`` / ``pull``: an image from / into the local OCI store, every digest
  preserved and every pulled byte verified before it enters the store.
- ``cache``: the CI cache, a tag that is a pure function of the build key.

The public entry points are re-exported here.
"""

from __future__ import annotations

from hermetic.registry.cache import RegistryCache, cache_fetch, cache_lookup, cache_publish, cache_tag
from hermetic.registry.locations import repo_digests
from hermetic.registry.pull import PullResult, ensure_image, pull_image, resolve_tag
from hermetic.registry.push import PushResult, push_image

__all__ = [
    "PullResult",
    "PushResult",
    "RegistryCache",
    "cache_fetch",
    "cache_lookup",
    "cache_publish",
    "cache_tag",
    "ensure_image",
    "pull_image",
    "push_image",
    "repo_digests",
    "resolve_tag",
]
