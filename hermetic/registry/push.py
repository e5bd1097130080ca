"""Push an image from the local OCI store, every digest preserved (the store's bytes as they are; ``docker push``
recompresses). Per blob, cheapest first: HEAD (skip), a cross-repository mount, an upload (PUT, or PATCH chunks).
The manifest goes last, so a push killed midway is finished by running it again.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from hermetic.core.errors import DataError, IntegrityError, NotFound, UsageError
from hermetic.core.reference import ImageName, parse_image_arg
from hermetic.registry.client import RegistryClient
from hermetic.registry.deadlines import Timeouts
from hermetic.registry.documents import descriptor, image_blobs
from hermetic.registry.locations import blob_locations, record_blob_locations, record_image_location
from hermetic.registry.progress import NoProgress, TransferProgress
from hermetic.registry.transport import TransferStats, result_json, retried
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES, Descriptor, OciStore

# Blobs above this go up in PATCH chunks: a broken connection then costs one
# chunk, not the whole layer, and registries with body-size limits accept it.
CHUNKED_THRESHOLD = 128 << 20
CHUNK_SIZE = 64 << 20
DEFAULT_WORKERS = 4
MANIFEST_ATTEMPTS = 4
RACE_CODES = ("DIGEST_INVALID", "MANIFEST_BLOB_UNKNOWN")

BlobOutcome = Literal["skipped", "mounted", "uploaded"]


@dataclass(frozen=True)
class PushResult:
    manifest_digest: str
    media_type: str
    registry: str
    repository: str
    tag: str | None
    stats: TransferStats
    attached: tuple[str, ...] = ()  # the base manifest and referrers pushed along (hermetic/registry/referrers.py)

    @property
    def repo_digest(self) -> str:
        return f"{self.registry}/{self.repository}@{self.manifest_digest}"

    def to_json(self) -> dict:
        return {"repo_digest": self.repo_digest, **result_json(self)}


def parse_push_ref(ref: str) -> ImageName:
    """``host[:port]/repo[:tag]``; a digest is allowed only as a check of what is pushed."""
    return parse_image_arg(ref, "write HOST[:PORT]/REPO[:TAG], e.g. ghcr.io/acme/train:v1")


def push_image(
    store: OciStore,
    manifest_digest: str,
    ref: str | ImageName,
    *,
    client: RegistryClient | None = None,
    workers: int = DEFAULT_WORKERS,
    chunked_threshold: int = CHUNKED_THRESHOLD,
    chunk_size: int = CHUNK_SIZE,
    progress: TransferProgress | None = None,
    timeout: float | None = None,
) -> PushResult:
    """Push the image (or image index) ``manifest_digest`` from ``store`` to ``ref``.

    Tags ``ref``'s tag when it has one, else pushes by digest only. Records the repo digest (see ``repo_digests``)
    and where each blob now lives. ``timeout``: seconds for the whole push (default HERMETIC_REGISTRY_TIMEOUT, else
    an hour); a deadline that passes is RegistryTimeout (exit 75)."""
    name = parse_push_ref(ref) if isinstance(ref, str) else ref
    if name.digest is not None and name.digest != manifest_digest:
        raise UsageError(f"{name} names digest {name.digest}, but the image to push is {manifest_digest}")
    host = name.registry_host()
    repository = name.registry_repository()
    client = client or RegistryClient(host, timeouts=Timeouts.from_env(total=timeout))
    client.begin("push", timeout)
    progress = progress or NoProgress()
    pusher = _Pusher(store, client, host, repository, max(1, min(workers, 8)), chunked_threshold, chunk_size, progress)
    media_type = pusher.push_manifest(manifest_digest, name.tag)
    from hermetic.registry.referrers import push_attached

    # The base manifest and the attestations (OCI 1.1 referrers), so the image can be verified anywhere.
    attached = push_attached(store, client, repository, manifest_digest, pusher.push_manifest)
    shown_host = "docker.io" if name.host is None else host
    record_image_location(store, manifest_digest, f"{shown_host}/{repository}@{manifest_digest}")
    return PushResult(manifest_digest, media_type, shown_host, repository, name.tag, client.stats, tuple(attached))


@dataclass
class _Pusher:
    store: OciStore
    client: RegistryClient
    host: str
    repository: str
    workers: int
    chunked_threshold: int
    chunk_size: int
    progress: TransferProgress

    def push_manifest(self, digest: str, tag: str | None) -> str:
        desc = self.store.find_manifest(digest)
        if desc is None:
            raise NotFound(f"image {digest} is not in the store {self.store.root}")
        body = self.store.read_blob(digest)  # verified: we never push a corrupt manifest
        try:
            doc = json.loads(body)
        except ValueError:
            raise IntegrityError(f"store blob {digest} is not a JSON manifest") from None
        media_type = doc.get("mediaType") or desc.media_type
        if media_type in INDEX_TYPES:
            for i, child in enumerate(doc.get("manifests") or []):
                self.push_manifest(descriptor({"mediaType": MANIFEST_TYPES[0], **child} if isinstance(child, dict)
                                              else child, f"store index {digest}, entry {i}").digest, None)
        elif media_type in MANIFEST_TYPES:
            blobs = image_blobs(doc, f"store manifest {digest}")
            for b in blobs:
                if not self.store.has_blob(b.digest):
                    raise DataError(f"image {digest} is incomplete in the store: blob {b.digest} is missing",
                                    hint="rebuild it, or pull it again by digest")
            self.push_blobs(blobs)
        else:
            raise DataError(f"image {digest}: cannot push a manifest of media type {media_type!r}")
        returned = self._put_manifest(tag or digest, body, media_type)
        if returned is not None and returned != digest:
            raise IntegrityError(
                f"registry {self.host} stored {self.repository} manifest as {returned}, expected {digest}"
            )
        return media_type

    def _put_manifest(self, reference: str, body: bytes, media_type: str) -> str | None:
        # Distribution 2.8 answers DIGEST_INVALID or MANIFEST_BLOB_UNKNOWN to a manifest PUT that races
        # another client writing the same blobs or manifest (two CI runners publishing one build):
        # our bytes are the ones whose digest we computed, so the same PUT is sent again, a few times.
        put = self.client.put_manifest
        return retried(MANIFEST_ATTEMPTS, lambda: put(self.repository, reference, body, media_type),
                       lambda e: e.code in RACE_CODES, lambda attempt: 0.2 * attempt)

    def push_blobs(self, blobs: list[Descriptor]) -> None:
        # Biggest first: the pool's wall time is bounded by the largest blob.
        blobs = sorted(blobs, key=lambda b: -b.size)
        advance = self.progress.start(f"push {self.host}/{self.repository}", sum(b.size for b in blobs))
        with ThreadPoolExecutor(max_workers=min(self.workers, len(blobs)) or 1,
                                thread_name_prefix="hermetic-push") as pool:
            futures = [pool.submit(self.push_blob, b, advance) for b in blobs]
            for f in futures:
                f.result()
        record_blob_locations(self.store, self.host, self.repository, [b.digest for b in blobs])

    def push_blob(self, blob: Descriptor, advance) -> BlobOutcome:
        client, repo = self.client, self.repository
        if client.blob_size(repo, blob.digest) is not None:
            client.stats.add(blobs_skipped=1)
            advance(blob.size)
            return "skipped"
        location = None
        sources = [r for r in blob_locations(self.store, self.host, blob.digest) if r != repo]
        if sources:
            # One try, from where it was seen last: a refused mount opens a normal upload session (202).
            location = client.start_upload(repo, mount=blob.digest, mount_from=sources[0])
            if location is None:
                client.stats.add(blobs_mounted=1)
                advance(blob.size)
                return "mounted"
        refused = [location] if location else []  # a refused mount's session serves the first try, then a fresh one
        retried(2, lambda: self.upload(refused.pop() if refused else client.start_upload(repo), blob, advance))
        client.stats.add(blobs_uploaded=1)
        return "uploaded"

    def upload(self, location: str, blob: Descriptor, advance) -> None:
        path = self.store.blob_path(blob.digest)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != blob.size:
                raise IntegrityError(f"store blob {blob.digest} is {size} bytes, the manifest says {blob.size}")
            chunk_size = self.chunk_size if size > self.chunked_threshold else size
            self.client.upload(self.repository, location, blob.digest, size, f, chunk_size, advance)
