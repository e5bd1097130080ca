"""OCI 1.1 referrers over the Distribution API: attach an image's attestations, fetch them back.

Push (distribution-spec 1.1, "Pushing Manifests with Subject"): each
artifact manifest of the store's referrers list for the image is pushed by
digest (its blobs first, as for any manifest). Where the registry has the
referrers API (``GET /v2/<name>/referrers/<digest>`` answers anything but
404) that is all; otherwise (Debian's docker-registry 2.8) the client keeps
the list itself, as an image index under the tag ``sha256-<hex>``: read it
(a 404 starts an empty one), add what is missing, put it back. The base
image's manifest goes along too, by digest (its layers are the image's first
layers, so only the manifest and config cross the wire): a machine that never
saw the project can then pull the base from the same repository to rebuild.

Fetch: the referrers API, else the tag; only artifacts of the types asked
for; every manifest and blob is checked against the digest that names it and
every artifact must name the image as its ``subject``. Attestations are
documents: one bigger than ``MAX_ARTIFACT_BYTES`` is refused, not buffered.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from hermetic.canonical import canonical_json, sha256_digest
from hermetic.errors import IntegrityError
from hermetic.registry.client import RegistryClient, RegistryError
from hermetic.store.oci import MT_INDEX, MT_MANIFEST, OciStore
from hermetic.store.referrers import (
    EMPTY_DIGEST, TITLE_ANNOTATION, Artifact, check_artifact, list_referrers, merge_referrers, referrers_tag,
)

MAX_ARTIFACT_BYTES = 64 << 20
BASE_DIGEST_LABEL = "org.hermetic.base.digest"  # set by hermetic/builder/build.py image_labels


def _name(d: dict[str, Any]) -> str:
    title = (d.get("annotations") or {}).get(TITLE_ANNOTATION)
    kind = d.get("artifactType") or "artifact"
    return f"{title} ({kind})" if title else kind


def list_remote(client: RegistryClient, repository: str, subject_digest: str) -> tuple[list[dict[str, Any]], str]:
    """(referrer descriptors, "api" | "tag") for ``subject_digest`` in ``repository``."""
    resp = client.request("GET", f"/v2/{repository}/referrers/{subject_digest}", repository=repository,
                          headers={"Accept": MT_INDEX}, ok=(200, 404))
    body = resp.content
    resp.close()
    if resp.status_code == 200:
        return _manifests(body, f"registry {client.host}: the referrers of {repository}@{subject_digest}"), "api"
    tag = referrers_tag(subject_digest)
    resp = client.request("GET", f"/v2/{repository}/manifests/{tag}", repository=repository,
                          headers={"Accept": MT_INDEX}, ok=(200, 404))
    body = resp.content
    resp.close()
    if resp.status_code == 404:
        return [], "tag"
    return _manifests(body, f"registry {client.host}: {repository}:{tag}"), "tag"


def _manifests(body: bytes, what: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(body)
        manifests = doc["manifests"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{what} is not an image index") from None
    if (doc.get("mediaType") or MT_INDEX) != MT_INDEX or not isinstance(manifests, list):
        raise RegistryError(f"{what} is not an image index (media type {doc.get('mediaType')!r})")
    return [m for m in manifests if isinstance(m, dict) and isinstance(m.get("digest"), str)]


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
        config = store.read_json(doc["config"]["digest"])
        return ((config.get("config") or {}).get("Labels") or {}).get(BASE_DIGEST_LABEL)
    except Exception:  # an index, a foreign image: nothing to send along
        return None


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
        if int(d.get("size") or 0) > MAX_ARTIFACT_BYTES:
            raise IntegrityError(f"registry {client.host}: {what} is {d.get('size')} bytes; an attestation over "
                                 f"{MAX_ARTIFACT_BYTES} bytes is refused")
        body = client.get_manifest(repository, d["digest"], accept=MT_MANIFEST).body
        if sha256_digest(body) != d["digest"]:
            raise IntegrityError(f"registry {client.host} served {what} (manifest {d['digest']}) with content "
                                 f"hashing to {sha256_digest(body)}; nothing was stored")
        doc = check_artifact(body, subject_digest, f"registry {client.host}: {what}")
        if (doc.get("config") or {}).get("digest") != EMPTY_DIGEST:
            continue  # not an attestation laid out the way hermetic reads them
        layer = doc["layers"][0]
        blob = _download_small(client, repository, layer, what)
        out.append(Artifact(body, blob, str(doc.get("artifactType"))))
    return out


def _download_small(client: RegistryClient, repository: str, layer: dict[str, Any], what: str) -> bytes:
    size = int(layer.get("size") or 0)
    if size > MAX_ARTIFACT_BYTES:
        raise IntegrityError(f"registry {client.host}: {what} is {size} bytes; refused")
    data = bytearray()
    for chunk in client.iter_blob(repository, layer["digest"]):
        data += chunk
        if len(data) > size:
            break
    actual = sha256_digest(bytes(data))
    if actual != layer["digest"] or len(data) != size:
        raise IntegrityError(f"registry {client.host} served {what} (blob {layer['digest']}) with content hashing "
                             f"to {actual} ({len(data)} bytes); nothing was stored")
    return bytes(data)


def fetch_attestations(client: RegistryClient, repository: str, subject_digest: str) -> tuple[list[Artifact], list[str]]:
    """hermetic's attestations of the image for a pull: (verified artifacts, notes).

    A registry that cannot list referrers (an error other than 404) costs a
    note, not the pull; bytes that do not match their digest fail it.
    """
    from hermetic.provenance import ATTESTATION_TYPES

    try:
        return fetch_remote(client, repository, subject_digest, ATTESTATION_TYPES), []
    except RegistryError as e:
        return [], [f"attestations not fetched: {e.message}"]


def pull_base_manifest(store: OciStore, client: RegistryClient, repository: str, manifest_digest: str) -> str | None:
    """After a pull: the base's manifest and config from the same repository, when it has them (verified).

    Its layers are the image's first layers, already in the store; with the
    manifest too, the base is a complete image here, so a later push sends it
    along again and a local ``hermetic verify`` can rebuild on it.
    """
    base = _base_digest(store, manifest_digest)
    if not base or store.has_image(base):
        return None
    try:
        resp = client.request("GET", f"/v2/{repository}/manifests/{base}", repository=repository,
                              headers={"Accept": MT_MANIFEST}, ok=(200, 404))
    except RegistryError:
        return None  # an optional extra: the image itself is complete
    body = resp.content
    resp.close()
    if resp.status_code == 404:
        return None
    if sha256_digest(body) != base:
        raise IntegrityError(f"registry {client.host} served the base manifest {base} of {repository} with "
                             f"content hashing to {sha256_digest(body)}")
    doc = json.loads(body)
    config = doc.get("config") or {}
    data = _download_small(client, repository, config, f"the config of the base {base}")
    store.put_bytes(data, config.get("digest"))
    if not all(store.has_blob(x.get("digest", "")) for x in doc.get("layers") or []):
        return None  # not this image's base after all: keep nothing that would name missing layers
    store.put_bytes(body, base)
    return base
