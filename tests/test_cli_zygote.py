"""The tests' CLI zygote (tests/cli_zygote.py) gives what a new `python -m hermetic` gives.

Most tests start `hermetic` through conftest.run_cli, which forks it from a
process that has imported hermetic already; what a test asserts about the
command (exit code, stdout, stderr, the files it wrote where) must not depend
on that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from cli_zygote import Zygote, startup_env

CONFIG = "name: demo\nbase: hermetic/debian-bookworm-python3@sha256:" + "a" * 64 + "\n"


@pytest.fixture(scope="module")
def zygote():
    """A zygote of this module's own (run_cli's may be turned off: HERMETIC_TEST_NO_ZYGOTE)."""
    z = Zygote()
    yield z
    z.stop()


def fresh(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermetic", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args", [["--version"], ["nonsense"], ["config", "show", "--json"], ["runs", "--json"],
                                  ["build", "-C", "no-such-dir"]])
def test_a_forked_command_is_a_new_interpreters_command(args, zygote, tmp_path, monkeypatch):
    (tmp_path / "hermetic.yaml").write_text(CONFIG)
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    env = dict(os.environ)
    forked = zygote.run(args, cwd=tmp_path, env=env, timeout=120)
    new = fresh(*args, cwd=tmp_path, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)


def test_the_working_directory_environment_and_umask_are_the_callers(zygote, tmp_path):
    (tmp_path / "hermetic.yaml").write_text(CONFIG.replace("demo", "from-cwd"))
    old = os.umask(0o077)
    try:
        proc = zygote.run(["config", "show", "--json"], cwd=tmp_path,
                          env={**os.environ, "HERMETIC_CACHE": str(tmp_path / "c"), "TZ": "Asia/Kolkata"},
                          timeout=120)
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    assert '"from-cwd"' in proc.stdout


def test_an_environment_that_changes_the_interpreter_gets_a_new_one(zygote):
    """PYTHON* and the locale are read at start-up: a fork would keep the zygote's, so run_cli starts
    a new interpreter for such an environment."""
    assert zygote.serves(dict(os.environ))
    assert not zygote.serves({**os.environ, "PYTHONHASHSEED": "123"})
    assert not zygote.serves({**os.environ, "LC_ALL": "C"})
    assert startup_env({"PATH": "/bin", "LANG": "C.UTF-8", "PYTHONPATH": "x"}) == {"LANG": "C.UTF-8",
                                                                                 "PYTHONPATH": "x"}
    proc = conftest.run_cli("--version", env={"PYTHONHASHSEED": "123"})  # through a new interpreter
    assert proc.returncode == 0 and proc.stdout.startswith("hermetic, version ")


def test_a_command_past_its_timeout_is_killed_and_says_so(zygote, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        # a timeout already past when the command starts: killed, as subprocess.run would
        zygote.run(["--help"], cwd=tmp_path, env=dict(os.environ), timeout=0)
