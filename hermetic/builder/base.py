"""Base images: a pinned reference resolved to an image in the local OCI store, verified on the way in.

Sources (hermetic/core/reference.py): the store, a registry, an OCI layout or archive, the local
engine (``docker save``). ``BaseFacts``: what later stages need of the base's files, cached by digest.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermetic.builder.libc import glibc_from_rootfs
from hermetic.builder.tarlayer import DirAttrs
from hermetic.core.errors import ConfigError, DataError, HermeticError, IntegrityError, NotFound
from hermetic.hostfs.fsutil import atomic_write_bytes, owned_temp_dir
from hermetic.core.reference import BaseReference, parse_base_reference
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES, MT_LAYER, MT_MANIFEST, Descriptor, OciStore
from hermetic.hostfs.tarextract import extract_all

FACTS_VERSION = 1
_CAPTURE = ("var/lib/dpkg/status", "etc/os-release", "usr/lib/os-release")


@dataclass(frozen=True)
class BaseImage:
    ref: BaseReference
    manifest_digest: str
    manifest: dict[str, Any]
    config_digest: str
    config: dict[str, Any]

    @property
    def layers(self) -> list[Descriptor]:
        return [Descriptor.from_json(x) for x in self.manifest["layers"]]

    @property
    def diff_ids(self) -> list[str]:
        return list(self.config.get("rootfs", {}).get("diff_ids", []))


def _pick_platform(index: dict[str, Any], index_digest: str) -> str:
    """The linux/amd64 image of an image index."""
    for m in index.get("manifests", []):
        p = m.get("platform") or {}
        if p.get("os") == "linux" and p.get("architecture") == "amd64":
            return m["digest"]
    raise NotFound(f"image index {index_digest} has no linux/amd64 image")


def load_base(store: OciStore, ref: BaseReference, manifest_digest: str) -> BaseImage:
    doc = store.read_json(manifest_digest)
    mt = doc.get("mediaType") or (MT_MANIFEST if "layers" in doc else "")
    if mt in INDEX_TYPES or "manifests" in doc:
        manifest_digest = _pick_platform(doc, manifest_digest)
        doc = store.read_json(manifest_digest)
        mt = doc.get("mediaType") or MT_MANIFEST
    if mt not in MANIFEST_TYPES and "layers" not in doc:
        raise DataError(f"{ref.raw}: {manifest_digest} is not an image manifest ({mt})")
    cfg_digest = doc["config"]["digest"]
    config = store.read_json(cfg_digest)
    for layer in doc["layers"]:
        if not store.has_blob(layer["digest"]):
            raise DataError(f"{ref.raw}: layer {layer['digest']} is missing from the store; pull the base again")
    return BaseImage(ref, manifest_digest, doc, cfg_digest, config)


PullImage = Callable[[OciStore, str], str]
"""``pull(store, "HOST/REPO@sha256:…")`` brings an image into the store and returns its manifest
digest (hermetic.registry.ensure_image); the builder is given it, it does not import the registry."""


def resolve_base(store: OciStore, ref_text: str, *, pull: PullImage | None = None) -> BaseImage:
    """Find or import the pinned base; raises naming the reference.

    A base named by a registry host that the store lacks is fetched with ``pull``.
    """
    try:
        ref = parse_base_reference(ref_text)
    except ValueError as e:
        raise ConfigError(f"base: {e}") from None
    store.ensure()
    if ref.kind == "docker":  # docker:ID names an image of the Docker Engine (hermetic.engines' "docker")
        digest = import_from_engine(store, ref.digest, engine=ref.kind)
        return load_base(store, ref, digest)
    if ref.kind in ("oci", "oci-archive"):
        if not store.has_image(ref.digest):
            import_oci(store, Path(ref.path or ""), ref.digest, archive=ref.kind == "oci-archive")
        return load_base(store, ref, ref.digest)
    # kind == "name": content-addressed, so any complete copy in the store will do.
    if store.has_blob(ref.digest):
        try:
            return load_base(store, ref, ref.digest)
        except (HermeticError, ValueError, KeyError, TypeError):
            pass  # incomplete or unreadable: pulled again, where it can be
    assert ref.name is not None
    if not ref.name.has_host:
        raise NotFound(
            f"base {ref.raw} is not in the local store {store.root}",
            hint="create it with `hermetic base bootstrap` (and `--pin` to write its digest), or `hermetic pull` it",
        )
    if pull is None:
        raise NotFound(f"base {ref.raw} is not in the local store {store.root}, and this build does not "
                            "pull from registries", hint=f"hermetic pull {ref.raw}")
    try:
        digest = pull(store, ref.raw)
    except HermeticError as e:  # (the registry's error, kept with its exit code, says which base)
        e.message = f"base {ref.raw}: cannot pull it: {e.message}"
        e.args = (e.message,)
        raise
    return load_base(store, ref, digest)


# -- importers -----------------------------------------------------------

def _copy_blob(store: OciStore, src: Path, digest: str, size: int | None = None) -> None:
    if store.has_blob(digest):
        return
    if not src.is_file():
        raise DataError(f"{src}: blob {digest} is missing from the layout")
    try:
        with open(src, "rb") as f, store.writer(digest, size) as w:
            shutil.copyfileobj(f, w, 1 << 20)
    except IntegrityError as e:
        raise IntegrityError(f"{src}: {e}; not imported") from None


def import_oci(store: OciStore, path: Path, manifest_digest: str, *, archive: bool) -> None:
    """Copy one image (by manifest digest) from an OCI layout into the store, verified."""
    if archive:
        if not path.is_file():
            raise NotFound(f"oci-archive {path}: no such file")
        with owned_temp_dir(store.tmp, "oci-archive.") as tmp:  # a killed import's files go with its lock
            try:
                with tarfile.open(path) as tf:
                    extract_all(tf, tmp)
            except tarfile.TarError as e:
                raise DataError(f"oci-archive {path}: {e}; not imported") from None
            import_oci(store, Path(tmp), manifest_digest, archive=False)
        return
    if not (path / "oci-layout").is_file():
        raise DataError(f"{path}: not an OCI image layout (no oci-layout file)")

    def blob(d: str) -> Path:
        algo, _, hexpart = d.partition(":")
        return path / "blobs" / algo / hexpart

    _copy_blob(store, blob(manifest_digest), manifest_digest)
    doc = store.read_json(manifest_digest)
    manifests = [manifest_digest]
    if "manifests" in doc:
        sub = _pick_platform(doc, manifest_digest)
        _copy_blob(store, blob(sub), sub)
        manifests.append(sub)
        doc = store.read_json(sub)
    _copy_blob(store, blob(doc["config"]["digest"]), doc["config"]["digest"], doc["config"].get("size"))
    for layer in doc["layers"]:
        _copy_blob(store, blob(layer["digest"]), layer["digest"], layer.get("size"))


def import_from_engine(store: OciStore, image_id: str, *, engine: str) -> str:
    """``docker save`` an image of ``engine`` into the store as an OCI image; returns the manifest digest."""
    from typing import cast

    from hermetic.engines import get_engine
    from hermetic.engines.base import SavesImages

    source = cast(SavesImages, get_engine(engine))
    try:
        chunks = source.save_image(image_id)
    except NotFound:
        raise NotFound(f"base docker:{image_id}: the Docker Engine has no image with this ID") from None
    with owned_temp_dir(store.tmp, "docker-save.") as tmp:
        tarpath = Path(tmp) / "image.tar"
        with open(tarpath, "wb") as f:
            for chunk in chunks:  # EngineError when the engine fails on the way
                f.write(chunk)
        try:
            with tarfile.open(tarpath) as tf:
                extract_all(tf, tmp)
        except tarfile.TarError as e:
            raise DataError(f"docker:{image_id}: the engine's saved image: {e}; not imported") from None
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())[0]
        config_bytes = (Path(tmp) / manifest["Config"]).read_bytes()
        config_digest = store.put_bytes(config_bytes)
        if config_digest != image_id:
            raise IntegrityError(f"docker:{image_id}: saved config hashes to {config_digest}")
        config = json.loads(config_bytes)
        diff_ids = config["rootfs"]["diff_ids"]
        layers = []
        for layer_path, diff_id in zip(manifest["Layers"], diff_ids):
            src = Path(tmp) / layer_path
            size = src.stat().st_size
            try:
                _copy_blob(store, src, diff_id, size)
            except IntegrityError:
                raise IntegrityError(f"docker:{image_id}: layer {layer_path} does not match its diff_id {diff_id}") from None
            layers.append(Descriptor(MT_LAYER, diff_id, size))
    from hermetic.builder.image import image_manifest

    digest, size, _ = store.put_json(image_manifest(config_digest, len(config_bytes), layers))
    store.set_ref(f"docker-{image_id.split(':')[1][:12]}", Descriptor(MT_MANIFEST, digest, size))
    return digest


# -- facts ---------------------------------------------------------------

@dataclass
class BaseFacts:
    dirs: dict[str, DirAttrs]
    symlinks: dict[str, str]
    files: set[str]
    captured: dict[str, str]  # small text files read from the base (dpkg status, os-release)
    glibc: tuple[int, int] | None

    def exists(self, path: str) -> bool:
        return self.resolve(path) is not None

    def resolve(self, path: str, _depth: int = 0) -> str | None:
        """Follow symlinks (absolute or relative) to a regular file or dir path, or None."""
        p = path.strip("/")
        if _depth > 40:
            return None
        parts = p.split("/")
        cur = ""
        for i, part in enumerate(parts):
            nxt = f"{cur}/{part}" if cur else part
            if nxt in self.symlinks:
                target = self.symlinks[nxt]
                base = "" if target.startswith("/") else posixpath.dirname(nxt)
                joined = posixpath.normpath(posixpath.join("/" + base, target)).strip("/")
                rest = "/".join(parts[i + 1:])
                return self.resolve(f"{joined}/{rest}" if rest else joined, _depth + 1)
            cur = nxt
        return cur if (cur in self.files or cur in self.dirs) else None

    def to_json(self) -> dict[str, Any]:
        return {"version": FACTS_VERSION,
                "dirs": {k: [v.mode, v.uid, v.gid] for k, v in sorted(self.dirs.items())},
                "symlinks": dict(sorted(self.symlinks.items())),
                "files": sorted(self.files), "captured": self.captured,
                "glibc": list(self.glibc) if self.glibc else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "BaseFacts":
        return cls({k: DirAttrs(*v) for k, v in d["dirs"].items()}, dict(d["symlinks"]), set(d["files"]),
                   dict(d["captured"]), tuple(d["glibc"]) if d.get("glibc") else None)  # type: ignore[arg-type]


def member_path(name: str) -> str:
    """A layer member's name as a path in the image, relative and normalized ('' for the root)."""
    return posixpath.normpath(name.lstrip("./").lstrip("/")) if name not in (".", "./") else ""


