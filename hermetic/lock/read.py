"""Read any supported lock format into one normalized ``Lock``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from hermetic.core.errors import LockError, NotFound, ReadError
from hermetic.lock.model import Lock, Target

# A lock larger than this is refused unread: far above any real lock (tests/fixtures/locks), far below a
# file that would take minutes to parse.
LOCK_MAX_BYTES = 16 << 20


def lock_format(path: Path) -> str:
    name = path.name
    if name == "uv.lock":
        return "uv.lock"
    if name == "pylock.toml" or (name.startswith("pylock.") and name.endswith(".toml")):
        return "pylock.toml"
    return "requirements"


def _toml(path: Path, text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LockError(f"{path}: invalid TOML: {e}") from None


def read_lock(path: str | Path, target: Target) -> Lock:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(LOCK_MAX_BYTES + 1)  # never more than the bound, whatever the file is
    except FileNotFoundError:
        raise NotFound(f"{path}: lock file not found; create it with: hermetic lock") from None
    except OSError as e:
        raise ReadError(f"{path}: cannot read lock: {e}") from None
    if len(raw) > LOCK_MAX_BYTES:
        try:
            size = f"{path.stat().st_size} bytes"
        except OSError:
            size = f"over {LOCK_MAX_BYTES} bytes"
        raise LockError(f"{path}: {size}; a lock file may hold at most {LOCK_MAX_BYTES} bytes (16 MiB): not read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LockError(f"{path}: not UTF-8 text") from None
    fmt = lock_format(path)
    find_links: list[str] = []
    if fmt == "uv.lock":
        from hermetic.lock.uvlock import read_uv_lock

        wheels, indexes = read_uv_lock(path, _toml(path, text), target)
    elif fmt == "pylock.toml":
        from hermetic.lock.pylock import read_pylock

        wheels, indexes = read_pylock(path, _toml(path, text), target)
    else:
        from hermetic.lock.requirements import read_requirements_lock

        wheels, indexes, find_links = read_requirements_lock(path, text, target)
    if not wheels:
        raise LockError(f"{path}: the lock pins no packages for {target.platform} / Python {target.python_version}")
    return Lock(
        path=str(path), format=fmt, target=target,
        wheels=tuple(sorted(wheels, key=lambda w: w.name)),
        index_urls=tuple(indexes), find_links=tuple(find_links),
        sha256=hashlib.sha256(raw).hexdigest(),
    )
