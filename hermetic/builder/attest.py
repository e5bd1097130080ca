"""The builder's side of provenance: a build's facts, and its SBOM and provenance stored as OCI 1.1 referrers.

Both are pure functions of the build's inputs, made once per image (a no-op finds them, a pull brings
the publisher's); the layer plan is recomputed with ``plan_layers`` and checked against the image.
"""

from __future__ import annotations

import json
from pathlib import Path

from hermetic.builder.image_record import ImageInfo
from hermetic.config.load import LoadedConfig
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.hostfs.fsutil import write_if_changed
from hermetic.lock.model import Lock
from hermetic.core.paths import CachePaths
from hermetic.provenance import MT_CYCLONEDX, MT_DSSE, MT_STATEMENT, PROVENANCE_FILE
from hermetic.provenance.statement import (
    PREDICATE_ANNOTATION, PREDICATE_TYPE, BuildFacts, LayerFact, WheelFact, read_statement,
    statement_bytes,
)
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore
from hermetic.store.referrers import TITLE_ANNOTATION, add_referrers, artifact_manifest, list_referrers, read_artifact


def stored_provenance(store: OciStore, manifest_digest: str) -> bytes | None:
    """The image's provenance in the store (every byte verified, checked to be about it), or None."""
    for d in list_referrers(store, manifest_digest, MT_STATEMENT):
        if (d.get("annotations") or {}).get(PREDICATE_ANNOTATION) == PREDICATE_TYPE:
            art = read_artifact(store, d, manifest_digest)
            read_statement(art.blob, subject_digest=manifest_digest, what=f"stored provenance {art.digest}")
            return art.blob
    return None


def ensure_attestations(cfg: LoadedConfig, paths: CachePaths, store: OciStore, lock: Lock,
                        info: ImageInfo) -> list[str]:
    """Make (once) and store the image's SBOM and provenance; write hermetic.provenance.json. Returns notes."""
    digest = info.manifest_digest
    notes: list[str] = []
    provenance = stored_provenance(store, digest)
    if provenance is None:
        facts, why = gather_facts(cfg, paths, store, lock, info)
        if facts is None:
            return [f"no provenance for {digest[:19]}: {why}"]
        provenance, sbom_note = store_attestations(store, facts, paths, cfg.model.build.source_date_epoch)
        notes += [sbom_note] if sbom_note else []
    write_if_changed(cfg.root / PROVENANCE_FILE, provenance)
    return notes


def store_attestations(store: OciStore, facts: BuildFacts, paths: CachePaths, created_epoch: int) -> tuple[bytes, str | None]:
    """SBOM first (the provenance names its digest), then the provenance, as referrers of the image."""
    from dataclasses import replace

    subject = Descriptor(facts.media_type, facts.manifest_digest, facts.manifest_size)
    artifacts = []
    note = None
    try:
        sbom = _sbom(store, facts, paths, created_epoch)
    except ImportError as e:
        sbom, note = None, f"no SBOM: {e.name or 'cyclonedx-python-lib'} is not installed"
    if sbom is not None:
        art = artifact_manifest(subject, MT_CYCLONEDX, sbom, annotations={TITLE_ANNOTATION: "sbom.cdx.json"})
        artifacts.append(art)
        facts = replace(facts, sbom={"digest": art.doc()["layers"][0]["digest"], "size": len(sbom),
                                     "mediaType": MT_CYCLONEDX})
    provenance = statement_bytes(facts)
    artifacts.append(artifact_manifest(subject, MT_STATEMENT, provenance, annotations={
        TITLE_ANNOTATION: PROVENANCE_FILE, PREDICATE_ANNOTATION: PREDICATE_TYPE}))
    add_referrers(store, facts.manifest_digest, artifacts)
    return provenance, note


