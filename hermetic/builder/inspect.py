"""Read an image back from the store (``hermetic inspect``, and every record of an image)."""

from __future__ import annotations

from typing import Any

from hermetic.core.errors import NotFound
from hermetic.store.oci import OciStore


def find_image(store: OciStore, image: str) -> str:
    """The manifest digest for ``image``: a manifest digest, an image ID, or a store ref (name:tag)."""
    if image.startswith("sha256:"):
        if store.find_manifest(image) is not None and "layers" in store.read_json(image):
            return image
        for d in store.manifests():
            if store.has_blob(d.digest) and store.read_json(d.digest).get("config", {}).get("digest") == image:
                return d.digest
        raise NotFound(f"no image {image} in the store {store.root} (by manifest digest or image ID)")
    desc = store.resolve(image)
    if desc is None:
        raise NotFound(f"no image named {image!r} in the store (known: {', '.join(sorted(store.refs())[:8]) or 'none'})")
    return desc.digest


def describe(store: OciStore, manifest_digest: str) -> dict[str, Any]:
    m = store.read_json(manifest_digest)
    cfg = store.read_json(m["config"]["digest"])
    history = [h for h in cfg.get("history", []) if not h.get("empty_layer")]
    layers = []
    for i, layer in enumerate(m["layers"]):
        created_by = history[i].get("created_by", "") if i < len(history) else ""
        layers.append({"digest": layer["digest"], "size": layer["size"], "media_type": layer["mediaType"],
                       "created_by": created_by})
    c = cfg.get("config", {})
    return {"manifest_digest": manifest_digest, "image_id": m["config"]["digest"], "created": cfg.get("created"),
            "user": c.get("User"), "workdir": c.get("WorkingDir"), "env": c.get("Env", []),
            "labels": c.get("Labels") or {}, "layers": layers, "cmd": c.get("Cmd")}
