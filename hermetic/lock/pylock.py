"""Reader for pylock.toml (PEP 751): packages whose marker holds for the image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.utils import canonicalize_name

from hermetic.core.errors import LockError
from hermetic.lock.model import LockedWheel, Target

def read_pylock(path: Path, doc: dict[str, Any], target: Target) -> tuple[list[LockedWheel], list[str]]:
    version = str(doc.get("lock-version", ""))
    if not version.startswith("1."):
        raise LockError(f"{path}: lock-version {version or '(missing)'} is not supported (PEP 751 1.x)")
    env = target.marker_environment()
    wheels: list[LockedWheel] = []
    indexes: list[str] = []
    seen: set[str] = set()
    for i, pkg in enumerate(doc.get("packages", [])):
        name = canonicalize_name(pkg.get("name", ""))
        where = f"{path}: packages[{i}] {name}"
        if not name:
            raise LockError(f"{path}: packages[{i}] has no name")
        marker = pkg.get("marker")
        if marker and not Marker(marker).evaluate(env):
            continue
        if "vcs" in pkg or "directory" in pkg:
            raise LockError(f"{where}: VCS/directory sources need a build, which is not hermetic")
        if "version" not in pkg:
            raise LockError(f"{where}: not pinned to a version")
        files = list(pkg.get("wheels", []))
        if "archive" in pkg and str(pkg["archive"].get("url", pkg["archive"].get("path", ""))).endswith(".whl"):
            files.append(pkg["archive"])
        if not files:
            raise LockError(f"{where}=={pkg['version']}: no wheel in the lock (sdist only); sdists need a build, which is not hermetic")
        hashes, urls, filenames = set(), [], []
        for w in files:
            h = (w.get("hashes") or {}).get("sha256")
            if not h:
                raise LockError(f"{where}: wheel {w.get('name', w.get('url', '?'))} has no sha256 hash")
            hashes.add(h.lower())
            if w.get("url"):
                urls.append(w["url"])
            fname = w.get("name") or (w.get("url") or w.get("path") or "").rsplit("/", 1)[-1]
            if fname:
                filenames.append(fname)
        if name in seen:
            raise LockError(f"{where}: {name} appears twice for this platform")
        seen.add(name)
        index = pkg.get("index")
        if index and index not in indexes:
            indexes.append(index)
        wheels.append(LockedWheel(name, str(pkg["version"]), frozenset(hashes), where, urls=tuple(urls),
                                  index=index, filenames=tuple(filenames)))
    return wheels, indexes
