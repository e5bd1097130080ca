"""The CI build cache: the tag ``hk-<build key>`` stands for the image those inputs make (builds are
byte-reproducible). A runner that finds it pulls by digest; one that misses builds and publishes; two that miss
together PUT the same bytes under the same tag, one write. The full key goes in the tag (no truncation, no
collisions)."""

from __future__ import annotations

from dataclasses import dataclass

from hermetic.core.canonical import is_sha256_hex
from hermetic.core.errors import HermeticError, UsageError
from hermetic.core.reference import ImageName, parse_image_arg
from hermetic.registry.client import RegistryClient
from hermetic.registry.locations import record_image_location
from hermetic.registry.progress import TransferProgress
from hermetic.registry.pull import PullResult, pull_image
from hermetic.registry.push import push_image
from hermetic.registry.transport import TransferStats, result_json
from hermetic.store.oci import OciStore

CACHE_TAG_PREFIX = "hk-"


def cache_tag(build_key: str) -> str:
    """``hk-<64 hex>``: the registry tag for a build key (a pure function of it)."""
    if not is_sha256_hex(build_key):
        raise ValueError(f"build key must be 64 lowercase hex digits, got {build_key!r}")
    return CACHE_TAG_PREFIX + build_key


def parse_cache_repo(registry_repo: str) -> ImageName:
    """``host[:port]/repo``: where cache entries live (no tag, no digest)."""
    name = parse_image_arg(registry_repo, prefix=f"--cache {registry_repo}: ")
    if name.host is None or name.tag or name.digest:
        raise UsageError(f"--cache {registry_repo}: must be HOST[:PORT]/REPO without tag or digest, "
                            "e.g. ghcr.io/acme/hermetic-cache")
    return name


@dataclass(frozen=True)
class CachePublish:
    repo_digest: str  # host/repo@manifest digest
    tag: str
    pushed: bool  # False when the tag already named this digest (another runner won the race)
    replaced: str | None  # the digest the tag named before, if different (a non-reproducible build!)
    stats: TransferStats

    def to_json(self) -> dict:
        return result_json(self)


def cache_lookup(registry_repo: str, build_key: str, *, client: RegistryClient | None = None) -> str | None:
    """The manifest digest cached for ``build_key`` in ``registry_repo``, or None on a miss."""
    name = parse_cache_repo(registry_repo)
    tag = cache_tag(build_key)
    return (client or RegistryClient(name.registry_host())).tag_digest(name.registry_repository(), tag)


def cache_fetch(store: OciStore, registry_repo: str, build_key: str, *, client: RegistryClient | None = None,
                progress: TransferProgress | None = None) -> PullResult | None:
    """On a hit, pull the cached image by digest (verified) and return it; None on a miss."""
    name = parse_cache_repo(registry_repo)
    client = client or RegistryClient(name.registry_host())
    digest = cache_lookup(registry_repo, build_key, client=client)
    if digest is None:
        return None
    return pull_image(store, ImageName(name.host, name.repository, None, digest), client=client, progress=progress)


def cache_publish(store: OciStore, registry_repo: str, build_key: str, manifest_digest: str, *,
                  client: RegistryClient | None = None, progress: TransferProgress | None = None) -> CachePublish:
    """Push ``manifest_digest`` and tag it ``cache_tag(build_key)``; safe to run concurrently."""
    name = parse_cache_repo(registry_repo)
    host, repository = name.registry_host(), name.registry_repository()
    tag = cache_tag(build_key)
    client = client or RegistryClient(host)
    repo_digest = f"{host}/{repository}@{manifest_digest}"
    before = cache_lookup(registry_repo, build_key, client=client)
    if before == manifest_digest:
        record_image_location(store, manifest_digest, repo_digest)
        return CachePublish(repo_digest, tag, False, None, client.stats)
    result = push_image(store, manifest_digest, ImageName(host, repository, tag, None), client=client, progress=progress)
    return CachePublish(result.repo_digest, tag, True, before, result.stats)


class RegistryCache:
    """``hermetic build --cache REGISTRY/REPO``: the builder's ImageCache on a registry.

    A hit is pulled by digest, every blob verified; a miss is built locally and published. Builds are reproducible,
    so two runners that miss at once publish the same digest under the same tag. An unreachable or read-only
    registry is a note, never a failed build."""

    def __init__(self, registry_repo: str):
        parse_cache_repo(registry_repo)  # a bad --cache value fails before any work
        self.registry_repo = registry_repo

    def pull(self, store: OciStore, key: str, notes: list[str]) -> str | None:
        try:
            pulled = cache_fetch(store, self.registry_repo, key)
        except HermeticError as e:
            notes.append(f"cache unavailable, building here: {e.message}")
            return None
        if pulled is None:
            return None
        notes.append(f"cache hit: pulled {pulled.repo_digest or pulled.manifest_digest} "
                     f"({pulled.stats.bytes_received / 1e6:.1f} MB)")
        return pulled.manifest_digest

    def publish(self, store: OciStore, key: str, manifest_digest: str, notes: list[str]) -> None:
        try:
            pub = cache_publish(store, self.registry_repo, key, manifest_digest)
            if not pub.pushed:
                return
            if pub.replaced:
                notes.append(f"the cache tag {pub.tag} named {pub.replaced}, a different image for the same "
                             "inputs: that build was not reproducible; replaced it")
            notes.append(f"cache miss: published {pub.repo_digest}")
        except HermeticError as e:
            # A read-only token (e.g. a fork's pull request) must not fail the build.
            notes.append(f"could not publish to the cache: {e.message}")
