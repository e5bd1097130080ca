"""verify_dataset on real directories: missing / extra / changed, the stat cache and its limit."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from hermetic.config.load import parse_config
from hermetic.data.hashfiles import hash_files, plan
from hermetic.data.manifest import ManifestError, format_manifest, read_manifest
from hermetic.data.scan import TreeError, scan_tree
from hermetic.data.statcache import StatCache, stat_key
from hermetic.data.verify import build_manifest, verify_configured, verify_dataset
from hermetic.core.errors import HermeticError, UsageError

LARGE = 48 << 20  # big enough to be hashed by the worker processes, in several 1 MiB reads


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))


def settle() -> None:
    """Let file timestamps age past the racy-clean slack, so cache entries are trusted."""
    time.sleep(0.12)


def make_dataset(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    root = tmp_path / "data"
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    manifest = tmp_path / "data.sha256"
    manifest.write_bytes(format_manifest(build_manifest(root).entries))
    return root, manifest


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_unchanged_dataset_is_ok_with_its_oxum(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a": b"aa", "d/b": b"bbb", "d/e/c": b""})
    r = verify_dataset(root, manifest)
    assert r.ok and r.missing == r.extra == r.changed == []
    assert (r.file_count, r.total_bytes, r.oxum) == (3, 5, "5.3")
    assert r.manifest_sha256 == sha(manifest.read_bytes()) == read_manifest(manifest).sha256
    assert r.summary().startswith(f"{root}: OK, 3 files, 5 bytes")
    assert verify_dataset(root, manifest, full=True).ok


def test_reports_missing_extra_and_changed_separately(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"keep": b"k", "gone": b"g", "edit": b"before"})
    (root / "gone").unlink()
    (root / "new").write_bytes(b"n")
    (root / "edit").write_bytes(b"after!")
    for full in (False, True):
        r = verify_dataset(root, manifest, full=full)
        assert not r.ok
        assert r.missing == ["gone"] and r.extra == ["new"]
        assert r.changed == [("edit", sha(b"before"), sha(b"after!"))]
        s = r.summary()
        assert "1 changed (edit)" in s and "1 missing (gone)" in s and "1 extra (new)" in s
        assert "\n" not in s
        assert r.to_json()["changed"] == [{"path": "edit", "expected": sha(b"before"), "actual": sha(b"after!")}]


def test_one_byte_change_in_a_large_file_is_found_by_full(tmp_path: Path) -> None:
    blob = os.urandom(1 << 20) * (LARGE >> 20)
    root, manifest = make_dataset(tmp_path, {"big.bin": blob, "small/1": b"1", "small/2": b"2"})
    assert verify_dataset(root, manifest, full=True).ok
    with open(root / "big.bin", "r+b") as f:
        f.seek(LARGE // 2 + 12345)
        old = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([old[0] ^ 0x01]))
    assert (root / "big.bin").stat().st_size == LARGE
    r = verify_dataset(root, manifest, full=True)
    assert r.mode == "full" and r.hashed_files == 3
    assert [c[0] for c in r.changed] == ["big.bin"]
    assert r.changed[0][1] == sha(blob) and r.changed[0][2] == sha((root / "big.bin").read_bytes())
    assert r.missing == r.extra == []


def test_warm_verify_reads_nothing_and_a_full_one_rehashes(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {f"f{i}": bytes([i]) * 100 for i in range(20)})
    settle()
    first = verify_dataset(root, manifest)  # entries recorded now are older than their files' stamps + slack
    assert first.ok
    warm = verify_dataset(root, manifest)
    assert warm.ok and warm.mode == "stat-cache" and warm.hashed_files == 0 and warm.cached_files == 20
    full = verify_dataset(root, manifest, full=True)
    assert full.ok and full.hashed_files == 20 and full.cached_files == 0


def test_change_that_keeps_size_and_mtime_is_caught_through_ctime(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a.bin": b"A" * 4096, "b.bin": b"B" * 4096})
    settle()
    assert verify_dataset(root, manifest).ok
    st = os.stat(root / "a.bin")
    (root / "a.bin").write_bytes(b"Z" * 4096)  # same size
    os.utime(root / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    assert os.stat(root / "a.bin").st_mtime_ns == st.st_mtime_ns
    r = verify_dataset(root, manifest)  # default mode: the ctime moved, so the cache misses
    assert r.mode == "stat-cache" and r.hashed_files == 1
    assert r.changed == [("a.bin", sha(b"A" * 4096), sha(b"Z" * 4096))]


def test_the_stat_caches_documented_limit_and_full_catching_it(tmp_path: Path) -> None:
    """A change that keeps size, mtime *and* ctime is invisible to the stat cache.

    User space cannot make one (writing moves ctime), but bit rot, writes to the
    raw block device, a clock set backwards or stale network-filesystem
    attributes can. We produce exactly what the cache would then see: the file's
    bytes differ from what was hashed while its stat key is the one recorded.
    Default verification trusts the cache (docs/data.md says so); --full reads
    the bytes and reports the change.
    """
    root, manifest = make_dataset(tmp_path, {"a.bin": b"A" * 4096, "b.bin": b"B" * 4096})
    settle()
    (root / "a.bin").write_bytes(b"Z" * 4096)
    settle()
    cache = StatCache.for_tree(os.path.realpath(root))
    path = os.path.realpath(root / "a.bin")
    cache.put(path, stat_key(os.stat(path)), sha(b"A" * 4096), time.time_ns())
    cache.save()
    assert verify_dataset(root, manifest).ok  # the limit
    r = verify_dataset(root, manifest, full=True)
    assert r.changed == [("a.bin", sha(b"A" * 4096), sha(b"Z" * 4096))]
    # ...and --full repaired the cache: the default mode now sees the change too.
    assert not verify_dataset(root, manifest).ok


def test_files_changed_right_after_hashing_are_not_trusted(tmp_path: Path) -> None:
    """Racy-clean, end to end: an entry recorded before its file's last change is re-hashed."""
    root, manifest = make_dataset(tmp_path, {"a": b"1" * 64})
    cache = StatCache.for_tree(os.path.realpath(root))
    path = os.path.realpath(root / "a")
    st = os.stat(path)
    # Recorded at the file's own timestamp: the same clock tick as its last write.
    cache.put(path, stat_key(st), sha(b"stale"), st.st_ctime_ns)
    cache.save()
    r = verify_dataset(root, manifest)
    assert r.ok and r.hashed_files == 1


