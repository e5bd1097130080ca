"""Reader for uv.lock (a universal lock): the packages reachable from the workspace root(s) whose dependency
markers hold in the image's environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.utils import canonicalize_name

from hermetic.core.errors import LockError
from hermetic.lock.model import LockedWheel, Target


def read_uv_lock(path: Path, doc: dict[str, Any], target: Target) -> tuple[list[LockedWheel], list[str]]:
    packages: list[dict[str, Any]] = doc.get("package", [])
    if not packages:
        raise LockError(f"{path}: no [[package]] entries")
    env = target.marker_environment()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for p in packages:
        by_name.setdefault(canonicalize_name(p["name"]), []).append(p)

    def is_root(p: dict[str, Any]) -> bool:
        src = p.get("source", {})
        return "editable" in src or "virtual" in src

    roots = [p for p in packages if is_root(p)]
    if not roots:
        raise LockError(f"{path}: no workspace root package (source = editable/virtual) to start from")

    def pick(dep: dict[str, Any], where: str) -> dict[str, Any] | None:
        marker = dep.get("marker")
        if marker and not Marker(marker).evaluate(env):
            return None
        cands = by_name.get(canonicalize_name(dep["name"]), [])
        if "version" in dep:
            cands = [c for c in cands if c.get("version") == dep["version"]]
        if "source" in dep:
            cands = [c for c in cands if c.get("source") == dep["source"]]
        if len(cands) != 1:
            raise LockError(f"{path}: {where} depends on {dep['name']}, which the lock does not pin unambiguously")
        return cands[0]

    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    extras_wanted: dict[tuple[str, str], set[str]] = {}
    stack: list[tuple[dict[str, Any], set[str]]] = [(r, set()) for r in roots]
    while stack:
        pkg, extras = stack.pop()
        key = (canonicalize_name(pkg["name"]), pkg.get("version", ""))
        have = extras_wanted.get(key)
        if have is not None and extras <= have:
            continue
        extras_wanted[key] = (have or set()) | extras
        chosen[key] = pkg
        deps = list(pkg.get("dependencies", []))
        for extra in extras:
            deps += pkg.get("optional-dependencies", {}).get(extra, [])
        for dep in deps:
            p = pick(dep, pkg["name"])
            if p is not None:
                stack.append((p, set(dep.get("extra", []))))

    wheels: list[LockedWheel] = []
    indexes: list[str] = []
    for (name, version), pkg in sorted(chosen.items()):
        if is_root(pkg):
            continue
        where = f"{path}: package {name}=={version}"
        src = pkg.get("source", {})
        if "git" in src or "directory" in src or "path" in src and not str(src.get("path", "")).endswith(".whl"):
            raise LockError(f"{where}: source {src} needs a build, which is not hermetic; lock a wheel with a hash")
        files = pkg.get("wheels", [])
        if not files:
            raise LockError(f"{where}: no wheel in the lock (sdist only); sdists need a build, which is not hermetic")
        hashes = set()
        urls = []
        filenames = []
        for w in files:
            if "hash" not in w:
                raise LockError(f"{where}: wheel {w.get('url', w.get('filename', '?'))} has no hash")
            algo, _, hexpart = w["hash"].partition(":")
            if algo != "sha256" or len(hexpart) != 64:
                raise LockError(f"{where}: unsupported hash {w['hash']!r} (sha256 required)")
            hashes.add(hexpart.lower())
            if "url" in w:
                urls.append(w["url"])
                filenames.append(w["url"].rsplit("/", 1)[-1].split("#")[0])
            elif "filename" in w:
                filenames.append(w["filename"])
        index = src.get("registry")
        if index and index not in indexes and not index.startswith(("/", ".")):
            indexes.append(index)
        wheels.append(LockedWheel(name, version, frozenset(hashes), where, urls=tuple(urls),
                                  index=index, filenames=tuple(filenames)))
    return wheels, indexes
