"""Where hermetic keeps its content-addressed state.

One cache root (HERMETIC_CACHE, else $XDG_CACHE_HOME/hermetic, else ~/.cache/hermetic) holds the wheel store, the
OCI blob store, the layer and build caches, and a tmp/ on the same filesystem so that every admission into a store
is an atomic rename."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path


def norm_relpath(path: str) -> str:
    """A path as hermetic.yaml's paths are compared and hashed: '/'-separated, one spelling
    ('./data/' and 'data' are the same path), relative paths kept relative."""
    return posixpath.normpath(path.replace("\\", "/"))


_NOT_IN_A_SLUG = re.compile(r"[^a-z0-9._-]+")
NAME_MAX = 128  # characters of a project or dataset name (hermetic.yaml); a run name in an ID: 63


def name_pattern(max_len: int = NAME_MAX) -> str:
    """The regular expression (text, unanchored) of a name of at most ``max_len`` characters: what
    hermetic.yaml's names, the record's dataset files and run IDs are checked against; slug makes one."""
    return rf"[a-z0-9][a-z0-9._-]{{0,{max_len - 1}}}"


def slug(text: str, max_len: int) -> str:
    """``text`` as a name hermetic writes into IDs and hermetic.yaml: lowercase, ``[a-z0-9._-]``, runs of
    anything else as one ``-``, no leading or trailing ``-._``, at most ``max_len`` characters ('' if
    nothing is left). Run names in run IDs, project and dataset names that `hermetic init` writes."""
    s = _NOT_IN_A_SLUG.sub("-", text.strip().lower()).strip("-._")
    return s[:max_len].rstrip("-._")


CONFIG_FILENAME = "hermetic.yaml"  # here, not in hermetic.config.load: the runs listing and `init` need it without the schema


def find_upward(start: Path, name: str) -> Path | None:
    """``start/name``, else the same name in the nearest parent directory (as git finds .git); None if none."""
    start = start.resolve()
    for d in (start, *start.parents):
        if (d / name).is_file():
            return d / name
    return None


def cache_root() -> Path:
    env = os.environ.get("HERMETIC_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "hermetic").resolve()


@dataclass(frozen=True)
class CachePaths:
    """Where each part of hermetic's cache lies under its root (HERMETIC_CACHE)."""

    root: Path  # the rest: its parts, named as their directories
    wheels = property(lambda self: self.root / "wheels")
    oci = property(lambda self: self.root / "oci")
    layers = property(lambda self: self.root / "layers")
    builds = property(lambda self: self.root / "builds")
    tmp = property(lambda self: self.root / "tmp")
    statcache = property(lambda self: self.root / "statcache")

    def tmpdir(self) -> Path:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self.tmp


def cache_paths() -> CachePaths:
    return CachePaths(cache_root())


def inside(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or below it (both absolute and normalized): a host path or one in a container."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")
