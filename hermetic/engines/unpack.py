"""Image layers as directories, for engines that run an image from a directory tree (Charliecloud).

Each layer blob is checked against its digest, then unpacked once into ``<root>/<hex>`` by a tar reader that
trusts nothing: written through directory descriptors (no link followed, ``..`` and absolute names refused),
files, directories and links only (devices and FIFOs refused, ``dev/`` skipped), setuid, setgid and owners
dropped, whiteouts made overlayfs's own (``userxattr``); renamed into place only once complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from hermetic.core.errors import IntegrityError
from hermetic.hostfs.fsutil import owned_temp_dir

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OPAQUE_XATTR = "user.overlay.opaque"
GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE_BITS = 0o1777  # permission bits and the sticky bit; never setuid or setgid


class LayerRefused(IntegrityError):
    """A layer holds an entry hermetic does not unpack (exit 65)."""


def layer_path(root: Path, digest: str) -> Path:
    return root / digest.split(":", 1)[1]


def ensure_layer(store, digest: str, media_type: str, root: Path) -> tuple[Path, bool]:
    """The layer's directory under ``root`` (unpacked now unless it is there); (path, unpacked now).

    The blob is checked first (hermetic.store.intact: from its stat when it was hashed since it last
    changed, else rehashed): a corrupt blob is never unpacked."""
    from hermetic.store.intact import REPAIR, blob_intact

    final = layer_path(root, digest)
    if final.is_dir():
        return final, False
    blob = store.blob_path(digest)
    if not blob_intact(store.root, blob, digest.split(":", 1)[1]):
        state = "missing from" if not blob.exists() else "corrupt in"
        raise IntegrityError(f"layer blob {digest} is {state} the store ({blob}); nothing was unpacked; run "
                             f"`{REPAIR}`, then build or pull the image again")
    root.mkdir(parents=True, exist_ok=True)
    with owned_temp_dir(root, ".unpack-") as tmp:
        target = tmp / "layer"
        os.mkdir(target, 0o755)
        with open(blob, "rb") as raw:
            unpack_tar(raw, target, gzip=media_type in GZIP_TYPES, what=digest)
        try:
            os.rename(target, final)
        except OSError:
            if not final.is_dir():  # not another process's copy that won the race
                raise
            _make_removable(target)
    return final, True


def unpack_tar(stream, dest: Path, *, gzip: bool = False, what: str = "layer") -> None:
    """Every entry of the tar ``stream`` into the directory ``dest`` (module doc); LayerRefused names the entry."""
    dirs = _Dirs(os.open(dest, _DIR_FLAGS), what)
    try:
        with tarfile.open(fileobj=stream, mode="r|gz" if gzip else "r|") as tf:
            for member in tf:
                name = _normal_name(member.name, what)
                if name is None:
                    continue
                parts = name.split("/")
                if parts[0] == "dev" and (member.ischr() or member.isblk() or member.isfifo()):
                    continue
                parent_fd = dirs.get("/".join(parts[:-1]), name)
                _make(tf, member, parent_fd, parts[-1], dirs, name, what)
        dirs.close_last()
        # Deepest first: a directory's mode may take away the search permission that reaching those beneath
        # it needs.
        for path, mode in sorted(dirs.modes.items(), key=lambda kv: -kv[0].count("/")):
            fd = dirs.open(path, path, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    except tarfile.TarError as e:
        raise LayerRefused(f"{what}: not a tar archive hermetic can read ({e})") from None
    finally:
        dirs.close()


class _Dirs:
    """The layer's directories by path ("" is the root), each reached from the root one component at a
    time with O_NOFOLLOW: a path with a link (or a file) among its parents is refused, never followed.

    Only the root's descriptor and the last directory's stay open, so an unpack holds a handful of
    descriptors however deep or wide the tree (one per directory ran past `ulimit -n` 1024 on Debian's base
    layer). A tar lists a directory's entries together, so the last directory is mostly the next one's.
    ``modes``: each directory's final mode, set once everything is in."""

    def __init__(self, root_fd: int, what: str) -> None:
        self.root_fd = root_fd
        self.what = what
        self.modes: dict[str, int] = {}
        self._last: tuple[str, int] | None = None  # (path, descriptor) of the directory ``get`` gave last

    def get(self, path: str, name: str) -> int:
        """The directory ``path`` (made, with its parents, where missing), open until the next ``get``."""
        if self._last is not None:
            if self._last[0] == path:
                return self._last[1]
            self.close_last()
        fd = self.open(path, name)
        self._last = (path, fd)
        return fd

    def open(self, path: str, name: str, create: bool = True) -> int:
        """A new descriptor of the directory ``path`` (the caller closes it); FileNotFoundError where a part
        is missing and not ``create``. ``name`` is the entry it is for, for the error."""
        fd = os.dup(self.root_fd)
        if not path:
            return fd
        try:
            parts = path.split("/")
            for i, part in enumerate(parts):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    raise LayerRefused(f"{self.what}: entry {name!r} lies beneath {'/'.join(parts[:i + 1])!r}, which "
                                       "is not a directory in the layer (a link or a file): not unpacked through "
                                       "it") from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def forget(self, path: str) -> None:
        """A directory removed (and everything under it)."""
        beneath = path + "/"
        if self._last is not None and (self._last[0] == path or self._last[0].startswith(beneath)):
            self.close_last()
        for p in [p for p in self.modes if p == path or p.startswith(beneath)]:
            del self.modes[p]

    def close_last(self) -> None:
        if self._last is not None:
            os.close(self._last[1])
            self._last = None

    def close(self) -> None:
        self.close_last()
        os.close(self.root_fd)


