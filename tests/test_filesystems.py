"""HERMETIC_CACHE on filesystems that lack what a local Linux one has (issue 38, item 5).

Each is a real filesystem, mounted here (root only: the suite runs as root on the test machines; every mount
is undone at the end of its test or module), or a real kernel refusal:

- exFAT (exfat-fuse on a loop device; the kernel here has no vfat/exfat module): no hard links, no symlinks,
  no FIFOs, no xattrs, no O_TMPFILE, no owners (chown EPERM), mode bits fixed by the mount. The numpy example
  is built there (the same digest as on ext4) and run.
- bindfs --chmod-deny --chown-deny --xattr-none: a filesystem that refuses chmod (as an SFTP server may, and
  FAT through fusefat answers ENOSYS), and has no xattrs or O_TMPFILE.
- tmpfs mounted noexec (a hardened home or /tmp): the base's interpreter cannot be run from the cache.
- a read-only bind mount: a store every node of a cluster mounts read-only.
- root that acts as nobody: NFS's root_squash, simulated by root without the capabilities that override file
  permissions and ownership (setpriv --bounding-set): euid 0, EACCES in a directory it does not own, EPERM on
  chown, as over a root-squashed export.
- a tmpfs mounted at a part of the cache (wheels/sha256, oci/blobs, bases/): one rename across two
  filesystems (EXDEV).

What cannot be simulated here, NFS itself (no nfs or nfsd in this kernel), is in the report of issue 38:
flock without a lock daemon (ENOLCK) and an exclusive flock on a file open read-only (EBADF over NFS).
Packages: exfat-fuse, exfatprogs, bindfs (and util-linux's losetup, setpriv).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from buildsupport import make_project
from conftest import assert_clean_error, run_cli
from run_support import EXAMPLES, copy_example
from wheelfactory import make_index, make_wheel, sha256_of

# Mounts are local and need root (checked before any fixture: no base is bootstrapped for a skip); none of it
# may run in `make test-quick` ("not integration").
pytestmark = [pytest.mark.mounts,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (the suite runs as root on the "
                                 "test machines)")]

NO_BASE = "hermetic/none@sha256:" + "0" * 64  # fetch never looks at the base
PACKAGES = {"mkfs.exfat": "exfatprogs", "mount.exfat-fuse": "exfat-fuse", "bindfs": "bindfs",
            "fusermount": "fuse3", "losetup": "util-linux", "setpriv": "util-linux"}
# root as a root-squashed NFS export sees it: no power over other users' files or over ownership
SQUASHED_ROOT = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-chown,-fsetid"]


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install "
                    f"{' '.join(sorted({PACKAGES[t] for t in missing}))}")


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=True)  # a straggler still has it open


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Mount points a test appends to: all unmounted at its end, the last first."""
    made: list[Path] = []
    yield made
    for p in reversed(made):
        unmount(p)


@pytest.fixture(scope="module")
def exfat(tmp_path_factory) -> Iterator[Path]:
    """An exFAT filesystem of 2 GiB (an image on a loop device, exfat-fuse), mounted for this module."""
    need("mkfs.exfat", "mount.exfat-fuse", "losetup")
    base = tmp_path_factory.mktemp("exfat")
    image, point = base / "fs.img", base / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(2 << 30)
    subprocess.run(["mkfs.exfat", str(image)], check=True, capture_output=True)
    loop = subprocess.run(["losetup", "-f", "--show", str(image)], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        subprocess.run(["mount.exfat-fuse", loop, str(point)], check=True, capture_output=True)
        try:
            yield point
        finally:
            unmount(point)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)


def copy_base(session_cache: Path, cache: Path, base_ref: str, example: str = "numpy-logreg") -> None:
    """The session's base (its blobs and its refs) and the example's locked wheels (fetched by logreg_built:
    no network here) copied into ``cache``: a hard link cannot cross filesystems, and exFAT has none."""
    from hermetic.store.oci import OciStore
    from hermetic.store.wheels import WheelStore

    src = OciStore(session_cache / "oci")
    dst = OciStore(cache / "oci").ensure()
    base = "sha256:" + base_ref.rpartition("@sha256:")[2]
    for digest in sorted(src.live_blobs_from(base)):
        shutil.copyfile(src.blob_path(digest), dst.blob_path(digest))
    for name, desc in src.refs().items():
        if desc.digest == base:
            dst.set_ref(name, desc)
    locked = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", (EXAMPLES / example / "requirements.lock").read_text()))
    wheels = WheelStore(cache / "wheels")
    for w in WheelStore(session_cache / "wheels").find_any(sorted(locked)):
        wheels.admit_file(w.path, {w.sha256})


