"""Where images and blobs live in registries, two records in the store dir (one flock, atomic rewrites):
``pushed.json`` (manifest digest -> repo digests, for run records) and ``blob-locations.json`` (blob digest ->
``host/repo``, for cross-repository mounts). A lost or corrupt record costs a mount or a repo digest, never
correctness: an unreadable file reads as empty."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

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


@contextlib.contextmanager
def _updated(store: OciStore, name: str) -> Iterator[dict[str, Any]]:
    """The record ``name`` under the records' lock, for the block to change; rewritten when it did."""
    store.ensure()
    path = store.root / name
    with file_lock(store.root / _LOCK_FILE):
        data = _read(path)
        before = copy.deepcopy(data)
        yield data
        if data != before:
            atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", fsync=False)


def repo_digests(store: OciStore, manifest_digest: str) -> list[str]:
    """Repo digests (``host/repo@sha256:…``) the image is known to be pullable by, sorted."""
    entries = _read(store.root / PUSHED_FILE).get(manifest_digest, [])
    return sorted(str(e) for e in entries) if isinstance(entries, list) else []


def record_image_location(store: OciStore, manifest_digest: str, repo_digest: str) -> None:
    with _updated(store, PUSHED_FILE) as data:
        data[manifest_digest] = sorted(set(data.get(manifest_digest) or []) | {repo_digest})


def blob_locations(store: OciStore, host: str, digest: str) -> list[str]:
    """Repositories on ``host`` known to hold blob ``digest`` (most recent first)."""
    entries = _read(store.root / BLOB_LOCATIONS_FILE).get(digest) or []
    prefix = host + "/"
    return [e[len(prefix):] for e in entries if isinstance(e, str) and e.startswith(prefix)]


def record_blob_locations(store: OciStore, host: str, repository: str, digests: Iterable[str]) -> None:
    where = f"{host}/{repository}"
    with _updated(store, BLOB_LOCATIONS_FILE) as data:
        for digest in digests:
            data[digest] = ([where] + [e for e in (data.get(digest) or []) if e != where])[:MAX_LOCATIONS_PER_BLOB]
