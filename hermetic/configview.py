"""hermetic.yaml as loaded, without its schema: ``LoadedConfig``, finding and reading the file, and the
validated config a run reads back from where its last run of the same bytes kept it.

hermetic.config validates hermetic.yaml with pydantic (its import, PyYAML's and the schema's: ~0.13 s
of every command that loads the config, a third of `hermetic run`'s overhead target over `docker run`).
A config's validation is a pure function of its bytes and of the code that validates them, so
`hermetic run` keeps what it gave (the resolved document, and where its sections and datasets are, with
their computed properties) under a key over hermetic's version, the validating code's own bytes
(hermetic/config.py and this file: a changed schema is a miss), the file's path and its bytes
(``keep_config``), and reads it back on the next run of the same bytes (``cached_config``: a
``ConfigView``, read-only attributes as the schema's models give them) instead of validating again: the
trust the quick no-op build (hermetic.builder.quick) puts in its note of the same bytes, kept in the
same cache. A full build validates the bytes again first (hermetic.config.confirm_config).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic import __version__
from hermetic.canonical import canonical_json, sha256_hex
from hermetic.errors import ConfigError
from hermetic.paths import CONFIG_FILENAME, CONFIG_MAX_BYTES, find_upward

CACHE_DIR = "configs"  # in the cache root: one validated config per (hermetic version, path, bytes)
CACHE_FORMAT = 1
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus where it came from. ``model``: hermetic.config's HermeticConfig, or the
    ConfigView of one read back (a run's, until hermetic.config.confirm_config has validated it)."""

    model: Any
    path: Path  # the hermetic.yaml file, absolute
    source: bytes | None = field(default=None, repr=False, compare=False)  # the bytes it was read from

    @property
    def root(self) -> Path:
        return self.path.parent

    def resolve(self, rel: str) -> Path:
        """A path from the config, made absolute against the config's directory."""
        return (self.root / rel).resolve() if not rel.startswith("/") else Path(rel)

    @property
    def lock_path(self) -> Path:
        return self.resolve(self.model.lock)

    @property
    def runs_path(self) -> Path:
        return self.resolve(self.model.runs_dir)

    def resolved(self) -> dict[str, Any]:
        return self.model.model_dump(mode="json")

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.resolved())

    @property
    def sha256(self) -> str:
        return sha256_hex(self.canonical_bytes())


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.match(name))


def size_bytes(size: str) -> int:
    """A validated size ("512m", "4g") in bytes, as Docker reads it (k, m, g are powers of 1024)."""
    unit = size[-1] if size[-1] in "bkmg" else "b"
    number = int(size[:-1] if size[-1] in "bkmg" else size)
    return number * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def in_project(path: str) -> bool:
    """Whether a dataset's ``path`` (as validated: relative paths normalized) lies inside the project."""
    return not (path.startswith("/") or path == ".." or path.startswith("../"))


def find_config(path: str | Path | None) -> Path:
    """``-C`` may name the file or its directory; without it, ./hermetic.yaml or the nearest one in a
    parent directory (so that commands work from anywhere in the project, as git's do)."""
    if not path:
        found = find_upward(Path.cwd(), CONFIG_FILENAME)
        if found is None:
            raise ConfigError(f"{Path.cwd() / CONFIG_FILENAME}: no such config file, here or in a parent "
                              "directory (make one: hermetic init; or pass -C PATH)")
        return found
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILENAME
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file (make one: hermetic init; or pass -C PATH)")
    return p.resolve()


def read_config_bytes(cfg_path: Path) -> bytes:
    """The file's bytes, read only up to CONFIG_MAX_BYTES (1 MiB): hermetic.yaml is a page of settings (the
    examples' are under 1 kB), and parsing a 100 MB file would take minutes, so a larger one is refused unread."""
    try:
        with open(cfg_path, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)  # never more than the bound, whatever the file is
    except OSError as e:
        raise ConfigError(f"{cfg_path}: cannot read: {e}") from None
    if len(raw) > CONFIG_MAX_BYTES:
        raise too_big(cfg_path)
    return raw


def too_big(cfg_path: Path, size: int | None = None) -> ConfigError:
    if size is None:
        try:
            size = cfg_path.stat().st_size
        except OSError:
            size = CONFIG_MAX_BYTES + 1
    return ConfigError(f"{cfg_path}: {size} bytes; a hermetic.yaml may hold at most {CONFIG_MAX_BYTES} bytes "
                       "(1 MiB): not read")


class ConfigView:
    """A validated config read back: the resolved document's values as attributes, a section (or a dataset)
    as a ConfigView of its own where the schema has a model, with the model's computed properties
    (``in_project``); ``model_dump`` gives the resolved document, as the model's does. Read-only."""

    __slots__ = ("_doc", "_where", "_shape")

    def __init__(self, doc: dict[str, Any], where: str, shape: dict[str, dict[str, Any]]) -> None:
        self._doc, self._where, self._shape = doc, where, shape

    def __getattr__(self, name: str) -> Any:
        props = self._shape.get(self._where, {})
        if name in props:
            return props[name]
        try:
            value = self._doc[name]
        except KeyError:
            raise AttributeError(f"the config has no {self._where + '.' if self._where else ''}{name}") from None
        at = f"{self._where}.{name}" if self._where else name
        if at in self._shape and isinstance(value, dict):
            return ConfigView(value, at, self._shape)
        if isinstance(value, list) and f"{at}[0]" in self._shape:
            return [ConfigView(v, f"{at}[{i}]", self._shape) for i, v in enumerate(value)]
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ConfigView.__slots__:
            object.__setattr__(self, name, value)
            return
        raise AttributeError("a config is read-only")

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return copy.deepcopy(self._doc)


def _schema_sha256() -> str:
    """The validating code's bytes (hermetic.config, and this module's reading of what it kept)."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("config.py", "configview.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def _cache_file(cache_root: Path, cfg_path: Path, data: bytes) -> Path:
    key = hashlib.sha256(canonical_json({"hermetic": __version__, "format": CACHE_FORMAT, "schema": _schema_sha256(),
                                         "path": str(cfg_path),
                                         "sha256": hashlib.sha256(data).hexdigest()})).hexdigest()
    return cache_root / CACHE_DIR / f"{key}.json"


def cached_config(config_path: str | Path | None, cache_root: Path) -> LoadedConfig | None:
    """The config at ``config_path`` as its last validation by this hermetic left it (a ConfigView), or
    None when there is none for these bytes (or anything about it is off: the full load says what)."""
    try:
        cfg_path = find_config(config_path)
        data = read_config_bytes(cfg_path)
        kept = json.loads(_cache_file(cache_root, cfg_path, data).read_bytes())
    except (ConfigError, OSError, ValueError):
        return None
    if not (isinstance(kept, dict) and isinstance(kept.get("config"), dict) and isinstance(kept.get("shape"), dict)):
        return None
    return LoadedConfig(model=ConfigView(kept["config"], "", kept["shape"]), path=cfg_path, source=data)


def keep_config(cfg: LoadedConfig, shape: dict[str, dict[str, Any]], cache_root: Path) -> None:
    """Keep a config just validated (``shape``: hermetic.config.model_shape of its model) for the next run
    of the same bytes; best effort (a read-only cache only means the next run validates first)."""
    if cfg.source is None:
        return
    from hermetic.fsutil import atomic_write_bytes

    path = _cache_file(cache_root, cfg.path, cfg.source)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"config": cfg.resolved(), "shape": shape}, sort_keys=True).encode(),
                           fsync=False)
    except OSError:
        pass
