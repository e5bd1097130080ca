"""OCI 1.1 referrers over the Distribution API: attach an image's attestations, fetch them back.

Push: each artifact manifest by digest, plus the referrers index under the tag ``sha256-<hex>`` where the registry
has no referrers API, and the base's manifest (so a rebuild can pull the base). Fetch: the API, else the tag;
every descriptor, manifest and blob checked, every ``subject`` the image, nothing over MAX_ARTIFACT_BYTES
buffered; for a pull, what they say is checked too, in memory, before anything is stored.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Callable

from hermetic.core.canonical import canonical_json, sha256_digest
from hermetic.core.display import escape_controls
from hermetic.core.errors import IntegrityError
from hermetic.core.reference import is_digest
from hermetic.registry.client import RegistryClient
from hermetic.registry.documents import descriptor, image_blobs, parse_document
from hermetic.registry.transport import RegistryError
from hermetic.store.oci import MT_INDEX, MT_MANIFEST, OciStore
from hermetic.store.referrers import (
    EMPTY_DIGEST, TITLE_ANNOTATION, Artifact, check_artifact, list_referrers, merge_referrers, referrers_tag,
)

MAX_ARTIFACT_BYTES = 64 << 20
BASE_DIGEST_LABEL = "org.hermetic.base.digest"  # set by hermetic/builder/build.py image_labels


def _name(d: dict[str, Any]) -> str:
    annotations = d.get("annotations")
    title = annotations.get(TITLE_ANNOTATION) if isinstance(annotations, dict) else None
    kind = d.get("artifactType") or "artifact"
    return escape_controls(f"{title} ({kind})" if title else str(kind), 120)


def list_remote(client: RegistryClient, repository: str, subject_digest: str) -> tuple[list[dict[str, Any]], str]:
    """(referrer descriptors, "api" | "tag") for ``subject_digest`` in ``repository``."""
    tag = referrers_tag(subject_digest)
    for path, where, kind in ((f"referrers/{subject_digest}", f"the referrers of {repository}@{subject_digest}", "api"),
                              (f"manifests/{tag}", f"{repository}:{tag}", "tag")):
        resp = client.request("GET", f"/v2/{repository}/{path}", repository=repository, headers={"Accept": MT_INDEX},
                              ok=(200, 404), what=where)
        resp.close()
        if resp.status_code == 200:
            return _manifests(resp.content, f"registry {client.host}: {where}"), kind
    return [], "tag"


def _manifests(body: bytes, what: str) -> list[dict[str, Any]]:
    """The descriptors of a referrers list, each one checked (a digest that is not one fails: exit 65)."""
    try:
        doc = json.loads(body)
        manifests = doc["manifests"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise RegistryError(f"{what} is not an image index") from None
    if (doc.get("mediaType") or MT_INDEX) != MT_INDEX or not isinstance(manifests, list):
        raise RegistryError(f"{what} is not an image index "
                            f"(media type {escape_controls(repr(doc.get('mediaType')), 120)})")
    out = []
    for i, m in enumerate(manifests):
        if isinstance(m, dict) and "mediaType" not in m:
            m = {**m, "mediaType": MT_MANIFEST}
        descriptor(m, f"{what}, entry {i}")
        artifact_type = m.get("artifactType")
        if artifact_type is not None and not isinstance(artifact_type, str):
            raise IntegrityError(f"{what}, entry {i}: its artifactType is not a string")
        out.append(m)
    return out


def push_attached(store: OciStore, client: RegistryClient, repository: str, manifest_digest: str,
                  push_manifest: Callable[[str, str | None], str]) -> list[str]:
    """Push the image's base manifest and its referrers (with the fallback tag where needed); what was pushed."""
    pushed = []
    base = _base_digest(store, manifest_digest)
    if base and store.has_image(base):
        push_manifest(base, None)
        pushed.append(f"base {base}")
    local = list_referrers(store, manifest_digest)
    if not local:
        return pushed
    for d in local:
        push_manifest(d["digest"], None)
        pushed.append(f"{_name(d)} {d['digest']}")
    remote, source = list_remote(client, repository, manifest_digest)
    if source == "api":
        return pushed  # the registry lists manifests by their subject itself
    known = {m["digest"] for m in remote}
    if all(d["digest"] in known for d in local):
        return pushed
    body = canonical_json(merge_referrers({"manifests": remote}, local))
    tag = referrers_tag(manifest_digest)
    returned = client.put_manifest(repository, tag, body, MT_INDEX)
    if returned is not None and returned != sha256_digest(body):
        raise IntegrityError(f"registry {client.host} stored {repository}:{tag} as {returned}, "
                             f"expected {sha256_digest(body)}")
    pushed.append(f"referrers tag {tag}")
    return pushed


