"""Image layers as directories, for engines that run an image from a directory tree (Charliecloud).

Each layer blob of hermetic's OCI store is unpacked once into its own
directory, named by the blob's digest (``<root>/<hex>``), by a normalizing tar
reader that trusts nothing in the tar:

* every entry is written beneath the layer's directory through directory
  descriptors, never by path: no parent component may be a link (``O_NOFOLLOW``
  on each), so nothing is written through a link; ``..`` and absolute names
  are refused;
* regular files, directories and symbolic links are made (a link's target is
  kept as written: it is resolved inside the container, never here); a hard
  link must name a file already unpacked in the same layer; device nodes and
  FIFOs are refused (those under ``dev/`` are skipped: the container's /dev is
  made at each start);
* setuid, setgid and the owner are dropped (files belong to whoever unpacks);
* whiteouts (``.wh.NAME``, ``.wh..wh..opq``) become overlayfs's own (a 0/0
  character device, the ``user.overlay.opaque`` xattr), so the layers stack
  as an overlay mount with ``userxattr``, as an unprivileged user may mount it.

The blob is checked against its digest before it is read (hermetic.store.intact:
from its stat when it was hashed since it last changed, else rehashed), and
the directory is renamed into place only once complete: a corrupt blob leaves
no layer directory behind, and an existing directory is a layer that was
verified when made.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from hermetic.errors import IntegrityError
from hermetic.fsutil import owned_temp_dir

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
    """Every entry of the tar ``stream`` into the directory ``dest`` (module doc); LayerRefused names the entry.

    An uncompressed tar in a file is read in place: each file's bytes are copied by the kernel
    (copy_file_range), not through Python."""
    dirs = _DirCache(os.open(dest, _DIR_FLAGS), what)
    modes: dict[str, int] = {}  # a directory's path -> its final mode, set once everything is in
    seekable = not gzip and hasattr(stream, "fileno")
    try:
        with tarfile.open(fileobj=stream, mode="r:" if seekable else ("r|gz" if gzip else "r|")) as tf:
            src_fd = stream.fileno() if seekable else None
            for member in tf:
                name = _normal_name(member.name, what)
                if name is None:
                    continue
                parts = name.split("/")
                if parts[0] == "dev" and (member.ischr() or member.isblk() or member.isfifo()):
                    continue
                parent_fd = dirs.open("/".join(parts[:-1]), name)
                _make(tf, member, parent_fd, parts[-1], dirs, name, what, modes, src_fd)
        for path, mode in sorted(modes.items(), key=lambda kv: -kv[0].count("/")):
            os.fchmod(dirs.open(path, path), mode)
    except tarfile.TarError as e:
        raise LayerRefused(f"{what}: not a tar archive hermetic can read ({e})") from None
    finally:
        dirs.close()


class _DirCache:
    """Open descriptors of the layer's directories by path ("" is the root), each opened from its parent
    with O_NOFOLLOW: a path with a link (or a file) among its parents is refused, never followed."""

    def __init__(self, root_fd: int, what: str) -> None:
        self.fds: dict[str, int] = {"": root_fd}
        self.what = what

    def open(self, path: str, name: str, create: bool = True) -> int:
        fd = self.fds.get(path)
        if fd is not None:
            return fd
        parent, _, leaf = path.rpartition("/")
        pfd = self.open(parent, name, create)
        try:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=pfd)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(leaf, 0o755, dir_fd=pfd)
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=pfd)
        except OSError as e:
            if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            raise LayerRefused(f"{self.what}: entry {name!r} lies beneath {path!r}, which is not a directory in "
                               "the layer (a link or a file): not unpacked through it") from None
        self.fds[path] = fd
        return fd

    def forget(self, path: str) -> None:
        """A directory removed (and everything under it)."""
        for p in [p for p in self.fds if p == path or p.startswith(path + "/")]:
            os.close(self.fds.pop(p))

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


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


def _clear(parent_fd: int, leaf: str, keep_dir: bool = False, dirs: "_DirCache | None" = None,
           path: str = "") -> None:
    """Whatever an earlier entry of the same name left (a tar may hold a name twice: the last wins)."""
    try:
        st = os.stat(leaf, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if keep_dir:
            return
        if dirs is not None:
            dirs.forget(path)
        fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            _remove_tree_at(fd)
        finally:
            os.close(fd)
        os.rmdir(leaf, dir_fd=parent_fd)
    else:
        os.unlink(leaf, dir_fd=parent_fd)


def _remove_tree_at(fd: int) -> None:
    os.fchmod(fd, 0o700)
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            try:
                _remove_tree_at(sub)
            finally:
                os.close(sub)
            os.rmdir(entry.name, dir_fd=fd)
        else:
            os.unlink(entry.name, dir_fd=fd)


def _make(tf: tarfile.TarFile, m: tarfile.TarInfo, parent_fd: int, leaf: str, dirs: _DirCache, name: str, what: str,
          modes: dict[str, int], src_fd: int | None) -> None:
    if leaf == OPAQUE_MARKER:
        os.setxattr(parent_fd, OPAQUE_XATTR, b"y")
        return
    if leaf.startswith(WHITEOUT_PREFIX):
        hidden = leaf[len(WHITEOUT_PREFIX):]
        _clear(parent_fd, hidden, dirs=dirs, path=name.rpartition("/")[0] + "/" + hidden if "/" in name else hidden)
        os.mknod(hidden, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=parent_fd)
        return
    mode = m.mode & _MODE_BITS
    if m.isdir():
        _clear(parent_fd, leaf, keep_dir=True)
        try:
            os.mkdir(leaf, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
        modes[name] = mode  # set last: a directory without write permission still gets its entries
        return
    _clear(parent_fd, leaf, dirs=dirs, path=name)
    if m.isreg():
        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=parent_fd)
        try:
            if src_fd is not None:
                _copy_range(src_fd, fd, m.offset_data, m.size)
            else:
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
        tparts = target.split("/")
        try:
            tdir = dirs.open("/".join(tparts[:-1]), target, create=False)
        except FileNotFoundError:
            raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r}: no such file in the layer") from None
        try:
            st = os.stat(tparts[-1], dir_fd=tdir, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r} names no regular file")
            os.link(tparts[-1], leaf, src_dir_fd=tdir, dst_dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise LayerRefused(f"{what}: hard link {name!r} -> {m.linkname!r}: no such file in the layer") from None
    elif m.ischr() or m.isblk() or m.isfifo():
        kind = "FIFO" if m.isfifo() else "device node"
        raise LayerRefused(f"{what}: entry {name!r} is a {kind}; hermetic unpacks no {kind}s outside dev/")
    else:
        raise LayerRefused(f"{what}: entry {name!r} is of a kind hermetic does not unpack ({m.type!r})")


def _copy_range(src_fd: int, dst_fd: int, offset: int, size: int) -> None:
    """``size`` bytes of ``src_fd`` from ``offset`` into ``dst_fd``, copied by the kernel where it can."""
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src_fd, dst_fd, size - done, offset + done)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = os.sendfile(dst_fd, src_fd, offset + done, size - done)
        if n == 0:
            raise LayerRefused(f"a file's bytes end early in the layer (at {offset + done} of {offset + size})")
        done += n


def _make_removable(path: Path) -> None:
    """Give back write permission on every directory under ``path`` (a layer unpacks some read-only)."""
    for d, subdirs, _files in os.walk(path):
        for s in subdirs:
            p = os.path.join(d, s)
            if not os.path.islink(p):
                try:
                    os.chmod(p, 0o700)
                except OSError:
                    pass
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass


def remove_layer_dir(path: Path) -> None:
    _make_removable(path)
    shutil.rmtree(path, ignore_errors=True)