def gather_facts(cfg: LoadedConfig, paths: CachePaths, store: OciStore, lock: Lock,
                 info: ImageInfo) -> tuple[BuildFacts | None, str]:
    from hermetic import __version__
    from hermetic.builder.image import BASE_LAYERS_LABEL
    from hermetic.builder.inputs import LAYER_FORMAT, runtime_sha256
    from hermetic.builder.install import VenvLayout
    from hermetic.builder.key import image_config_part
    from hermetic.builder.layers import MAX_LAYERS, _installer_version, hermetic_layer_files, plan_layers
    from hermetic.store.fetch import resolve_from_store
    from hermetic.store.wheels import WheelStore

    m = cfg.model
    digest = info.manifest_digest
    labels = info.labels
    wheels, missing = resolve_from_store(lock, WheelStore(paths.wheels))
    if missing:
        return None, f"{len(missing)} wheel(s) are not in the store (e.g. {missing[0].name}); run hermetic fetch"
    try:
        lock_bytes = cfg.lock_path.read_bytes()
    except OSError as e:
        return None, f"{cfg.lock_path}: {e.strerror or e}"
    import hashlib

    if hashlib.sha256(lock_bytes).hexdigest() != info.lock["sha256"]:
        return None, f"{cfg.lock_path} changed since the image was built"
    base_layers = int(labels.get(BASE_LAYERS_LABEL, "0"))
    layout = VenvLayout(m.build.prefix, m.python.version, m.python.path)
    specs = plan_layers(wheels, hermetic_layer_files(layout), max_layers=MAX_LAYERS - base_layers)
    ours = info.layers[base_layers:]
    if [s.description for s in specs] != [x["contents"] for x in ours]:
        return None, "the layer plan of the stored wheels does not match the image's layers"
    layers, where = [], {}
    for i, x in enumerate(info.layers):
        spec = specs[i - base_layers] if i >= base_layers else None
        files = tuple(w.filename for w in spec.wheels) if spec else ()
        for f in files:
            where[f] = i
        layers.append(LayerFact(i, x["digest"], x["size"], x["media_type"], x["contents"], files, spec is None))
    wheel_facts = []
    for w in wheels:
        direct = next((u for u in w.locked.urls if u.split("#")[0].rsplit("/", 1)[-1] == w.filename), None)
        wheel_facts.append(WheelFact(w.locked.name, w.locked.version, w.filename, w.sha256, w.size,
                                     where.get(w.filename), direct))
    manifest_size = store.blob_size(digest)
    media_type = (store.read_json(digest).get("mediaType") or MT_MANIFEST)
    base = info.base
    return BuildFacts(
        name=m.name, manifest_digest=digest, manifest_size=manifest_size, media_type=media_type,
        image_id=info.image_id, config=image_config_part(cfg), config_sha256=info.config_sha256,
        lock_path=m.lock, lock_format=lock.format, lock_bytes=lock_bytes, lock_indexes=lock.index_urls,
        target_platform=lock.target.platform, target_python=lock.target.python_version,
        build_key=info.build_key, hermetic_version=__version__, layer_format=LAYER_FORMAT,
        runtime_sha256=runtime_sha256(), installer_version=_installer_version(),
        base_reference=base["reference"] or m.base, base_digest=base["manifest_digest"], base_layers=base_layers,
        base_os=base.get("os"), base_glibc=base.get("glibc"),
        wheels=tuple(sorted(wheel_facts, key=lambda w: (w.name, w.filename))), layers=tuple(layers),
    ), ""


def _sbom(store: OciStore, facts: BuildFacts, paths: CachePaths, created_epoch: int) -> bytes:
    from hermetic.provenance.sbom import make_sbom

    captured = _base_captured(store, facts, paths.root / "bases")
    return make_sbom(
        image_name=facts.name, manifest_digest=facts.manifest_digest, created_epoch=created_epoch,
        hermetic_version=facts.hermetic_version, runtime_sha256=facts.runtime_sha256,
        wheels=facts.wheels,
        dpkg_status=captured.get("var/lib/dpkg/status", ""),
        os_release_text=captured.get("etc/os-release") or captured.get("usr/lib/os-release") or "",
    )


def _base_captured(store: OciStore, facts: BuildFacts, cache_dir: Path) -> dict[str, str]:
    """dpkg status and os-release of the base, from the facts cache or the image's own base layers."""
    from hermetic.builder.base import BaseImage, scan_base

    manifest = store.read_json(facts.manifest_digest)
    base = BaseImage(ref=None, manifest_digest=facts.base_digest,  # type: ignore[arg-type]
                     manifest={"layers": manifest["layers"][:facts.base_layers]}, config_digest="", config={})
    try:
        return scan_base(store, base, cache_dir).captured
    except (HermeticError, OSError, json.JSONDecodeError):
        return {}


def sign_stored_provenance(store: OciStore, manifest_digest: str, key_path: Path) -> str:
    """Sign the image's stored provenance (DSSE, ed25519) and store the envelope as a referrer; its digest."""
    from hermetic.provenance.dsse import sign

    provenance = stored_provenance(store, manifest_digest)
    if provenance is None:
        raise IntegrityError(f"image {manifest_digest} has no provenance in the store to sign",
                             hint="build it with this hermetic (hermetic build), then push again")
    envelope = sign(provenance, key_path)
    subject = store.find_manifest(manifest_digest)
    assert subject is not None
    art = artifact_manifest(Descriptor(subject.media_type, manifest_digest, store.blob_size(manifest_digest)),
                            MT_DSSE, envelope, annotations={TITLE_ANNOTATION: "provenance.dsse.json",
                                                            PREDICATE_ANNOTATION: PREDICATE_TYPE})
    add_referrers(store, manifest_digest, [art])
    return art.digest
