"""hermetic without root: a plain user account (no docker group, no sudo) on a cluster node's terms.

The account is made here (useradd, with the /etc/subuid and /etc/subgid ranges rootless Podman maps its
containers into) and removed afterwards. It has what such a user has: the OS's own python3 (Debian 12's
3.11.2, no tarfile extraction filter) with hermetic in a venv of the account's own, the default `ulimit -n`
of 1024, an empty cache of its own, a registry holding the base and a directory of the locked wheels (a
site's wheelhouse, named by pip's find-links). As that user: `hermetic pull` of the base, `hermetic fetch`,
`hermetic build` (the builder is daemonless; hermetic.yaml's run.engine is podman, so the build copies the
image into the user's own containers-storage), `hermetic run` on rootless Podman and on Charliecloud (the
same hardening checked from inside, as test_run's lockdown test does), `hermetic diff` of the two and
`hermetic replay` of the first. What the containers wrote belongs to the user.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from hermetic.core.reference import parse_base_reference
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


OS_PYTHON = "/usr/bin/python3"  # Debian's own (3.11.2 on Debian 12: no tarfile extraction filter)
USER_NOFILE = 1024  # a plain account's default `ulimit -n`; root's is higher here


def _as_account(pw):
    """subprocess.run's arguments that make a child the account, with its limits (no extra groups)."""
    import resource

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (USER_NOFILE, USER_NOFILE))

    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "preexec_fn": limits}


