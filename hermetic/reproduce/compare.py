"""Why a rebuilt image differs from the one it should reproduce: per layer, per file, per config key.

Layers by position; a differing layer's tar entries compared (path, type, mode, owner, size, mtime, link,
content sha256); the config key by key.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_FILE_NOTES = 8


@dataclass
class LayerDiff:
    index: int
    contents: str
    wheels: tuple[str, ...]
    image_digest: str | None
    rebuilt_digest: str | None
    files: list[str] = field(default_factory=list)  # what differs inside, first MAX_FILE_NOTES
    files_differing: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "contents": self.contents, "wheels": list(self.wheels),
                "image_digest": self.image_digest, "rebuilt_digest": self.rebuilt_digest,
                "files": self.files, "files_differing": self.files_differing}

    def headline(self) -> str:
        wheels = f" from {', '.join(self.wheels)}" if self.wheels else ""
        return (f"layer {self.index} ({self.contents}{wheels}) differs: the image has {self.image_digest}, "
                f"the rebuild made {self.rebuilt_digest}")


def _entries(path: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    with tarfile.open(path, "r:*") as tf:
        for m in tf:
            content = None
            if m.isreg():
                f = tf.extractfile(m)
                h = hashlib.sha256()
                if f is not None:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                content = h.hexdigest()
            out[m.name] = (m.type, m.mode, m.uid, m.gid, m.size, m.mtime, m.linkname, content)
    return out


_FIELDS = ("type", "mode", "uid", "gid", "size", "mtime", "link target", "content sha256")
_SAY = {"mode": "mode {x:o} vs {y:o}",  # how a field's difference reads; "{label} {x!r} vs {y!r}" for the others
        "content sha256": "content differs (sha256 {x!s:.12}… in the image, {y!s:.12}… rebuilt)"}


def tar_differences(image_layer: Path, rebuilt_layer: Path) -> list[str]:
    """One line per entry that differs between two layer tars (sorted by path)."""
    a, b = _entries(image_layer), _entries(rebuilt_layer)
    lines = []
    for name in sorted(a.keys() | b.keys()):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            lines.append(f"{name}: only in the {'rebuild' if x is None else 'image'}")
        elif x != y:
            lines.append(f"{name}: " + ", ".join(_SAY.get(label, "{label} {x!r} vs {y!r}").format(label=label, x=p, y=q)
                                                 for label, p, q in zip(_FIELDS, x, y) if p != q))
    return lines


def config_differences(image: dict[str, Any], rebuilt: dict[str, Any]) -> list[str]:
    """Config keys that differ (labels and env one by one; diff_ids are the layers' business)."""
    ci, cr = image.get("config") or {}, rebuilt.get("config") or {}
    env = [dict(e.partition("=")[::2] for e in c.get("Env") or []) for c in (ci, cr)]
    rest = [{k: v for k, v in c.items() if k not in ("Labels", "Env")} for c in (ci, cr)]
    keyed = (("label ", ci.get("Labels") or {}, cr.get("Labels") or {}), ("env ", *env), ("config.", *rest))
    lines = [f"{what}{k}: {x.get(k)!r} in the image, {y.get(k)!r} rebuilt"
             for what, x, y in keyed for k in sorted(x.keys() | y.keys()) if x.get(k) != y.get(k)]
    return lines + [f"{k} differs" for k in sorted((image.keys() | rebuilt.keys()) - {"config", "rootfs"})
                    if image.get(k) != rebuilt.get(k)]


def layer_differences(image_manifest: dict[str, Any], rebuilt_manifest: dict[str, Any],
                      contents: list[str], wheels: list[tuple[str, ...]]) -> list[LayerDiff]:
    li, lr = image_manifest.get("layers") or [], rebuilt_manifest.get("layers") or []
    out = []
    for i in range(max(len(li), len(lr))):
        a = li[i]["digest"] if i < len(li) else None
        b = lr[i]["digest"] if i < len(lr) else None
        if a != b:
            out.append(LayerDiff(i, contents[i] if i < len(contents) else "?",
                                 wheels[i] if i < len(wheels) else (), a, b))
    return out