def test_manifest_inside_the_dataset_is_not_part_of_it(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "x").write_bytes(b"x")
    m = build_manifest(root, exclude=[root / "manifest-sha256.txt"])
    (root / "manifest-sha256.txt").write_bytes(format_manifest(m.entries))
    r = verify_dataset(root, root / "manifest-sha256.txt")
    assert r.ok and r.file_count == 1


def test_malformed_manifest_is_refused_not_reported(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a": b"a"})
    manifest.write_text(f"{sha(b'a')}  a\n{sha(b'a')}  ../etc/passwd\n")
    with pytest.raises(ManifestError, match=rf"^{manifest}:2: '\.\.' in path"):
        verify_dataset(root, manifest)


def test_unsafe_tree_is_refused(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a": b"a"})
    os.symlink("/etc/passwd", root / "passwd")
    with pytest.raises(TreeError, match="absolute target"):
        verify_dataset(root, manifest)


def test_file_gone_when_its_turn_comes_is_reported_as_vanished(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a": b"a", "b": b"b"})
    got = hash_files([str(root / "a"), str(root / "vanished"), str(root / "b")], [1, 1, 1])
    assert got.vanished == [1] and got.hex(0) == sha(b"a") and got.hex(2) == sha(b"b")
    st = os.stat(root / "b")
    assert got.key(2) == stat_key(st) and list(got.sizes()) == [1, 0, 1]


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    root, manifest = make_dataset(tmp_path, {"a": b"a"})
    (root / "a").chmod(0)
    with pytest.raises(HermeticError, match="/a: cannot read"):
        verify_dataset(root, manifest, full=True)


# ---------------------------------------------------------------- the hashing engine


def test_worker_threads_hash_like_hashlib(tmp_path: Path) -> None:
    files = []
    for i in range(120):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(300_000 + i))  # ~36 MB: over the in-process limit
        files.append(str(p))
    expected = [sha(Path(p).read_bytes()) for p in files]
    for sizes in ([os.path.getsize(p) for p in files], None):  # batches by bytes, or by count
        got = hash_files(files, sizes, workers=2)
        assert got.hexes() == expected and got.vanished == []
        assert [got.key(i) for i in range(len(files))] == [stat_key(os.stat(p)) for p in files]


@pytest.mark.parametrize("n", [10, 300])  # hashed in this thread, or by worker threads
def test_a_file_that_cannot_be_read_is_named_after_the_rest_is_hashed(tmp_path: Path, n: int) -> None:
    files = [tmp_path / f"f{i:03d}" for i in range(n)]
    for p in files:
        p.write_bytes(p.name.encode())
    files[n // 2].unlink()
    files[n // 2].mkdir()  # what a dataset file can turn into between the scan and its turn
    with pytest.raises(HermeticError, match=rf"^{files[n // 2]}: cannot read: no longer a regular file$"):
        hash_files([str(p) for p in files], workers=2)


def test_full_verify_hashes_while_other_threads_run(tmp_path: Path) -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        root, manifest = make_dataset(tmp_path, {f"f{i}": os.urandom(400_000) for i in range(100)})
        assert verify_dataset(root, manifest, full=True, workers=2).ok
    finally:
        stop.set()
        t.join()


def test_plan_gives_large_files_their_own_batch_biggest_first() -> None:
    sizes = [10] * 5000 + [500 << 20] + [10] * 10
    batches = plan(sizes, len(sizes), 2)
    assert batches[0] == (5000, 5001)
    assert sorted(i for s, e in batches for i in range(s, e)) == list(range(len(sizes)))
    assert max(e - s for s, e in batches) <= 2000
    by_count = plan(None, 100_000, 2)
    assert sorted(i for s, e in by_count for i in range(s, e)) == list(range(100_000))
    assert len(by_count) >= 16


def test_hashing_nothing(tmp_path: Path) -> None:
    hashed = hash_files([], workers=2)
    assert len(hashed) == 0 and hashed.keys == b"" and hashed.vanished == []


def test_scan_error_comes_before_a_manifest_error_as_when_scanning_first(tmp_path: Path) -> None:
    root, manifest = make_dataset(tmp_path, {"a": b"a", "b": b"b"})
    manifest.write_text(f"{sha(b'a')}  a\n{sha(b'b')}  ../b\n")
    with pytest.raises(ManifestError, match=r":2: '\.\.' in path"):
        verify_dataset(root, manifest, full=True, workers=2)
    os.mkfifo(root / "fifo")
    with pytest.raises(TreeError, match="fifo: a FIFO"):
        verify_dataset(root, manifest, full=True, workers=2)
    manifest.write_bytes(format_manifest({"a": sha(b"a")}))
    with pytest.raises(TreeError, match="fifo: a FIFO"):
        verify_dataset(root, manifest, full=True, workers=2)


def test_file_deleted_while_the_workers_hash_is_vanished_or_was_hashed_before(tmp_path: Path) -> None:
    root, _ = make_dataset(tmp_path, {f"f{i:04d}": b"x" * i for i in range(2000)})
    tree = scan_tree(os.path.realpath(root))
    hashed = hash_files(tree.abs_paths, workers=2, while_hashing=lambda: (root / tree.paths[-1]).unlink())
    last = len(tree.paths) - 1  # hashed by the worker before it was deleted, or found gone
    assert (hashed.vanished == [last] and hashed.hex(last) == "0" * 64) or (
        hashed.vanished == [] and hashed.hex(last) == sha(b"x" * int(tree.paths[last][1:])))
    assert all(hashed.hex(i) == sha(b"x" * int(p[1:])) for i, p in enumerate(tree.paths[:-1]))


def test_full_verify_rewrites_a_cache_too_recent_to_trust_as_a_whole(tmp_path: Path) -> None:
    """Entries recorded within ~2 s of their files' stamps would send every warm verify
    down the entry-by-entry path: --full records them again, at its own (later) time."""
    root, manifest = make_dataset(tmp_path, {f"f{i}": bytes([i]) * 10 for i in range(50)})
    real = os.path.realpath(root)
    cache = StatCache.for_tree(real)
    tree = scan_tree(real, stat=False)
    hashed = hash_files(tree.abs_paths, workers=1)
    newest = max(max(os.stat(p).st_mtime_ns, os.stat(p).st_ctime_ns) for p in tree.abs_paths)
    cache.replace(tree.abs_paths, hashed.keys_little_endian(), newest, hashed.digests)  # racy: same tick
    cache.set_note(b"verified-manifest-sha256:" + sha(manifest.read_bytes()).encode())
    cache.save()
    before = cache.file.stat()
    assert verify_dataset(root, manifest, full=True, workers=2).ok
    assert cache.file.stat().st_ino != before.st_ino  # rewritten, with this verify's own recorded time


# ---------------------------------------------------------------- hermetic.yaml datasets


def write_config(project: Path, datasets: str) -> None:
    (project / "hermetic.yaml").write_text(
        "name: demo\n"
        f"base: debian@sha256:{'0' * 64}\n"
        "datasets:\n" + datasets
    )


def test_configured_datasets_resolve_against_the_config_directory(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "data" / "train").mkdir(parents=True)
    (project / "data" / "train" / "x").write_bytes(b"x")
    (project / "manifests").mkdir()
    m = build_manifest(project / "data" / "train")
    (project / "manifests" / "train.sha256").write_bytes(format_manifest(m.entries))
    write_config(project, "  - {name: train, path: data/train, manifest: manifests/train.sha256, mount: /data/train}\n")
    cfg = parse_config((project / "hermetic.yaml").read_text(), project / "hermetic.yaml")
    [res] = verify_configured(cfg)
    assert res.name == "train" and res.mount == "/data/train" and res.report.ok
    assert res.report.manifest_sha256 == m.sha256
    with pytest.raises(UsageError, match="no dataset named 'val'"):
        verify_configured(cfg, ["val"])


def test_configured_dataset_with_missing_directory_names_the_dataset(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "m.sha256").write_text("")
    write_config(project, "  - {name: train, path: nowhere, manifest: m.sha256, mount: /data/train}\n")
    cfg = parse_config((project / "hermetic.yaml").read_text(), project / "hermetic.yaml")
    with pytest.raises(HermeticError, match=r"^dataset 'train' \(.*hermetic.yaml\): .*nowhere: no such directory"):
        verify_configured(cfg)


def test_verified_manifest_shortcut_needs_the_same_manifest_and_tree(tmp_path: Path) -> None:
    """A warm verify skips parsing a manifest the cache already matched -- only that manifest, that tree."""
    root, manifest = make_dataset(tmp_path, {"a": b"a", "b": b"b"})
    real = os.path.realpath(root)
    cache = StatCache.for_tree(real)
    names = ["a", "b"]
    # Entries recorded well after the files were written, as on any dataset older than a few seconds.
    cache.put_many([f"{real}/{n}" for n in names], [stat_key(os.stat(root / n)) for n in names],
                   [sha(b"a"), sha(b"b")], time.time_ns() + 5_000_000_000)
    cache.save()
    assert verify_dataset(root, manifest).ok
    assert StatCache.for_tree(real).note.endswith(sha(manifest.read_bytes()).encode())
    assert verify_dataset(root, manifest).ok

    other = tmp_path / "other.sha256"
    other.write_text(f"{sha(b'x')}  a\n{sha(b'b')}  b\n")
    r = verify_dataset(root, other)
    assert r.changed == [("a", sha(b"x"), sha(b"a"))] and r.manifest_sha256 == sha(other.read_bytes())
    assert verify_dataset(root, manifest).ok

    (root / "b").write_bytes(b"B")
    assert verify_dataset(root, manifest).changed == [("b", sha(b"b"), sha(b"B"))]
    (root / "c").write_bytes(b"c")
    assert verify_dataset(root, manifest).extra == ["c"]


@pytest.mark.parametrize("full", [True, False])
def test_file_deleted_between_scan_and_hashing_is_missing(tmp_path: Path, full: bool) -> None:
    from hermetic.data.scan import scan_tree
    from hermetic.data.verify import _Job

    root, manifest = make_dataset(tmp_path, {"a": b"a", "b": b"b", "c": b"c"})
    settle()
    real = os.path.realpath(root)
    tree = scan_tree(real, stat=not full)
    (root / "b").unlink()  # after the scan listed it, before its turn to be hashed
    cache = StatCache(tmp_path / "other-cache.bin")  # empty: every file must be hashed
    job = _Job(real, manifest, manifest.read_bytes(), tree, cache, time.time_ns(), None, None)
    r = job.full() if full else job.with_stat_cache()
    assert r.missing == ["b"] and r.extra == [] and r.changed == []
    assert StatCache(tmp_path / "other-cache.bin").get_many(
        [f"{real}/a", f"{real}/b"], [stat_key(os.stat(root / "a")), (0, 0, 0, 0, 0)]) == [sha(b"a"), None]
