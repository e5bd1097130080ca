"""``hermetic build --cache REGISTRY/REPO``: CI runners share images by build key.

The build key is computed from the config and the lock alone (no store, no
network), so a fresh runner can ask the registry for ``hk-<key>`` before it
fetches a single wheel. A hit is pulled by digest, every blob verified; a miss
is built locally and published. Builds are reproducible, so two runners that
miss at once publish the same digest under the same tag.
"""

from __future__ import annotations

import time
from typing import Callable

from hermetic.builder.build import (
    BuildResult, _build, _resolve_wheels, build_key, finish, image_info, lookup_build, read_config_lock,
    remember_build,
)
from hermetic.builder.layers import BuiltLayer
from hermetic.config import LoadedConfig
from hermetic.errors import HermeticError
from hermetic.fsutil import file_lock
from hermetic.paths import CachePaths
from hermetic.store.oci import OciStore


def cached_build(cfg: LoadedConfig, paths: CachePaths, registry_repo: str, *, offline: bool = False,
                 load: bool = True, log: Callable[[str], None] | None = None,
                 on_layer: Callable[[BuiltLayer], None] | None = None) -> BuildResult:
    from hermetic.registry.cache import cache_fetch, cache_lookup, cache_publish, parse_cache_repo

    parse_cache_repo(registry_repo)  # a bad --cache value fails before any work
    t0 = time.monotonic()
    lock = read_config_lock(cfg)
    key = build_key(cfg, lock)
    store = OciStore(paths.oci).ensure()
    notes: list[str] = []
    built: list[BuiltLayer] = []
    with file_lock(paths.builds / f".{key}.lock"):
        done = lookup_build(paths, store, key)
        source = "local"
        if done is None and not offline:
            try:
                pulled = cache_fetch(store, registry_repo, key)
            except HermeticError as e:
                # The cache is an optimization: an unreachable registry means build here.
                pulled = None
                notes.append(f"cache unavailable, building here: {e.message}")
            if pulled is not None:
                done = pulled.manifest_digest
                remember_build(paths, key, done)
                source = "registry"
                notes.append(f"cache hit: pulled {pulled.repo_digest or done} "
                              f"({pulled.stats.bytes_received / 1e6:.1f} MB)")
        if done is None:
            wheels = _resolve_wheels(lock, paths, offline=offline, log=log)
            manifest_digest, built, build_notes = _build(cfg, paths, store, lock, wheels, key, log=log, on_layer=on_layer)
            notes += build_notes
            remember_build(paths, key, manifest_digest)
            source = "built"
    digest = done or manifest_digest
    if source != "registry" and not offline:
        try:
            if cache_lookup(registry_repo, key) != digest:
                pub = cache_publish(store, registry_repo, key, digest)
                if pub.replaced:
                    notes.append(f"the cache tag {pub.tag} named {pub.replaced}, a different image for the same "
                                 "inputs: that build was not reproducible; replaced it")
                notes.append(f"cache miss: published {pub.repo_digest}")
        except HermeticError as e:
            # A read-only token (e.g. a fork's pull request) must not fail the build.
            notes.append(f"could not publish to the cache: {e.message}")
    info = image_info(store, digest, key)
    return finish(cfg, store, info, noop=source == "local", load=load, t0=t0, notes=notes, built=built)
