"""The CI build cache: a registry tag that is a pure function of the build key.

The builder hashes every input of a build into a 64-hex build key. Because
builds are byte-reproducible, the key determines the image, so a tag derived
from the key alone (``hk-<key>``) can stand for "the image these inputs
make": a runner that finds the tag pulls the image by digest instead of
building; a runner that misses builds and publishes. Two runners that miss at
the same time build the same digest and PUT the same manifest bytes under the
same tag, which the Distribution API treats as the same write: publishing is
idempotent.

The full key goes into the tag (67 characters, under the 128 allowed): a
truncated key would make collisions merely unlikely instead of impossible.
"""

from __future__ import annotations

from dataclasses import dataclass

from hermetic.builder.reference import ImageName, parse_image_name
from hermetic.canonical import is_sha256_hex, sha256_digest
from hermetic.errors import HermeticError
from hermetic.registry.client import RegistryClient, TransferStats
from hermetic.registry.locations import record_image_location
from hermetic.registry.progress import TransferProgress
from hermetic.registry.pull import PullResult, pull_image
from hermetic.registry.push import push_image
from hermetic.store.oci import OciStore

CACHE_TAG_PREFIX = "hk-"


def cache_tag(build_key: str) -> str:
    """``hk-<64 hex>``: the registry tag for a build key (a pure function of it)."""
    if not is_sha256_hex(build_key):
        raise ValueError(f"build key must be 64 lowercase hex digits, got {build_key!r}")
    return CACHE_TAG_PREFIX + build_key


def parse_cache_repo(registry_repo: str) -> ImageName:
    """``host[:port]/repo``: where cache entries live (no tag, no digest)."""
    try:
        name = parse_image_name(registry_repo)
    except ValueError as e:
        raise HermeticError(f"--cache {registry_repo}: {e}") from None
    if name.host is None or name.tag or name.digest:
        raise HermeticError(f"--cache {registry_repo}: must be HOST[:PORT]/REPO without tag or digest, "
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
        return {"repo_digest": self.repo_digest, "tag": self.tag, "pushed": self.pushed,
                "replaced": self.replaced, **self.stats.to_json()}


def cache_lookup(registry_repo: str, build_key: str, *, client: RegistryClient | None = None) -> str | None:
    """The manifest digest cached for ``build_key`` in ``registry_repo``, or None on a miss."""
    name = parse_cache_repo(registry_repo)
    tag = cache_tag(build_key)
    client = client or RegistryClient(name.registry_host())
    head = client.head_manifest(name.registry_repository(), tag)
    if head is None:
        return None
    digest, _ = head
    if digest and digest.startswith("sha256:"):
        return digest
    return sha256_digest(client.get_manifest(name.registry_repository(), tag).body)


def cache_fetch(store: OciStore, registry_repo: str, build_key: str, *, client: RegistryClient | None = None,
                progress: TransferProgress | None = None) -> PullResult | None:
    """On a hit, pull the cached image by digest (verified) and return it; None on a miss."""
    name = parse_cache_repo(registry_repo)
    client = client or RegistryClient(name.registry_host())
    digest = cache_lookup(registry_repo, build_key, client=client)
    if digest is None:
        return None
    ref = ImageName(name.host, name.repository, None, digest)
    return pull_image(store, ref, client=client, progress=progress)


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
