"""Whole images in the store checked (``check_image``, before a no-op build or a run trusts one) and sealed
(``seal_image``, after a build or pull wrote one), blob by blob, above oci.py and intact.py.
"""

from __future__ import annotations

from hermetic.core.canonical import parse_digest
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.store.intact import REPAIR, blob_intact, seal
from hermetic.store.inuse import claim_image
from hermetic.store.oci import OciStore


def check_image(store: OciStore, manifest_digest: str) -> None:
    """Refuse (IntegrityError naming the blob, and the fix) unless every blob of the image --
    manifest, config, layers -- is in the store and matches its digest. Costs a stat and a
    small read per blob when nothing changed since the last check.

    The image is claimed first (store/inuse.py): what this process checked, it uses (a run,
    a no-op build), and ``cache gc`` keeps it until the process exits."""
    claim_image(store, manifest_digest)  # before the check: a gc that deleted first is seen by it

    blobs: list[tuple[str, str, int | None]] = [("manifest", manifest_digest, None)]
    try:
        config, *layers = store.image_blobs(manifest_digest)
        blobs.append(("config", config.digest, config.size))
        blobs += [(f"layer {i}", d.digest, d.size) for i, d in enumerate(layers, 1)]
    except HermeticError:
        pass  # the manifest itself is missing or corrupt: reported below as such
    except (ValueError, KeyError) as e:
        raise IntegrityError(f"image {manifest_digest}: unreadable manifest in the store ({e.__class__.__name__})",
                             hint=f"run `{REPAIR}`, then build or pull again") from None
    for role, digest, size in blobs:
        hexdigest = parse_digest(digest)
        blob = store.blob_path(digest)
        if not blob_intact(store.root, blob, hexdigest, size):
            state = "missing from" if not blob.exists() else "corrupt in"
            raise IntegrityError(
                f"image {manifest_digest}: {role} blob {digest} is {state} the store ({blob}); "
                f"run `{REPAIR}`, then build or pull the image again",
                hint=f"`{REPAIR}` removes what does not match its digest, and the cache entries that point at it",
            )


def seal_image(store: OciStore, manifest_digest: str) -> None:
    """``seal`` every blob of an image (after a build or a pull wrote it)."""
    digests = [manifest_digest] + [d.digest for d in store.image_blobs(manifest_digest)]
    seal(store.root, {parse_digest(d): store.blob_path(d) for d in digests})
