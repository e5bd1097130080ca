"""Where a Slurm task gets the image: a store every node mounts (``--shared-store``, or HERMETIC_CACHE below a
``--shared-root`` or on a network filesystem), each blob checked by digest, else the registry it was pushed to.
The choice and why are said before anything is submitted; ``--node-cache`` copies from the shared store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hermetic.core.paths import inside
from hermetic.core.errors import IntegrityError, NotFound
from hermetic.hostfs.filesystems import NETWORK_FS, filesystem_of
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore


@dataclass(frozen=True)
class ImageSource:
    """How the tasks get the image: ``store`` (a cache every node mounts) or ``registry`` (pull by digest)."""

    kind: str  # "store" | "registry"
    store: str | None  # the shared cache's root (kind store)
    pull_from: str | None  # the repo digest the nodes pull (kind registry)
    why: str  # one line: which way and why, for the log before submitting

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "store": self.store, "pull_from": self.pull_from}


def shared_because(path: Path, shared_roots: tuple[Path, ...]) -> str | None:
    """Why every node would see ``path`` (below a --shared-root, on a network filesystem); None: no sign."""
    real = os.path.realpath(path)
    for r in shared_roots:
        if inside(real, os.path.realpath(r)):
            return f"below --shared-root {r}"
    found = filesystem_of(path)
    if found is not None and found[1] in NETWORK_FS:
        return f"on {found[1]} (mounted at {found[0]})"
    return None


def copy_image(src: OciStore, dst: OciStore, manifest_digest: str, ref_name: str | None = None) -> int:
    """The image's blobs (manifest, config, layers) from ``src`` into ``dst``, each checked against its digest
    as it is written (a blob ``dst`` holds intact is skipped), then a ref in ``dst`` naming it (``cache gc``
    keeps it); how many blobs were copied."""
    from hermetic.store.intact import REPAIR

    dst.ensure()
    if not src.has_image(manifest_digest):
        raise NotFound(f"image {manifest_digest} is not in the store at {src.root}")
    blobs = [Descriptor(MT_MANIFEST, manifest_digest, src.blob_size(manifest_digest))]
    blobs += src.image_blobs(manifest_digest)
    copied = 0
    for d in blobs:
        if dst.has_blob(d.digest) and dst.blob_intact(d.digest, d.size if d.digest != manifest_digest else None):
            continue
        path = src.blob_path(d.digest)
        try:
            with open(path, "rb") as f, dst.writer(d.digest, needed=os.fstat(f.fileno()).st_size) as w:
                while chunk := f.read(1 << 20):
                    w.write(chunk)
                w.commit()
        except IntegrityError:
            raise IntegrityError(f"image {manifest_digest}: blob {d.digest} in the store at {src.root} does not match "
                                 f"its digest; nothing of it was copied; run `{REPAIR}` there, then build or pull "
                                 "the image again") from None
        copied += 1
    name = ref_name or f"shared:{manifest_digest.split(':', 1)[1][:20]}"
    current = dst.resolve(name)
    if current is None or current.digest != manifest_digest:
        dst.set_ref(name, blobs[0])
    return copied
