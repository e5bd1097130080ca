"""A SquashFS 4.0 file written from a stream of tar entries, its data and tables stored uncompressed.

Uncompressed because a run maps most of an image's libraries (torch's alone are hundreds of MB) and each
run mounts the file afresh: squashfuse would decompress them again at every start, where an uncompressed
block is read as it lies (enroot packs its images the same way, ``mksquashfs -noD``). Written here, not by
mksquashfs or tar2sqfs, because neither writes this from a tar stream (mksquashfs 4.5 reads only unpacked
trees; tar2sqfs always compresses), and because the bytes then depend on nothing but the entries: no tool
version, no thread count. The layout is the kernel's (Documentation/filesystems/squashfs.rst): superblock,
data blocks, inode table, directory table, id table; no fragments, no xattrs, no export table.
"""

from __future__ import annotations

import struct
import tarfile
from dataclasses import dataclass, field
from typing import IO, BinaryIO, Iterable

FORMAT = "SquashFS 4.0, uncompressed, hermetic writer 1"
BLOCK_SIZE = 1 << 17
_META = 8192                     # a metadata block's payload
_UNCOMPRESSED_META = 0x8000      # a metadata block's header bit: stored as it is
_UNCOMPRESSED_DATA = 1 << 24     # a data block's size bit: stored as it is
_NONE32, _NONE64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_DIR, _FILE, _SYMLINK, _XDIR, _XFILE = 1, 2, 3, 8, 9
# uncompressed inodes, data, fragments and ids; no fragments; no xattrs
_FLAGS = 0x0001 | 0x0002 | 0x0008 | 0x0010 | 0x0200 | 0x0800
_NAME_MAX = 256
_DEPTH_MAX = 512                 # the tree is written by recursion
_U32 = 1 << 32


class Unpackable(ValueError):
    """An entry SquashFS cannot hold (a name too long, a hard link to a directory or to nothing)."""


@dataclass(eq=False)
class _Node:
    kind: int                    # _DIR, _FILE or _SYMLINK
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    mtime: int = 0
    start: int = 0               # a file's first data block
    size: int = 0
    blocks: list[int] = field(default_factory=list)
    target: bytes = b""          # a symlink's
    children: dict[bytes, "_Node"] = field(default_factory=dict)
    implicit: bool = False       # a directory made for its children, no entry of its own yet
    nlink: int = 1
    number: int = 0
    ref: int = -1                # (metadata block << 16) | offset, once written


class _Metadata:
    """A table of metadata blocks, all stored uncompressed: an item's place is known as it is added."""

    def __init__(self) -> None:
        self.data = bytearray()

    def place(self) -> tuple[int, int]:
        """(the on-disk offset of the block the next byte lands in, the offset in that block)."""
        block, offset = divmod(len(self.data), _META)
        return block * (_META + 2), offset

    def blocks(self) -> Iterable[bytes]:
        for i in range(0, len(self.data), _META):
            chunk = bytes(self.data[i:i + _META])
            yield struct.pack("<H", len(chunk) | _UNCOMPRESSED_META) + chunk


