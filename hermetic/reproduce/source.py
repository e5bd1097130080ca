"""Where ``hermetic verify`` reads an image and its attestations: a registry, or the local store.

Checked on the way in: manifest and config against their digests, each attestation against its referrers
digest and its subject against the image; the SBOM must be the provenance's; with ``--key`` the DSSE envelope
must verify and carry the provenance's exact bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.core.reference import ImageName
from hermetic.core.canonical import sha256_digest
from hermetic.core.errors import DataError, IntegrityError
from hermetic.provenance import ATTESTATION_TYPES, MT_CYCLONEDX, MT_DSSE, MT_STATEMENT
from hermetic.provenance.statement import PREDICATE_ANNOTATION, PREDICATE_TYPE, BuildFacts, ProvenanceError, read_statement
from hermetic.store.oci import MANIFEST_TYPES, OciStore
from hermetic.store.referrers import Artifact, list_referrers, read_artifact, referrers_tag


@dataclass
class Subject:
    """The image to verify, read and checked."""

    name: ImageName
    digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]
    facts: BuildFacts
    provenance: bytes
    provenance_artifact: str
    sbom: str | None = None  # digest of the attached SBOM blob
    signature: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    _client: Any = None
    _store: OciStore | None = None

    @property
    def where(self) -> str:
        return str(self.name)

    def fetch_blob(self, digest: str, dest: OciStore) -> Path:
        """A blob of the image into ``dest`` (verified), for comparing layers."""
        if dest.has_blob(digest):
            return dest.blob_path(digest)
        if self._store is not None:
            with open(self._store.blob_path(digest), "rb") as f, dest.writer(digest) as w:
                while chunk := f.read(1 << 20):
                    w.write(chunk)
        else:
            repo = self.name.registry_repository()
            with dest.writer(digest) as w:
                for chunk in self._client.iter_blob(repo, digest):
                    w.write(chunk)
        return dest.blob_path(digest)


def parse_verify_ref(ref: str) -> ImageName:
    from hermetic.registry.pull import parse_pull_ref

    return parse_pull_ref(ref, digest="manifest digest", why="; verify checks one image, by its manifest digest",
                          hint="{ref}@sha256:…")


def open_subject(name: ImageName, *, local_store: OciStore, key: Path | None) -> Subject:
    """The image ``name`` names, from its registry (or the local store for a name without a host)."""
    assert name.digest is not None
    digest = name.digest
    if name.host is None:
        if not local_store.has_blob(digest):
            raise IntegrityError(f"{name}: no such image in the local store {local_store.root} "
                                 "(write HOST/REPO@sha256:… to verify a pushed image)")
        manifest_bytes = local_store.read_blob(digest)
        manifest = _manifest(manifest_bytes, str(name))
        config = json.loads(local_store.read_blob(manifest["config"]["digest"]))
        artifacts = [read_artifact(local_store, d, digest) for d in list_referrers(local_store, digest)
                     if d.get("artifactType") in ATTESTATION_TYPES]
        where = f"the local store's referrers ref {referrers_tag(digest)}"
        client = None
    else:
        from hermetic.registry.client import RegistryClient
        from hermetic.registry.referrers import fetch_remote

        client = RegistryClient(name.registry_host())
        repo = name.registry_repository()
        resp = client.get_manifest(repo, digest)
        if sha256_digest(resp.body) != digest:
            raise IntegrityError(f"registry {client.host} served {name} with content hashing to "
                                 f"{sha256_digest(resp.body)}")
        manifest = _manifest(resp.body, str(name))
        config_digest = manifest["config"]["digest"]
        config_bytes = b"".join(client.iter_blob(repo, config_digest))
        if sha256_digest(config_bytes) != config_digest:
            raise IntegrityError(f"registry {client.host} served the config of {name} with content hashing to "
                                 f"{sha256_digest(config_bytes)}")
        config = json.loads(config_bytes)
        artifacts = fetch_remote(client, repo, digest, ATTESTATION_TYPES)
        where = f"the referrers API or the tag {referrers_tag(digest)} of {name.host}/{repo}"
    statements = [a for a in artifacts if a.artifact_type == MT_STATEMENT
                  and (a.doc().get("annotations") or {}).get(PREDICATE_ANNOTATION) == PREDICATE_TYPE]
    if not statements:
        raise ProvenanceError(f"{name} has no provenance (no {MT_STATEMENT} artifact with predicate "
                              f"{PREDICATE_TYPE} in {where})",
                              hint="images get one from `hermetic build`; `hermetic push` attaches it")
    prov = statements[0]
    facts = read_statement(prov.blob, subject_digest=digest, what=f"the provenance {prov.digest} of {name}")
    subject = Subject(name, digest, manifest, config, facts, prov.blob, prov.digest, _client=client,
                      _store=local_store if name.host is None else None)
    _check_sbom(subject, [a for a in artifacts if a.artifact_type == MT_CYCLONEDX])
    if key is not None:
        _check_signature(subject, [a for a in artifacts if a.artifact_type == MT_DSSE], key)
    return subject


def _manifest(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise IntegrityError(f"{what}: the manifest is not JSON") from None
    media_type = doc.get("mediaType") or ("" if "manifests" in doc else MANIFEST_TYPES[0])
    if media_type not in MANIFEST_TYPES or "layers" not in doc:
        raise DataError(f"{what} is a {media_type or 'index'}, not an image manifest; "
                          "verify the platform image's manifest digest")
    return doc


def _check_sbom(s: Subject, sboms: list[Artifact]) -> None:
    named = (s.facts.sbom or {}).get("digest")
    if not sboms:
        if named:
            s.notes.append(f"the provenance names an SBOM ({named}) that is not attached")
        return
    blob_digest = sha256_digest(sboms[0].blob)
    if named and blob_digest != named:
        raise IntegrityError(f"the SBOM attached to {s.name} ({blob_digest}) is not the one its provenance "
                             f"names ({named})")
    s.sbom = blob_digest


def _check_signature(s: Subject, envelopes: list[Artifact], key: Path) -> None:
    from hermetic.provenance.dsse import keyid, load_public_key, verify

    if not envelopes:
        raise IntegrityError(f"{s.name} has no signed provenance ({MT_DSSE}) to check with --key {key}",
                             hint="sign when pushing: hermetic push REF --sign-key KEY.pem")
    errors = []
    for env in envelopes:
        try:
            payload = verify(env.blob, key, what=f"the signature {env.digest} of {s.name}")
        except IntegrityError as e:
            errors.append(e)
            continue
        if payload != s.provenance:
            raise IntegrityError(f"the signed provenance in {env.digest} is not the provenance attached to "
                                 f"{s.name} ({s.provenance_artifact})")
        s.signature = {"envelope": env.digest, "keyid": keyid(load_public_key(key))}
        return
    raise errors[0]