def _install_into_account_venv(pw, home: Path) -> Path:
    """hermetic in a venv of the account's own, made by the account with the OS's python3 (root's interpreter is
    not the account's to run). The packages are the project's lock, hashes required, copied from the session's
    uv cache (the test stays offline; the account's own `pip install` would download the same files), and
    hermetic built from a copy of the source with that python3 (its C extension for that interpreter)."""
    venv = home / "venv"
    subprocess.run([OS_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, **_as_account(pw))
    uv = REPO / ".venv" / "bin" / "uv"
    uv = uv if uv.exists() else Path(shutil.which("uv") or "uv")
    source = home / "hermetic-src"
    for part in ("hermetic", "setup.py", "pyproject.toml", "README.md"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(
            REPO / part, source / part, **({"ignore": shutil.ignore_patterns("__pycache__", "*.so")}
                                           if (REPO / part).is_dir() else {}))
    py = str(venv / "bin" / "python")
    for args in (["--require-hashes", "--no-deps", "-r", str(REPO / "requirements.lock")],
                 ["--no-deps", "--no-build-isolation", str(source)]):
        proc = subprocess.run([str(uv), "pip", "install", "--quiet", "--link-mode", "copy", "--python", py, *args],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(source)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(venv)], check=True)
    return venv


@pytest.fixture(scope="module")
def as_user(account, tmp_path_factory, session_cache, base_ref, registry, logreg_built):
    """(run hermetic as the account, its project dir, its cache): the account's own venv on the OS's python3,
    its own empty cache, ulimit -n 1024; the base is in a registry (pushed there by root), the locked wheels in a
    directory of files (what a site's wheelhouse is) that pip's find-links names (taken from the session's wheel
    store, which the example's build filled: logreg_built)."""
    pw = account
    home = Path(pw.pw_dir)
    venv = _install_into_account_venv(pw, home)
    project = copy_example("numpy-logreg", home / "numpy-logreg", base_ref)
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text() + "run:\n  engine: podman\n")
    base_digest = parse_base_reference(base_ref).digest
    base_in_registry = _push_base(session_cache, tmp_path_factory.mktemp("base-pusher"), base_digest, registry)
    wheelhouse = _wheelhouse(session_cache, project, home / "wheelhouse")
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(project), str(wheelhouse)], check=True)
    cache = home / "cache"
    env = {"HOME": str(home), "USER": ACCOUNT, "LOGNAME": ACCOUNT, "LANG": "C.UTF-8",
           "PATH": f"{venv}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HERMETIC_CACHE": str(cache),
           "PIP_FIND_LINKS": str(wheelhouse), "PIP_NO_INDEX": "1"}

    def hermetic(*args: str, expect: int | None = 0, timeout: float = 600,
                 more_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(venv / "bin" / "hermetic"), *args], cwd=project, env={**env, **(more_env or {})},
                              capture_output=True, text=True, timeout=timeout, **_as_account(pw))
        if expect is not None:
            assert proc.returncode == expect, (args, proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    hermetic.base_in_registry = base_in_registry  # type: ignore[attr-defined]
    return hermetic, project, cache, pw


def _push_base(session_cache: Path, pusher: Path, digest: str, registry) -> str:
    """The session's base pushed to the test registry from a store of its own; returns the pull reference."""
    from hermetic.slurm.shared import copy_image
    from hermetic.store.oci import OciStore

    copy_image(OciStore(session_cache / "oci"), OciStore(pusher / "oci"), digest, "base:rootless")
    ref = f"{registry.host}/bases/rootless"
    proc = run_cli("push", f"{ref}:bookworm", "--image", digest, env={"HERMETIC_CACHE": str(pusher)})
    assert proc.returncode == 0, proc.stderr
    return f"{ref}@{digest}"


def _wheelhouse(session_cache: Path, project: Path, dest: Path) -> Path:
    """The project's locked wheels as plain files in ``dest``, copied from the session's wheel store."""
    from hermetic.lock.model import Target
    from hermetic.lock.read import read_lock
    from hermetic.store.fetch import resolve_from_store
    from hermetic.store.wheels import WheelStore

    lock = read_lock(project / "requirements.lock", Target(python_version="3.11"))
    found, missing = resolve_from_store(lock, WheelStore(session_cache / "wheels"))
    assert not missing, missing
    dest.mkdir()
    for w in found:
        shutil.copy2(w.url or "", dest / w.filename)
    return dest


def test_a_plain_user_builds_runs_diffs_and_replays_without_root_or_docker(as_user):
    hermetic, project, cache, pw = as_user
    groups = subprocess.run(["id", "-Gn", ACCOUNT], capture_output=True, text=True, check=True).stdout.split()
    assert "docker" not in groups and "sudo" not in groups and "root" not in groups
    # hermetic runs on the OS's python3 from the account's venv, under the account's limit on descriptors
    venv_python = Path(pw.pw_dir) / "venv" / "bin" / "python"
    seen = subprocess.run([str(venv_python), "-c", "import hermetic, resource, sys; print(sys.base_prefix, "
                           "resource.getrlimit(resource.RLIMIT_NOFILE)[0], hermetic.__file__)"],
                          capture_output=True, text=True, check=True, cwd=pw.pw_dir, env={"PATH": "/usr/bin:/bin"},
                          **_as_account(pw)).stdout.split()
    assert seen[:2] == ["/usr", str(USER_NOFILE)] and seen[2].startswith(str(venv_python.parent.parent)), seen
    assert not cache.exists()  # nothing in its cache but what it pulls and fetches itself
    pulled = json.loads(hermetic("pull", hermetic.base_in_registry, "--json").stdout)
    assert pulled["manifest_digest"] == hermetic.base_in_registry.rsplit("@", 1)[1], pulled
    fetched = json.loads(hermetic("fetch", "--json").stdout)  # PIP_NO_INDEX: the wheelhouse alone
    assert len(fetched["downloaded"]) == len(fetched["wheels"]) > 0, fetched
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
        if engine == "charliecloud":  # /dev/fuse is root's here: the layers as directories, and the record says why
            assert e["image"]["form"] == "directory", e
            assert any("cannot open /dev/fuse" in n for n in e["notes"]), e["notes"]
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
    # the image as one file asked for where this account may not mount it: one line with the fix, nothing run
    refused = hermetic("run", "--engine", "charliecloud", "train.py", expect=69,
                       more_env={"HERMETIC_IMAGE_FORM": "squashfs"})
    assert "cannot open /dev/fuse" in refused.stderr and "HERMETIC_IMAGE_FORM=directory" in refused.stderr
    assert set((project / "runs").iterdir()) == before