def write_image(entries: Iterable[tuple[tarfile.TarInfo, IO[bytes] | None]], out: BinaryIO) -> int:
    """Write the SquashFS file of ``entries`` (relative names, an upper entry before any it hides) to ``out``,
    a seekable file at offset 0; the count of inodes. Regular files' data is read as the entries come."""
    root = _Node(_DIR, implicit=True)
    links: list[tuple[bytes, bytes]] = []
    out.write(bytes(96))
    pos = 96
    for info, data in entries:
        path = info.name.encode("utf-8", "surrogateescape")
        parent, leaf = _parent(root, path)
        old = parent.children.get(leaf)
        if old is not None:
            if old.kind == _DIR and old.implicit and info.isdir():
                old.mode, old.uid, old.gid, old.mtime = _attrs(info)
                old.implicit = False
            continue  # an upper entry of that name was first
        if info.islnk():
            links.append((path, info.linkname.encode("utf-8", "surrogateescape")))
            continue
        node = _Node(_DIR if info.isdir() else _SYMLINK if info.issym() else _FILE)
        node.mode, node.uid, node.gid, node.mtime = _attrs(info)
        if info.issym():
            node.target = info.linkname.encode("utf-8", "surrogateescape")
            node.mode = 0o777  # a link's own mode means nothing on Linux; 0777 as every packer writes it
        elif info.isreg():
            node.size, node.start = info.size, pos if info.size else 0
            pos = _copy_blocks(data, info.size, out, node.blocks, pos)
        parent.children[leaf] = node
    for path, target in links:
        parent, leaf = _parent(root, path)
        node = _lookup(root, target)
        if node is None or node.kind == _DIR:
            raise Unpackable(f"hard link {path.decode(errors='replace')!r} names no file of the image")
        if leaf not in parent.children:
            parent.children[leaf] = node
            node.nlink += 1
    count = _number(root, 0)
    ids: dict[int, int] = {}  # uid or gid -> its index in the id table, in the order first met
    _collect_ids(root, ids)
    if len(ids) > 0x10000:
        raise Unpackable(f"{len(ids)} distinct owners and groups; SquashFS holds at most 65536")
    inodes, dirs = _Metadata(), _Metadata()
    _write_tree(root, count + 1, inodes, dirs, ids)
    inode_start = pos
    table = b"".join(inodes.blocks())
    dir_start = inode_start + len(table)
    table += b"".join(dirs.blocks())
    id_blocks_start = inode_start + len(table)
    id_data = _Metadata()
    id_data.data += b"".join(struct.pack("<I", i) for i in ids)
    id_blocks = list(id_data.blocks())
    index, at = [], id_blocks_start
    for block in id_blocks:
        index.append(struct.pack("<Q", at))
        at += len(block)
    table += b"".join(id_blocks)
    id_index_start = inode_start + len(table)
    table += b"".join(index)
    out.write(table)
    used = inode_start + len(table)
    out.write(bytes(-used % 4096))  # padded to a device block, as mksquashfs and tar2sqfs do
    out.seek(0)
    out.write(struct.pack("<IIIIIHHHHHHQQQQQQQQ", 0x73717368, count, 0, BLOCK_SIZE, 0, 1, 17, _FLAGS, len(ids),
                          4, 0, root.ref, used, id_index_start, _NONE64, inode_start, dir_start, _NONE64, _NONE64))
    out.seek(0, 2)
    return count


def _attrs(info: tarfile.TarInfo) -> tuple[int, int, int, int]:
    if not (0 <= info.uid < _U32 and 0 <= info.gid < _U32):
        raise Unpackable(f"{info.name[:200]!r}: owner {info.uid}:{info.gid} is out of SquashFS's range")
    return info.mode & 0o7777, info.uid, info.gid, min(max(int(info.mtime), 0), _NONE32)


def _parent(root: _Node, path: bytes) -> tuple[_Node, bytes]:
    """The directory ``path`` lies in (made where missing) and its last name."""
    *dirs, leaf = path.split(b"/")
    node = root
    if len(dirs) >= _DEPTH_MAX or any(len(name) > _NAME_MAX or not name for name in (*dirs, leaf)):
        raise Unpackable(f"{path.decode(errors='replace')[:200]!r}: a name or depth SquashFS cannot hold")
    for name in dirs:
        child = node.children.get(name)
        if child is None:
            child = node.children[name] = _Node(_DIR, implicit=True)
        elif child.kind != _DIR:
            raise Unpackable(f"{path.decode(errors='replace')!r}: {name.decode(errors='replace')!r} is not a "
                             "directory in the image")
        node = child
    return node, leaf


def _lookup(root: _Node, path: bytes) -> _Node | None:
    node: _Node | None = root
    for name in path.split(b"/"):
        node = node.children.get(name) if node is not None and node.kind == _DIR else None
    return node