def _base_digest(store: OciStore, manifest_digest: str) -> str | None:
    try:
        doc = store.read_json(manifest_digest)
        return base_digest_of(store.read_blob(doc["config"]["digest"]))
    except Exception:  # an index, a foreign image: nothing to send along
        return None


def base_digest_of(config: bytes) -> str | None:
    """The base image digest an image config's label names (hermetic's images), or None; a label that
    is not a digest is treated as none, so it never becomes a URL or a path."""
    try:
        doc = json.loads(config)
        label = ((doc.get("config") or {}).get("Labels") or {}).get(BASE_DIGEST_LABEL)
    except (ValueError, AttributeError, TypeError, RecursionError):
        return None
    return label if is_digest(label) else None


def fetch_remote(client: RegistryClient, repository: str, subject_digest: str,
                 artifact_types: tuple[str, ...]) -> list[Artifact]:
    """The subject's referrers of ``artifact_types``, downloaded and verified (not stored)."""
    remote, _ = list_remote(client, repository, subject_digest)
    out = []
    where = f"{repository}@{subject_digest}"
    for d in remote:
        if d.get("artifactType") not in artifact_types or d.get("mediaType", MT_MANIFEST) != MT_MANIFEST:
            continue
        what = f"the {_name(d)} of {where}"
        if d["size"] > MAX_ARTIFACT_BYTES:
            raise IntegrityError(f"registry {client.host}: {what} is {d['size']} bytes; an attestation over "
                                 f"{MAX_ARTIFACT_BYTES} bytes is refused")
        body = client.get_manifest(repository, d["digest"], accept=MT_MANIFEST).body
        doc = check_artifact(body, subject_digest, f"registry {client.host}: {what}")
        if doc.get("artifactType") != d.get("artifactType"):
            raise IntegrityError(f"registry {client.host}: {what}: the manifest {d['digest']} says its type is "
                                 f"{escape_controls(repr(doc.get('artifactType')), 120)}; nothing was stored")
        if (doc.get("config") or {}).get("digest") != EMPTY_DIGEST:
            continue  # not an attestation laid out the way hermetic reads them
        layer = descriptor(doc["layers"][0], f"registry {client.host}: {what}")
        blob = download_small(client, repository, layer.digest, layer.size, what)
        out.append(Artifact(body, blob, str(doc.get("artifactType"))))
    return out


def download_small(client: RegistryClient, repository: str, digest: str, size: int, what: str) -> bytes:
    """A small blob (a document) into memory, verified against its digest and size."""
    if size > MAX_ARTIFACT_BYTES:
        raise IntegrityError(f"registry {client.host}: {what} is {size} bytes; refused")
    data = bytearray()
    for chunk in client.iter_blob(repository, digest):
        data += chunk
        if len(data) > size:
            break
    actual = sha256_digest(bytes(data))
    if actual != digest or len(data) != size:
        raise IntegrityError(f"registry {client.host} served {what} (blob {digest}) with content hashing "
                             f"to {actual} ({len(data)} bytes); nothing was stored")
    return bytes(data)


