"""An image as one SquashFS file, for clusters: made from the store's verified layers, byte-reproducible.

The layers are flattened in one pass, top layer first (an entry hidden by an upper layer's entry, a
whiteout or an opaque directory is skipped), into hermetic's own writer (squashfs_writer: uncompressed,
its bytes fixed by the entries alone); nothing is unpacked on the host. The sidecar ``<file>.json`` binds
the file's sha256 to the manifest digest and the writer's format. Ownership, modes (setuid included) and
times are the layers'; device nodes under dev/ are skipped (a runtime makes /dev), elsewhere refused.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from hermetic.core.errors import DataError, HermeticError, IntegrityError, NotFound, UsageError
from hermetic.hostfs.fsutil import sha256_file
from hermetic.store.intact import REPAIR, blob_intact
from hermetic.engines.squashfs_writer import FORMAT, Unpackable, write_image
from hermetic.engines.unpack import GZIP_TYPES, OPAQUE_MARKER, WHITEOUT_PREFIX, LayerRefused, _normal_name

SIDECAR_FORMAT = 1
FORM_VARIABLE = "HERMETIC_IMAGE_FORM"  # Charliecloud's image: auto (the default), squashfs or directory
FORMS = ("auto", "squashfs", "directory")
# A Slurm task's: the file in the shared store and its sha256 as submitted (checked in full before the mount).
FILE_VARIABLE, EXPECT_VARIABLE = "HERMETIC_SQUASHFS_FILE", "HERMETIC_SQUASHFS_SHA256"


class SquashfsRefused(DataError):
    """A .sqfs file that is not what its sidecar or its name says (exit 65)."""


@dataclass(frozen=True)
class SquashImage:
    path: Path
    manifest_digest: str
    sha256: str
    size: int
    tool: str
    made: bool  # False: an intact file was already there

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "manifest_digest": self.manifest_digest, "sha256": self.sha256,
                "size": self.size, "tool": self.tool, "made": self.made}


def wanted_form() -> str:
    """HERMETIC_IMAGE_FORM, checked: auto, squashfs or directory."""
    form = os.environ.get(FORM_VARIABLE, "").strip() or "auto"
    if form not in FORMS:
        raise UsageError(f"{FORM_VARIABLE}={form!r}: one of {', '.join(FORMS)}")
    return form


MOUNTER = "squashfuse_ll"  # squashfuse's low-level (multithreaded) mounter, as ch-run's own (docs/benchmarks.md)


def fuse_reason() -> str | None:
    """Why squashfuse cannot mount a file here (None: it can): no squashfuse_ll, or no access to /dev/fuse."""
    if shutil.which(MOUNTER) is None:
        return f"{MOUNTER} is not installed (Debian: apt-get install squashfuse)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "this account cannot open /dev/fuse (FUSE is not allowed here)"
    return None


def kernel_mountable(path: Path) -> bool:
    """True where root may mount ``path`` with the kernel's squashfs (a loop device) instead of squashfuse.

    The kernel reads the file unaided (no FUSE round trip per read: torch's start from the file then costs about
    what it costs from directories, docs/benchmarks.md), so it must read bytes no user can change after their check:
    hermetic runs as root, the file and every directory above it are root's and writable by root alone (a
    sticky directory's entries are their owners'), no link on the way; and the kernel has squashfs and loop
    devices. Otherwise squashfuse mounts it, as for a user."""
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        return False
    try:
        if "squashfs" not in Path("/proc/filesystems").read_text().split():
            return False
        path = Path(os.path.abspath(path))
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return False
        for d in path.parents:
            st = os.lstat(d)
            if (not stat.S_ISDIR(st.st_mode) or st.st_uid != 0
                    or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)):
                return False
    except OSError:
        return False
    return True


def store_path(cache_root: Path, manifest_digest: str) -> Path:
    """Where the cache keeps an image's file (and `hermetic export` writes it by default)."""
    return cache_root / "squashfs" / file_name(manifest_digest)