def _copy_blocks(data: IO[bytes] | None, size: int, out: BinaryIO, blocks: list[int], pos: int) -> int:
    left = size
    while left > 0:
        chunk = data.read(min(BLOCK_SIZE, left)) if data is not None else b""
        if len(chunk) != min(BLOCK_SIZE, left):
            raise Unpackable(f"an entry's data ended {left} bytes short")
        out.write(chunk)
        blocks.append(len(chunk) | _UNCOMPRESSED_DATA)
        left -= len(chunk)
        pos += len(chunk)
    return pos


def _number(node: _Node, last: int) -> int:
    """Number the inodes in the order they are written: a directory's children before it, by name."""
    for name in sorted(node.children):
        child = node.children[name]
        if child.kind == _DIR:
            last = _number(child, last)
        elif child.number == 0:
            last += 1
            child.number = last
    node.number = last + 1
    return last + 1


def _collect_ids(node: _Node, ids: dict[int, int]) -> None:
    for value in (node.uid, node.gid):
        ids.setdefault(value, len(ids))
    for name in sorted(node.children):
        _collect_ids(node.children[name], ids)


def _write_tree(node: _Node, parent_number: int, inodes: _Metadata, dirs: _Metadata, ids: dict[int, int]) -> None:
    """Write ``node``'s subtree: each child's inode (a directory's whole subtree), then its listing, then its
    own inode, so each reference is known where it is written."""
    entries = []
    for name in sorted(node.children):
        child = node.children[name]
        if child.kind == _DIR:
            _write_tree(child, node.number, inodes, dirs, ids)
        elif child.ref < 0:
            _write_inode(child, inodes, ids)
        entries.append((name, child))
    listing = bytearray()
    i = 0
    while i < len(entries):  # runs of at most 256 entries whose inodes share a metadata block
        block, base = entries[i][1].ref >> 16, entries[i][1].number
        run = entries[i:i + 256]
        for n, (_, child) in enumerate(run):
            if child.ref >> 16 != block or abs(child.number - base) > 32767:
                run = run[:n]
                break
        listing += struct.pack("<III", len(run) - 1, block, base)
        for name, child in run:
            listing += struct.pack("<HhHH", child.ref & 0xFFFF, child.number - base, child.kind, len(name) - 1) + name
        i += len(run)
    block, offset = dirs.place()
    dirs.data += listing
    subdirs = sum(1 for c in node.children.values() if c.kind == _DIR)
    node.nlink = 2 + subdirs
    _write_inode(node, inodes, ids, block, offset, parent_number, len(listing) + 3)


def _write_inode(node: _Node, inodes: _Metadata, ids: dict[int, int], dir_block: int = 0, dir_offset: int = 0,
                 parent: int = 0, dir_size: int = 0) -> None:
    """Append ``node``'s inode (a directory's: its listing's place, size + 3 as the format counts it)."""
    block, offset = inodes.place()
    node.ref = block << 16 | offset
    head = (node.mode, ids[node.uid], ids[node.gid], node.mtime, node.number)
    if node.kind == _DIR:
        if dir_size < 0x10000:
            body = struct.pack("<HHHHIIIIHHI", _DIR, *head, dir_block, node.nlink, dir_size, dir_offset, parent)
        else:
            body = struct.pack("<HHHHIIIIIIHHI", _XDIR, *head, node.nlink, dir_size, dir_block, parent, 0,
                               dir_offset, _NONE32)
    elif node.kind == _SYMLINK:
        body = struct.pack("<HHHHIIII", _SYMLINK, *head, node.nlink, len(node.target)) + node.target
    elif node.nlink == 1 and node.start < _U32 and node.size < _U32:
        body = struct.pack("<HHHHIIIIII", _FILE, *head, node.start, _NONE32, 0, node.size)
    else:
        body = struct.pack("<HHHHIIQQQIIII", _XFILE, *head, node.start, node.size, 0, node.nlink, _NONE32, 0,
                           _NONE32)
    inodes.data += body + struct.pack(f"<{len(node.blocks)}I", *node.blocks)
