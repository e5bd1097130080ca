"""hermetic.hostfs.safetree and hermetic.hostfs.privdrop: trees a script wrote, handled without following a link."""

from __future__ import annotations

import os
import signal
import stat
import threading
from pathlib import Path

import pytest

from hermetic.hostfs import privdrop, safetree
from hermetic.core.errors import HermeticError
from hermetic.record.outputs import hash_outputs, metrics_summary
from hermetic.run.workdir import collect


@pytest.fixture
def host(tmp_path) -> Path:
    """What lies outside the tree: a canary file and a sentinel directory, both must stay untouched."""
    h = tmp_path / "host"
    (h / "sentinel").mkdir(parents=True)
    (h / "canary.txt").write_text("host secret 4711\n")
    return h


def _untouched(host: Path) -> None:
    assert sorted(p.name for p in (host / "sentinel").iterdir()) == []
    assert (host / "canary.txt").read_text() == "host secret 4711\n"


def _rootfd(path: Path) -> int:
    return safetree.open_root(path)


def test_walk_never_enters_a_directory_link(tmp_path, host):
    t = tmp_path / "t"
    (t / "real").mkdir(parents=True)
    (t / "real" / "a.txt").write_text("a")
    os.symlink(host / "sentinel", t / "victimdir")
    os.symlink("../../..", t / "escdir")
    fd = _rootfd(t)
    try:
        entries = {e.rel: (e.kind, e.target) for e in safetree.walk(fd)}
    finally:
        os.close(fd)
    assert entries == {"escdir": ("symlink", "../../.."), "real": ("dir", None), "real/a.txt": ("file", None),
                       "victimdir": ("symlink", str(host / "sentinel"))}


def test_open_regular_refuses_links_fifos_and_link_components(tmp_path, host):
    t = tmp_path / "t"
    t.mkdir()
    os.symlink(host / "canary.txt", t / "metrics.jsonl")
    os.symlink(host, t / "up")
    os.mkfifo(t / "pipe")
    (t / "ok").write_bytes(b"ok")
    fd = _rootfd(t)
    try:
        for rel in ("metrics.jsonl", "up/canary.txt", "pipe"):
            with pytest.raises((safetree.UnsafePath, OSError)):
                f = safetree.open_regular(fd, rel)
                os.close(f)  # pragma: no cover - must not get here
        f = safetree.open_regular(fd, "ok")
        assert os.read(f, 10) == b"ok"
        os.close(f)
        with pytest.raises(safetree.UnsafePath):
            safetree.read_limited(fd, "ok", 1)
    finally:
        os.close(fd)


def test_open_regular_refuses_escapes(tmp_path, host):
    t = tmp_path / "t"
    t.mkdir()
    os.symlink(host, t / "up")
    fd = _rootfd(t)
    try:
        for rel in ("up/canary.txt", "../host/canary.txt", "/etc/passwd"):
            with pytest.raises(safetree.UnsafePath):
                os.close(safetree.open_regular(fd, rel))
    finally:
        os.close(fd)


def test_move_never_writes_through_a_link(tmp_path, host):
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "victimdir").mkdir(parents=True)
    (ws / "victimdir" / "PWNED.txt").write_text("pwned")
    out.mkdir()
    os.symlink(host / "sentinel", out / "victimdir")
    wfd, ofd = _rootfd(ws), _rootfd(out)
    try:
        with pytest.raises(safetree.UnsafePath):
            safetree.move(wfd, "victimdir/PWNED.txt", ofd, "victimdir/PWNED.txt")
    finally:
        os.close(wfd)
        os.close(ofd)
    _untouched(host)


def test_names_are_recorded_reversibly():
    raw = [b"plain.txt", b"caf\xc3\xa9.txt", b"bad\xff\xfename", b"100%.txt", b"new\nline", b"back\\slash",
           b"esc\x1b[31m", b"c1\xc2\x85"]
    for b in raw:
        name = os.fsdecode(b)
        rec = safetree.record_name(name)
        rec.encode("utf-8")  # always valid UTF-8
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in rec)
        assert "\\" not in rec
        assert os.fsencode(safetree.fs_name(rec)) == b
    assert safetree.record_name("café.txt") == "café.txt"
    assert safetree.record_name(os.fsdecode(b"bad\xff")) == "bad%FF"
    assert safetree.record_name("100%.txt") == "100%25.txt"


