"""hermetic export --squashfs: one byte-reproducible file per image, checked before it is used.

The images are small crafted ones (tests/registry_support.make_image) whose layers exercise what a
flattening must get right; the file is read back by two readers hermetic did not write: squashfs-tools-ng's
sqfs2tar and squashfs-tools' unsquashfs (the kernel and squashfuse mount it in tests/test_squashfs_runs.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import run_cli
from registry_support import make_image
from hermetic.engines import squashfs as sqfs
from hermetic.store.oci import OciStore

pytestmark = pytest.mark.engines  # squashfs-tools-ng and squashfuse: scripts/ensure-test-deps


def _tar(*entries: tuple[str, bytes, dict]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data, kw in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_000_000
            for k, v in kw.items():
                setattr(info, k, v)
            if info.type == tarfile.REGTYPE:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def _f(name: str, data: bytes = b"x", **kw) -> tuple[str, bytes, dict]:
    return name, data, kw


def _d(name: str, **kw) -> tuple[str, bytes, dict]:
    return name, b"", {"type": tarfile.DIRTYPE, "mode": 0o755, **kw}


LOWER = _tar(_d("etc"), _f("etc/keep", b"lower keep\n"), _f("etc/replaced", b"lower\n"), _f("etc/gone", b"gone\n"),
             _d("opt"), _d("opt/old"), _f("opt/old/a", b"a\n"), _d("var"), _d("var/cache"), _f("var/cache/x", b"x\n"),
             _f("usr-sbin-tool", b"#!tool\n", mode=0o4755, uid=0, gid=0),
             _d("dev"), _f("dev/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3))
UPPER = _tar(_f("etc/replaced", b"upper\n", mode=0o600, uid=1000, gid=1000), _f("etc/.wh.gone", b""),
             _d("opt/old"), _f("opt/old/.wh..wh..opq", b""), _f("opt/old/b", b"b\n"),
             _f("var/.wh.cache", b""), _f("bin-hard", type=tarfile.LNKTYPE, linkname="etc/replaced-copy"),
             _f("etc/replaced-copy", b"copy\n"), _f("link", type=tarfile.SYMTYPE, linkname="/etc/passwd"))


def _listing(path: Path) -> dict[str, tarfile.TarInfo | bytes]:
    """name -> TarInfo (and name + ':data' -> bytes) of the SquashFS file, read back by sqfs2tar."""
    out = subprocess.run(["sqfs2tar", str(path)], check=True, capture_output=True).stdout
    got: dict = {}
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        for m in tf:
            name = m.name.removeprefix("./").rstrip("/")
            got[name] = m
            if m.isreg():
                got[name + ":data"] = tf.extractfile(m).read()
    return got


@pytest.fixture
def image(tmp_path):
    store = OciStore(tmp_path / "oci")
    return store, make_image(store, [LOWER, UPPER])


def test_the_file_is_the_flattened_image_with_the_layers_owners_modes_and_times(image, tmp_path):
    store, digest = image
    made = sqfs.make(store, digest, tmp_path / "out" / sqfs.file_name(digest))
    assert made.made and made.manifest_digest == digest
    got = _listing(made.path)
    assert got["etc/keep:data"] == b"lower keep\n"
    assert got["etc/replaced:data"] == b"upper\n"  # the upper layer wins, with its owner and mode
    assert (got["etc/replaced"].mode, got["etc/replaced"].uid, got["etc/replaced"].gid) == (0o600, 1000, 1000)
    assert "etc/gone" not in got                   # a whiteout removes it
    assert "opt/old/a" not in got and got["opt/old/b:data"] == b"b\n"  # an opaque directory hides the lower's
    assert "var/cache" not in got and "var/cache/x" not in got  # a whiteout of a directory removes its tree
    assert got["usr-sbin-tool"].mode == 0o4755      # setuid as the layer says (squashfuse mounts nosuid)
    assert got["link"].issym() and got["link"].linkname == "/etc/passwd"  # kept as written, never followed
    assert got["bin-hard:data"] == b"copy\n"
    assert got["etc/keep"].mtime == 1_000_000
    assert "dev/null" not in got                   # a runtime makes /dev
    assert not any(".wh." in n for n in got)
    side = json.loads(sqfs.sidecar_path(made.path).read_text())
    assert side["manifest_digest"] == digest and side["sha256"] == made.sha256
    assert side["tool"] == sqfs.FORMAT


def test_the_same_image_gives_the_same_bytes_whatever_the_place(image, tmp_path):
    store, digest = image
    a = sqfs.make(store, digest, tmp_path / "a" / "x.sqfs")
    b = sqfs.make(store, digest, tmp_path / "b" / "y.sqfs")
    assert a.path.read_bytes() == b.path.read_bytes()
    again = sqfs.make(store, digest, a.path)
    assert not again.made and again.sha256 == a.sha256  # an intact file is kept


def test_another_image_gives_other_bytes(tmp_path):
    store = OciStore(tmp_path / "oci")
    one = sqfs.make(store, make_image(store, [LOWER]), tmp_path / "1.sqfs")
    two = sqfs.make(store, make_image(store, [LOWER, UPPER]), tmp_path / "2.sqfs")
    assert one.sha256 != two.sha256


@pytest.mark.parametrize("entries,needle", [
    ((_f("etc/tty", type=tarfile.CHRTYPE, devmajor=4, devminor=0),), "device node or FIFO outside dev/"),
    ((_f("fifo", type=tarfile.FIFOTYPE),), "device node or FIFO outside dev/"),
    ((_f("../escape"),), "climbs out"),
    ((_f("h", type=tarfile.LNKTYPE, linkname="nowhere"),), "names no file of its own layer"),
    ((_f("twice"), _f("twice")), "appears twice"),
    ((_f("d/" * 600 + "f"),), "depth SquashFS cannot hold"),
    ((_f("owner", uid=1 << 33),), "out of SquashFS's range"),
])
def test_what_cannot_be_packed_is_refused_with_nothing_left(tmp_path, entries, needle):
    store = OciStore(tmp_path / "oci")
    digest = make_image(store, [_tar(*entries)])
    out = tmp_path / "out" / "x.sqfs"
    r = run_cli("export", digest, "--squashfs", "-o", str(out), env={**os.environ, "HERMETIC_CACHE": str(tmp_path)})
    assert r.returncode == 65, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_a_corrupt_layer_blob_is_not_packed(image, tmp_path):
    store, digest = image
    layer = store.read_json(digest)["layers"][0]["digest"]
    blob = store.blob_path(layer)
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[600] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(sqfs.IntegrityError, match="corrupt in the store"):
        sqfs.make(store, digest, tmp_path / "x.sqfs")
    assert not (tmp_path / "x.sqfs").exists()


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])


@pytest.mark.parametrize("how", ["truncated", "altered"])
def test_a_truncated_or_altered_file_is_refused(image, tmp_path, how):
    store, digest = image
    made = sqfs.make(store, digest, tmp_path / sqfs.file_name(digest))
    _damage(made.path, how)
    with pytest.raises(sqfs.SquashfsRefused, match="truncated or altered"):
        sqfs.check(made.path, digest)
    again = sqfs.make(store, digest, made.path)  # made again, not kept
    assert again.made and again.sha256 == made.sha256


def test_a_file_named_for_another_image_or_made_by_another_tool_is_refused(image, tmp_path):
    store, digest = image
    made = sqfs.make(store, digest, tmp_path / "x.sqfs")
    other = "sha256:" + "0" * 64
    with pytest.raises(sqfs.SquashfsRefused, match="not " + other):
        sqfs.check(made.path, other)
    renamed = tmp_path / sqfs.file_name(other)
    shutil.copy(made.path, renamed)
    shutil.copy(sqfs.sidecar_path(made.path), sqfs.sidecar_path(renamed))
    with pytest.raises(sqfs.SquashfsRefused, match="its name says image"):
        sqfs.check(renamed)
    side = sqfs.sidecar_path(made.path)
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({**meta, "tool": "squashfs-tools-ng 1.2.0 (libzstd 1.5.4)"}))
    with pytest.raises(sqfs.SquashfsRefused, match="not this hermetic's writer"):
        sqfs.check(made.path)
    side.unlink()
    with pytest.raises(sqfs.SquashfsRefused, match="no sidecar"):
        sqfs.check(made.path)


# What the small images above do not reach: a file of several blocks and one of none, a directory of more
# entries than one listing header holds (256) and a listing over 64 KiB (an extended directory inode), hard
# links (an extended file inode with its link count), long names, many owners, times past 2038.
BIG = bytes(range(256)) * 1300  # 332,800 bytes: two full blocks and a partial one
WIDE = _tar(_d("wide"), *(_f(f"wide/{'n' * 200}{i:04d}", str(i).encode(), uid=i % 7, gid=i % 5)
                          for i in range(700)),
            _f("big", BIG, mtime=4_000_000_000), _f("empty", b""), _f("hard", type=tarfile.LNKTYPE, linkname="big"),
            _d("a"), _d("a/b"), _d("a/b/c"), _f("a/b/c/deep", b"deep\n"), _f("a/sym", type=tarfile.SYMTYPE,
                                                                             linkname="b/c/deep"))


def test_large_directories_files_and_hard_links_read_back_by_two_readers(tmp_path):
    store = OciStore(tmp_path / "oci")
    digest = make_image(store, [WIDE])
    made = sqfs.make(store, digest, tmp_path / "w.sqfs")
    got = _listing(made.path)
    assert sum(1 for n in got if n.startswith("wide/") and not n.endswith(":data")) == 700
    last = f"wide/{'n' * 200}0699"
    assert got[last + ":data"] == b"699" and (got[last].uid, got[last].gid) == (699 % 7, 699 % 5)
    assert got["big:data"] == BIG and got["big"].mtime == 4_000_000_000 and got["empty:data"] == b""
    assert got["a/b/c/deep:data"] == b"deep\n" and got["a/sym"].linkname == "b/c/deep"
    assert got["hard"].islnk() or got["hard:data"] == BIG  # sqfs2tar writes the second name as a link
    dest = tmp_path / "un"
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(dest), str(made.path)], check=True, capture_output=True)
    assert (dest / "big").read_bytes() == BIG and os.stat(dest / "hard").st_ino == os.stat(dest / "big").st_ino
    assert os.stat(dest / "big").st_nlink == 2 and len(os.listdir(dest / "wide")) == 700
    assert (dest / last).read_bytes() == b"699" and os.readlink(dest / "a/sym") == "b/c/deep"


def test_export_cli_writes_to_the_store_and_says_where(image, tmp_path):
    store, digest = image
    env = {**os.environ, "HERMETIC_CACHE": str(tmp_path)}
    r = run_cli("export", digest, "--squashfs", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["path"] == str(tmp_path / "squashfs" / sqfs.file_name(digest)) and out["made"] is True
    r = run_cli("export", "sha256:" + "1" * 64, "--squashfs", env=env)
    assert r.returncode == 66 and "no image" in r.stderr


@pytest.mark.parametrize("layers", [[LOWER, UPPER], [WIDE]], ids=["layers", "wide"])
def test_the_same_filesystem_as_squashfs_tools_ng_packs_from_the_same_entries(tmp_path, layers):
    """An oracle hermetic did not write: the flattened entries as a tar, packed by tar2sqfs, compared by sqfsdiff
    (contents, owners, modes, times) with hermetic's file."""
    store = OciStore(tmp_path / "oci")
    digest = make_image(store, layers)
    made = sqfs.make(store, digest, tmp_path / "ours.sqfs")
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in sqfs.image_entries(store, store.read_json(digest)["layers"]):
            tf.addfile(info, data)
    theirs = tmp_path / "theirs.sqfs"
    subprocess.run(["tar2sqfs", "--quiet", "--no-xattr", "--defaults", "uid=0,gid=0,mode=0755,mtime=0", str(theirs)],
                   input=stream.getvalue(), check=True, capture_output=True)
    diff = subprocess.run(["sqfsdiff", "--timestamps", "-a", str(theirs), "-b", str(made.path)],
                          capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_root_mounts_with_the_kernel_only_a_file_no_user_can_change(tmp_path):
    """kernel_mountable: the file and every directory above it root's and writable by root alone (a sticky
    directory counts as root's), no link; anything else is squashfuse's, as a user's file is."""
    if os.geteuid() != 0:
        pytest.skip("the rule is root's; a user's file is always squashfuse's")
    kernel = os.path.exists("/dev/loop-control") and "squashfs" in Path("/proc/filesystems").read_text().split()
    store = tmp_path / "store"
    store.mkdir(mode=0o755)
    f = store / "img.sqfs"
    f.write_bytes(b"x")
    f.chmod(0o644)
    assert sqfs.kernel_mountable(f) is kernel
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "img.sqfs").write_bytes(b"x")
    assert sqfs.kernel_mountable(sticky / "img.sqfs") is kernel

    f.chmod(0o664)  # a group could rewrite it after its check
    assert not sqfs.kernel_mountable(f)
    f.chmod(0o644)
    store.chmod(0o775)  # a group could put another file in its place
    assert not sqfs.kernel_mountable(f)
    store.chmod(0o755)
    os.chown(f, 65534, 65534)  # a user's file
    assert not sqfs.kernel_mountable(f)
    os.chown(f, 0, 0)
    (store / "link.sqfs").symlink_to(f)
    assert not sqfs.kernel_mountable(store / "link.sqfs")
    assert not sqfs.kernel_mountable(store / "missing.sqfs")
