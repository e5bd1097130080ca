"""The quick no-op: "up to date" from the inputs' bytes, without validating hermetic.yaml again.

A no-op ``hermetic build`` spent most of its time importing what it needs to
*compute* the build key (pydantic for the config schema alone is ~0.1 s, more
than all the checks a no-op makes). But the build key is a pure function of
hermetic.yaml's bytes, the lock's bytes, the runtime shipped into the image,
the layer format and hermetic's version. So every successful build notes, under
a key over the config file's path and bytes (and the version and layer
format), the lock file and its sha256, the runtime's sha256, and the build key
it computed from them. A later build whose config bytes, lock bytes and runtime
are the same has the same key; it then makes exactly the no-op's checks --
the image is in the store, every blob intact (store/intact.py, stat-based), its
provenance is the stored one, the engine holds the image -- and answers as a
no-op does. Anything else (a changed input, no note, a corrupt blob, an image
the engine lacks) goes the full way, whose messages and repairs are the
reference.

The note is written only after the config file has been read again and found
to give the same image (so an edit during a build cannot be noted under the
old key).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import __version__
from hermetic.builder.inputs import COMPILER_FORMAT, LAYER_FORMAT, engine_tag, runtime_sha256
from hermetic.canonical import canonical_json, canonical_sha256
from hermetic.fsutil import write_if_changed
from hermetic.paths import CachePaths

if TYPE_CHECKING:
    from hermetic.builder.result import BuildResult
    from hermetic.config import LoadedConfig
    from hermetic.lock.model import Lock



def _config_file(config_path: str | None) -> Path | None:
    """hermetic.configview.find_config's answer, or None where it would refuse (the full path says why)."""
    from hermetic.configview import find_config
    from hermetic.errors import ConfigError

    try:
        return find_config(config_path)
    except ConfigError:
        return None


def _note_path(paths: CachePaths, config_file: Path, config_bytes: bytes) -> Path:
    key = canonical_sha256({"hermetic": __version__, "layer_format": LAYER_FORMAT, "compiler_format": COMPILER_FORMAT,
                            "config_file": str(config_file),
                            "config_sha256": hashlib.sha256(config_bytes).hexdigest()})
    return paths.builds / "inputs" / f"{key}.json"


def remember_inputs(cfg: "LoadedConfig", lock: "Lock", paths: CachePaths, build_key: str, manifest_digest: str) -> None:
    """After a successful build: note which inputs' bytes gave ``build_key`` (see the module doc)."""
    from hermetic.builder.key import image_config_part
    from hermetic.config import parse_config
    from hermetic.errors import ConfigError

    try:
        data = cfg.path.read_bytes()
        again = parse_config(data.decode("utf-8"), cfg.path)
        lock_bytes = cfg.lock_path.read_bytes()
    except (OSError, UnicodeDecodeError, ConfigError):
        return
    if (image_config_part(again) != image_config_part(cfg) or again.lock_path != cfg.lock_path
            or hashlib.sha256(lock_bytes).hexdigest() != lock.sha256):
        return  # an input changed while we built: no note
    from hermetic.lock.torchbuild import companion_warnings

    note = {"name": cfg.model.name, "lock_file": str(cfg.lock_path), "lock_sha256": lock.sha256,
            "lock_as_written": cfg.model.lock,
            "runtime_sha256": runtime_sha256(), "build_key": build_key, "manifest_digest": manifest_digest,
            "warnings": companion_warnings(lock)}  # the lock's, said again by every no-op
    path = _note_path(paths, cfg.path, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, canonical_json(note))  # canonical bytes: equal bytes are an equal note


def quick_noop(config_path: str | None, paths: CachePaths, *, load: bool, config_bytes: bytes | None = None,
               claim: bool = False) -> "BuildResult | None":
    """The no-op build's result when the inputs are the noted ones and every check passes, else None.

    ``config_bytes``: what the caller read hermetic.yaml as (a run, which goes on with that config), instead
    of reading it again; ``claim``: keep the image from ``cache gc`` while this process lives (a run uses
    it after this), claimed before it is checked."""
    t0 = time.monotonic()
    config_file = _config_file(config_path)
    if config_file is None:
        return None
    try:
        data = config_file.read_bytes() if config_bytes is None else config_bytes
        note: dict[str, Any] = json.loads(_note_path(paths, config_file, data).read_bytes())
        lock_bytes = Path(note["lock_file"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if hashlib.sha256(lock_bytes).hexdigest() != note.get("lock_sha256") or runtime_sha256() != note.get("runtime_sha256"):
        return None
    from hermetic.store.oci import OciStore

    store = OciStore(paths.oci)
    key, digest = note["build_key"], note["manifest_digest"]
    if claim:
        from hermetic.store.inuse import claim_image

        try:
            claim_image(store, digest)
        except ValueError:  # not a digest: a note that is not ours
            return None
    try:
        built = json.loads((paths.builds / f"{key}.json").read_bytes())["manifest_digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if built != digest or not store.has_image(digest):
        return None
    from hermetic.builder.image_record import ImageInfo, write_image_record
    from hermetic.store.images import check_image

    check_image(store, digest)  # a corrupt blob is refused here exactly as on the full path
    info = ImageInfo.from_store(store, digest, key)
    if not _provenance_in_place(store, digest, config_file.parent):
        return None
    name = note.get("name")
    latest = store.resolve(f"{name}:latest") if name else None
    if latest is None or latest.digest != digest:
        return None  # NAME:latest names another image now: the full path points it back
    if load:
        from hermetic.engine import engine_tag_is

        if engine_tag_is(info.image_id, engine_tag(name)) is not True:  # True: the engine holds it, so tagged
            return None  # the full path loads or tags it
    record = write_image_record(config_file.parent, note["lock_as_written"], info)
    from hermetic.builder.result import BuildResult, layer_rows

    warnings = [str(w) for w in note.get("warnings") or []]  # notes written before these were kept: none
    return BuildResult(info, layer_rows(info), True, False, time.monotonic() - t0, record, warnings)


def _provenance_in_place(store, manifest_digest: str, config_dir: Path) -> bool:
    """The image's stored provenance (digest-checked) is what hermetic.provenance.json beside the config holds."""
    from hermetic.provenance import MT_STATEMENT, PROVENANCE_FILE
    from hermetic.store.referrers import list_referrers, read_artifact

    try:
        on_disk = (config_dir / PROVENANCE_FILE).read_bytes()
    except OSError:
        return False
    for d in list_referrers(store, manifest_digest, MT_STATEMENT):
        try:
            if read_artifact(store, d, manifest_digest).blob == on_disk:
                return True
        except Exception:  # any doubt: the full path decides
            return False
    return False
