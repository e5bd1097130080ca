"""hermetic without root: a plain user account (no docker group, no sudo) builds, runs, diffs and replays.

The account is made here (useradd, with the /etc/subuid and /etc/subgid ranges rootless Podman maps its
containers into) and removed afterwards. Its cache starts with only the session's base image and the
locked wheels (copied in, as `hermetic base` and `hermetic fetch` would have put them there); then, as that
user: `hermetic build` (the builder is daemonless; hermetic.yaml's run.engine is podman, so the build copies
the image into the user's own containers-storage), `hermetic run` on rootless Podman and on Charliecloud
(the same hardening checked from inside, as test_run's lockdown test does), `hermetic diff` of the two and
`hermetic replay` of the first. What the containers wrote belongs to the user.

The session's interpreter may live where another user cannot reach it (a pyenv under /root): the account
then runs hermetic with the system's python3 of the same minor version and the session's packages on
PYTHONPATH (the compiled ones are for that ABI).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from run_support import copy_example
from test_run import LOCKDOWN

pytestmark = [pytest.mark.docker]

ACCOUNT = "hermetic-rootless"  # made and removed by this module
SUBID_COUNT = 65536


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a user account needs root (the suite runs as root on the test machines)")


def _processes_of(uid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _remove_account(name: str) -> None:
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    for pid in _processes_of(uid):  # rootless Podman's pause process, started for this account by this module
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["userdel", "-r", name], capture_output=True)
    # rootless Podman's run directories (no XDG_RUNTIME_DIR here): a next account of the same uid must not find
    # them, with the state of a storage that went with the home
    for d in (Path(f"/tmp/containers-user-{uid}"), Path(f"/tmp/podman-run-{uid}")):
        if d.is_dir() and d.stat().st_uid == uid:
            shutil.rmtree(d, ignore_errors=True)
    for f in ("/etc/subuid", "/etc/subgid"):  # userdel removes them; older shadow did not
        p = Path(f)
        if p.exists():
            p.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if not ln.startswith(f"{name}:")))


def _free_subid_start() -> int:
    starts = [100000]
    for f in ("/etc/subuid", "/etc/subgid"):
        try:
            for ln in Path(f).read_text().splitlines():
                parts = ln.split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    starts.append(int(parts[1]) + int(parts[2]))
        except OSError:
            pass
    return max(starts)


@pytest.fixture(scope="module")
def account():
    _root_only()
    _remove_account(ACCOUNT)  # a session that died left it
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", ACCOUNT], check=True, capture_output=True)
    pw = pwd.getpwnam(ACCOUNT)
    for f, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        if not any(ln.startswith(f"{ACCOUNT}:") for ln in Path(f).read_text().splitlines()):
            start = _free_subid_start()
            subprocess.run(["usermod", flag, f"{start}-{start + SUBID_COUNT - 1}", ACCOUNT], check=True,
                           capture_output=True)
    # rootless Podman picks vfs (a full copy per container) unless told; overlay is native on this kernel
    conf = Path(pw.pw_dir) / ".config" / "containers"
    conf.mkdir(parents=True)
    (conf / "storage.conf").write_text('[storage]\ndriver = "overlay"\n')
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(Path(pw.pw_dir) / ".config")], check=True)
    yield pw
    _remove_account(ACCOUNT)


def _interpreter(pw) -> tuple[list[str], dict[str, str]]:
    """How the account runs hermetic: this interpreter if it can reach it, else a copy of it (hard links: the
    standard library and the interpreter, not its site-packages) in the account's home, with the session's
    packages on PYTHONPATH. (Not the system's python3: Debian 12's 3.11.2 has no tarfile extraction filter.)"""
    try:
        probe = subprocess.run([sys.executable, "-c", "import hermetic"], user=pw.pw_uid, group=pw.pw_gid,
                               extra_groups=[], capture_output=True, env={"PATH": "/usr/bin:/bin"})
        if probe.returncode == 0:
            return [sys.executable, "-m", "hermetic"], {}
    except PermissionError:  # the interpreter itself is out of its reach (a pyenv under /root)
        pass
    base = Path(sys.base_prefix)
    mm = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dest = Path(pw.pw_dir) / "python"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(base / "lib" / mm, dest / "lib" / mm, copy_function=link,
                    ignore=lambda d, names: [n for n in names if n in ("site-packages", "test")
                                             and Path(d) == base / "lib" / mm])
    for lib in (base / "lib").glob(f"lib{mm}*.so*"):
        link(str(lib), str(dest / "lib" / lib.name))
    (dest / "bin").mkdir()
    link(os.path.realpath(sys.executable), str(dest / "bin" / mm))
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir() and p.startswith(sys.prefix))
    return [str(dest / "bin" / mm), "-m", "hermetic"], {"PYTHONPATH": f"{REPO}:{site}",
                                                        "LD_LIBRARY_PATH": str(dest / "lib")}


@pytest.fixture(scope="module")
def as_user(account, tmp_path_factory, session_cache, base_ref):
    """(run hermetic as the account, its project dir, its cache): the cache holding only the base and wheels."""
    pw = account
    home = Path(pw.pw_dir)
    project = copy_example("numpy-logreg", home / "numpy-logreg", base_ref)
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text() + "run:\n  engine: podman\n")
    cache = home / "cache"
    _seed_cache(session_cache, cache, base_ref, project)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(project), str(cache)], check=True)
    cmd, extra = _interpreter(pw)
    env = {"HOME": str(home), "USER": ACCOUNT, "LOGNAME": ACCOUNT, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "HERMETIC_CACHE": str(cache), "LANG": "C.UTF-8", **extra}

    def hermetic(*args: str, expect: int | None = 0, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run([*cmd, *args], cwd=project, env=env, user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=[], capture_output=True, text=True, timeout=timeout)
        if expect is not None:
            assert proc.returncode == expect, (args, proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    return hermetic, project, cache, pw


def _seed_cache(session_cache: Path, cache: Path, base_ref: str, project: Path) -> None:
    """The base image and the project's locked wheels, copied from the session's cache (nothing else)."""
    from hermetic.lock.model import Target
    from hermetic.lock.read import read_lock
    from hermetic.reference import parse_base_reference
    from hermetic.slurm.shared import copy_image
    from hermetic.store.fetch import resolve_from_store
    from hermetic.store.oci import OciStore
    from hermetic.store.wheels import WheelStore

    copy_image(OciStore(session_cache / "oci"), OciStore(cache / "oci"), parse_base_reference(base_ref).digest,
               "base:rootless")
    lock = read_lock(project / "requirements.lock", Target(python_version="3.11"))
    found, missing = resolve_from_store(lock, WheelStore(session_cache / "wheels"))
    assert not missing, missing
    store = WheelStore(cache / "wheels")
    for w in found:
        store.admit_file(Path(w.url or ""), {w.sha256})


def test_a_plain_user_builds_runs_diffs_and_replays_without_root_or_docker(as_user):
    hermetic, project, cache, pw = as_user
    groups = subprocess.run(["id", "-Gn", ACCOUNT], capture_output=True, text=True, check=True).stdout.split()
    assert "docker" not in groups and "sudo" not in groups and "root" not in groups
    built = json.loads(hermetic("build", "--json").stdout)  # daemonless; the load step copies it into Podman's
    assert built["loaded"] is True
    (project / "lockdown.py").write_text(LOCKDOWN)
    (project / "lockdown.py").chmod(0o644)
    os.chown(project / "lockdown.py", pw.pw_uid, pw.pw_gid)
    records = {}
    for engine in ("podman", "charliecloud"):
        rec = json.loads(hermetic("run", "--json", "--engine", engine, "train.py", "--epochs", "2").stdout)
        assert rec["record"]["status"] == "succeeded", rec["record"]
        e = rec["invocation"]["engine"]
        assert (e["name"], e["rootless"]) == (engine, True)
        assert rec["invocation"]["user"] == f"{pw.pw_uid}:{pw.pw_gid}"
        run_dir = project / "runs" / rec["record"]["run_id"]
        for p in [run_dir, *run_dir.rglob("*")]:  # what the container wrote is the user's, as is the record
            st = p.lstat()
            assert (st.st_uid, st.st_gid) == (pw.pw_uid, pw.pw_gid), p
        records[engine] = run_dir
        locked = json.loads(hermetic("run", "--json", "--engine", engine, "lockdown.py").stdout)
        seen = json.loads((project / "runs" / locked["record"]["run_id"] / "logs" / "stdout.log").read_text())
        for path in ("/etc/x", "/usr/x", "/data/logreg/x"):
            assert seen[path] == errno.EROFS, (engine, path, seen[path])
        assert seen["/outputs/x"] == "ok" and seen["/tmp/x"] == "ok" and seen["/workspace/x"] == "ok"
        assert seen["uid"] == pw.pw_uid and seen["no_new_privs"] == "1"
        assert {k: v for k, v in seen["caps"].items() if k != "CapBnd"} == dict.fromkeys(
            ("CapInh", "CapPrm", "CapEff", "CapAmb"), 0)
        assert seen["interfaces"] == ["lo"] and seen["sockets"] == []
        assert seen["pids"] == "4096", (engine, seen["pids"])  # a cgroup, or RLIMIT_NPROC (said in the record)
    diff = hermetic("diff", "--json", str(records["podman"]), str(records["charliecloud"]), expect=None)
    assert diff.returncode == 0, diff.stdout[-2000:]
    doc = json.loads(diff.stdout)
    assert doc["verdict"]["kind"] == "identical", doc["verdict"]  # the same bits on either engine
    assert any("engine podman" in n and "-> charliecloud" in n for n in doc["verdict"]["notes"]), doc["verdict"]
    replay = hermetic("replay", "--json", str(records["podman"]))
    assert json.loads(replay.stdout)["diff"]["verdict"]["kind"] == "identical"


def test_what_needs_root_is_refused_with_the_fix(as_user):
    hermetic, project, cache, pw = as_user
    # the Docker Engine is root's: the account cannot reach it, and says so with what to do
    proc = hermetic("run", "--engine", "docker", "train.py", expect=None)
    assert proc.returncode == 69, proc.stderr
    assert "no Docker Engine answers" in proc.stderr
    # a memory limit needs a cgroup this user does not have (cgroup v1 here): refused before anything starts
    cfg = project / "hermetic.yaml"
    text = cfg.read_text()
    try:
        cfg.write_text(text.replace("run:\n  engine: podman\n", "run:\n  engine: podman\n  memory: 1g\n"))
        before = set((project / "runs").iterdir())
        for engine in ("podman", "charliecloud"):
            refused = hermetic("run", "--engine", engine, "train.py", expect=None)
            if engine == "podman" and "cgroup v1" not in refused.stderr and refused.returncode == 0:
                continue  # a delegated cgroup v2 host gives the limit: nothing to refuse
            assert refused.returncode == 69, (engine, refused.stderr)
            assert "run.memory" in refused.stderr and "set run.memory: null" in refused.stderr
        assert set((project / "runs").iterdir()) == before
    finally:
        cfg.write_text(text)