def temp_files(cache: Path) -> list[Path]:
    """What the stores' tmp/ directories hold: nothing once a command has ended, whatever its outcome."""
    return [p for d in (cache / "tmp", cache / "oci" / "tmp", cache / "wheels" / "tmp") if d.is_dir()
            for p in d.iterdir()]


def fetch_project(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A project whose lock pins one local wheel, served by a local index: (project, env, wheel)."""
    wheel = make_wheel(tmp_path / "wheels", "alpha", "1.0")
    proj = make_project(tmp_path / "p", NO_BASE, {"alpha": wheel})
    return proj, {"PIP_INDEX_URL": make_index(tmp_path / "wheels" / "index", [wheel])}, wheel


# --- exFAT: no hard links, symlinks, FIFOs, xattrs, O_TMPFILE or owners ------------------------------


def test_exfat_lacks_what_the_stores_do_not_use(exfat):
    """The premise of the tests below, checked on the filesystem itself."""
    probe = exfat / "probe"
    probe.write_bytes(b"x")
    with pytest.raises(OSError):
        os.link(probe, exfat / "link")
    with pytest.raises(OSError):
        os.symlink("probe", exfat / "symlink")
    with pytest.raises(OSError):
        os.setxattr(probe, "user.hermetic", b"1")
    with pytest.raises(OSError):
        os.open(exfat, os.O_TMPFILE | os.O_WRONLY, 0o600)
    probe.unlink()


@pytest.fixture(scope="module")
def exfat_built(exfat, tmp_path_factory, session_cache, base_ref, logreg_built) -> tuple[Path, Path, dict]:
    """examples/numpy-logreg built with HERMETIC_CACHE on exFAT: (project, cache, build JSON)."""
    cache = exfat / "cache"
    copy_base(session_cache, cache, base_ref)
    proj = copy_example("numpy-logreg", tmp_path_factory.mktemp("exfat-project") / "numpy-logreg", base_ref)
    proc = run_cli("build", "-C", str(proj), "--json", "--offline", env={"HERMETIC_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proj, cache, json.loads(proc.stdout)


def test_the_numpy_example_builds_on_exfat_to_the_digest_it_has_on_ext4(exfat_built, logreg_built):
    proj, cache, built = exfat_built
    assert built["manifest_digest"] == logreg_built[1]["manifest_digest"]  # the same bytes, whatever holds them
    assert temp_files(cache) == []
    verify = run_cli("cache", "verify", "--json", env={"HERMETIC_CACHE": str(cache)})
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"], verify.stdout + verify.stderr
    gc = run_cli("cache", "gc", env={"HERMETIC_CACHE": str(cache)})
    assert gc.returncode == 0, gc.stderr
    again = run_cli("build", "-C", str(proj), "--json", "--offline", env={"HERMETIC_CACHE": str(cache)})
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["manifest_digest"] == built["manifest_digest"]


def test_a_shared_store_on_exfat_takes_a_copy_of_the_image(exfat, session_cache, logreg_built):
    """What `hermetic submit --shared-store` does for a Slurm cluster's nodes: every blob copied (no links)."""
    from hermetic.slurm.shared import copy_image
    from hermetic.store.oci import OciStore

    digest = logreg_built[1]["manifest_digest"]
    shared = exfat / "shared"
    assert copy_image(OciStore(session_cache / "oci"), OciStore(shared / "oci"), digest) > 0
    assert OciStore(shared / "oci").has_image(digest)
    verify = run_cli("cache", "verify", "--json", env={"HERMETIC_CACHE": str(shared)})
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"], verify.stdout + verify.stderr


def test_a_run_with_its_cache_on_exfat_says_what_its_scratch_space_needs(exfat_built):
    """A run's gate is a FIFO and its working copy is given to the container's user, in the cache's tmp/:
    exFAT has neither FIFOs nor owners. One line naming the filesystem and the way out, before any run
    directory is made, and nothing left in the cache."""
    proj, cache, built = exfat_built
    proc = run_cli("run", "--json", "train.py", cwd=proj, env={"HERMETIC_CACHE": str(cache)})
    assert_clean_error(proc, 73, "exfat", "the run's gate (a FIFO)", "needs FIFOs and file owners")
    assert "hint: set HERMETIC_CACHE to a directory on a local Linux filesystem" in proc.stderr
    assert not (proj / "runs").exists() or not list((proj / "runs").iterdir())
    assert temp_files(cache) == []


# --- a filesystem that refuses chmod ---------------------------------------------------------------


def test_a_cache_where_chmod_is_refused_takes_wheels_and_blobs(tmp_path, mounts, isolated_pip):
    """Permission bits are the mount's there (set_mode); the stores work as anywhere else."""
    need("bindfs", "fusermount")
    back, cache = tmp_path / "back", tmp_path / "cache"
    back.mkdir()
    cache.mkdir()
    subprocess.run(["bindfs", "--chmod-deny", "--chown-deny", "--xattr-none", str(back), str(cache)], check=True)
    mounts.append(cache)
    with pytest.raises(PermissionError):
        os.chmod(cache, 0o700)  # the premise
    proj, env, wheel = fetch_project(tmp_path)
    proc = run_cli("fetch", "-C", str(proj), "--json", env={**env, "HERMETIC_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wheels"][0]["sha256"] == sha256_of(wheel)

    from hermetic.hostfs.fsutil import atomic_write_bytes
    from hermetic.store.oci import OciStore

    store = OciStore(cache / "oci")
    digest = store.put_bytes(b"a blob\n")
    assert store.read_blob(digest) == b"a blob\n"
    atomic_write_bytes(cache / "note.json", b"{}")
    assert (cache / "note.json").read_bytes() == b"{}"
    assert temp_files(cache) == []


# --- a cache on a filesystem mounted noexec ----------------------------------------------------------


def test_a_cache_mounted_noexec_is_named_when_the_base_interpreter_cannot_start(
        tmp_path, mounts, session_cache, base_ref, logreg_built):
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=1g", "tmpfs", str(cache)], check=True)
    mounts.append(cache)
    copy_base(session_cache, cache, base_ref)
    proj = copy_example("numpy-logreg", tmp_path / "numpy-logreg", base_ref)
    proc = run_cli("build", "-C", str(proj), "--offline", env={"HERMETIC_CACHE": str(cache)})
    assert_clean_error(proc, 69, "mounted noexec", f"tmpfs at {cache}")
    assert "HERMETIC_CACHE" in proc.stderr and "build.bytecode: none" in proc.stderr  # both ways out
    assert temp_files(cache) == []


# --- a store mounted read-only (a cluster's shared store on its nodes) --------------------------------


def test_a_read_only_cache_is_read_and_refuses_writes_in_one_line(tmp_path, mounts, isolated_pip):
    proj, env, wheel = fetch_project(tmp_path)
    rw, cache = tmp_path / "rw", tmp_path / "cache"
    first = run_cli("fetch", "-C", str(proj), env={**env, "HERMETIC_CACHE": str(rw)})
    assert first.returncode == 0, first.stderr
    dead = rw / "oci" / "tmp" / "blob.0123456789ab"  # what a killed writer left: no live process holds it
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b"half")
    (rw / "wheels" / "tmp" / "wheel.0123456789ab").write_bytes(b"half")
    cache.mkdir()
    subprocess.run(["mount", "--bind", str(rw), str(cache)], check=True)
    mounts.append(cache)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(cache)], check=True)

    verify = run_cli("cache", "verify", "--json", env={"HERMETIC_CACHE": str(cache)})
    assert verify.returncode == 0, verify.stderr  # reading needs no write
    assert json.loads(verify.stdout)["dead_temp_files"]["count"] == 2  # listed, and left
    wheel2 = make_wheel(tmp_path / "wheels", "beta", "1.0")
    proj2 = make_project(tmp_path / "p2", NO_BASE, {"beta": wheel2})
    env2 = {"PIP_INDEX_URL": make_index(tmp_path / "wheels" / "index2", [wheel2]), "HERMETIC_CACHE": str(cache)}
    proc = run_cli("fetch", "-C", str(proj2), env=env2)
    assert_clean_error(proc, 73, f"{cache}/wheels/tmp: read-only file system (", "hermetic cannot write there")
    assert "HERMETIC_CACHE" in proc.stderr  # the hint
    gc = run_cli("cache", "gc", env={"HERMETIC_CACHE": str(cache)})
    assert_clean_error(gc, 73, "read-only file system")


