"""``hermetic build``: plan -> base -> layers -> config -> manifest -> store (-> engine).

The build key covers every input that decides the image; when the store holds the image for it, the
build is a no-op that still checks every blob (store/intact.py), the one answer to "is it up to date".
Builds of one key are serialized by a file lock, and hold the store's gc lock shared (store/inuse.py);
a full disk ends in one line (errors.DiskFull) with the store as it was. The base is resolved before
any wheel is fetched.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from hermetic import __version__
from hermetic.builder.image_record import ImageInfo, write_image_record
from hermetic.builder.key import build_key, image_config_sha256
from hermetic.core.canonical import canonical_json
from hermetic.config.load import LoadedConfig
from hermetic.core.errors import ConfigError
from hermetic.hostfs.filelocks import file_lock
from hermetic.hostfs.filesystems import naming_full_disk
from hermetic.hostfs.fsutil import atomic_write_bytes
from hermetic.lock.model import Lock, ResolvedWheel, Target
from hermetic.core.paths import CachePaths
from hermetic.store.images import check_image, seal_image
from hermetic.store.inuse import claim_image, writing
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore

if TYPE_CHECKING:  # what only a real build uses is imported there: a no-op does not pay for it
    from hermetic.builder.base import BaseImage, PullImage
    from hermetic.engines.base import BuildFeed
    from hermetic.builder.layers import BuiltLayer


@dataclass
class BuildResult:
    """What a build made: the image, its layers, whether it was a no-op or loaded, how long it took."""

    info: ImageInfo
    layers: list[dict[str, Any]]
    noop: bool
    loaded: bool
    seconds: float
    record_path: Path
    notes: list[str] = field(default_factory=list)
    engine_loads: list[dict[str, Any]] = field(default_factory=list)  # each load into the engine: what, from/to (s)

    @property
    def image_id(self) -> str:
        return self.info.image_id

    @property
    def manifest_digest(self) -> str:
        return self.info.manifest_digest

    @property
    def build_key(self) -> str:
        return self.info.build_key

    def to_json(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "manifest_digest": self.manifest_digest, "build_key": self.build_key,
                "layers": self.layers, "noop": self.noop, "loaded": self.loaded,
                "seconds": round(self.seconds, 3), "record": str(self.record_path), "notes": self.notes,
                "engine_loads": self.engine_loads}


def layer_rows(info: ImageInfo, built: list[BuiltLayer] | None = None) -> list[dict[str, Any]]:
    """The image's layers, each with whether this build made it or reused it, and its packages."""
    built = built or []
    first_built = len(info.layers) - len(built)
    rows = []
    for i, layer in enumerate(info.layers):
        b = built[i - first_built] if built and i >= first_built else None
        rows.append({**layer, "cached": b.cached if b else True, "seconds": round(b.seconds, 3) if b else 0.0,
                     "packages": [f"{w.locked.name}=={w.locked.version}" for w in b.spec.wheels] if b else []})
    return rows


class ImageCache(Protocol):
    """Images shared by build key (``build --cache``: hermetic.registry.cache.RegistryCache).

    The cache is an optimization: each method turns its own failures into a
    note and never fails the build.
    """

    def pull(self, store: OciStore, key: str, notes: list[str]) -> str | None:
        """The manifest digest for ``key``, brought into ``store`` (verified), or None on a miss."""

    def publish(self, store: OciStore, key: str, manifest_digest: str, notes: list[str]) -> None:
        """Make ``manifest_digest`` the image for ``key``."""


def _resolve_wheels(lock: Lock, paths: CachePaths, *, offline: bool, log) -> list[ResolvedWheel]:
    from hermetic.store.fetch import fetch, resolve_from_store
    from hermetic.store.wheels import WheelStore

    store = WheelStore(paths.wheels)
    found, missing = resolve_from_store(lock, store)
    if not missing:
        return found
    if log:
        log(f"fetching {len(missing)} wheel(s) missing from the store ...")
    from hermetic.lock.indexes import read_pip_sources

    report = fetch(lock, store, read_pip_sources(), offline=offline)
    return report.resolved


