"""Locks no worker inherits, temp files tied to their writer, workers that die with their parent.

Each writer and holder here is a real process killed with a real SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hermetic.hostfs.fsutil import OwnedTemp, atomic_write_bytes, is_atomic_temp, sweep_dead
from hermetic.core.workers import pid_alive

REPO = Path(__file__).resolve().parent.parent


def start(script: str, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """Run a Python script in its own session; wait for its "ready ..." line; (process, words after ready)."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE, text=True,
                         cwd=REPO, start_new_session=True)
    line = p.stdout.readline().split()
    assert line and line[0] == "ready", line
    return p, line[1:]


def kill(p: subprocess.Popen) -> None:
    os.kill(p.pid, signal.SIGKILL)  # the process only: whatever it started is on its own
    p.wait()


def gone_within(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid) or _state(pid) == "Z":
            return True
        time.sleep(0.02)
    return False


def reap_all(pids) -> None:
    """SIGKILL what is left (a failing test leaves nothing running)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def try_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_lock_is_not_inherited_by_a_forked_child(tmp_path):
    """The holder forks a child that lives on (as a pool worker would) and is SIGKILLed: the lock is free."""
    lock = tmp_path / ".build.lock"
    p, (child,) = start("""
        import os, sys, time
        from hermetic.hostfs.filelocks import file_lock
        with file_lock(sys.argv[1]):
            if os.fork() == 0:  # (the child prints: by then it has let go of its copy)
                print("ready", os.getpid(), flush=True)
                time.sleep(120)
                os._exit(0)
            time.sleep(120)
    """, str(lock))
    try:
        assert not try_lock(lock)  # held while its holder lives
        kill(p)
        assert pid_alive(int(child))  # the child lives on ...
        assert try_lock(lock)  # ... and holds nothing
    finally:
        os.kill(int(child), signal.SIGKILL)


def test_a_zombie_is_not_alive():
    """A command SIGKILLed and not yet reaped by its parent is a zombie: gone, for the workers that check."""
    from hermetic.core.workers import pid_alive

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while _state(pid) != "Z":  # ended, not reaped
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not pid_alive(pid)
        assert pid_alive(os.getpid())
    finally:
        os.waitpid(pid, 0)
    assert not pid_alive(pid)


def test_pool_workers_die_with_their_parent(tmp_path):
    """hermetic.core.workers.die_with_parent as a pool's initializer: SIGKILL the parent, the workers follow."""
    p, pids = start("""
        import os, time
        from concurrent.futures import ProcessPoolExecutor
        from hermetic.core.workers import die_with_parent
        pool = ProcessPoolExecutor(2, initializer=die_with_parent, initargs=(os.getpid(),))
        pool.submit(os.getpid).result()  # (a fork pool starts all its workers at the first submit)
        print("ready", *pool._processes, flush=True)
        time.sleep(120)
    """)
    assert len(pids) == 2
    kill(p)
    try:
        assert all(gone_within(int(pid)) for pid in pids), [(pid, _state(int(pid))) for pid in pids]
    finally:
        reap_all(int(pid) for pid in pids)


def test_a_dead_writers_temp_file_is_swept_and_a_live_ones_is_not(tmp_path):
    live = OwnedTemp(tmp_path, "blob.")  # this process's: alive
    os.write(live.fd, b"x" * 100)
    p, (path,) = start("""
        import os, sys, time
        from hermetic.hostfs.fsutil import OwnedTemp
        t = OwnedTemp(sys.argv[1], "blob.")
        os.write(t.fd, b"y" * 12345)
        print("ready", t.path, flush=True)
        time.sleep(120)
    """, str(tmp_path))
    assert sweep_dead(tmp_path, remove=False).count == 0  # both writers alive
    kill(p)
    listed = sweep_dead(tmp_path, remove=False)
    assert (listed.count, listed.bytes, listed.paths) == (1, 12345, [path])
    assert Path(path).exists()
    removed = sweep_dead(tmp_path)
    assert (removed.count, removed.bytes) == (1, 12345)
    assert not Path(path).exists() and live.path.exists()
    live.discard()
    assert not list(tmp_path.iterdir())


def test_atomic_writer_leaves_no_temp_file_and_a_killed_one_is_dead(tmp_path):
    target = tmp_path / "index.json"
    atomic_write_bytes(target, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]
    p, _ = start("""
        import sys, time
        from hermetic.hostfs.fsutil import atomic_writer
        with atomic_writer(sys.argv[1]) as f:
            f.write(b"half")
            f.flush()
            print("ready", flush=True)
            time.sleep(120)
    """, str(target))
    kill(p)
    assert target.read_bytes() == b"{}"
    assert sweep_dead(tmp_path, is_atomic_temp).count == 1
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_a_dead_owners_staging_directory_goes_with_its_lock(tmp_path):
    """owned_temp_dir (a bootstrap's rootfs, an engine image being saved): a SIGKILLed owner's directory
    is removed, with its lock file, and counted; a live owner's is not touched."""
    from hermetic.hostfs.fsutil import owned_temp_dir

    with owned_temp_dir(tmp_path, "bootstrap.") as live:
        (live / "rootfs.tar").write_bytes(b"l" * 10)
        p, (path,) = start("""
            import sys, time
            from hermetic.hostfs.fsutil import owned_temp_dir
            with owned_temp_dir(sys.argv[1], "bootstrap.") as d:
                (d / "rootfs.tar").write_bytes(b"r" * 5000)
                print("ready", d, flush=True)
                time.sleep(120)
        """, str(tmp_path))
        assert sweep_dead(tmp_path).count == 0
        kill(p)
        removed = sweep_dead(tmp_path)
        assert (removed.count, removed.bytes) == (1, 5000)
        assert not Path(path).exists() and not Path(path + ".lock").exists()
        assert (live / "rootfs.tar").exists()
    assert not list(tmp_path.iterdir())
