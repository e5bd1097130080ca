"""The local OCI image layout store (``skopeo inspect oci:<dir>:<ref>`` reads it).

Blobs enter only through ``BlobWriter``: hashed while written to a temp file in tmp/ (locked by its writer, so
only a dead writer's is swept), checked, renamed into place; a crash leaves a stray temp file, never a wrong blob,
a full disk removes it at once. index.json is rewritten atomically under an flock.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from hermetic.core.canonical import canonical_json
from hermetic.core.errors import DiskFull, HermeticError, IntegrityError, NotFound, disk_full, is_disk_full
from hermetic.hostfs.filelocks import file_lock
from hermetic.hostfs.filesystems import naming_full_disk, naming_unwritable
from hermetic.hostfs.fsutil import OwnedTemp, atomic_write_bytes, replace_file, set_mode, sha256_file, sweep_dead_once
from hermetic.core.reference import check_digest
from hermetic.store import intact

OCI_LAYOUT = {"imageLayoutVersion": "1.0.0"}
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MT_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MT_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
MT_DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
MANIFEST_TYPES = (MT_MANIFEST, MT_DOCKER_MANIFEST)
INDEX_TYPES = (MT_INDEX, MT_DOCKER_LIST)


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: media type, digest, size (and annotations, platform)."""

    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    platform: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        if self.platform:
            d["platform"] = dict(self.platform)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Descriptor":
        return cls(
            media_type=d["mediaType"], digest=d["digest"], size=int(d["size"]),
            annotations=dict(d.get("annotations") or {}), platform=d.get("platform"),
        )


class BadDigest(IntegrityError, ValueError):
    """A digest that is not ``sha256:<64 hex>`` never becomes a path in the store: one line, exit 65
    (a ValueError too, for callers that took any malformed document as one)."""


def _hex(digest: str) -> str:
    return check_digest(digest, "a blob of the OCI store", BadDigest)[len("sha256:"):]