def _normal_name(raw: str, what: str) -> str | None:
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.lstrip("/").rstrip("/")
    if name in ("", "."):
        return None
    parts = name.split("/")
    if any(p in ("..",) for p in parts) or any(p == "" for p in parts) or "\0" in name:
        raise LayerRefused(f"{what}: entry {raw!r} climbs out of the image (a '..' or empty part); not unpacked")
    return "/".join(p for p in parts if p != ".")


def _clear(dirs: _Dirs, parent_fd: int, leaf: str, path: str, keep_dir: bool = False) -> None:
    """Whatever an earlier entry of the same name (``path``) left: a tar may hold a name twice, the last wins."""
    try:
        st = os.stat(leaf, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(leaf, dir_fd=parent_fd)
    elif not keep_dir:
        dirs.forget(path)
        _remove_tree(dirs, path)


def _remove_tree(dirs: _Dirs, path: str) -> None:
    """The directory ``path`` and everything in it, depth first, each directory reached again from the root:
    a descriptor or two at a time however deep it goes. (Every directory is writable until the unpack ends:
    modes are set last.)"""
    todo = [path]
    while todo:
        here = todo[-1]
        fd = dirs.open(here, here, create=False)
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            subdirs = [f"{here}/{e.name}" for e in entries if e.is_dir(follow_symlinks=False)]
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    os.unlink(e.name, dir_fd=fd)
        finally:
            os.close(fd)
        if subdirs:  # emptied first; ``here`` comes up again after them
            todo += subdirs
            continue
        todo.pop()
        parent, _, leaf = here.rpartition("/")
        pfd = dirs.open(parent, here, create=False)
        try:
            os.rmdir(leaf, dir_fd=pfd)
        finally:
            os.close(pfd)


def _make(tf: tarfile.TarFile, m: tarfile.TarInfo, parent_fd: int, leaf: str, dirs: _Dirs, name: str,
          what: str) -> None:
    if leaf == OPAQUE_MARKER:
        os.setxattr(parent_fd, OPAQUE_XATTR, b"y")
        return
    if leaf.startswith(WHITEOUT_PREFIX):
        hidden = leaf[len(WHITEOUT_PREFIX):]
        _clear(dirs, parent_fd, hidden, name.rpartition("/")[0] + "/" + hidden if "/" in name else hidden)
        os.mknod(hidden, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=parent_fd)
        return
    mode = m.mode & _MODE_BITS
    if m.isdir():
        _clear(dirs, parent_fd, leaf, name, keep_dir=True)
        try:
            os.mkdir(leaf, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
        dirs.modes[name] = mode  # set last: a directory without write permission still gets its entries
        return
    _clear(dirs, parent_fd, leaf, name)
    if m.isreg():
        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=parent_fd)
        try:
            src = tf.extractfile(m)
            if src is not None:
                with os.fdopen(os.dup(fd), "wb", buffering=0) as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    elif m.issym():
        os.symlink(m.linkname, leaf, dir_fd=parent_fd)
    elif m.islnk():
        target = _normal_name(m.linkname, what)
        if target is None:
            raise LayerRefused(f"{what}: hard link {name!r} names no file")
        tdir_path, _, tleaf = target.rpartition("/")
        try:
            tdir = dirs.open(tdir_path, target, create=False)
        except FileNotFoundError:
            raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r}: no such file in the layer") from None
        try:
            st = os.stat(tleaf, dir_fd=tdir, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r} names no regular file")
            os.link(tleaf, leaf, src_dir_fd=tdir, dst_dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r}: no such file in the layer") from None
        finally:
            os.close(tdir)
    elif m.ischr() or m.isblk() or m.isfifo():
        kind = "FIFO" if m.isfifo() else "device node"
        raise LayerRefused(f"{what}: entry {name!r} is a {kind}; hermetic unpacks no {kind}s outside dev/")
    else:
        raise LayerRefused(f"{what}: entry {name!r} is of a kind hermetic does not unpack ({m.type!r})")


def _make_removable(path: Path) -> None:
    """Give back write permission on every directory under ``path`` (a layer unpacks some read-only)."""
    for d, subdirs, _files in os.walk(path):
        for p in [d] + [os.path.join(d, s) for s in subdirs]:
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o700)
