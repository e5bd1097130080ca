"""Who is using the OCI store now, so ``hermetic cache gc`` never deletes what they need; both marks are flocks
(gone when the holder dies). Writers (build, pull, base import) hold ``.gc.lock`` shared while they write, gc
takes it exclusively. A run claims its image (``in-use/<hex>.<random>``, held until exit, made under the shared
lock; no data block needed, so a full disk allows it); gc keeps all a live claim reaches.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from hermetic.core.canonical import is_sha256_hex, parse_digest
from hermetic.hostfs.filelocks import exclusive_file_lock, is_locked, lock_holders, shared_file_lock
from hermetic.hostfs.fsutil import OwnedTemp, sweep_dead

if TYPE_CHECKING:
    from hermetic.store.oci import OciStore

GC_LOCK = ".gc.lock"
CLAIMS_DIR = "in-use"

# (store root, manifest hex) -> this process's claim; reset in a forked child (its copies hold no lock).
_claims: dict[tuple[str, str], OwnedTemp] = {}
_claims_pid = os.getpid()


def _mine() -> dict[tuple[str, str], OwnedTemp]:
    global _claims_pid
    if _claims_pid != os.getpid():  # a forked child: the parent's claims are the parent's
        _claims.clear()
        _claims_pid = os.getpid()
    return _claims


def gc_lock_path(store: "OciStore") -> Path:
    return store.root / GC_LOCK


@contextlib.contextmanager
def writing(store: "OciStore") -> Iterator[None]:
    """Hold the store's gc lock shared for the block: gc waits until it ends (module doc)."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(shared_file_lock(gc_lock_path(store)))
        except OSError:
            pass  # a store we cannot write a lock into is one no gc can change either
        yield


@contextlib.contextmanager
def collecting(store: "OciStore", on_wait: Callable[[list[int]], None] | None = None) -> Iterator[None]:
    """Hold the store's gc lock exclusively (gc, verify --repair): waits for every writer;
    ``on_wait(pids)`` first when one is running (the pids that hold the lock, where known)."""
    path = gc_lock_path(store)
    waiting = (lambda: on_wait(lock_holders(path))) if on_wait is not None else None
    with exclusive_file_lock(path, waiting):
        yield


def claim_image(store: "OciStore", manifest_digest: str) -> None:
    """Keep the image ``manifest_digest`` from gc while this process lives (module doc)."""
    hexdigest = parse_digest(manifest_digest)
    claims = _mine()
    key = (str(store.root), hexdigest)
    if key in claims:
        return
    claims_dir = store.root / CLAIMS_DIR
    try:
        with shared_file_lock(gc_lock_path(store)):
            _sweep_dead_claims(claims_dir)
            claims[key] = OwnedTemp(claims_dir, f"{hexdigest}.", mode=0o644)
    except OSError:
        return  # a read-only store (or no inode left): used without a claim, as the module doc says


def release_claims() -> None:
    """Remove this process's claims (at exit; a killed process's claims are dead and swept)."""
    for claim in _mine().values():
        claim.discard()
    _claims.clear()


atexit.register(release_claims)


def claimed_images(store: "OciStore", *, sweep: bool = True) -> set[str]:
    """The manifest digests that live processes claim (call with ``collecting`` held); dead
    claims are removed (unless ``sweep=False``: a dry run)."""
    claims_dir = store.root / CLAIMS_DIR
    if sweep:
        _sweep_dead_claims(claims_dir)
    out: set[str] = set()
    try:
        names = os.listdir(claims_dir)
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        hexdigest = name.split(".", 1)[0]
        if is_sha256_hex(hexdigest) and is_locked(claims_dir / name):
            out.add("sha256:" + hexdigest)
    return out


def _sweep_dead_claims(claims_dir: Path) -> None:
    sweep_dead(claims_dir)  # a claim's flock is gone with its holder
