"""OCI 1.1 referrers in the local layout: artifacts (provenance, SBOM, signature) whose ``subject`` is an image,
listed per subject in an image index under the ref ``sha256-<subject hex>`` (the referrers tag schema, as a
registry without the API keeps it). A push copies the entries, a pull adds to them; gc keeps the ref as long as
its subject.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from hermetic.core.canonical import canonical_json, is_sha256_hex, parse_digest, sha256_digest
from hermetic.core.errors import IntegrityError
from hermetic.hostfs.filelocks import file_lock
from hermetic.store.oci import MT_INDEX, MT_MANIFEST, Descriptor, OciStore

# image-spec 1.1 manifest.md, "Guidance for an Empty Descriptor": the two bytes `{}`.
MT_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
EMPTY_DESCRIPTOR = {"mediaType": MT_EMPTY, "digest": EMPTY_DIGEST, "size": 2}
TITLE_ANNOTATION = "org.opencontainers.image.title"
_LOCK = ".referrers.lock"


def referrers_tag(digest: str) -> str:
    """``sha256:<hex>`` -> ``sha256-<hex>`` (the tag schema; sha256 needs no truncation)."""
    return "sha256-" + parse_digest(digest)


def subject_of_tag(name: str) -> str | None:
    """The subject digest a referrers tag stands for, or None when ``name`` is not one."""
    algo, sep, hexpart = name.partition("-")
    return f"sha256:{hexpart}" if sep and algo == "sha256" and is_sha256_hex(hexpart) else None


@dataclass(frozen=True)
class Artifact:
    """One artifact manifest, its document, and the descriptor a referrers index lists."""

    manifest: bytes
    blob: bytes
    artifact_type: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)

    def doc(self) -> dict[str, Any]:
        return json.loads(self.manifest)

    def descriptor(self) -> dict[str, Any]:
        """The descriptor a referrers list holds for it (distribution-spec 1.1): its artifactType (else the
        config's media type) and every annotation of the manifest."""
        doc = self.doc()
        d: dict[str, Any] = {"mediaType": doc.get("mediaType") or MT_MANIFEST, "digest": self.digest,
                             "size": len(self.manifest)}
        artifact_type = doc.get("artifactType") or (doc.get("config") or {}).get("mediaType")
        if artifact_type:
            d["artifactType"] = artifact_type
        if doc.get("annotations"):
            d["annotations"] = dict(doc["annotations"])
        return d


def artifact_manifest(subject: Descriptor, artifact_type: str, blob: bytes, *,
                      annotations: dict[str, str] | None = None) -> Artifact:
    """An artifact manifest (canonical JSON) for ``blob`` about ``subject``: pure."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "artifactType": artifact_type,
        "config": dict(EMPTY_DESCRIPTOR),
        "layers": [{"mediaType": artifact_type, "digest": sha256_digest(blob), "size": len(blob)}],
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
    }
    if annotations:
        doc["annotations"] = dict(annotations)
    return Artifact(canonical_json(doc), blob, artifact_type)


def merge_referrers(index: dict[str, Any] | None, new: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A referrers index with ``new`` descriptors added (no duplicates), in a stable order."""
    manifests = {m["digest"]: m for m in (index or {}).get("manifests") or [] if isinstance(m, dict) and "digest" in m}
    for d in new:
        manifests.setdefault(d["digest"], d)
    return {"schemaVersion": 2, "mediaType": MT_INDEX,
            "manifests": sorted(manifests.values(), key=lambda m: (m.get("artifactType", ""), m["digest"]))}


def check_artifact(manifest: bytes, subject_digest: str, what: str) -> dict[str, Any]:
    """Parse an artifact manifest and check it is about ``subject_digest``."""
    try:
        doc = json.loads(manifest)
        layers = doc["layers"]
        subject = (doc.get("subject") or {}).get("digest")
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{what}: not an OCI artifact manifest (no layers)") from None
    if subject != subject_digest:
        raise IntegrityError(f"{what}: its subject is {subject or 'missing'}, not the image {subject_digest}")
    if not isinstance(layers, list) or len(layers) != 1:
        raise IntegrityError(f"{what}: an attestation artifact has exactly one layer, this one has "
                             f"{len(layers) if isinstance(layers, list) else 'no'} layers")
    return doc


# -- the store side ----------------------------------------------------------------

def add_referrers(store: OciStore, subject_digest: str, artifacts: Iterable[Artifact]) -> None:
    """Put artifacts (blobs, empty config, manifest) into the store and list them under the subject's ref."""
    store.ensure()
    descs = []
    for a in artifacts:
        check_artifact(a.manifest, subject_digest, f"artifact {a.digest}")
        store.put_bytes(EMPTY_JSON, EMPTY_DIGEST)
        store.put_bytes(a.blob, a.doc()["layers"][0]["digest"])
        store.put_bytes(a.manifest)
        descs.append(a.descriptor())
    if not descs:
        return
    tag = referrers_tag(subject_digest)
    with file_lock(store.root / _LOCK):
        current = store.resolve(tag)
        index = store.read_json(current.digest) if current is not None and store.has_blob(current.digest) else None
        merged = merge_referrers(index, descs)
        if index is not None and merged == merge_referrers(None, index.get("manifests") or []):
            return
        digest, size, _ = store.put_json(merged)
        store.set_ref(tag, Descriptor(MT_INDEX, digest, size))


def list_referrers(store: OciStore, subject_digest: str, artifact_type: str | None = None) -> list[dict[str, Any]]:
    """Descriptors of the artifacts about ``subject_digest`` in the store (optionally of one type)."""
    current = store.resolve(referrers_tag(subject_digest)) if store.index_path.exists() else None
    if current is None or not store.has_blob(current.digest):
        return []
    out = []
    for m in store.read_json(current.digest).get("manifests") or []:
        if store.has_blob(m.get("digest", "")) and (artifact_type is None or m.get("artifactType") == artifact_type):
            out.append(m)
    return out


def read_artifact(store: OciStore, descriptor: dict[str, Any], subject_digest: str) -> Artifact:
    """An artifact from the store, every byte verified, its subject checked."""
    manifest = store.read_blob(descriptor["digest"])
    what = f"{descriptor.get('artifactType', 'artifact')} {descriptor['digest']}"
    doc = check_artifact(manifest, subject_digest, what)
    blob = store.read_blob(doc["layers"][0]["digest"])
    return Artifact(manifest, blob, doc.get("artifactType") or "")


def referrers_to_keep(store: OciStore, refs: dict[str, Descriptor], live: set[str]) -> tuple[set[str], list[str]]:
    """For ``cache gc``: (blobs of the referrers of live images, referrers refs whose subject is gone)."""
    keep: set[str] = set()
    drop: list[str] = []
    for name, desc in refs.items():
        subject = subject_of_tag(name)
        if subject is None:
            continue
        if subject in live:
            keep |= store.live_blobs_from(desc.digest)
        else:
            drop.append(name)
    return keep, drop
