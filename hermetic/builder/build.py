"""``hermetic build``: plan -> base -> layers -> config -> manifest -> store (-> engine).

The build key is one sha256 over every input that decides the image (base
manifest digest, the chosen wheel files, the image-relevant config, the
runtime sources, hermetic's layer format). When the store already holds the
image for a key, the build is a no-op: no layer is read, no tar written.
Builds of the same key are serialized by a file lock; different keys run
concurrently, and everything they share (blobs, layer cache entries,
index.json) is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermetic import __version__
from hermetic.builder.install import VenvLayout
from hermetic.builder.layers import (
    LAYER_FORMAT, MAX_LAYERS, BuiltLayer, LayerCache, build_layers, cleanup_tmp, hermetic_layer_files, plan_layers,
)
from hermetic.builder.reference import parse_base_reference
from hermetic.canonical import canonical_json, canonical_sha256, pretty_json
from hermetic.config import LoadedConfig
from hermetic.errors import HermeticError
from hermetic.fsutil import atomic_write_bytes, atomic_write_text, file_lock
from hermetic.lock.model import Lock, ResolvedWheel, Target
from hermetic.paths import CachePaths
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore

BUILD_RECORD = "hermetic.image.json"


def image_config_part(cfg: LoadedConfig) -> dict[str, Any]:
    """The parts of hermetic.yaml that decide the image (not datasets, runs_dir, seed)."""
    m = cfg.model
    return {
        "name": m.name, "base": m.base, "python": m.python.model_dump(mode="json"),
        "determinism": {"mode": m.determinism.mode, "threads": m.determinism.threads, "env": dict(m.determinism.env)},
        "env": dict(m.env), "build": m.build.model_dump(mode="json"),
    }


def image_config_sha256(cfg: LoadedConfig) -> str:
    return canonical_sha256(image_config_part(cfg))


def runtime_sha256() -> str:
    h = hashlib.sha256()
    rt = Path(__file__).resolve().parent.parent / "runtime"
    for p in sorted(rt.rglob("*.py")) if rt.is_dir() else []:
        h.update(p.relative_to(rt).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_key(cfg: LoadedConfig, base_digest: str, wheels: list[ResolvedWheel]) -> str:
    return canonical_sha256({
        "hermetic": __version__, "layer_format": LAYER_FORMAT, "base": base_digest,
        "wheels": sorted(w.sha256 for w in wheels), "config": image_config_part(cfg),
        "runtime": runtime_sha256(),
    })


@dataclass
class BuildResult:
    image_id: str
    manifest_digest: str
    build_key: str
    layers: list[dict[str, Any]]
    noop: bool
    loaded: bool
    seconds: float
    record_path: Path
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "manifest_digest": self.manifest_digest, "build_key": self.build_key,
                "layers": self.layers, "noop": self.noop, "loaded": self.loaded,
                "seconds": round(self.seconds, 3), "record": str(self.record_path), "notes": self.notes}


def _resolve_wheels(lock: Lock, paths: CachePaths, *, offline: bool, log) -> list[ResolvedWheel]:
    from hermetic.store.fetch import fetch, resolve_from_store
    from hermetic.store.wheels import WheelStore

    store = WheelStore(paths.wheels)
    found, missing = resolve_from_store(lock, store)
    if not missing:
        return found
    if log:
        log(f"fetching {len(missing)} wheel(s) missing from the store ...")
    from hermetic.indexes import read_pip_sources

    report = fetch(lock, store, read_pip_sources(), offline=offline)
    return report.resolved


def _verify_wheels(wheels: list[ResolvedWheel]) -> None:
    """A stored wheel must still hash to its name before its bytes go into a layer."""
    from hermetic.errors import IntegrityError
    from hermetic.fsutil import sha256_file

    for w in wheels:
        actual = sha256_file(w.url or "")
        if actual != w.sha256:
            raise IntegrityError(
                f"{w.locked.name}=={w.locked.version}: stored wheel {w.filename} is corrupt "
                f"(expected sha256 {w.sha256}, found {actual})",
                hint="run `hermetic cache verify --repair`, then `hermetic fetch`",
            )


def build(cfg: LoadedConfig, paths: CachePaths, *, offline: bool = False, load: bool = True,
          log: Callable[[str], None] | None = None,
          on_layer: Callable[[BuiltLayer], None] | None = None) -> BuildResult:
    from hermetic.lock.read import read_lock

    t0 = time.monotonic()
    m = cfg.model
    target = Target(python_version=m.python.version)
    lock = read_lock(cfg.lock_path, target)
    ref = parse_base_reference(m.base)
    wheels = _resolve_wheels(lock, paths, offline=offline, log=log)
    key = build_key(cfg, ref.digest, wheels)
    store = OciStore(paths.oci).ensure()
    builds_dir = paths.builds
    with file_lock(builds_dir / f".{key}.lock"):
        done = _read_build(builds_dir, key, store)
        if done is not None:
            loaded = _ensure_loaded(store, done, m.name, load)
            record = _write_record(cfg, done)
            return BuildResult(done["image_id"], done["manifest_digest"], key, done["layers"], True, loaded,
                               time.monotonic() - t0, record)
        info = _build(cfg, paths, store, lock, wheels, key, log=log, on_layer=on_layer)
        atomic_write_bytes(builds_dir / f"{key}.json", canonical_json(info))
    loaded = _ensure_loaded(store, info, m.name, load)
    record = _write_record(cfg, info)
    return BuildResult(info["image_id"], info["manifest_digest"], key, info["layers"], False, loaded,
                       time.monotonic() - t0, record, info.get("notes", []))


def _read_build(builds_dir: Path, key: str, store: OciStore) -> dict[str, Any] | None:
    try:
        info = json.loads((builds_dir / f"{key}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    md = info.get("manifest_digest", "")
    # Cheap presence check; blob contents are verified when layers are reused
    # and by `hermetic cache verify`.
    if not store.has_blob(md) or not store.has_blob(info.get("image_id", "")):
        return None
    try:
        if not all(store.has_blob(layer["digest"]) for layer in store.read_json(md)["layers"]):
            return None
    except (HermeticError, ValueError, KeyError):
        return None
    return info


def _ensure_loaded(store: OciStore, info: dict[str, Any], name: str, load: bool) -> bool:
    if not load:
        return False
    from hermetic.engine import engine_has_image, load_image

    if engine_has_image(info["image_id"]):
        return False
    load_image(store, info["manifest_digest"], repo_tag=f"hermetic/{name}:latest" if "/" not in name else f"{name}:latest")
    return True


def _build(cfg: LoadedConfig, paths: CachePaths, store: OciStore, lock: Lock, wheels: list[ResolvedWheel],
           key: str, *, log, on_layer) -> dict[str, Any]:
    from hermetic.builder.base import resolve_base, scan_base
    from hermetic.builder.checks import run_build_checks
    from hermetic.builder.image import LayerRef, image_config, image_manifest

    m = cfg.model
    cleanup_tmp(paths.tmp)
    base = resolve_base(store, m.base)
    facts = scan_base(store, base, paths.root / "bases")
    if not facts.exists(m.python.path):
        raise HermeticError(f"base {m.base}: has no interpreter at python.path {m.python.path}")
    notes = run_build_checks(cfg, wheels, facts)
    _verify_wheels(wheels)
    layout = VenvLayout(m.build.prefix, m.python.version, m.python.path)
    specs = plan_layers(wheels, hermetic_layer_files(layout), max_layers=MAX_LAYERS - len(base.layers))
    built = build_layers(specs, layout, facts.dirs, m.build.source_date_epoch, store,
                         LayerCache(paths.layers, store), paths.tmp, on_layer=on_layer)
    labels = image_labels(cfg, lock, base.manifest_digest, wheels)
    refs = [LayerRef(b.descriptor, b.descriptor.digest, f"hermetic: {b.spec.description}") for b in built]
    config = image_config(base_config=base.config, cfg=m, layers=refs, base_layer_count=len(base.layers),
                          labels=labels, venv_bin=layout.bin, venv_prefix=layout.prefix)
    config_digest, config_size, _ = store.put_json(config)
    layer_descs = base.layers + [b.descriptor for b in built]
    manifest = image_manifest(config_digest, config_size, layer_descs)
    manifest_digest, manifest_size, _ = store.put_json(manifest)
    desc = Descriptor(MT_MANIFEST, manifest_digest, manifest_size)
    store.set_ref(f"{m.name}:latest", desc)
    store.set_ref(f"{m.name}:bk-{key[:16]}", desc)
    layer_info = [{"digest": d.digest, "size": d.size, "media_type": d.media_type, "contents": f"base layer {i}",
                   "cached": True} for i, d in enumerate(base.layers)]
    for b in built:
        layer_info.append({"digest": b.descriptor.digest, "size": b.descriptor.size,
                           "media_type": b.descriptor.media_type, "contents": b.spec.description,
                           "packages": [f"{w.locked.name}=={w.locked.version}" for w in b.spec.wheels],
                           "cached": b.cached, "seconds": round(b.seconds, 3)})
    from hermetic.builder.base import os_pretty_name

    return {
        "image_id": config_digest, "manifest_digest": manifest_digest, "build_key": key,
        "layers": layer_info, "labels": labels, "notes": notes,
        "base": {"reference": m.base, "manifest_digest": base.manifest_digest, "image_id": base.config_digest,
                 "os": os_pretty_name(facts), "glibc": ".".join(map(str, facts.glibc)) if facts.glibc else None},
        "lock": {"path": m.lock, "sha256": lock.sha256, "format": lock.format},
        "packages": [{"name": w.locked.name, "version": w.locked.version, "filename": w.filename, "sha256": w.sha256,
                      "size": w.size} for w in sorted(wheels, key=lambda w: w.locked.name)],
        "config_sha256": image_config_sha256(cfg),
        "env": config["config"]["Env"],
    }


def image_labels(cfg: LoadedConfig, lock: Lock, base_digest: str, wheels: list[ResolvedWheel]) -> dict[str, str]:
    m = cfg.model
    labels = {
        "org.opencontainers.image.title": m.name,
        "org.hermetic.version": __version__,
        "org.hermetic.lock.sha256": lock.sha256,
        "org.hermetic.config.sha256": image_config_sha256(cfg),
        "org.hermetic.base": m.base,
        "org.hermetic.base.digest": base_digest,
        "org.hermetic.python": m.python.version,
        "org.hermetic.determinism": m.determinism.mode,
    }
    from hermetic.gpu.cuda import cuda_info, image_labels as cuda_labels

    labels.update(cuda_labels(cuda_info(wheels)))
    return labels


def _write_record(cfg: LoadedConfig, info: dict[str, Any]) -> Path:
    """hermetic.image.json beside hermetic.yaml: every input with its digest, for `git diff`."""
    path = cfg.root / BUILD_RECORD
    record = {
        "hermetic_version": __version__,
        "image_id": info["image_id"], "manifest_digest": info["manifest_digest"], "build_key": info["build_key"],
        "base": info["base"], "lock": info["lock"], "config_sha256": info["config_sha256"],
        "packages": info["packages"], "labels": info["labels"], "env": info["env"],
        "layers": [{k: v for k, v in layer.items() if k not in ("cached", "seconds")} for layer in info["layers"]],
    }
    text = pretty_json(record)
    try:
        if path.read_text() == text:
            return path
    except FileNotFoundError:
        pass
    atomic_write_text(path, text)
    return path