def test_hash_outputs_records_links_special_files_and_odd_names(tmp_path, host):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "w.bin").write_bytes(b"weights")
    os.symlink(host / "canary.txt", out / "metrics.jsonl")
    os.symlink(host, out / "devdir")
    os.mkfifo(out / "fifo")
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(out / "sock"))
    (out / os.fsdecode(b"odd\xffname")).write_bytes(b"x")
    done = []
    t = threading.Thread(target=lambda: done.append(hash_outputs(out)), daemon=True)
    t.start()
    t.join(20)  # a FIFO that was opened would block here
    s.close()
    assert done, "hash_outputs blocked"
    files = done[0]["files"]
    assert files["sub/w.bin"]["size"] == 7
    assert files["metrics.jsonl"]["symlink"] == str(host / "canary.txt")
    assert files["metrics.jsonl"]["size"] == len(str(host / "canary.txt"))
    assert files["devdir"]["symlink"] == str(host)
    assert files["fifo"]["type"] == "fifo" and files["sock"]["type"] == "socket"
    assert "odd%FFname" in files
    assert metrics_summary(out / "metrics.jsonl") == {"final": {}, "steps": None}


def test_collect_keeps_nothing_behind_a_link(tmp_path, host):
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "victimdir").mkdir(parents=True)
    (ws / "victimdir" / "PWNED.txt").write_text("pwned")
    (ws / "escdir").mkdir()
    (ws / "escdir" / "x.txt").write_text("x")
    (ws / "devdir").mkdir()
    (ws / "devdir" / "zero").write_text("z")
    (ws / "model.pt").write_bytes(b"m")
    out.mkdir()
    os.symlink(host / "sentinel", out / "victimdir")
    os.symlink("../../..", out / "escdir")
    os.symlink("/dev", out / "devdir")
    done = []
    t = threading.Thread(target=lambda: done.append(collect(ws, {}, out, include=["**"], exclude=[], skip=[])),
                         daemon=True)
    t.start()
    t.join(20)
    assert done, "collect hung (read /dev/zero?)"
    r = done[0]
    assert r.collected == ["model.pt"]
    assert sorted(r.conflicts) == ["devdir/zero", "escdir/x.txt", "victimdir/PWNED.txt"]
    _untouched(host)
    assert not (tmp_path.parent / "x.txt").exists()


def test_deep_trees_are_bounded(tmp_path):
    t = tmp_path / "t"
    t.mkdir()
    fd = _rootfd(t)
    cur = os.dup(fd)
    for _ in range(safetree.MAX_DEPTH + 20):
        os.mkdir("d", dir_fd=cur)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=cur))
    os.close(cur)
    notes: list[str] = []
    try:
        deep = []
        list(safetree.walk(fd, on_too_deep=deep.append))
        assert len(deep) == 1
    finally:
        os.close(fd)
    assert hash_outputs(t, notes)["files"] == {}
    assert len(notes) == 1 and "deeper than" in notes[0]


def test_lchown_tree_changes_links_not_targets(tmp_path, host):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    t = tmp_path / "t"
    (t / "d").mkdir(parents=True)
    (t / "d" / "f").write_text("f")
    os.symlink(host / "canary.txt", t / "link")
    before = os.stat(host / "canary.txt")
    fd = _rootfd(t)
    try:
        safetree.lchown_tree(fd, 1234, 1234)
    finally:
        os.close(fd)
    assert os.stat(t / "d" / "f").st_uid == 1234 and os.lstat(t / "link").st_uid == 1234
    after = os.stat(host / "canary.txt")
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)



