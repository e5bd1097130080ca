"""Extracting an untrusted tar on every Python: the standard library's data filter where it exists, hermetic's
own checks where it does not (Debian 12's python3 3.11.2) -- the same refusals, messages and files either way."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from hermetic.hostfs import tarextract
from hermetic.core.errors import DataError
from hermetic.hostfs.tarextract import HAS_DATA_FILTER, extract_all

# Both paths where this Python has the filter; the fallback alone where it has not (it is then the real path).
PATHS = [False, True] if HAS_DATA_FILTER else [False]


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, linkname: str = "",
            mtime: int = 1_000_000) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.mtime = kind, mode, linkname, mtime
    info.uid, info.gid, info.uname, info.gname = 1234, 5678, "someone", "somegroup"
    return info


def _extract(buf: io.BytesIO, dest: Path, use_filter: bool) -> None:
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tf:
        extract_all(tf, dest, use_filter=use_filter)


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = "l" if p.is_symlink() else "d" if p.is_dir() else "f"
        out[str(p.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode) if kind != "l" else None,
                                         st.st_mtime_ns if kind != "l" else None, st.st_uid, st.st_gid,
                                         os.readlink(p) if kind == "l" else p.read_bytes() if kind == "f" else None)
    return out


HOSTILE = {
    "dot-dot": (lambda: _tar((_member("../escaped"), b"x")), "would be extracted to"),
    "through a link": (lambda: _tar((_member("up", tarfile.SYMTYPE, linkname=".."), None),
                                    (_member("up/escaped"), b"x")), "would link to"),
    "link to an absolute path": (lambda: _tar((_member("l", tarfile.SYMTYPE, linkname="/etc/passwd"), None)),
                                 "is a link to an absolute path"),
    "hard link outside": (lambda: _tar((_member("h", tarfile.LNKTYPE, linkname="../../etc/passwd"), None)),
                          "would link to"),
    "device": (lambda: _tar((_member("dev/null", tarfile.CHRTYPE), None)), "is a special file"),
    "fifo": (lambda: _tar((_member("fifo", tarfile.FIFOTYPE), None)), "is a special file"),
}


@pytest.mark.parametrize("use_filter", PATHS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_unsafe_member_is_refused_and_nothing_lands_outside(tmp_path, case, use_filter):
    make, needle = HOSTILE[case]
    dest = tmp_path / "in" / "dest"
    dest.mkdir(parents=True)
    with pytest.raises(tarfile.TarError) as err:
        _extract(make(), dest, use_filter)
    assert needle in str(err.value)
    assert not (tmp_path / "in" / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(p.name for p in [tmp_path / "in", dest,
                                                                                   *dest.rglob("*")])


@pytest.mark.skipif(not HAS_DATA_FILTER, reason="this Python has no data filter to compare with")
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_refusals_say_what_the_standard_filter_says(tmp_path, case):
    make, _ = HOSTILE[case]
    said = []
    for use_filter in (True, False):
        dest = tmp_path / str(use_filter)
        dest.mkdir()
        with pytest.raises(tarfile.TarError) as err:
            _extract(make(), dest, use_filter)
        said.append(str(err.value).replace(str(dest), "DEST"))
    assert said[0] == said[1]


def test_the_fallback_refuses_by_its_own_checks(tmp_path, monkeypatch):
    """The path taken where tarfile has no filter never calls it (a Python 3.11.2 has none to call)."""
    monkeypatch.setattr(tarextract, "HAS_DATA_FILTER", False)

    def no_filter(*args, **kwargs):
        raise AssertionError("extractall called: 3.11.2 has no filter= to give it")

    monkeypatch.setattr(tarfile.TarFile, "extractall", no_filter)
    with pytest.raises(tarextract.UnsafeMember, match="would be extracted to"):
        _extract(HOSTILE["dot-dot"][0](), tmp_path, None)


def test_both_paths_make_the_same_files(tmp_path):
    """Modes as the filter leaves them (no setuid, setgid, sticky or group/other write; directories the
    default), times kept, the owner whoever extracts, an absolute name made relative, links inside kept."""
    buf = _tar((_member("d", tarfile.DIRTYPE, mode=0o7777, mtime=2_000_000), None),
               (_member("d/setuid", mode=0o6777), b"suid"),
               (_member("d/plain", mode=0o666), b"plain"),
               (_member("d/exec", mode=0o750), b"exec"),
               (_member("/abs/name"), b"abs"),
               (_member("d/link", tarfile.SYMTYPE, linkname="plain"), None),
               (_member("hard", tarfile.LNKTYPE, linkname="d/plain"), None),
               (_member("sticky", tarfile.DIRTYPE, mode=0o1777), None))
    trees = []
    for use_filter in PATHS:
        dest = tmp_path / str(use_filter)
        dest.mkdir()
        _extract(buf, dest, use_filter)
        made = _tree(dest)
        made["abs"] = made["abs"][:2] + (None,) + made["abs"][3:]  # a parent no member names: made now, at this time
        trees.append(made)
    tree = trees[0]
    umask = os.umask(0)
    os.umask(umask)
    assert tree["d/setuid"][1] == 0o755 and tree["d/plain"][1] == 0o644 and tree["d/exec"][1] == 0o750
    assert tree["d"][1] == tree["sticky"][1] == 0o777 & ~umask
    assert tree["d"][2] == 2_000_000 * 10**9 and tree["d/plain"][2] == 1_000_000 * 10**9
    assert tree["abs/name"][0] == "f" and tree["d/link"][5] == "plain" and tree["hard"][5] == b"plain"
    assert {v[3:5] for v in tree.values()} == {(os.geteuid(), os.getegid())}
    assert all(t == tree for t in trees)


@pytest.mark.parametrize("use_filter", PATHS)
def test_a_hostile_source_snapshot_is_one_error(tmp_path, monkeypatch, use_filter):
    from hermetic.run.snapshot import extract_snapshot

    monkeypatch.setattr(tarextract, "HAS_DATA_FILTER", use_filter)
    tar_path = tmp_path / "source.tar"
    tar_path.write_bytes(HOSTILE["through a link"][0]().getvalue())
    with pytest.raises(DataError, match=r"source\.tar: cannot extract the source snapshot: 'up' would link to"):
        extract_snapshot(tar_path, tmp_path / "workspace")
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("use_filter", PATHS)
def test_a_hostile_oci_archive_is_one_error(tmp_path, monkeypatch, use_filter):
    from hermetic.builder.base import import_oci
    from hermetic.store.oci import OciStore

    monkeypatch.setattr(tarextract, "HAS_DATA_FILTER", use_filter)
    archive = tmp_path / "image.tar"
    archive.write_bytes(HOSTILE["link to an absolute path"][0]().getvalue())
    with pytest.raises(DataError, match=r"oci-archive .*image\.tar: 'l' is a link to an absolute path; not imported"):
        import_oci(OciStore(tmp_path / "oci"), archive, "sha256:" + "0" * 64, archive=True)
