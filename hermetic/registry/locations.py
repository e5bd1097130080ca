"""Where images and blobs live in registries, two records in the store dir (one flock, atomic rewrites):
``pushed.json`` (manifest digest -> repo digests, for run records) and ``blob-locations.json`` (blob digest ->
``host/repo``, for cross-repository mounts). A lost or corrupt record costs a mount or a repo digest, never
correctness: an unreadable file reads as empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from hermetic.hostfs.filelocks import file_lock
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.store.oci import OciStore

PUSHED_FILE = "pushed.json"
BLOB_LOCATIONS_FILE = "blob-locations.json"
_LOCK_FILE = ".registry-records.lock"
# Enough mount sources to find one that works; more only grows the file.
MAX_LOCATIONS_PER_BLOB = 8


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", fsync=False)


def repo_digests(store: OciStore, manifest_digest: str) -> list[str]:
    """Repo digests (``host/repo@sha256:…``) the image is known to be pullable by, sorted."""
    entries = _read(store.root / PUSHED_FILE).get(manifest_digest, [])
    return sorted(str(e) for e in entries) if isinstance(entries, list) else []


def record_image_location(store: OciStore, manifest_digest: str, repo_digest: str) -> None:
    store.ensure()
    path = store.root / PUSHED_FILE
    with file_lock(store.root / _LOCK_FILE):
        data = _read(path)
        known = set(data.get(manifest_digest) or [])
        if repo_digest in known:
            return
        data[manifest_digest] = sorted(known | {repo_digest})
        _write(path, data)


def blob_locations(store: OciStore, host: str, digest: str) -> list[str]:
    """Repositories on ``host`` known to hold blob ``digest`` (most recent first)."""
    entries = _read(store.root / BLOB_LOCATIONS_FILE).get(digest) or []
    prefix = host + "/"
    return [e[len(prefix):] for e in entries if isinstance(e, str) and e.startswith(prefix)]


def record_blob_locations(store: OciStore, host: str, repository: str, digests: Iterable[str]) -> None:
    store.ensure()
    where = f"{host}/{repository}"
    path = store.root / BLOB_LOCATIONS_FILE
    with file_lock(store.root / _LOCK_FILE):
        data = _read(path)
        changed = False
        for digest in digests:
            entries = [e for e in (data.get(digest) or []) if e != where]
            new = ([where] + entries)[:MAX_LOCATIONS_PER_BLOB]
            if new != data.get(digest):
                data[digest] = new
                changed = True
        if changed:
            _write(path, data)
