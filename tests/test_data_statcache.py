"""StatCache: keys, git's racy-clean rule, atomic storage, tolerance of a broken file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hermetic.data.statcache import StatCache, is_racy, stat_key
from hermetic.core.paths import cache_paths

S = 1_000_000_000
MS = 1_000_000
D1 = hashlib.sha256(b"1").hexdigest()
D2 = hashlib.sha256(b"2").hexdigest()
# An ext4-like timestamp: nanoseconds, not a round number.
T = 1_700_000_000 * S + 123_456_789


def key(mtime: int = T, ctime: int = T, size: int = 10, ino: int = 7) -> tuple[int, int, int, int, int]:
    return (2049, ino, size, mtime, ctime)


def test_hit_only_when_all_five_fields_match(tmp_path: Path) -> None:
    c = StatCache(tmp_path / "c.bin")
    c.put("/d/a", key(), D1, T + 10 * S)
    c.save()
    c = StatCache(tmp_path / "c.bin")
    assert c.get("/d/a", key()) == D1
    assert c.get("/d/a", key(size=11)) is None
    assert c.get("/d/a", key(ino=8)) is None
    assert c.get("/d/a", key(mtime=T + 1)) is None
    assert c.get("/d/a", key(ctime=T + 1)) is None
    assert c.get("/d/a", (2050, 7, 10, T, T)) is None
    assert c.get("/d/other", key()) is None


def test_racy_clean_rule_mtime_not_older_than_recording_is_not_trusted() -> None:
    # Recorded in the same instant, or before the file's timestamp: never trusted.
    assert is_racy(T, T, T)
    assert is_racy(T + S, T + S, T)
    # Within the coarse-clock slack (the kernel stamps files up to a tick behind time_ns()).
    assert is_racy(T, T, T + 10 * MS)
    # Clearly older than the recording: trusted.
    assert not is_racy(T, T, T + 100 * MS)
    # ctime counts too: a file whose mtime was set back but was changed just now.
    assert is_racy(T - 100 * S, T, T + 10 * MS)


def test_racy_slack_grows_with_timestamp_granularity() -> None:
    whole_second = 1_700_000_000 * S  # FAT/HFS+/ext3 store seconds only
    assert is_racy(whole_second, whole_second, whole_second + 1500 * MS)
    assert not is_racy(whole_second, whole_second, whole_second + 3 * S)
    assert not is_racy(T, T, T + 1500 * MS)


def test_racy_entry_is_not_returned(tmp_path: Path) -> None:
    c = StatCache(tmp_path / "c.bin")
    c.put("/d/a", key(), D1, T)  # recorded at the file's own mtime
    c.put("/d/b", key(ino=9), D2, T + S)
    assert c.get("/d/a", key()) is None
    assert c.get("/d/b", key(ino=9)) == D2
    c.save()
    assert StatCache(tmp_path / "c.bin").get_many(["/d/a", "/d/b"], [key(), key(ino=9)]) == [None, D2]


def test_bulk_lookup_matches_per_entry_lookup(tmp_path: Path) -> None:
    paths = [f"/d/{i}" for i in range(50)]
    keys = [key(ino=i) for i in range(50)]
    digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(50)]
    c = StatCache(tmp_path / "c.bin")
    c.put_many(paths, keys, digests, T + 10 * S)
    c.retain(paths)
    c.save()
    c = StatCache(tmp_path / "c.bin")
    assert c.digests_if_unchanged(paths, keys) == b"".join(bytes.fromhex(d) for d in digests)
    assert c.get_many(paths, keys) == digests
    # One changed key, a different order, or a missing path: no bulk answer, per-entry still right.
    changed = keys[:49] + [key(ino=49, size=99)]
    assert c.digests_if_unchanged(paths, changed) is None
    assert c.get_many(paths, changed) == digests[:49] + [None]
    assert c.digests_if_unchanged(paths[::-1], keys[::-1]) is None
    assert c.digests_if_unchanged(paths[:49], keys[:49]) is None


def test_retain_drops_entries_of_files_that_are_gone(tmp_path: Path) -> None:
    c = StatCache(tmp_path / "c.bin")
    c.put("/d/a", key(), D1, T + S)
    c.put("/d/b", key(ino=9), D2, T + S)
    c.save()
    c = StatCache(tmp_path / "c.bin")
    c.retain(["/d/b"])
    c.save()
    c = StatCache(tmp_path / "c.bin")
    assert len(c) == 1 and c.get("/d/a", key()) is None and c.get("/d/b", key(ino=9)) == D2


def test_note_is_cleared_by_any_change(tmp_path: Path) -> None:
    c = StatCache(tmp_path / "c.bin")
    c.put("/d/a", key(), D1, T + S)
    c.set_note(b"verified")
    c.save()
    c = StatCache(tmp_path / "c.bin")
    assert c.note == b"verified"
    c.put("/d/a", key(), D2, T + S)
    assert c.note == b""


def test_save_is_atomic_and_writes_only_when_changed(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "c.bin"
    c = StatCache(f)
    c.save()
    assert not f.exists()
    c.put("/d/a", key(), D1, T + S)
    c.save()
    assert f.exists() and [p.name for p in f.parent.iterdir()] == ["c.bin"]  # no temp file left
    before = f.stat().st_mtime_ns
    c = StatCache(f)
    assert c.get("/d/a", key()) == D1
    c.save()
    assert f.stat().st_mtime_ns == before


@pytest.mark.parametrize("damage", [b"", b"garbage", None])
def test_unreadable_cache_file_is_an_empty_cache(tmp_path: Path, damage: bytes | None) -> None:
    f = tmp_path / "c.bin"
    c = StatCache(f)
    c.put("/d/a", key(), D1, T + S)
    c.save()
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage is None else damage)  # truncated, empty, foreign
    c = StatCache(f)
    assert c.get("/d/a", key()) is None and len(c) == 0
    c.put("/d/a", key(), D1, T + S)
    c.save()
    assert StatCache(f).get("/d/a", key()) == D1


def test_paths_with_odd_characters_round_trip(tmp_path: Path) -> None:
    names = ["/d/with space", "/d/new\nline", "/d/caf\u00e9", "/d/" + os.fsdecode(b"\xff")]
    c = StatCache(tmp_path / "c.bin")
    for i, n in enumerate(names):
        c.put(n, key(ino=i), D1, T + S)
    c.save()
    c = StatCache(tmp_path / "c.bin")
    assert [c.get(n, key(ino=i)) for i, n in enumerate(names)] == [D1] * 4


def test_for_tree_lives_under_hermetic_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    c = StatCache.for_tree("/data/train")
    assert c.file.parent == cache_paths().statcache == (tmp_path / "cache" / "statcache").resolve()
    assert StatCache.for_tree("/data/train").file == c.file != StatCache.for_tree("/data/val").file


def test_stat_key_of_a_real_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    st = os.stat(p)
    assert stat_key(st) == (st.st_dev, st.st_ino, 3, st.st_mtime_ns, st.st_ctime_ns)
