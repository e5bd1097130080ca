"""SIGKILL at several points of a cold build: the next command starts at once, no process of the
killed one lives on, and the image comes out with the digests of an uninterrupted build (issue 14).

Before: the layer workers of a killed `hermetic build` lived on with PPID 1, holding the build's
flock (a fork shares it), and the next build waited for them without a word.

The project has the shape of the torch example's lock at a fifth of its size (the suite's one real
torch build is run_support's `torch_built`): one wheel over the big-wheel bound (64 MB) with a
160 MB incompressible payload and a few hundred modules to compile (its own layer, and the blob
the load into the engine streams), and small wheels that fall into groups of their own, so that
several layers are written side by side, each one's bytecode compiled by a child (the base's
interpreter). The wheels are served slowly from 127.0.0.1 (so a download can be caught midway); a
fresh `build.source_date_epoch` gives this run's image layers no engine or cache has, so that every
stage (downloads, layer writes with their compiler children, the load into the engine) really happens.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
from pathlib import Path

import docker.errors
import pytest

from buildsupport import make_project, share_base
from conftest import run_cli
from hermetic.hostfs.filelocks import is_locked
from kill_support import children_of, sigkill, start_hermetic, survivors, wait_for
from slow_server import SlowWheels
from wheelfactory import make_index, make_wheel

pytestmark = pytest.mark.docker


def lock_is_free(builds: Path) -> bool:
    """Every build lock can be taken at once (none is held by anything of the killed build)."""
    return not any(is_locked(lock) for lock in builds.glob(".*.lock"))


def open_blob_larger_than(pid: int, blobs: Path, size: int) -> bool:
    """The process has a blob of the store open that is bigger than ``size`` (the load streaming it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if target.parent == blobs and target.exists() and target.stat().st_size > size:
            return True
    return False


BIG_PAYLOAD = 160 << 20  # over the big-wheel bound and over the 100 MB the load is caught at


def module_source(i: int) -> bytes:
    return "".join(f"def f{i}_{j}(x):\n    return [x * {j} + k for k in range({j})]\n\n"
                   for j in range(40)).encode()


@pytest.fixture
def cold_project(tmp_path, base_ref, isolated_pip, monkeypatch) -> Path:
    """A project no cache has seen: a big wheel, six small ones, a fresh source_date_epoch."""
    src = tmp_path / "wheels"
    big = {"bulk/__init__.py": b"__version__ = '1.0'\n\n\ndef main():\n    return 0\n",
           "bulk/weights.bin": os.urandom(BIG_PAYLOAD)}
    big.update({f"bulk/layer{i:03d}.py": module_source(i) for i in range(300)})
    files = [make_wheel(src, "bulk", "1.0", files=big, console_scripts={"bulk-run": "bulk:main"})]
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
        files.append(make_wheel(src, name, "1.0", files={f"{name}/blob.bin": os.urandom(2 << 20),
                                                           **{f"{name}/m{i}.py": module_source(i) for i in range(20)}}))
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", files))
    proj = make_project(tmp_path / "cold", base_ref, {f.name.split("-")[0]: f for f in files},
                        extra=f"build:\n  source_date_epoch: {random.randrange(10 ** 8, 10 ** 9)}\n")
    cfg = proj / "hermetic.yaml"
    cfg.write_text(cfg.read_text().replace("name: demo", f"name: kill-{os.getpid()}"))
    return proj


def size_of(path: Path) -> int:
    """Its size, or 0 when it is gone since it was listed (a download that ended, renamed into the store)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def test_sigkill_at_each_stage_of_a_cold_build(tmp_path, cold_project, session_cache, docker_client):
    proj = cold_project
    ref_cache, cold = tmp_path / "reference-cache", tmp_path / "cache"
    share_base(session_cache, ref_cache)
    share_base(session_cache, cold)
    image_id = None
    try:
        # The uninterrupted build, from the project's index (its package sources).
        proc = run_cli("build", "-C", str(proj), "--json", "--no-load", env={"HERMETIC_CACHE": str(ref_cache)})
        assert proc.returncode == 0, proc.stderr
        reference = json.loads(proc.stdout)
        image_id = reference["image_id"]
        wheels = sorted((ref_cache / "wheels" / "sha256").glob("*/*.whl"))
        assert any(w.name.startswith("bulk-") for w in wheels) and len(wheels) == 7, wheels

        partial, stored = cold / "wheels" / "tmp", cold / "wheels" / "sha256"
        builds, blobs, oci_tmp = cold / "builds", cold / "oci" / "blobs" / "sha256", cold / "oci" / "tmp"
        with SlowWheels(wheels, bytes_per_s=40 << 20) as server:
            env = {"HERMETIC_CACHE": str(cold), "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": server.url,
                   "PIP_NO_INDEX": "1", "PIP_INDEX_URL": "", "PIP_EXTRA_INDEX_URL": ""}

            def kill_at(what: str, moment, *args: str) -> None:
                p = start_hermetic(*args, "-C", str(proj), env=env)
                wait_for(p, lambda: moment(p), what)
                sid = sigkill(p)
                assert survivors(sid) == [], f"processes of the build killed at {what} live on"
                assert lock_is_free(builds), f"a build lock is still held after the kill at {what}"

            # 1. `hermetic fetch`, a download midway.
            kill_at("a download midway", lambda p: any(size_of(f) > (8 << 20) for f in partial.glob("wheel.*")),
                    "fetch")
            assert json.loads(run_cli("cache", "verify", "--json", env=env).stdout)["dead_temp_files"]["count"] >= 1
            # 2. `hermetic build`, right after its fetch: every pin is in the store.
            kill_at("the end of the fetch", lambda p: len(list(stored.glob("*/*.whl"))) == len(wheels),
                    "build", "--json")
            # 3. `hermetic build`, a layer's bytecode being compiled (the compiler, a child, running).
            kill_at("the bytecode being compiled", lambda p: len(children_of(p.pid)) >= 1, "build", "--json")
            # 4. `hermetic build`, a layer being written into the store.
            kill_at("a layer being written", lambda p: any(oci_tmp.glob("blob.*")), "build", "--json")
            # Ctrl-C (SIGINT to the group, as a terminal sends it) while layers are written: the layers under way
            # stop at their next write, their temp blobs go, the build ends 130 with nothing left behind.
            dead = set(oci_tmp.glob("blob.*"))  # the killed builds' (this one sweeps them first)
            p = start_hermetic("build", "--json", "-C", str(proj), env=env)
            wait_for(p, lambda: bool(set(oci_tmp.glob("blob.*")) - dead), "a layer being written (Ctrl-C)")
            os.killpg(p.pid, signal.SIGINT)
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 130 and "aborted" in err, (p.returncode, err[-2000:])
            assert survivors(p.pid) == [] and lock_is_free(builds)
            assert not list(oci_tmp.glob("blob.*")), "an interrupted build left its temp blobs"
            # 5. `hermetic build`, the image streaming into the engine.
            kill_at("the load into the engine", lambda p: open_blob_larger_than(p.pid, blobs, 100 << 20),
                    "build", "--json")
            with pytest.raises(docker.errors.ImageNotFound):
                docker_client.images.get(image_id)  # the engine kept nothing of the cut stream

            p = start_hermetic("build", "-C", str(proj), "--json", env=env)
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        final = json.loads(out)
        assert (final["image_id"], final["manifest_digest"]) == (reference["image_id"], reference["manifest_digest"])
        assert [x["digest"] for x in final["layers"]] == [x["digest"] for x in reference["layers"]]
        assert final["loaded"] is True and docker_client.images.get(image_id).id == image_id
        verify = json.loads(run_cli("cache", "verify", "--json", env={"HERMETIC_CACHE": str(cold)}).stdout)
        assert verify["ok"] and verify["dead_temp_files"]["count"] == 0, verify
    finally:
        if image_id:
            try:
                docker_client.images.remove(image_id, force=True)
            except docker.errors.APIError:
                pass
        for d in (ref_cache, cold):
            shutil.rmtree(d, ignore_errors=True)