def build(cfg: LoadedConfig, paths: CachePaths, *, offline: bool = False, load: bool = True,
          log: Callable[[str], None] | None = None,
          on_layer: Callable[[BuiltLayer], None] | None = None,
          cache: ImageCache | None = None, pull_base: PullImage | None = None,
          engine: str | None = None, before_build: Callable[[], object] | None = None) -> BuildResult:
    """Build (or find) the image for ``cfg``.

    With ``cache`` (``build --cache``) the cache is asked for the build key
    before anything is built, and a local build is published to it.
    ``before_build``: called when the store has no image for the key (not
    on a no-op), before anything is pulled or built; it may refuse the build.
    ``pull_base`` fetches a base named by a registry that the store lacks.
    ``load``: make the image runnable in ``engine`` (default hermetic.yaml's
    ``run.engine``): loaded into Docker (fed while the layers build), copied
    into Podman's storage, or unpacked for Charliecloud (hermetic.engines).
    """
    engine = engine or cfg.model.run.engine
    t0 = time.monotonic()
    lock = read_config_lock(cfg)
    key = build_key(cfg, lock)
    built: list[BuiltLayer] = []
    from hermetic.lock.torchbuild import companion_warnings

    notes: list[str] = companion_warnings(lock)  # torchvision for the other torch: said at every build
    feeds: list[BuildFeed] = []  # the load into the engine that runs while the layers build
    # A full disk anywhere below ends in one line: the writers name their file or store; what
    # reaches here unnamed is named by the cache it happened in.
    with naming_full_disk(paths.root, f"the image {cfg.model.name}"):
        store = OciStore(paths.oci).ensure()
        with writing(store):  # `cache gc` waits for this build: its blobs are named by no ref until the end
            try:
                with file_lock(paths.builds / f".{key}.lock"):
                    try:  # what was built for the key, if the store still holds all of it (check_image: its bytes)
                        digest = json.loads((paths.builds / f"{key}.json").read_text())["manifest_digest"]
                        digest = digest if store.has_image(digest) else None
                    except (FileNotFoundError, ValueError, KeyError):
                        digest = None
                    source = "local"
                    if digest is not None:
                        check_image(store, digest)  # trusted only if every blob still matches its digest
                    elif before_build is not None:
                        before_build()
                    if digest is None and cache is not None and not offline:
                        digest = cache.pull(store, key, notes)
                        source = "registry"
                    if digest is None:
                        from hermetic.builder.base import resolve_base
                        from hermetic.builder.gc import dead_temp_files

                        dead_temp_files(paths, remove=True, once=True)  # a killed writer's leftovers go first
                        base = resolve_base(store, cfg.model.base, pull=None if offline else pull_base)  # then fetch
                        wheels = _resolve_wheels(lock, paths, offline=offline, log=log)
                        digest, built, build_notes = _build(cfg, paths, store, lock, wheels, key, base,
                                                            on_layer=on_layer, feeds=feeds if load else None,
                                                            engine=engine)
                        notes += build_notes
                        source = "built"
                    if source != "local":
                        atomic_write_bytes(paths.builds / f"{key}.json", canonical_json({"manifest_digest": digest}))
                info = ImageInfo.from_store(store, digest, key)
                from hermetic.builder.attest import ensure_attestations

                # SBOM + provenance as referrers of the image (issue 20), before a cache publish pushes them.
                notes += ensure_attestations(cfg, paths, store, lock, info)
                if cache is not None and source != "registry" and not offline:
                    cache.publish(store, key, digest, notes)
                feed = feeds[0] if feeds else None
                loaded = False
                if load:  # runnable in the engine, its tag pointed at it (after a feed: only what it still lacks)
                    from hermetic.engines import get_engine

                    tag = engine_tag(cfg.model.name)
                    loaded = get_engine(engine).ensure_image(store, digest, repo_tag=tag, feed=feed)
                if source != "local":  # after the load: a blob written a moment before it is still racy
                    seal_image(store, digest)  # what this build wrote or pulled: trusted from its stat now
                # NAME:latest names this image after every build, a no-op too: two projects of one name in one
                # cache, or an older build of this one, may have moved it (the engine's tag: its ensure_image).
                latest = store.resolve(f"{cfg.model.name}:latest")
                if latest is None or latest.digest != digest:
                    store.set_ref(f"{cfg.model.name}:latest", Descriptor(MT_MANIFEST, digest, store.blob_size(digest)))
                record = write_image_record(cfg.root, cfg.model.lock, info)
                claim_image(store, digest)  # what the caller (a run) uses after the lock is gone
                # The result (not the record) also says which layers this build made or reused.
                loads = [{**e, "from": round(e["from"] - t0, 3), "to": round(e["to"] - t0, 3)}
                         for e in (feed.timeline if feed else [])]
                return BuildResult(info, layer_rows(info, built), source == "local", loaded, time.monotonic() - t0,
                                   record, notes, loads)
            finally:
                for feed in feeds:
                    feed.close()
                    feed.remove_partials()


def read_config_lock(cfg: LoadedConfig) -> Lock:
    from hermetic.lock.read import read_lock

    return read_lock(cfg.lock_path, Target(python_version=cfg.model.python.version))


def engine_tag(name: str) -> str:
    """The engine's tag for a config's image."""
    return f"hermetic/{name}:latest" if "/" not in name else f"{name}:latest"