def file_name(manifest_digest: str) -> str:
    algo, _, hex_ = manifest_digest.partition(":")
    return f"{algo}-{hex_}.sqfs"


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def make(store: Any, manifest_digest: str, out: Path) -> SquashImage:
    """The image ``manifest_digest`` of ``store`` as the SquashFS file ``out`` (with its sidecar).

    An intact file already at ``out`` for the same image and format is kept (made=False)."""
    if not store.has_blob(manifest_digest):
        raise NotFound(f"no image {manifest_digest} in the store {store.root}; build or pull it first")
    manifest = store.read_json(manifest_digest)
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise IntegrityError(f"{manifest_digest}: not an image manifest (no layers)")
    if out.exists():
        try:
            return check(out, manifest_digest, full=False)
        except HermeticError:
            pass  # made again below
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            try:
                write_image(image_entries(store, layers), f)
            except Unpackable as e:
                raise LayerRefused(f"{manifest_digest}: {e}") from None
        sha, size = sha256_file(tmp), tmp.stat().st_size
        sidecar = {"format": SIDECAR_FORMAT, "manifest_digest": manifest_digest, "sha256": sha, "size": size,
                   "tool": FORMAT}
        side_tmp = sidecar_path(tmp)
        side_tmp.write_text(json.dumps(sidecar, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        os.replace(side_tmp, sidecar_path(out))
    finally:
        for p in (tmp, sidecar_path(tmp)):
            p.unlink(missing_ok=True)
    return SquashImage(out, manifest_digest, sha, size, FORMAT, True)


def check(path: Path, manifest_digest: str | None = None, sha256: str | None = None, *,
          full: bool = True) -> SquashImage:
    """``path`` as its sidecar says: its sha256 and size, the image its name and sidecar name, this writer.

    ``manifest_digest`` / ``sha256``: what the caller expects (a run record, a job script). Any mismatch
    is SquashfsRefused naming the file; nothing is mounted before this passed. Not ``full``: the bytes are
    trusted from a stat when they were hashed since they last changed (hermetic.store.intact's note,
    beside the file), else hashed."""
    if not path.is_file():
        raise NotFound(f"{path}: no such SquashFS file")
    side = sidecar_path(path)
    try:
        meta = json.loads(side.read_text())
        if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT:
            raise ValueError
        named, want_sha, want_size, tool = (meta["manifest_digest"], meta["sha256"], meta["size"], meta["tool"])
    except FileNotFoundError:
        raise SquashfsRefused(f"{path}: no sidecar {side.name} binding it to an image; make it again with "
                              "`hermetic export --squashfs`") from None
    except (ValueError, KeyError, TypeError, OSError):
        raise SquashfsRefused(f"{side}: not a hermetic SquashFS sidecar; make the file again with "
                              "`hermetic export --squashfs`") from None
    if path.name.endswith(".sqfs") and path.name.startswith("sha256-") and path.name != file_name(str(named)):
        raise SquashfsRefused(f"{path}: its name says image {path.name[:-5].replace('-', ':', 1)}, its sidecar "
                              f"{named}: not used")
    if manifest_digest is not None and named != manifest_digest:
        raise SquashfsRefused(f"{path} holds image {named}, not {manifest_digest}: not used")
    if tool != FORMAT:
        raise SquashfsRefused(f"{path} was made by {tool}, not this hermetic's writer ({FORMAT}): "
                              "make it again with `hermetic export --squashfs`")
    size = path.stat().st_size
    if full or not isinstance(want_sha, str) or not blob_intact(path.parent, path, want_sha, size):
        sha = sha256_file(path)
    else:
        sha = want_sha
    if size != want_size or sha != want_sha or (sha256 is not None and sha != sha256):
        raise SquashfsRefused(f"{path}: sha256 {sha[:12]}… ({size} bytes) is not the {(sha256 or want_sha)[:12]}… "
                              "it was made with (truncated or altered): not used; make it again with "
                              "`hermetic export --squashfs`")
    return SquashImage(path, str(named), sha, size, str(tool), False)


def image_entries(store: Any, layers: list[dict[str, Any]]) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """The image's filesystem (its ``layers``, lowest first) as entries, top layer first, each with its data
    (to be read before the next entry is asked for).

    Each layer blob is checked against its digest before it is read (hermetic.store.intact)."""
    upper: dict[str, bool] = {}     # path -> is a directory, from the layers above
    whited: set[str] = set()        # paths a layer above removed
    opaque: set[str] = set()        # directories whose lower contents a layer above removed
    for desc in reversed(layers):
        digest = str(desc.get("digest", ""))
        blob = store.blob_path(digest)
        if not blob_intact(store.root, blob, digest.split(":", 1)[-1]):
            raise IntegrityError(f"layer blob {digest} is missing from or corrupt in the store ({blob}); run "
                                 f"`{REPAIR}`, then build or pull the image again")
        here: dict[str, bool] = {}
        links: list[tuple[str, str]] = []
        gone: set[str] = set()
        opq: set[str] = set()
        gzip = desc.get("mediaType") in GZIP_TYPES
        with open(blob, "rb") as raw, tarfile.open(fileobj=raw, mode="r|gz" if gzip else "r|") as tf:
            for m in tf:
                name = _normal_name(m.name, digest)
                if name is None:
                    continue
                parent, _, leaf = name.rpartition("/")
                if leaf == OPAQUE_MARKER:
                    opq.add(parent)
                    continue
                if leaf.startswith(WHITEOUT_PREFIX):
                    gone.add(f"{parent}/{leaf[len(WHITEOUT_PREFIX):]}".lstrip("/"))
                    continue
                if _covered(name, upper, whited, opaque):
                    continue
                if name in here:
                    raise LayerRefused(f"{digest}: entry {name!r} appears twice in the layer")
                if m.ischr() or m.isblk() or m.isfifo():
                    if name.split("/")[0] == "dev":
                        continue
                    raise LayerRefused(f"{digest}: entry {name!r} is a device node or FIFO outside dev/; "
                                       "not put in a SquashFS image")
                if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                    raise LayerRefused(f"{digest}: entry {name!r} is of a kind hermetic does not pack "
                                       f"({m.type!r})")
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.uid, info.gid = m.type, m.mode & 0o7777, m.uid, m.gid
                info.mtime = int(m.mtime)
                if m.issym():
                    info.linkname = m.linkname
                elif m.islnk():
                    info.linkname = _normal_name(m.linkname, digest) or ""
                    links.append((name, info.linkname))
                info.size = m.size if m.isreg() else 0
                yield info, tf.extractfile(m) if m.isreg() else None
                here[name] = m.isdir()
        for name, target in links:
            if here.get(target) is not False:
                raise LayerRefused(f"{digest}: hard link {name!r} -> {target!r} names no file of its own layer")
        upper.update(here)
        whited |= gone
        opaque |= opq


def _covered(name: str, upper: dict[str, bool], whited: set[str], opaque: set[str]) -> bool:
    """Whether a layer above hides ``name``: the same path, a whiteout of it or of a parent, an opaque
    parent, or a parent that is not a directory there."""
    if name in upper or name in whited:
        return True
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in whited or parent in opaque or upper.get(parent) is False:
            return True
    return False