def fetch_attestations(client: RegistryClient, repository: str, subject_digest: str) -> tuple[list[Artifact], list[str]]:
    """hermetic's attestations of the image for a pull: (verified artifacts, notes); nothing is stored.

    A registry that cannot list referrers (an error other than 404) costs a note, not the pull; bytes that do not
    match their digest, or documents that are not about this image, fail it."""
    from hermetic.provenance import ATTESTATION_TYPES, MT_CYCLONEDX, MT_DSSE, MT_STATEMENT
    from hermetic.provenance.dsse import PAYLOAD_TYPE
    from hermetic.provenance.statement import BUILD_TYPE, PREDICATE_TYPE, read_statement

    where = f"registry {client.host}: {repository}@{subject_digest}"
    try:
        artifacts = fetch_remote(client, repository, subject_digest, ATTESTATION_TYPES)
    except RegistryError as e:
        return [], [f"attestations not fetched: {e.message}"]
    # What they say, checked before they are kept: every in-toto statement (bare or in a DSSE envelope) is about
    # the image; hermetic's provenance reads as one (read_statement); an attached SBOM is the one that provenance
    # names. (A signature's key is checked by `hermetic verify --key`: a pull has no key.)
    named_sbom = None
    for a in artifacts:
        what = f"{where}: the {escape_controls(a.artifact_type, 120)} {a.digest}"
        if a.artifact_type == MT_STATEMENT:
            doc = _statement_about(a.blob, subject_digest, what)
            definition = (doc.get("predicate") or {}).get("buildDefinition") if isinstance(doc.get("predicate"), dict) else None
            if doc.get("predicateType") == PREDICATE_TYPE and isinstance(definition, dict) \
                    and definition.get("buildType") == BUILD_TYPE:
                try:
                    facts = read_statement(a.blob, subject_digest=subject_digest, what=what)
                except IntegrityError:
                    raise
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise IntegrityError(f"{what}: not a provenance hermetic can read") from None
                named_sbom = (facts.sbom or {}).get("digest") or named_sbom
        elif a.artifact_type == MT_DSSE:
            try:
                env = json.loads(a.blob)
                payload = base64.b64decode(env["payload"], validate=True)
                payload_type = env["payloadType"]
                signatures = env["signatures"]
            except (ValueError, KeyError, TypeError, RecursionError):
                raise IntegrityError(f"{what}: not a DSSE envelope; nothing was stored") from None
            if payload_type != PAYLOAD_TYPE or not isinstance(signatures, list) or not signatures:
                raise IntegrityError(f"{what}: not a signed in-toto envelope (payloadType "
                                     f"{escape_controls(repr(payload_type), 120)}); nothing was stored")
            _statement_about(payload, subject_digest, f"{what} (its payload)")
    if named_sbom:
        for a in artifacts:
            if a.artifact_type == MT_CYCLONEDX and sha256_digest(a.blob) != named_sbom:
                raise IntegrityError(f"{where}: the attached SBOM ({sha256_digest(a.blob)}) is not the one its "
                                     f"provenance names ({named_sbom}); nothing was stored")
    return artifacts, []


def _statement_about(data: bytes, subject_digest: str, what: str) -> dict[str, Any]:
    """An in-toto Statement whose subjects include the image, or IntegrityError."""
    from hermetic.provenance.statement import STATEMENT_TYPE

    doc = parse_document(data, what)
    if doc.get("_type") != STATEMENT_TYPE:
        raise IntegrityError(f"{what}: not an in-toto Statement v1; nothing was stored")
    hexpart = subject_digest.partition(":")[2]
    subjects = doc.get("subject")
    if not isinstance(subjects, list) or not any(
            isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get("sha256") == hexpart
            for s in subjects):
        raise IntegrityError(f"{what}: its subject is not the image {subject_digest}; nothing was stored")
    return doc


@dataclass(frozen=True)
class BaseImage:
    """The base's manifest and config, fetched and verified, ready to be stored with the image."""

    digest: str
    manifest: bytes
    config_digest: str
    config: bytes


def fetch_base(client: RegistryClient, repository: str, config: bytes, has_blob: Callable[[str], bool]) -> BaseImage | None:
    """For a pull: the base's manifest and config from the same repository, when it has them (verified, in memory);
    None when the image names no base, the repository lacks it, or a layer it lists is not one ``has_blob`` knows
    (then it is not this image's base after all). Its layers are the image's first layers; with the manifest too,
    the base is a complete image in the store, so a later push sends it along again and a local ``hermetic verify``
    can rebuild on it."""
    base = base_digest_of(config)
    if not base:
        return None
    what = f"the base manifest {base} of {repository}"
    try:
        body = client.get_manifest(repository, base, accept=MT_MANIFEST).body
    except RegistryError:
        return None  # absent, or an optional extra the registry cannot give: the image itself is complete
    where = f"registry {client.host}: {what}"
    blobs = image_blobs(parse_document(body, where), where)
    config_desc, layers = blobs[0], blobs[1:]
    if not all(has_blob(x.digest) for x in layers):
        return None  # not this image's base after all: keep nothing that would name missing layers
    data = download_small(client, repository, config_desc.digest, config_desc.size, f"the config of the base {base}")
    return BaseImage(base, body, config_desc.digest, data)