def _build(cfg: LoadedConfig, paths: CachePaths, store: OciStore, lock: Lock, wheels: list[ResolvedWheel],
           key: str, base: BaseImage, *, on_layer, feeds: list["BuildFeed"] | None = None,
           engine: str = "docker") -> tuple[str, list[BuiltLayer], list[str]]:
    from hermetic.builder.base import scan_base
    from hermetic.builder.image import BASE_LAYERS_LABEL, LayerRef, image_config, image_manifest
    from hermetic.builder.install import VenvLayout
    from hermetic.builder.layers import MAX_LAYERS, LayerCache, build_layers, hermetic_layer_files, plan_layers

    m = cfg.model
    with naming_full_disk(paths.root / "bases", "the base's file list"):
        facts = scan_base(store, base, paths.root / "bases")
    if not facts.exists(m.python.path):
        raise ConfigError(f"base {m.base}: has no interpreter at python.path {m.python.path}")
    from hermetic.gpu.cuda import cuda_info
    from hermetic.gpu.findings import raise_for_failures, warnings
    from hermetic.gpu.wheels import build_checks

    # Every wheel runs on the base and its Python (hermetic.gpu.wheels): the first misfit refuses the build.
    findings = build_checks(cuda_info(wheels), [w.filename for w in wheels], glibc=facts.glibc,
                            python_version=m.python.version)
    raise_for_failures(findings)
    notes = [f.message for f in warnings(findings)]
    layout = VenvLayout(m.build.prefix, m.python.version, m.python.path)
    specs = plan_layers(wheels, hermetic_layer_files(layout), max_layers=MAX_LAYERS - len(base.layers))
    bytecode = None
    if m.build.bytecode != "none":
        from hermetic.builder.bytecode import BytecodeSpec
        from hermetic.builder.interpreter import base_interpreter

        with naming_full_disk(paths.root / "bases", "a copy of the base's interpreter (to compile bytecode with)"):
            interp = base_interpreter(store, base, facts, m.python.path, m.python.version, paths.root / "bases",
                                      paths.tmpdir())
        bytecode = BytecodeSpec(interp, m.build.bytecode)
    labels = image_labels(cfg, lock, base.manifest_digest, wheels)
    on_ready = on_planned = None
    if feeds is not None:
        from hermetic.engines import get_engine

        feed = get_engine(engine).build_feed(store, base.config, base.layers, len(base.layers) + len(specs),
                                             engine_tag(m.name), dict(labels))
        if feed is not None:  # the engine takes the layers as they are built (Docker, Charliecloud)
            feeds.append(feed)
        if feeds:
            on_ready, on_planned = feeds[0].layer_ready, feeds[0].start
    built = build_layers(specs, layout, facts.dirs, m.build.source_date_epoch, store,
                         LayerCache(paths.layers, store), on_layer=on_layer, bytecode=bytecode, on_ready=on_ready,
                         on_planned=on_planned)
    if bytecode is not None:
        v = ".".join(map(str, bytecode.interpreter.version))
        labels["org.hermetic.bytecode"] = f"{bytecode.mode} {bytecode.interpreter.cache_tag} (Python {v})"
    labels[BASE_LAYERS_LABEL] = str(len(base.layers))
    from hermetic.builder.base import os_pretty_name

    base_os = os_pretty_name(facts)
    if base_os:
        labels["org.hermetic.base.os"] = base_os
    if facts.glibc:
        labels["org.hermetic.base.glibc"] = ".".join(map(str, facts.glibc))
    refs = [LayerRef(b.descriptor, b.descriptor.digest, f"hermetic: {b.spec.description}") for b in built]
    config = image_config(base_config=base.config, cfg=m, layers=refs, base_layer_count=len(base.layers),
                          labels=labels, venv_bin=layout.bin, venv_prefix=layout.prefix)
    config_digest, config_size, config_bytes = store.put_json(config)
    if feeds:
        feeds[0].finish(config_digest, config_bytes)  # the engine load goes on while we write the rest
    ours = [b.descriptor for b in built]
    if m.build.compression == "gzip":
        from hermetic.builder.layers import gzip_layer

        ours = [gzip_layer(d, store, LayerCache(paths.layers, store)) for d in ours]
    layer_descs = base.layers + ours
    manifest = image_manifest(config_digest, config_size, layer_descs)
    if m.build.compression == "gzip":
        import zlib

        # Machine-dependent, so recorded on the manifest (not in the config: the image ID stays put).
        manifest["annotations"] = {"org.hermetic.layers.gzip": f"zlib {zlib.ZLIB_RUNTIME_VERSION} level 6"}
    manifest_digest, manifest_size, _ = store.put_json(manifest)
    desc = Descriptor(MT_MANIFEST, manifest_digest, manifest_size)
    store.set_ref(f"{m.name}:bk-{key[:16]}", desc)  # (NAME:latest: build() points it, as after a no-op)
    return manifest_digest, built, notes


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
    from hermetic.builder.image import PACKAGES_LABEL
    from hermetic.gpu.cuda import cuda_info
    from hermetic.gpu.cuda import image_labels as cuda_labels

    labels.update(cuda_labels(cuda_info(wheels)))
    # The wheels that went in, so the image describes itself wherever it is pulled.
    labels[PACKAGES_LABEL] = canonical_json(sorted(
        [w.locked.name, w.locked.version, w.filename, w.sha256] for w in wheels)).decode()
    return labels

