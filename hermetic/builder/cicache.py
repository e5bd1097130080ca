"""``hermetic build --cache REGISTRY/REPO``: CI runners share images by build key.

The build key is computed from the config and the lock alone (no store, no
network), so a fresh runner can ask the registry for ``hk-<key>`` before it
fetches a single wheel. A hit is pulled by digest, every blob verified; a miss
is built locally (hermetic/builder/build.py) and published. Builds are
reproducible, so two runners that miss at once publish the same digest under
the same tag. The cache is an optimization: an unreachable or read-only
registry is a note, never a failed build.
"""

from __future__ import annotations

from hermetic.errors import HermeticError
from hermetic.store.oci import OciStore


def check_repo(registry_repo: str) -> None:
    from hermetic.registry.cache import parse_cache_repo

    parse_cache_repo(registry_repo)


def pull_cached(store: OciStore, registry_repo: str, key: str, notes: list[str]) -> str | None:
    """The image for ``key`` pulled (verified) from the cache, or None on a miss or an unreachable cache."""
    from hermetic.registry.cache import cache_fetch

    try:
        pulled = cache_fetch(store, registry_repo, key)
    except HermeticError as e:
        notes.append(f"cache unavailable, building here: {e.message}")
        return None
    if pulled is None:
        return None
    notes.append(f"cache hit: pulled {pulled.repo_digest or pulled.manifest_digest} "
                 f"({pulled.stats.bytes_received / 1e6:.1f} MB)")
    return pulled.manifest_digest


def publish_cached(store: OciStore, registry_repo: str, key: str, digest: str, notes: list[str]) -> None:
    """Tag ``digest`` as the image for ``key`` unless the cache already says so."""
    from hermetic.registry.cache import cache_lookup, cache_publish

    try:
        if cache_lookup(registry_repo, key) == digest:
            return
        pub = cache_publish(store, registry_repo, key, digest)
        if pub.replaced:
            notes.append(f"the cache tag {pub.tag} named {pub.replaced}, a different image for the same "
                         "inputs: that build was not reproducible; replaced it")
        notes.append(f"cache miss: published {pub.repo_digest}")
    except HermeticError as e:
        # A read-only token (e.g. a fork's pull request) must not fail the build.
        notes.append(f"could not publish to the cache: {e.message}")