def test_lchown_tree_leaves_a_skipped_subtree_as_it_is(tmp_path):
    """The primary node's give-back must not take another node's run directory while that node still
    collects into it as the container's user (a race seen on a two-node Slurm run: exit 73)."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    t = tmp_path / "run"
    (t / "outputs").mkdir(parents=True)
    (t / "nodes" / "n1" / "ranks").mkdir(parents=True)
    for p in (t / "outputs", t / "nodes" / "n1", t / "nodes" / "n1" / "ranks"):
        os.chown(p, 1000, 1000)
    fd = _rootfd(t)
    try:
        safetree.lchown_tree(fd, 0, 0, skip=lambda rel: rel == "nodes")
    finally:
        os.close(fd)
    assert os.stat(t / "outputs").st_uid == 0
    assert os.stat(t / "nodes" / "n1").st_uid == 1000 and os.stat(t / "nodes" / "n1" / "ranks").st_uid == 1000


# ---------------------------------------------------------------- privdrop


def _write(_fds, path: str) -> str:
    Path(path).write_text("written")
    return "ok"


def _whoami(_fds) -> list[int]:
    return [os.getuid(), os.geteuid(), os.getgid(), len(os.getgroups())]


def _read(_fds, path: str) -> str:
    return Path(path).read_text()


def _fail(_fds) -> None:
    from hermetic.core.errors import DataError

    raise DataError("the child's own error", hint="its hint")


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_call_as_drops_to_the_user(tmp_path):
    assert privdrop.call_as(4321, 4321, _whoami) == [4321, 4321, 4321, 0]
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o755)
    with pytest.raises(RuntimeError, match="PermissionError"):
        privdrop.call_as(4321, 4321, _write, str(root_only / "x"))
    assert not (root_only / "x").exists()
    secret = tmp_path / "secret"
    secret.write_text("s")
    os.chmod(secret, 0o600)
    with pytest.raises(RuntimeError, match="PermissionError"):
        privdrop.call_as(4321, 4321, _read, str(secret))
    assert privdrop.call_as(4321, 4321, _read, str(secret), read_any=True) == "s"
    with pytest.raises(RuntimeError, match="PermissionError"):  # read_any reads; it still cannot write
        privdrop.call_as(4321, 4321, _write, str(root_only / "x"), read_any=True)
    with pytest.raises(HermeticError) as ei:
        privdrop.call_as(4321, 4321, _fail)
    assert ei.value.exit_code == 65 and ei.value.message == "the child's own error" and ei.value.hint == "its hint"


def _parent_death_signal(_fds) -> int:
    import ctypes

    sig = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return sig.value


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_the_child_as_the_user_still_dies_with_its_parent():
    """A change of user clears the parent-death signal (the kernel's rule): the child sets it again after."""
    assert privdrop.call_as(4321, 4321, _parent_death_signal) == signal.SIGKILL
    assert privdrop.call_as(4321, 4321, _parent_death_signal, read_any=True) == signal.SIGKILL


def test_call_as_runs_inline_when_there_is_nothing_to_drop():
    assert privdrop.call_as(os.geteuid(), os.getegid(), _whoami)[0] == os.getuid()


def _hash_at(fds, path: str) -> dict:
    from hermetic.record.outputs import hash_outputs_at

    return hash_outputs_at(fds[path])["files"]


def test_the_user_needs_no_right_to_search_the_parents(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("dropping privileges needs root")
    private = tmp_path / "home"  # like /root: 0700
    out = private / "proj" / "runs" / "r" / "outputs"
    out.mkdir(parents=True)
    os.chmod(private, 0o700)
    (out / "w.bin").write_bytes(b"w")
    os.chown(out, 4321, 4321)
    assert privdrop.call_as(4321, 4321, _hash_at, str(out), open_dirs=[str(out)])["w.bin"]["size"] == 1


def test_chmod_000_files_of_the_owner_are_still_hashed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "locked").write_bytes(b"abc")
    os.chmod(out / "locked", 0)
    if os.geteuid() == 0:
        os.chown(out, 4321, 4321)
        os.chown(out / "locked", 4321, 4321)
        files = privdrop.call_as(4321, 4321, _hash_at, str(out), open_dirs=[str(out)])
    else:
        files = hash_outputs(out)["files"]
    assert files["locked"]["size"] == 3
    assert stat.S_IMODE(os.stat(out / "locked").st_mode) & 0o400