def scan_base(store: OciStore, base: BaseImage, cache_dir: Path) -> BaseFacts:
    cache_file = cache_dir / f"{base.manifest_digest.split(':')[1]}.json"
    if cache_file.is_file():
        try:
            d = json.loads(cache_file.read_text())
            if d.get("version") == FACTS_VERSION:
                return BaseFacts.from_json(d)
        except (ValueError, KeyError):
            pass
    dirs: dict[str, DirAttrs] = {}
    symlinks: dict[str, str] = {}
    files: set[str] = set()
    captured: dict[str, str] = {}
    libc_bytes: bytes | None = None
    for layer in base.layers:
        try:
            tf = tarfile.open(store.blob_path(layer.digest), mode="r|*")  # gzip or plain
        except tarfile.TarError as e:
            raise DataError(f"base layer {layer.digest} is not a tar this build can read ({e})") from None
        with tf:
            for m in tf:
                name = member_path(m.name)
                if not name or name == ".":
                    continue
                base_name = posixpath.basename(name)
                if base_name.startswith(".wh."):
                    victim = posixpath.join(posixpath.dirname(name), base_name[4:])
                    files.discard(victim)
                    dirs.pop(victim, None)
                    symlinks.pop(victim, None)
                    continue
                if m.isdir():
                    dirs[name] = DirAttrs(m.mode & 0o7777, m.uid, m.gid)
                elif m.issym():
                    symlinks[name] = m.linkname
                elif m.isreg() or m.islnk():
                    files.add(name)
                    if name in _CAPTURE and m.isreg():
                        f = tf.extractfile(m)
                        if f is not None:
                            captured[name] = f.read().decode("utf-8", "replace")
                    elif name.endswith("libc.so.6") and m.isreg() and libc_bytes is None:
                        f = tf.extractfile(m)
                        if f is not None:
                            libc_bytes = f.read()
    facts = BaseFacts(dirs, symlinks, files, captured, None)
    facts.glibc = _glibc(facts, libc_bytes)
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(cache_file, json.dumps(facts.to_json()).encode(), fsync=False)
    return facts


def _glibc(facts: BaseFacts, libc_bytes: bytes | None) -> tuple[int, int] | None:
    def read_file(p: str) -> bytes | None:
        key = p.lstrip("/")
        if key in facts.captured:
            return facts.captured[key].encode()
        if key.endswith("libc.so.6"):
            return libc_bytes
        return None

    return glibc_from_rootfs(read_file)


def os_pretty_name(facts: BaseFacts) -> str | None:
    from hermetic.provenance.sbom import os_release

    text = facts.captured.get("etc/os-release") or facts.captured.get("usr/lib/os-release") or ""
    return os_release(text).get("PRETTY_NAME")
