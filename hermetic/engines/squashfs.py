"""An image as one SquashFS file, for clusters: made from the store's verified layers, byte-reproducible.

The layers are flattened in one pass, top layer first (an entry hidden by an upper layer's entry, a
whiteout or an opaque directory is skipped), into a tar stream that tar2sqfs (squashfs-tools-ng) packs;
nothing is unpacked on the host. The file's bytes depend on the stream, which the manifest fixes, and on
tar2sqfs: its version is pinned (TOOL_VERSION), any other is refused, and the sidecar ``<file>.json``
binds the file's sha256 to the manifest digest and the tool. Ownership, modes (setuid included) and times
are the layers'; device nodes under dev/ are skipped (a runtime makes /dev), elsewhere refused.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hermetic.core.errors import DataError, HermeticError, IntegrityError, NotFound, Unavailable, UsageError
from hermetic.hostfs.fsutil import sha256_file
from hermetic.store.intact import REPAIR, blob_intact
from hermetic.engines.unpack import GZIP_TYPES, OPAQUE_MARKER, WHITEOUT_PREFIX, LayerRefused, _normal_name

TOOL = "tar2sqfs"
TOOL_VERSION = "1.2.0"
# zstd at level 3: packs as fast as the layers stream in (gzip's default takes ten times as long); squashfuse
# >= 0.1.101 and Linux >= 4.14 read it. The defaults are the root directory's.
OPTIONS = ("--compressor", "zstd", "--comp-extra", "level=3", "--block-size", "131072", "--no-xattr", "--quiet",
           "--defaults", "uid=0,gid=0,mode=0755,mtime=0")
SIDECAR_FORMAT = 1
INSTALL_HINT = "install squashfs-tools-ng 1.2.0 (Debian 12: apt-get install squashfs-tools-ng)"
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


def store_path(cache_root: Path, manifest_digest: str) -> Path:
    """Where the cache keeps an image's file (and `hermetic export` writes it by default)."""
    return cache_root / "squashfs" / file_name(manifest_digest)


def file_name(manifest_digest: str) -> str:
    algo, _, hex_ = manifest_digest.partition(":")
    return f"{algo}-{hex_}.sqfs"


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


@functools.lru_cache(maxsize=4)
def tool_version(tool: str | None = None) -> str | None:
    """tar2sqfs's version (``tar2sqfs (squashfs-tools-ng) 1.2.0`` -> ``1.2.0``); None where it is missing."""
    exe = tool or shutil.which(TOOL)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1] if "squashfs-tools-ng" in first else None


def compressor_library(tool: str) -> str:
    """The zstd library tar2sqfs loads (``libzstd 1.5.4``): its version, too, decides the bytes."""
    try:
        out = subprocess.run(["ldd", tool], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        name, _, where = line.strip().partition(" => ")
        if name.startswith("libzstd.so"):
            real = os.path.realpath(where.split(" (")[0])
            return "libzstd " + (real.split(".so.", 1)[1] if ".so." in real else "of an unknown version")
    return "libzstd of an unknown version"


def require_tool() -> tuple[str, str]:
    """The pinned tar2sqfs's path and its name with the compressor's library (recorded in each sidecar).

    A missing tar2sqfs or another version is refused: its files would differ."""
    exe = shutil.which(TOOL)
    if exe is None:
        raise Unavailable(f"{TOOL} not found: making a SquashFS image needs it", hint=INSTALL_HINT)
    version = tool_version(exe)
    if version != TOOL_VERSION:
        raise Unavailable(f"{exe} is squashfs-tools-ng {version or 'of an unknown version'}, not the pinned "
                          f"{TOOL_VERSION}: its files would not be byte-identical to other machines'",
                          hint=INSTALL_HINT)
    return exe, f"squashfs-tools-ng {TOOL_VERSION} ({compressor_library(exe)})"


def make(store: Any, manifest_digest: str, out: Path, *, jobs: int | None = None) -> SquashImage:
    """The image ``manifest_digest`` of ``store`` as the SquashFS file ``out`` (with its sidecar).

    An intact file already at ``out`` for the same image and tool is kept (made=False)."""
    exe, tool = require_tool()
    if not store.has_blob(manifest_digest):
        raise NotFound(f"no image {manifest_digest} in the store {store.root}; build or pull it first")
    manifest = store.read_json(manifest_digest)
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise IntegrityError(f"{manifest_digest}: not an image manifest (no layers)")
    if out.exists():
        try:
            kept = check(out, manifest_digest, full=False)
            if kept.tool == tool:
                return kept
        except HermeticError:
            pass  # made again below
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    argv = [exe, *OPTIONS, "--num-jobs", str(jobs or os.cpu_count() or 1), "--force", str(tmp)]
    try:
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
            try:
                assert proc.stdin is not None
                with proc.stdin:
                    flatten(store, layers, proc.stdin)
            except BrokenPipeError:
                pass  # tar2sqfs ended early: its own message says why
            finally:
                proc.wait()
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip().splitlines()
        if proc.returncode != 0:
            raise IntegrityError(f"{TOOL} failed on {manifest_digest} (exit {proc.returncode})"
                                 + (f": {said[-1]}" if said else ""))
        sha, size = sha256_file(tmp), tmp.stat().st_size
        sidecar = {"format": SIDECAR_FORMAT, "manifest_digest": manifest_digest, "sha256": sha, "size": size,
                   "tool": tool, "options": list(OPTIONS)}
        side_tmp = sidecar_path(tmp)
        side_tmp.write_text(json.dumps(sidecar, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        os.replace(side_tmp, sidecar_path(out))
    finally:
        for p in (tmp, sidecar_path(tmp)):
            p.unlink(missing_ok=True)
    return SquashImage(out, manifest_digest, sha, size, tool, True)


def check(path: Path, manifest_digest: str | None = None, sha256: str | None = None, *,
          full: bool = True) -> SquashImage:
    """``path`` as its sidecar says: its sha256 and size, the image its name and sidecar name, the pinned tool.

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
    if not str(tool).startswith(f"squashfs-tools-ng {TOOL_VERSION} "):
        raise SquashfsRefused(f"{path} was made by {tool}, not the pinned squashfs-tools-ng {TOOL_VERSION}: "
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


def flatten(store: Any, layers: list[dict[str, Any]], out: IO[bytes]) -> int:
    """Write the image's filesystem (its ``layers``, lowest first) to ``out`` as one tar; the entry count.

    Each layer blob is checked against its digest before it is read (hermetic.store.intact)."""
    upper: dict[str, bool] = {}     # path -> is a directory, from the layers above
    whited: set[str] = set()        # paths a layer above removed
    opaque: set[str] = set()        # directories whose lower contents a layer above removed
    count = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar_out:
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
                    if m.isreg():
                        info.size = m.size
                        tar_out.addfile(info, tf.extractfile(m))
                    else:
                        tar_out.addfile(info)
                    here[name] = m.isdir()
                    count += 1
            for name, target in links:
                if here.get(target) is not False:
                    raise LayerRefused(f"{digest}: hard link {name!r} -> {target!r} names no file of its own layer")
            upper.update(here)
            whited |= gone
            opaque |= opq
    return count


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

