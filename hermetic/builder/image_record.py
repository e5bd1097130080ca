"""What an image is, read back from the image itself (``ImageInfo.from_store``: built, no-op or pulled alike),
and hermetic.image.json beside hermetic.yaml, rewritten only when its content changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic import __version__
from hermetic.builder.image import BASE_LAYERS_LABEL, PACKAGES_LABEL
from hermetic.builder.inspect import describe
from hermetic.core.canonical import parse_digest, pretty_json
from hermetic.core.errors import DataError, NotFound
from hermetic.hostfs.fsutil import write_if_changed
from hermetic.store.oci import OciStore

BUILD_RECORD = "hermetic.image.json"


@dataclass(frozen=True)
class ImageInfo:
    """A built image as the store and hermetic.image.json know it: its IDs, layers and labels."""

    image_id: str  # sha256 of the config: what `docker image inspect` shows as Id
    manifest_digest: str
    build_key: str  # "" when unknown (an image found by digest, e.g. for a replay)
    layers: list[dict[str, Any]]  # digest, size, media_type, contents
    labels: dict[str, str]  # the image's labels, without the (long) package list
    base: dict[str, Any]  # reference, manifest_digest, os, glibc
    lock: dict[str, Any]  # sha256
    packages: list[dict[str, str]]  # name, version, filename, sha256
    config_sha256: str | None
    env: list[str]  # the image config's Env, NAME=VALUE, sorted

    @classmethod
    def from_store(cls, store: OciStore, manifest_digest: str, build_key: str = "") -> "ImageInfo":
        d = describe(store, manifest_digest)
        labels = d["labels"]
        packages = json.loads(labels.get(PACKAGES_LABEL, "[]"))
        base_layers = int(labels.get(BASE_LAYERS_LABEL, "0"))
        layers = []
        for i, layer in enumerate(d["layers"]):
            contents = layer["created_by"].removeprefix("hermetic: ") if i >= base_layers else f"base layer {i}"
            layers.append({"digest": layer["digest"], "size": layer["size"], "media_type": layer["media_type"],
                           "contents": contents})
        return cls(
            image_id=d["image_id"], manifest_digest=manifest_digest, build_key=build_key, layers=layers,
            labels={k: v for k, v in labels.items() if k != PACKAGES_LABEL},
            base={"reference": labels.get("org.hermetic.base"),
                  "manifest_digest": labels.get("org.hermetic.base.digest"),
                  "os": labels.get("org.hermetic.base.os"), "glibc": labels.get("org.hermetic.base.glibc")},
            lock={"sha256": labels.get("org.hermetic.lock.sha256")},
            packages=[{"name": n, "version": v, "filename": f, "sha256": h} for n, v, f, h in packages],
            config_sha256=labels.get("org.hermetic.config.sha256"),
            env=list(d["env"]),
        )

    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)


def write_image_record(config_dir: Path, lock_path_as_written: str, info: ImageInfo) -> Path:
    """hermetic.image.json beside hermetic.yaml: every input with its digest, for `git diff`.

    Written only when its content changes (an unchanged tracked file must not
    make the checkout dirty).
    """
    path = config_dir / BUILD_RECORD
    record = {
        "hermetic_version": __version__,
        "image_id": info.image_id, "manifest_digest": info.manifest_digest, "build_key": info.build_key,
        "base": info.base, "lock": {"path": lock_path_as_written, **info.lock}, "config_sha256": info.config_sha256,
        "packages": info.packages, "labels": info.labels, "env": info.env, "layers": info.layers,
    }
    write_if_changed(path, pretty_json(record).encode("utf-8"))
    return path


def recorded_manifest_digest(config_dir: Path, *, otherwise: str = "") -> str:
    """The manifest digest hermetic.image.json in ``config_dir`` names.

    ``otherwise`` completes the error's advice (e.g. "or pass --image sha256:…").
    """
    record = config_dir / BUILD_RECORD
    tail = f", {otherwise}" if otherwise else ""
    try:
        digest = json.loads(record.read_text(encoding="utf-8"))["manifest_digest"]
        parse_digest(digest)
    except FileNotFoundError:
        raise NotFound(f"{record}: no build record; run `hermetic build` first{tail}") from None
    except (ValueError, KeyError, TypeError, OSError):
        raise DataError(f"{record}: unreadable build record (want a JSON object with manifest_digest)") from None
    return digest
