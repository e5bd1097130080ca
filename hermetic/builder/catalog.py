"""The base catalog (images/catalog.yaml): GPU-ready bases by tag, pinned with ``hermetic base pin REF``.

A digest typed into the catalog would freeze a base nobody can update from here: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.core.errors import ConfigError, EXIT_SOFTWARE, HermeticError
from hermetic.core.reference import parse_image_name

KINDS = ("registry", "bootstrap")


def catalog_path() -> Path:
    """images/catalog.yaml of the checkout (beside the package, like the base recipes)."""
    from hermetic.core.resources import images_dir

    return images_dir() / "catalog.yaml"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    ref: str  # a tag reference: registry host/repo:tag, or a local-store name:tag for bootstraps
    kind: str  # "registry" | "bootstrap"
    provides: dict[str, str | None] = field(default_factory=dict)  # python, glibc, cuda
    gpu: bool = True
    notes: str = ""
    how: str = ""  # the command that makes it pinnable / pins it

    @property
    def python(self) -> str | None:
        return self.provides.get("python")

    @property
    def glibc(self) -> tuple[int, int] | None:
        g = self.provides.get("glibc")
        if not g:
            return None
        major, _, minor = str(g).partition(".")
        return int(major), int(minor)


def load_catalog(path: str | Path | None = None) -> list[CatalogEntry]:
    import yaml

    p = Path(path) if path is not None else catalog_path()
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HermeticError(f"{p}: base catalog not found; the installation is incomplete",
                            exit_code=EXIT_SOFTWARE) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise ConfigError(f"{p}: expected a mapping with an 'entries' list")
    out: list[CatalogEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["entries"]):
        entry = _entry(p, i, raw)
        if entry.name in seen:
            raise ConfigError(f"{p}: entries[{i}]: duplicate name {entry.name!r}")
        seen.add(entry.name)
        out.append(entry)
    return out


def _entry(p: Path, i: int, raw: Any) -> CatalogEntry:
    where = f"{p}: entries[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = set(raw) - {"name", "ref", "kind", "provides", "gpu", "notes", "how"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("name", "ref", "kind"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    name, ref, kind = raw["name"], raw["ref"], raw["kind"]
    where = f"{p}: entry {name!r}"
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    try:
        image = parse_image_name(ref)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if image.digest:
        raise ConfigError(f"{where}: ref {ref} carries a digest; the catalog lists tags, "
                            f"`hermetic base pin` resolves them")
    if not image.tag:
        raise ConfigError(f"{where}: ref {ref} has no tag")
    if kind == "registry" and not image.has_host:
        raise ConfigError(f"{where}: registry ref {ref} must name its registry host (e.g. docker.io/...)")
    provides = raw.get("provides") or {}
    if not isinstance(provides, dict) or set(provides) - {"python", "glibc", "cuda"}:
        raise ConfigError(f"{where}: 'provides' takes python, glibc and cuda")
    provides = {k: (None if v is None else str(v)) for k, v in provides.items()}
    glibc = provides.get("glibc")
    major, dot, minor = (glibc or "").partition(".")
    if glibc is not None and not (dot and major.isdigit() and minor.isdigit()):
        raise ConfigError(f"{where}: provides.glibc {glibc!r} is not MAJOR.MINOR")
    return CatalogEntry(
        name=name, ref=ref, kind=kind, provides=provides, gpu=bool(raw.get("gpu", True)),
        notes=" ".join(str(raw.get("notes") or "").split()), how=str(raw.get("how") or ""),
    )
