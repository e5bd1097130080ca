"""What ``hermetic build`` reports: one shape for a real build and a no-op."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.builder.image_record import ImageInfo

if TYPE_CHECKING:
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


def layer_rows(info: ImageInfo, built: "list[BuiltLayer] | None" = None) -> list[dict[str, Any]]:
    """The image's layers, each with whether this build made it or reused it, and its packages."""
    built = built or []
    first_built = len(info.layers) - len(built)
    rows = []
    for i, layer in enumerate(info.layers):
        b = built[i - first_built] if built and i >= first_built else None
        rows.append({**layer, "cached": b.cached if b else True, "seconds": round(b.seconds, 3) if b else 0.0,
                     "packages": [f"{w.locked.name}=={w.locked.version}" for w in b.spec.wheels] if b else []})
    return rows
