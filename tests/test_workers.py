"""hermetic.core.workers.start: the one fork-and-pipe of hermetic's workers.

Every worker here is a real forked process; the ones that die are killed with a real SIGKILL, and a
process that could hang runs under a timeout (the timeout is the failure).
"""

from __future__ import annotations

import os
import signal
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