class BlobWriter:
    """Stream bytes into the store; the blob appears only once verified.

    ``needed``: at least how big the blob will be, where the caller knows,
    for the message when the disk is full (``expected_size`` is exact)."""

    WHAT = "a blob into the OCI store"

    def __init__(self, store: "OciStore", expected_digest: str | None = None, expected_size: int | None = None,
                 *, needed: int | None = None):
        self._store = store
        self._expected = expected_digest
        self._expected_size = expected_size
        self._needed = expected_size if expected_size is not None else needed
        self._full: DiskFull | None = None
        sweep_dead_once(store.tmp)  # dead writers' temp files, once per process (the first writer does)
        with naming_full_disk(store.root, self.WHAT, needed=self._needed):
            self._owner = OwnedTemp(store.tmp, "blob.")
        self._tmp = self._owner.path
        self._f: BinaryIO = self._owner.open("wb")
        self._h = hashlib.sha256()
        self.size = 0
        self.digest: str | None = None

    def tell(self) -> int:
        return self.size

    def write(self, data: bytes | memoryview) -> int:
        if self._full is not None:  # (a tar's close writes its end blocks after the failed write)
            raise self._full
        try:
            self._f.write(data)
        except OSError as e:
            self._disk_full(e)
            raise
        self._h.update(data)
        self.size += len(data)
        return len(data)

    def _disk_full(self, e: OSError) -> None:
        """On ENOSPC/EDQUOT: remove the temp file at once (its space is what the disk lacks) and raise
        DiskFull naming the store; any other error is the caller's to raise."""
        if not is_disk_full(e):
            return
        self._full = disk_full(e, self._store.root, what=self.WHAT, written=self.size, needed=self._needed,
                               at_least=self._expected_size is None)
        self.abort()
        raise self._full from None

    def commit(self) -> str:
        if self._full is not None:
            raise self._full
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            self._disk_full(e)
            self.abort()
            raise
        digest = "sha256:" + self._h.hexdigest()
        try:
            if self._expected is not None and digest != self._expected:
                raise IntegrityError(f"blob digest mismatch: expected {self._expected}, got {digest} ({self.size} bytes)")
            if self._expected_size is not None and self.size != self._expected_size:
                raise IntegrityError(f"blob {digest}: expected {self._expected_size} bytes, got {self.size}")
            dest = self._store.blob_path(digest)
            with naming_full_disk(self._store.root, self.WHAT):
                dest.parent.mkdir(parents=True, exist_ok=True)
                set_mode(self._owner.fd, 0o644)
                replace_file(self._tmp, dest)
            # The bytes just hashed are the blob's: note its stat (taken after the rename, which
            # changes ctime) for intact.py.
            noted_ns = time.time_ns()
            intact.write_note(self._store.root, digest[len("sha256:"):], os.fstat(self._owner.fd), noted_ns)
            self._owner.close()
        except BaseException:
            self.abort()
            raise
        self.digest = digest
        return digest

    def abort(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass  # the flush of what the disk had no room for: the file goes anyway
        self._owner.discard()

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self.digest is None:
            self.commit()


class OciStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    # -- layout ---------------------------------------------------------
    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def index_path(self) -> Path:
        return self.root / "index.json"

    def ensure(self) -> "OciStore":
        with naming_unwritable(self.root):  # another user's store, a read-only one: one line (filesystems)
            (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir(parents=True, exist_ok=True)
        layout = self.root / "oci-layout"
        if not layout.exists():
            atomic_write_bytes(layout, json.dumps(OCI_LAYOUT).encode())
        if not self.index_path.exists():
            with file_lock(self.root / ".index.lock"):
                if not self.index_path.exists():
                    self._write_index({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": []})
        return self

    # -- blobs ----------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / _hex(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def blob_size(self, digest: str) -> int:
        return self.blob_path(digest).stat().st_size

    def writer(self, expected_digest: str | None = None, expected_size: int | None = None, *,
               needed: int | None = None) -> BlobWriter:
        self.ensure()
        return BlobWriter(self, expected_digest, expected_size, needed=needed)

    def put_bytes(self, data: bytes, expected_digest: str | None = None) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if expected_digest is not None and digest != expected_digest:
            raise IntegrityError(f"blob digest mismatch: expected {expected_digest}, got {digest}")
        if self.has_blob(digest):
            return digest
        with self.writer(digest) as w:
            w.write(data)
        return digest

    def put_json(self, value: Any) -> tuple[str, int, bytes]:
        data = canonical_json(value)
        return self.put_bytes(data), len(data), data

    def read_blob(self, digest: str, *, verify: bool = True) -> bytes:
        try:
            data = self.blob_path(digest).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"blob {digest} is not in the store {self.root}") from None
        if verify:
            actual = "sha256:" + hashlib.sha256(data).hexdigest()
            if actual != digest:
                raise IntegrityError(f"store blob {digest} is corrupt (content hashes to {actual}); run `{intact.REPAIR}`")
        return data

    def read_json(self, digest: str) -> Any:
        """A JSON blob (a manifest, an index, a config), verified."""
        return json.loads(self.read_blob(digest))

    def verify_blob(self, digest: str) -> bool:
        """Rehash a blob. True when its content matches its name."""
        try:
            return "sha256:" + sha256_file(self.blob_path(digest)) == digest
        except FileNotFoundError:
            return False

    def blob_intact(self, digest: str, size: int | None = None) -> bool:
        """True when the blob matches its name (and size): from its stat when safe (intact.py)."""
        return intact.blob_intact(self.root, self.blob_path(digest), _hex(digest), size)

    def remove_blob(self, digest: str) -> None:
        self.blob_path(digest).unlink(missing_ok=True)
        intact.forget(self.root, _hex(digest))

    def iter_blobs(self) -> Iterator[str]:
        d = self.root / "blobs" / "sha256"
        if d.is_dir():
            for p in sorted(d.iterdir()):
                yield "sha256:" + p.name

    # -- index / refs ---------------------------------------------------
    def _read_index(self) -> dict[str, Any]:
        try:
            return json.loads(self.index_path.read_text())
        except FileNotFoundError:
            return {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": []}

    def _write_index(self, index: dict[str, Any]) -> None:
        index["manifests"].sort(key=lambda m: (m.get("annotations", {}).get(REF_ANNOTATION, ""), m["digest"]))
        atomic_write_bytes(self.index_path, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())

    def refs(self) -> dict[str, Descriptor]:
        out: dict[str, Descriptor] = {}
        for m in self._read_index().get("manifests", []):
            name = m.get("annotations", {}).get(REF_ANNOTATION)
            if name:
                out[name] = Descriptor.from_json(m)
        return out

    def manifests(self) -> list[Descriptor]:
        return [Descriptor.from_json(m) for m in self._read_index().get("manifests", [])]

    def resolve(self, name: str) -> Descriptor | None:
        return self.refs().get(name)

    def set_ref(self, name: str, desc: Descriptor) -> None:
        """Point ``name`` at a manifest (replacing what it named before)."""
        self.ensure()
        self._replace_ref(name, desc)

    def remove_ref(self, name: str) -> bool:
        return self._replace_ref(name, None)

    def _replace_ref(self, name: str, desc: Descriptor | None) -> bool:
        """``name`` now names ``desc`` (None: nothing); whether it named something before."""
        with file_lock(self.root / ".index.lock"):
            index = self._read_index()
            keep = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_ANNOTATION) != name]
            had = len(keep) != len(index["manifests"])
            if desc is not None:
                keep.append({**desc.to_json(), "annotations": {**desc.annotations, REF_ANNOTATION: name}})
            index["manifests"] = keep
            self._write_index(index)
            return had

    # -- images ---------------------------------------------------------
    def find_manifest(self, digest: str) -> Descriptor | None:
        """A manifest we hold, by digest, whether or not a ref names it."""
        for d in self.manifests():
            if d.digest == digest:
                return d
        if self.has_blob(digest):
            try:
                doc = self.read_json(digest)
            except (ValueError, HermeticError):
                return None
            mt = doc.get("mediaType") or (MT_MANIFEST if "layers" in doc else MT_INDEX if "manifests" in doc else "")
            if mt:
                return Descriptor(mt, digest, self.blob_size(digest))
        return None

    def image_blobs(self, manifest_digest: str) -> list[Descriptor]:
        """Config and layer descriptors of one image manifest."""
        m = self.read_json(manifest_digest)
        return [Descriptor.from_json(m["config"])] + [Descriptor.from_json(x) for x in m["layers"]]

    def has_image(self, manifest_digest: str) -> bool:
        if not self.has_blob(manifest_digest):
            return False
        try:
            return all(self.has_blob(d.digest) for d in self.image_blobs(manifest_digest))
        except (ValueError, KeyError, HermeticError):
            return False

    def live_blobs_from(self, root_digest: str) -> set[str]:
        """The manifest (or index) and every blob it reaches that the store holds."""
        return {digest for _role, digest, present in self.walk(root_digest) if present}

    def walk(self, root_digest: str, *, every_child: bool = False) -> Iterator[tuple[str, str, bool]]:
        """(role, digest, present) of a manifest or index and of every blob it names: an index's manifests
        that the store keeps (``every_child``: all), and theirs; a manifest's config and layers. A blob that
        does not parse names nothing (it is corrupt: a rehash reports it)."""
        todo = [("manifest", root_digest)]
        seen: set[str] = set()
        while todo:
            role, dg = todo.pop(0)
            if dg in seen:
                continue
            seen.add(dg)
            present = self.has_blob(dg)
            yield role, dg, present
            try:
                doc = self.read_json(dg) if present else None
            except Exception:
                continue
            if not isinstance(doc, dict):
                continue
            prefix = "" if dg == root_digest else f"{role} "
            if isinstance(doc.get("manifests"), list) or doc.get("mediaType") in INDEX_TYPES:
                for i, m in enumerate(doc.get("manifests") or [], 1):
                    child = m.get("digest", "") if isinstance(m, dict) else ""
                    if child and (every_child or self.has_blob(child)):
                        todo.append((f"{prefix}manifest {i} ({child[:19]})", child))
            elif "layers" in doc or doc.get("mediaType") in MANIFEST_TYPES:
                try:
                    blobs = [("config", doc["config"]["digest"])]
                    blobs += [(f"layer {i}", layer["digest"]) for i, layer in enumerate(doc.get("layers") or [], 1)]
                except (KeyError, TypeError):
                    continue
                for r, d in blobs:
                    if d not in seen:
                        seen.add(d)
                        yield prefix + r, d, self.has_blob(d)
