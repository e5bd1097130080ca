"""The provenance of an image: an in-toto Statement v1 with a SLSA Provenance v1 predicate.

``BuildFacts`` -> statement bytes, and back (strictly, for ``hermetic verify``): everything a rebuild needs
without the checkout (docs/provenance.md lists every field). No timestamps or invocation IDs: the bytes are a
function of the build's inputs; stored as written here (sorted keys, 2-space indent).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hermetic.core.canonical import is_sha256_hex, pretty_json
from hermetic.core.errors import IntegrityError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"  # what BuildKit annotates its provenance layers with
# URNs, not URLs: docs/provenance.md is their description, wherever the docs are hosted.
BUILD_TYPE = "urn:hermetic:build-type:image:v1"
BUILDER_ID = "urn:hermetic:builder:local"


@dataclass(frozen=True)
class WheelFact:
    name: str
    version: str
    filename: str
    sha256: str
    size: int | None
    layer: int | None  # index in the image's layer list
    download: str | None = None  # a direct URL when the lock names one


@dataclass(frozen=True)
class LayerFact:
    index: int
    digest: str
    size: int
    media_type: str
    contents: str  # "base layer 0", "numpy==2.4.6", "hermetic runtime + venv"
    wheels: tuple[str, ...] = ()  # filenames installed in this layer
    base: bool = False


@dataclass(frozen=True)
class BuildFacts:
    name: str
    manifest_digest: str
    manifest_size: int
    media_type: str
    image_id: str
    config: dict[str, Any]  # image_config_part(cfg)
    config_sha256: str
    lock_path: str  # as hermetic.yaml names it (relative)
    lock_format: str
    lock_bytes: bytes
    lock_indexes: tuple[str, ...]
    target_platform: str
    target_python: str
    build_key: str
    hermetic_version: str
    layer_format: int
    runtime_sha256: str
    installer_version: str
    base_reference: str
    base_digest: str
    base_layers: int
    base_os: str | None
    base_glibc: str | None
    wheels: tuple[WheelFact, ...]
    layers: tuple[LayerFact, ...]
    sbom: dict[str, Any] | None = None  # {"digest", "size", "mediaType"} of the SBOM blob

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock_bytes).hexdigest()

    def layer_of(self, filename: str) -> LayerFact | None:
        for w in self.wheels:
            if w.filename == filename and w.layer is not None and 0 <= w.layer < len(self.layers):
                return self.layers[w.layer]
        return None


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


def statement(f: BuildFacts) -> dict[str, Any]:
    deps: list[dict[str, Any]] = [
        {"name": "lock", "digest": {"sha256": f.lock_sha256}, "mediaType": "text/plain; charset=utf-8",
         "content": base64.b64encode(f.lock_bytes).decode("ascii"),
         "annotations": {"path": f.lock_path, "format": f.lock_format, "indexes": list(f.lock_indexes)}},
        {"name": "base", "uri": f.base_reference, "digest": {"sha256": _hex(f.base_digest)},
         "mediaType": "application/vnd.oci.image.manifest.v1+json",
         "annotations": {"layers": f.base_layers, "os": f.base_os, "glibc": f.base_glibc}},
    ]
    for w in sorted(f.wheels, key=lambda w: (w.name, w.filename)):
        d: dict[str, Any] = {"name": w.filename, "uri": f"pkg:pypi/{w.name}@{w.version}",
                             "digest": {"sha256": w.sha256},
                             "annotations": {"package": w.name, "version": w.version, "size": w.size, "layer": w.layer}}
        if w.download:
            d["downloadLocation"] = w.download
        deps.append(d)
    deps.append({"name": "hermetic_runtime", "uri": f"pkg:pypi/hermetic@{f.hermetic_version}",
                 "digest": {"sha256": f.runtime_sha256},
                 "annotations": {"what": "sha256 over the runtime sources' relative paths and bytes "
                                         "(hermetic/builder/build.py runtime_sha256)"}})
    byproducts: list[dict[str, Any]] = [
        {"name": "image config", "digest": {"sha256": _hex(f.image_id)},
         "mediaType": "application/vnd.oci.image.config.v1+json"},
    ]
    for layer in f.layers:
        byproducts.append({"name": f"layer {layer.index}: {layer.contents}", "digest": {"sha256": _hex(layer.digest)},
                           "mediaType": layer.media_type,
                           "annotations": {"index": layer.index, "size": layer.size, "contents": layer.contents,
                                           "base": layer.base, "wheels": list(layer.wheels)}})
    if f.sbom:
        byproducts.append({"name": "sbom", "digest": {"sha256": _hex(f.sbom["digest"])},
                           "mediaType": f.sbom["mediaType"], "annotations": {"size": f.sbom["size"]}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f.name, "digest": {"sha256": _hex(f.manifest_digest)},
                     "annotations": {"mediaType": f.media_type, "size": f.manifest_size, "imageId": f.image_id}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"config": f.config, "lock": {"path": f.lock_path}},
                "internalParameters": {"buildKey": f.build_key, "configSha256": f.config_sha256,
                                       "layerFormat": f.layer_format,
                                       "target": {"platform": f.target_platform, "python": f.target_python}},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID,
                            "version": {"hermetic": f.hermetic_version, "installer": f.installer_version}},
                "byproducts": byproducts,
            },
        },
    }


def statement_bytes(f: BuildFacts) -> bytes:
    return pretty_json(statement(f)).encode("utf-8")


# -- reading ------------------------------------------------------------------------

class ProvenanceError(IntegrityError):
    """A provenance document that cannot be trusted or used as written (exit 65)."""


def _get(d: Any, *keys: str, what: str) -> Any:
    cur = d
    path = []
    for k in keys:
        path.append(k)
        if not isinstance(cur, dict) or k not in cur:
            raise ProvenanceError(f"{what}: missing {'.'.join(path)}")
        cur = cur[k]
    return cur


def _digest(desc: dict[str, Any], what: str) -> str:
    hexpart = (desc.get("digest") or {}).get("sha256")
    if not isinstance(hexpart, str) or not is_sha256_hex(hexpart):
        raise ProvenanceError(f"{what}: {desc.get('name', '?')} has no sha256 digest")
    return hexpart


def read_statement(data: bytes, *, subject_digest: str | None, what: str = "provenance") -> BuildFacts:
    """The facts of a provenance document; checks its types and (when given) that it is about ``subject_digest``."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ProvenanceError(f"{what}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        raise ProvenanceError(f"{what}: not an in-toto Statement v1 (_type {doc.get('_type') if isinstance(doc, dict) else None!r})")
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise ProvenanceError(f"{what}: predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE}")
    subjects = doc.get("subject") or []
    if not subjects or not isinstance(subjects[0], dict):
        raise ProvenanceError(f"{what}: has no subject")
    subject = subjects[0]
    manifest_digest = "sha256:" + _digest(subject, what)
    if subject_digest is not None and manifest_digest != subject_digest:
        raise ProvenanceError(f"{what}: its subject is {manifest_digest}, not the image {subject_digest}")
    pred = _get(doc, "predicate", what=what)
    bd = _get(pred, "buildDefinition", what=what)
    if bd.get("buildType") != BUILD_TYPE:
        raise ProvenanceError(f"{what}: buildType {bd.get('buildType')!r} is not hermetic's {BUILD_TYPE}")
    ext = _get(bd, "externalParameters", what=what)
    internal = _get(bd, "internalParameters", what=what)
    deps = {d.get("name"): d for d in _get(bd, "resolvedDependencies", what=what) if isinstance(d, dict)}
    lock = deps.get("lock")
    base = deps.get("base")
    runtime = deps.get("hermetic_runtime")
    if lock is None or base is None or runtime is None:
        raise ProvenanceError(f"{what}: resolvedDependencies lacks the lock, the base or the hermetic runtime")
    try:
        lock_bytes = base64.b64decode(lock["content"], validate=True)
    except (KeyError, ValueError, TypeError):
        raise ProvenanceError(f"{what}: the lock's content is not base64") from None
    if hashlib.sha256(lock_bytes).hexdigest() != _digest(lock, what):
        raise ProvenanceError(f"{what}: the lock's content does not hash to its digest")
    wheels = []
    for d in deps.values():
        if str(d.get("uri", "")).startswith("pkg:pypi/") and d.get("name") != "hermetic_runtime":
            a = d.get("annotations") or {}
            wheels.append(WheelFact(str(a.get("package")), str(a.get("version")), str(d["name"]), _digest(d, what),
                                    a.get("size"), a.get("layer"), d.get("downloadLocation")))
    run = _get(pred, "runDetails", what=what)
    version = _get(run, "builder", "version", what=what)
    layers = []
    sbom = None
    image_id = None
    for b in run.get("byproducts") or []:
        a = b.get("annotations") or {}
        if b.get("name") == "image config":
            image_id = "sha256:" + _digest(b, what)
        elif b.get("name") == "sbom":
            sbom = {"digest": "sha256:" + _digest(b, what), "size": a.get("size"), "mediaType": b.get("mediaType")}
        elif "index" in a:
            layers.append(LayerFact(int(a["index"]), "sha256:" + _digest(b, what), int(a.get("size") or 0),
                                    str(b.get("mediaType")), str(a.get("contents")), tuple(a.get("wheels") or ()),
                                    bool(a.get("base"))))
    layers.sort(key=lambda x: x.index)
    if [x.index for x in layers] != list(range(len(layers))):
        raise ProvenanceError(f"{what}: its layer list has gaps")
    sa = subject.get("annotations") or {}
    ba = base.get("annotations") or {}
    la = lock.get("annotations") or {}
    target = internal.get("target") or {}
    return BuildFacts(
        name=str(subject.get("name")), manifest_digest=manifest_digest, manifest_size=int(sa.get("size") or 0),
        media_type=str(sa.get("mediaType") or "application/vnd.oci.image.manifest.v1+json"),
        image_id=image_id or str(sa.get("imageId") or ""),
        config=_get(ext, "config", what=what), config_sha256=str(internal.get("configSha256")),
        lock_path=str(_get(ext, "lock", "path", what=what)), lock_format=str(la.get("format")),
        lock_bytes=lock_bytes, lock_indexes=tuple(la.get("indexes") or ()),
        target_platform=str(target.get("platform")), target_python=str(target.get("python")),
        build_key=str(internal.get("buildKey")), hermetic_version=str(version.get("hermetic")),
        layer_format=int(internal.get("layerFormat") or 0), runtime_sha256=_digest(runtime, what),
        installer_version=str(version.get("installer")),
        base_reference=str(base.get("uri")), base_digest="sha256:" + _digest(base, what),
        base_layers=int(ba.get("layers") or 0), base_os=ba.get("os"), base_glibc=ba.get("glibc"),
        wheels=tuple(sorted(wheels, key=lambda w: (w.name, w.filename))), layers=tuple(layers), sbom=sbom,
    )
