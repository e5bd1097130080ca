"""Walking dataset directories: what is listed, what is refused (real files, real symlinks)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hermetic.data.scan import TreeError, scan_tree
from hermetic.data.verify import build_manifest


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))


def write(root: Path, rel: str, data: bytes = b"x") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def test_lists_regular_files_with_relative_slash_paths_and_stat_keys(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "a.txt", b"aa")
    write(root, "sub/deeper/b.bin", b"bbb")
    (root / "empty-dir").mkdir()
    tree = scan_tree(root)
    got = dict(zip(tree.paths, tree.keys))
    assert sorted(got) == ["a.txt", "sub/deeper/b.bin"]
    st = os.stat(root / "sub/deeper/b.bin")
    assert got["sub/deeper/b.bin"] == (st.st_dev, st.st_ino, 3, st.st_mtime_ns, st.st_ctime_ns)
    assert tree.total_bytes == 5 and tree.root == os.path.realpath(root)


def test_exclude_leaves_out_the_manifest_file(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "a")
    write(root, "manifest-sha256.txt")
    assert scan_tree(root, exclude={"manifest-sha256.txt"}).paths == ["a"]


def test_missing_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TreeError, match="no such directory"):
        scan_tree(tmp_path / "absent")
    write(tmp_path, "f")
    with pytest.raises(TreeError, match="not a directory"):
        scan_tree(tmp_path / "f")


def test_relative_symlink_inside_is_listed_with_its_targets_content(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "real/file.bin", b"payload")
    (root / "alias").mkdir()
    os.symlink("../real/file.bin", root / "alias" / "link.bin")
    m = build_manifest(root)
    digest = hashlib.sha256(b"payload").hexdigest()
    assert m.entries == {"alias/link.bin": digest, "real/file.bin": digest}


def test_symlink_escaping_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(tmp_path, "outside.txt")
    write(root, "ok")
    os.symlink("../outside.txt", root / "leak")
    with pytest.raises(TreeError, match=r"/leak: symlink points outside the dataset root"):
        scan_tree(root)


def test_symlink_that_leaves_and_comes_back_is_refused(tmp_path: Path) -> None:
    # Resolves inside on this host, but not once the dataset is mounted under another name.
    root = tmp_path / "d"
    write(root, "x")
    os.symlink("../d/x", root / "roundabout")
    with pytest.raises(TreeError, match="outside the dataset root"):
        scan_tree(root)


def test_absolute_symlink_is_refused_even_to_a_file_inside(tmp_path: Path) -> None:
    root = tmp_path / "d"
    target = write(root, "x")
    os.symlink(str(target), root / "abs")
    with pytest.raises(TreeError, match="absolute target"):
        scan_tree(root)


def test_symlink_to_a_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "sub/x")
    os.symlink("sub", root / "subdir-link")
    with pytest.raises(TreeError, match="symlink to a directory"):
        scan_tree(root)


def test_broken_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    os.symlink("nowhere", root / "dangling")
    with pytest.raises(TreeError, match="broken symlink"):
        scan_tree(root)


def test_fifo_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(TreeError, match="a FIFO"):
        scan_tree(root)


def test_names_equal_under_unicode_normalization_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "caf\u00e9.txt", b"nfc")
    write(root, "cafe\u0301.txt", b"nfd")
    if len(os.listdir(root)) != 2:
        pytest.skip("this filesystem normalizes names itself")
    with pytest.raises(TreeError, match="differ only by Unicode normalization"):
        scan_tree(root)


def test_a_single_nfd_name_is_fine(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "cafe\u0301/x.txt")
    assert scan_tree(root).paths == ["cafe\u0301/x.txt"]


def test_non_utf8_name_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (Path(os.fsdecode(bytes(root) + b"/latin1-\xe9.txt"))).write_bytes(b"x")
    with pytest.raises(TreeError, match="not valid UTF-8"):
        scan_tree(root)


def test_unreadable_directory_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    root = tmp_path / "d"
    write(root, "locked/x")
    (root / "locked").chmod(0)
    try:
        with pytest.raises(TreeError, match="locked"):
            scan_tree(root)
    finally:
        (root / "locked").chmod(0o755)