# --- root that acts as nobody (NFS root_squash) -------------------------------------------------------


def squashed(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`hermetic ARGS` as root without the power over others' files (SQUASHED_ROOT); a new interpreter."""
    return subprocess.run([*SQUASHED_ROOT, sys.executable, "-m", "hermetic", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)


def test_root_squashed_on_a_users_cache_is_told_whose_it_is(tmp_path, isolated_pip):
    """The user's cache, used by root acting as nobody (sudo on a home over NFS with root_squash): reads work,
    writes end in one line naming the directory, its owner and what to do."""
    need("setpriv")
    proj, env, wheel = fetch_project(tmp_path)
    cache = tmp_path / "cache"
    first = run_cli("fetch", "-C", str(proj), env={**env, "HERMETIC_CACHE": str(cache)})
    assert first.returncode == 0, first.stderr
    from hermetic.store.oci import OciStore

    OciStore(cache / "oci").put_bytes(b"a blob\n")
    for root, dirs, files in os.walk(cache):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, 65534, 65534)  # the user's (here nobody's: any uid but root's)
    premise = subprocess.run([*SQUASHED_ROOT, "touch", str(cache / "x")], capture_output=True)
    assert premise.returncode != 0  # root acts as nobody here

    verify = squashed("cache", "verify", env={"HERMETIC_CACHE": str(cache)})
    assert verify.returncode == 0, verify.stderr
    wheel2 = make_wheel(tmp_path / "wheels", "beta", "1.0")
    proj2 = make_project(tmp_path / "p2", NO_BASE, {"beta": wheel2})
    env2 = {"PIP_INDEX_URL": make_index(tmp_path / "wheels" / "index2", [wheel2]), "HERMETIC_CACHE": str(cache)}
    proc = squashed("fetch", "-C", str(proj2), env=env2)
    assert_clean_error(proc, 73, f"{cache}/wheels/tmp: permission denied, even to root",
                       "is uid 65534's, mode 0755")
    assert "run hermetic as its owner (uid 65534)" in proc.stderr
    gc = squashed("cache", "gc", env={"HERMETIC_CACHE": str(cache)})
    assert_clean_error(gc, 73, f"{cache}/oci: permission denied, even to root")
    assert not (cache / "wheels" / "sha256" / sha256_of(wheel2)).exists()


# --- a part of the cache on another filesystem ---------------------------------------------------------


def test_a_store_split_across_two_filesystems_is_refused_in_one_line(tmp_path, mounts, cache_dir, isolated_pip):
    """wheels/sha256 on a tmpfs of its own (to save space on home, say): the rename from wheels/tmp cannot cross."""
    kept = cache_dir / "wheels" / "sha256"
    kept.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(kept)], check=True)
    mounts.append(kept)
    proj, env, wheel = fetch_project(tmp_path)
    proc = run_cli("fetch", "-C", str(proj), env=env)
    assert_clean_error(proc, 73, "they are on different filesystems", f"tmpfs at {kept}")
    assert "keep the whole cache on one filesystem" in proc.stderr
    assert temp_files(cache_dir) == []
    assert not any(kept.rglob("*.whl"))

    from hermetic.core.errors import CannotCreate
    from hermetic.store.oci import OciStore

    blobs = cache_dir / "oci" / "blobs"
    blobs.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(blobs)], check=True)
    mounts.append(blobs)
    with pytest.raises(CannotCreate, match="different filesystems"):
        OciStore(cache_dir / "oci").put_bytes(b"a blob\n")
    assert temp_files(cache_dir) == []



def test_the_base_interpreters_copy_on_another_filesystem_is_refused_in_one_line(
        tmp_path, mounts, cache_dir, session_cache, base_ref, logreg_built):
    """bases/ (the copies of base interpreters that compile bytecode) on a tmpfs of its own."""
    copy_base(session_cache, cache_dir, base_ref)
    bases = cache_dir / "bases"
    bases.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(bases)], check=True)
    mounts.append(bases)
    proj = copy_example("numpy-logreg", tmp_path / "numpy-logreg", base_ref)
    proc = run_cli("build", "-C", str(proj), "--offline")
    assert_clean_error(proc, 73, "they are on different filesystems", f"tmpfs at {bases}")
    assert temp_files(cache_dir) == [] and list(bases.glob("*.python")) == []  # (its .json: the base's facts)
