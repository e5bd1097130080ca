"""hermetic.core.workers.start: the one fork-and-pipe of hermetic's workers, and the hashing built on it.

Every worker here is a real forked process; the ones that die are killed with a real SIGKILL, and a
process that could hang runs under a timeout (the timeout is the failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermetic.core import workers
from hermetic.data.scan import TreeError
from hermetic.core.errors import EXIT_OSERR, WorkerDied

REPO = Path(__file__).resolve().parent.parent


def _answer(*values):
    return list(values)


def _refuse():
    raise TreeError("a tree the worker refused", hint="its hint", details=["a line"])


def _bug():
    return {}["missing"]


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_a_worker_answers_what_it_returns():
    with workers.start("a test worker", _answer, 1, ("a", "\udcff")) as w:
        assert w.result() == [1, ["a", "\udcff"]]  # JSON: a tuple comes back a list, an odd name intact


def test_a_workers_error_is_raised_here_as_its_own_class():
    with pytest.raises(TreeError) as ei, workers.start("a test worker", _refuse) as w:
        w.result()
    assert (ei.value.message, ei.value.hint, ei.value.details, ei.value.exit_code) == (
        "a tree the worker refused", "its hint", ["a line"], TreeError.exit_code)


def test_a_bug_in_a_worker_is_a_bug_here_with_its_traceback():
    with pytest.raises(RuntimeError, match="KeyError: 'missing'"), workers.start("a test worker", _bug) as w:
        w.result()


def test_a_worker_killed_before_it_answered_is_one_line_71():
    with pytest.raises(WorkerDied, match="a test worker ended without an answer .signal SIGKILL.") as ei, \
            workers.start("a test worker", _die) as w:
        w.result()
    assert ei.value.exit_code == EXIT_OSERR


def test_leaving_the_block_ends_a_worker_that_did_not_answer():
    with pytest.raises(ValueError), workers.start("a test worker", signal.pause) as w:
        raise ValueError("the parent gives up")
    assert not workers.pid_alive(w.pid)
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(w.pid, os.WNOHANG)


def test_a_worker_holds_none_of_its_elder_siblings_pipes():
    """Each worker costs its parent a pipe, and only its parent: the fifth holds as many descriptors as the first."""
    started = [workers.start("a test worker", _open_descriptors) for _ in range(5)]
    try:
        counts = [w.result() for w in started]
    finally:
        for w in started:
            w.stop()
    assert len(set(counts)) == 1, counts


# ---------------------------------------------------------------- the hashing on it


def _run(script: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, **kw)


def _dataset(root: Path) -> None:
    for i in range(600):
        (root / f"d{i % 6}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 6}" / f"f{i}").write_bytes(os.urandom(512))


HASH_AND_SAY = """
    import os, signal, sys
    from pathlib import Path
    from hermetic.data import hashfiles
    from hermetic.core.errors import WorkerDied
    parent = os.getpid()
    real_drain = hashfiles.drain
    def dying(*a, **k):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
        return real_drain(*a, **k)
    hashfiles.drain = dying
    root = sys.argv[1]
    try:
        hashfiles.hash_files(sorted(str(p) for p in Path(root).rglob("f*")), workers=3, start_method="fork")
    except WorkerDied as e:
        print(e.exit_code, e)
"""


def test_a_hashing_worker_killed_midway_ends_the_hashing_in_one_line(tmp_path):
    """No hang waiting for a dead worker: its pipe ends, and the parent says so (exit 71)."""
    _dataset(tmp_path)
    proc = _run(HASH_AND_SAY, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{EXIT_OSERR} ") and "ended without an answer (signal SIGKILL)" in proc.stdout
    assert "a hashing worker process" in proc.stdout, proc.stdout


CTRL_C = """
    import os, sys, time
    from pathlib import Path
    from hermetic.data import hashfiles
    parent = os.getpid()
    real = hashfiles.drain
    def busy(*a, **k):
        if os.getpid() != parent:
            os.write(1, b"worker %d\\n" % os.getpid())  # one write: the two workers share the pipe
            time.sleep(120)
        return real(*a, **k)
    hashfiles.drain = busy
    hashfiles.hash_files(sorted(str(p) for p in Path(sys.argv[1]).rglob("f*")), workers=3, start_method="fork")
"""


def test_ctrl_c_ends_the_hashing_and_its_workers(tmp_path):
    """Ctrl-C reaches the whole process group: the workers leave it to the parent, which ends them."""
    _dataset(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CTRL_C), str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    try:
        pids = [int(p.stdout.readline().split()[1]) for _ in range(2)]
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert not any(workers.pid_alive(pid) for pid in pids)
