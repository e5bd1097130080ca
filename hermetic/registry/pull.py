"""Pull an image by digest into the local OCI store, all or nothing: everything is fetched and checked first
(manifests, descriptors, config, attestations, the base), the layers hashed into uncommitted temp files, and only
then committed: blobs, base, manifests, ref, referrers. OCI and Docker v2 schema 2 manifests are stored as
served; an index resolves to its linux/amd64 image; schema 1 is refused.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hermetic.core.display import escape_controls
from hermetic.core.errors import DataError, HermeticError, IntegrityError, NotFound, ProtocolError, UsageError
from hermetic.core.reference import ImageName, parse_image_arg, parse_pinned
from hermetic.registry.client import RegistryClient
from hermetic.registry.deadlines import Timeouts
from hermetic.registry.documents import descriptor, image_blobs, parse_document
from hermetic.registry.locations import record_blob_locations, record_image_location
from hermetic.registry.progress import NoProgress, TransferProgress
from hermetic.registry.transport import TransferStats, result_json, retried
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES, BlobWriter, Descriptor, OciStore

DEFAULT_PLATFORM = ("linux", "amd64")
DEFAULT_WORKERS = 4
DOWNLOAD_ATTEMPTS = 3  # a connection that breaks mid-blob is retried; wrong bytes never are


@dataclass(frozen=True)
class PullResult:
    manifest_digest: str  # the image manifest now complete in the store
    requested_digest: str  # what the reference named (an index digest, or the same manifest)
    media_type: str
    ref_name: str  # the store ref pointing at the image
    repo_digest: str | None  # host/repo@requested digest, when it came from (or is known in) a registry
    already_present: bool
    stats: TransferStats
    attestations: tuple[str, ...] = ()  # "<artifactType> <manifest digest>" of the verified referrers pulled along
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return result_json(self, {"ref_name": "ref"})


def parse_pull_ref(ref: str) -> ImageName:
    return parse_pinned(ref, "digest", "", lambda name: f"pull by digest: hermetic pull {_repo(name)}@sha256:… "
                                                        f"(the repo digest `hermetic push {name}` printed)")


def _repo(name: ImageName) -> str:
    """HOST[:PORT]/REPO, as the user wrote it (no tag)."""
    return (f"{name.host}/" if name.host else "") + name.repository


def ensure_image(store: OciStore, ref_with_digest: str, *, client: RegistryClient | None = None) -> str:
    """The image manifest digest for ``ref_with_digest``, pulling it only if the store lacks it.

    ``[host/]repo[:tag]@sha256:…``; a digest of an index resolves to its linux/amd64 image. A name without a host is
    looked up in the store only."""
    return pull_image(store, ref_with_digest, client=client).manifest_digest


def pull_image(
    store: OciStore,
    ref: str | ImageName,
    *,
    client: RegistryClient | None = None,
    platform: tuple[str, str] = DEFAULT_PLATFORM,
    workers: int = DEFAULT_WORKERS,
    ref_name: str | None = None,
    progress: TransferProgress | None = None,
    timeout: float | None = None,
) -> PullResult:
    """Pull ``ref`` (pinned by digest) into ``store``. ``timeout``: seconds for the whole pull (default
    HERMETIC_REGISTRY_TIMEOUT, else an hour); a deadline that passes is RegistryTimeout (exit 75). `hermetic cache
    gc` waits for it (hermetic.store.inuse.writing): its blobs are named by no ref until the end."""
    from hermetic.store.inuse import writing

    with writing(store):
        name = parse_pull_ref(ref) if isinstance(ref, str) else ref
        assert name.digest is not None
        requested = name.digest
        ref_name = ref_name or f"{_repo(name)}@{name.digest}"  # skopeo's oci: transport reads it

        local = _local_image(store, requested, platform)
        if local is not None:
            current = store.resolve(ref_name)
            if current is None or current.digest != local.digest:
                store.set_ref(ref_name, local)
            repo_digest = f"{name.host}/{name.registry_repository()}@{requested}" if name.host else None
            return PullResult(local.digest, requested, local.media_type, ref_name, repo_digest, True,
                              client.stats if client else TransferStats())
        if name.host is None:
            raise NotFound(f"image {name} is not in the store {store.root} and names no registry to pull from",
                           hint="write HOST[:PORT]/REPO@sha256:… to pull it")

        host, repository = name.registry_host(), name.registry_repository()
        client = client or RegistryClient(host, timeouts=Timeouts.from_env(total=timeout))
        client.begin("pull", timeout)
        # Everything is fetched and checked before anything is stored (the module docstring).
        top_body, top_type = _fetch_manifest(client, repository, requested)
        manifests: list[tuple[str, bytes]] = [(requested, top_body)]
        image_digest, image_body, image_type = requested, top_body, top_type
        if top_type in INDEX_TYPES:
            source = f"registry {host}: index {requested} of {repository}"
            child = select_platform(parse_document(top_body, source), platform, f"{name}", source)
            image_body, image_type = _fetch_manifest(client, repository, child.digest)
            image_digest = child.digest
            manifests.insert(0, (image_digest, image_body))
        if image_type not in MANIFEST_TYPES:
            raise DataError(f"{name}: {image_digest} is a {escape_controls(repr(image_type), 120)}, "
                            "not an image manifest")

        where = f"registry {host}: manifest {image_digest} of {repository}"
        blobs = image_blobs(parse_document(image_body, where), where)
        config_desc, layers = blobs[0], blobs[1:]
        from hermetic.registry.referrers import MAX_ARTIFACT_BYTES, download_small, fetch_attestations, fetch_base

        if config_desc.size > MAX_ARTIFACT_BYTES:
            raise IntegrityError(f"{where}: its config is {config_desc.size} bytes; a config over {MAX_ARTIFACT_BYTES} "
                                 "bytes is refused")
        config = (store.read_blob(config_desc.digest) if store.has_blob(config_desc.digest) else
                  download_small(client, repository, config_desc.digest, config_desc.size,
                                 f"the config of {repository}@{image_digest}"))
        if not store.has_blob(config_desc.digest):
            client.stats.add(blobs_downloaded=1)
        attached, notes = fetch_attestations(client, repository, image_digest)  # verified, in memory
        layer_digests = {b.digest for b in layers}
        base = fetch_base(client, repository, config, lambda d: d in layer_digests or store.has_blob(d))
        missing = [b for b in layers if not store.has_blob(b.digest)]
        short = f"{host}/{repository}@{requested[:19]}"  # sha256: + 12 hex, like docker's short IDs
        writers = _download_all(store, client, repository, missing, max(1, min(workers, 8)), progress or NoProgress(),
                                short)

        # Nothing was refused: commit, blobs before the documents that name them, the referrers last.
        _commit(writers)
        store.put_bytes(config, config_desc.digest)
        if base is not None and not store.has_image(base.digest):
            store.put_bytes(base.config, base.config_digest)
            store.put_bytes(base.manifest, base.digest)
        for digest, body in manifests:  # children before the index, the image before any ref
            store.put_bytes(body, expected_digest=digest)
        store.set_ref(ref_name, Descriptor(image_type, image_digest, len(image_body)))
        from hermetic.store.referrers import add_referrers

        add_referrers(store, image_digest, attached)
        repo_digest = f"{host}/{repository}@{requested}"
        record_image_location(store, image_digest, f"{host}/{repository}@{image_digest}")
        if requested != image_digest:
            record_image_location(store, requested, repo_digest)
        record_blob_locations(store, host, repository, [b.digest for b in blobs] + [d for d, _ in manifests])
        return PullResult(image_digest, requested, image_type, ref_name, repo_digest, False, client.stats,
                          tuple(f"{a.artifact_type} {a.digest}" for a in attached), tuple(notes))


def resolve_tag(ref: str, *, client: RegistryClient | None = None) -> str:
    """The digest a tag points to now (``host/repo[:tag]``, default tag ``latest``).

    HEAD with Accept for OCI and Docker types; the registry's Docker-Content-Digest, else the sha256 of the GET
    body. For a multi-arch image this is the index digest, which is what a pin should name."""
    name = parse_image_arg(ref)
    if name.digest is not None:
        return name.digest
    if name.host is None:
        raise UsageError(f"{ref} names no registry host; write HOST[:PORT]/REPO[:TAG]")
    repository = name.registry_repository()
    tag = name.tag or "latest"
    digest = (client or RegistryClient(name.registry_host())).tag_digest(repository, tag)
    if digest is None:
        raise NotFound(f"{name.registry_host()}/{repository}:{tag} not found in the registry")
    return digest


# -- helpers -----------------------------------------------------------------

def select_platform(index: dict, platform: tuple[str, str], what: str, source: str | None = None) -> Descriptor:
    """The ``platform`` image an index lists, its descriptor checked (``source``: where the index came from)."""
    os_name, arch = platform
    where = source or what
    seen = []
    entries = index.get("manifests") or []
    if not isinstance(entries, list):
        raise IntegrityError(f"{where}: its manifests are not a list")
    for i, m in enumerate(entries):
        if not isinstance(m, dict):
            raise IntegrityError(f"{where}: entry {i} of its manifests is not a JSON object")
        p = m.get("platform") if isinstance(m.get("platform"), dict) else {}
        seen.append(escape_controls(f"{p.get('os', '?')}/{p.get('architecture', '?')}", 60))
        is_image = m.get("mediaType", MANIFEST_TYPES[0]) in MANIFEST_TYPES
        if p.get("os") == os_name and p.get("architecture") == arch and is_image:
            return descriptor({"mediaType": MANIFEST_TYPES[0], **m}, f"{where}, entry {i}")
    raise NotFound(f"{what} has no {os_name}/{arch} image (it lists: {', '.join(seen) or 'nothing'})")


def _local_image(store: OciStore, digest: str, platform: tuple[str, str]) -> Descriptor | None:
    """The complete image ``digest`` names in the store (through an index), or None."""
    if not store.has_blob(digest):
        return None
    try:
        doc = store.read_json(digest)
    except (ValueError, HermeticError):
        return None
    if not isinstance(doc, dict):
        return None
    if "manifests" in doc:
        try:
            child = select_platform(doc, platform, digest)
        except HermeticError:
            return None
        return child if store.has_image(child.digest) else None
    if store.has_image(digest):
        return Descriptor(doc.get("mediaType") or MANIFEST_TYPES[0], digest, store.blob_size(digest))
    return None


def _fetch_manifest(client: RegistryClient, repository: str, digest: str) -> tuple[bytes, str]:
    resp = client.get_manifest(repository, digest)
    doc = parse_document(resp.body, f"registry {client.host}: manifest {digest} of {repository}")
    if doc.get("schemaVersion") == 1:
        raise ProtocolError(f"{client.host}/{repository}@{digest} is a Docker schema 1 manifest, which has no "
                            "content-addressed config; re-push it with a current client")
    media_type = doc.get("mediaType") or resp.media_type
    if not isinstance(media_type, str):
        raise IntegrityError(f"registry {client.host}: manifest {digest} of {repository}: its mediaType is not a string")
    if not media_type:  # OCI manifests may omit mediaType; tell them apart by shape
        media_type = INDEX_TYPES[0] if "manifests" in doc else MANIFEST_TYPES[0]
    return resp.body, media_type


def _download_all(store: OciStore, client: RegistryClient, repository: str, blobs: list[Descriptor],
                  workers: int, progress: TransferProgress, what: str) -> list[BlobWriter]:
    """Download and verify every blob into an uncommitted writer; on any failure none is kept."""
    if not blobs:
        return []
    advance = progress.start(f"pull {what}", sum(b.size for b in blobs))
    with ThreadPoolExecutor(max_workers=min(workers, len(blobs)), thread_name_prefix="hermetic-pull") as pool:
        futures = [pool.submit(_download, store, client, repository, b, advance) for b in blobs]
        outcomes = [(f.result() if f.exception() is None else f.exception()) for f in futures]
    verified = [w for w in outcomes if isinstance(w, BlobWriter)]
    failed = [e for e in outcomes if not isinstance(e, BlobWriter)]
    if failed:
        for w in verified:
            w.abort()
        raise failed[0]
    return verified


def _commit(writers: list[BlobWriter]) -> None:
    try:
        for w in writers:
            w.commit()  # re-checks digest and size, then renames into place
    except BaseException:
        for w in writers:
            if w.digest is None:
                w.abort()
        raise


def _download(store: OciStore, client: RegistryClient, repository: str, blob: Descriptor, advance) -> BlobWriter:
    """One blob into an uncommitted BlobWriter, verified; a broken connection is retried from the start."""
    return retried(DOWNLOAD_ATTEMPTS, lambda: _download_once(store, client, repository, blob, advance))


def _download_once(store: OciStore, client: RegistryClient, repository: str, blob: Descriptor,
                   advance) -> BlobWriter:
    w = store.writer(blob.digest, blob.size)
    h = hashlib.sha256()
    size = 0
    try:
        for chunk in client.iter_blob(repository, blob.digest):
            size += len(chunk)
            if size > blob.size:
                raise IntegrityError(f"registry {client.host} served more than the {blob.size} bytes of {blob.digest}")
            h.update(chunk)
            w.write(chunk)
            advance(len(chunk))
        actual = "sha256:" + h.hexdigest()
        if actual != blob.digest or size != blob.size:
            raise IntegrityError(
                f"registry {client.host} served {repository} blob {blob.digest} with content hashing to {actual} "
                f"({size} bytes); nothing was stored"
            )
    except BaseException:
        w.abort()
        advance(-size)
        raise
    client.stats.add(blobs_downloaded=1)
    return w
