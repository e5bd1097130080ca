"""A full disk, for real: HERMETIC_CACHE (or an output) on a small tmpfs (issue 24, item 6).

Each command that fills it ends in one line naming the path (`hermetic: error: <path>: no space
left on device ...`), exit 73, no traceback; every temp file it made is gone, the store still
verifies (complete blobs, index.json as it was), and the same command on the same tmpfs made
bigger (`mount -o remount,size=`) gives the same wheel, or the same image digest as a build
that never ran out of space.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from buildsupport import build_json, make_project
from conftest import run_cli
from slow_server import SlowWheels
from wheelfactory import make_index, make_wheel, sha256_of

NO_BASE = "hermetic/none@sha256:" + "0" * 64  # fetch never looks at the base
PAGE = 4096


class Disk:
    """A tmpfs mounted at ``path`` (a real filesystem with a real size limit)."""

    def __init__(self, path: Path, size: int):
        self.path = path
        path.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)

    def grow(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], check=True)  # a straggler still has it open


@pytest.fixture
def small_disk(tmp_path) -> Callable[[int], Disk]:
    """``small_disk(bytes)``: a new tmpfs of that size under tmp_path; all unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disks: list[Disk] = []

    def make(size: int) -> Disk:
        disks.append(Disk(tmp_path / f"disk{len(disks)}", size))
        return disks[-1]

    yield make
    for d in reversed(disks):
        d.unmount()


def footprint(root: Path) -> int:
    """What the files under ``root`` take on a tmpfs: whole pages."""
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def copy_base(session_cache: Path, cache: Path) -> set[str]:
    """The session's bootstrapped base (only its blobs and refs), copied: a tmpfs cannot share the
    session cache's blobs by hardlink. Returns the digests of the blobs copied."""
    from hermetic.store.oci import OciStore

    src = OciStore(session_cache / "oci")
    refs = {name: desc for name, desc in src.refs().items() if name.startswith("hermetic/")}
    blobs: set[str] = set()
    for desc in refs.values():
        blobs |= src.live_blobs_from(desc.digest)
    dst = OciStore(cache / "oci").ensure()
    for digest in sorted(blobs):
        shutil.copyfile(src.blob_path(digest), dst.blob_path(digest))
    for name, desc in refs.items():
        dst.set_ref(name, desc)
    return blobs


def assert_disk_full(proc: subprocess.CompletedProcess, path: Path, *needles: str) -> str:
    """Exit 73, no traceback, one error line: `<path>: no space left on device ...` (and the needles)."""
    assert proc.returncode == 73, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic: error: ")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"hermetic: error: {path}: no space left on device"), proc.stderr
    for n in needles:
        assert n in errors[0], (n, proc.stderr)
    return errors[0]


def temp_files(cache: Path) -> list[str]:
    """Every temporary file under the cache: the tmp/ directories' contents, atomic writes'
    `.NAME.*.tmp`, claims of processes that are gone, and what `cache verify` counts as dead."""
    found = []
    for d in (cache / "tmp", cache / "oci" / "tmp", cache / "wheels" / "tmp"):
        if d.is_dir():
            found += [str(p) for p in d.iterdir()]
    found += [str(p) for p in cache.rglob(".*.tmp")]
    if (cache / "oci" / "in-use").is_dir():
        found += [str(p) for p in (cache / "oci" / "in-use").iterdir()]
    proc = run_cli("cache", "verify", "--json", env={"HERMETIC_CACHE": str(cache)})
    verify = json.loads(proc.stdout)
    assert proc.returncode == 0 and verify["ok"], (proc.stdout, proc.stderr)  # the store is intact
    return found + verify["dead_temp_files"]["paths"]


# --- fetch --------------------------------------------------------------------------------------


@pytest.mark.parametrize("served", ["index", "http"])
def test_fetch_on_a_full_disk_says_so_in_one_line_and_keeps_nothing_half_written(
        tmp_path, small_disk, isolated_pip, served):
    src = tmp_path / "wheels"
    big = make_wheel(src, "bigpkg", "1.0", files={"bigpkg/noise.bin": os.urandom(6 << 20)})  # incompressible
    small = make_wheel(src, "smallpkg", "1.0")
    proj = make_project(tmp_path / "p", NO_BASE, {"bigpkg": big, "smallpkg": small})
    disk = small_disk(3 << 20)
    env = {"HERMETIC_CACHE": str(disk.path)}
    with SlowWheels([big, small], bytes_per_s=1 << 30) as server:
        if served == "index":
            env["PIP_INDEX_URL"] = make_index(src / "index", [big, small])
        else:  # over HTTP: the size it needs is the download's Content-Length
            env.update({"PIP_FIND_LINKS": server.url, "PIP_NO_INDEX": "1"})
        proc = run_cli("fetch", "-C", str(proj), env=env)
        assert_disk_full(proc, disk.path / "wheels", f"while writing {big.name}",
                         f"{big.stat().st_size / 1e6:.1f} MB needed")
        assert "hermetic cache gc" in proc.stderr  # the hint
        assert temp_files(disk.path) == []
        assert not (disk.path / "wheels" / "sha256" / sha256_of(big)).exists()

        disk.grow(64 << 20)
        again = run_cli("fetch", "-C", str(proj), "--json", env=env)
    assert again.returncode == 0, again.stderr
    stored = {w["filename"]: w["sha256"] for w in json.loads(again.stdout)["wheels"]}
    assert stored == {big.name: sha256_of(big), small.name: sha256_of(small)}
    assert temp_files(disk.path) == []


# --- an output beside the project -----------------------------------------------------------------


def test_a_data_manifest_on_a_full_disk_names_its_output(tmp_path, small_disk, cache_dir):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2000):
        (data / f"sample-{i:05d}-{'x' * 60}.bin").write_bytes(b"%d" % i)
    disk = small_disk(64 << 10)
    out = disk.path / "train.sha256"
    proc = run_cli("data", "manifest", str(data), "-o", str(out))
    assert_disk_full(proc, out)
    assert list(disk.path.iterdir()) == []  # not even the temp file of the atomic write
    disk.grow(4 << 20)
    again = run_cli("data", "manifest", str(data), "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert len(out.read_text().splitlines()) == 2000


def fill(disk: Disk) -> Path:
    """A file that takes every byte the disk has left."""
    filler = disk.path / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * PAGE)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_a_lock_on_a_full_disk_names_its_output(tmp_path, small_disk, isolated_pip, cache_dir):
    """The resolver writes the lock's temp file beside it: a full disk there is exit 73, not a bad lock (65)."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    disk = small_disk(64 << 10)
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: demo\nbase: {NO_BASE}\nlock: {disk.path / 'requirements.lock'}\n")
    (proj / "requirements.in").write_text(f"--find-links {wheels}\nalpha==1.0\n")
    filler = fill(disk)
    allow = {"HERMETIC_ALLOW_PATHS": str(disk.path)}  # the lock outside the project, as its user allows
    proc = run_cli("lock", "--no-index-check", cwd=proj, env=allow)
    assert_disk_full(proc, disk.path, "while writing requirements.lock")
    assert list(disk.path.iterdir()) == [filler]  # the resolver's temp file and ours are gone
    filler.unlink()
    again = run_cli("lock", "--no-index-check", cwd=proj, env=allow)
    assert again.returncode == 0, again.stderr
    assert "alpha==1.0" in (disk.path / "requirements.lock").read_text()


# --- build ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory) -> dict:
    src = tmp_path_factory.mktemp("full-disk-wheels")
    files = {"alpha": make_wheel(src, "alpha", "1.0"),
             # random bytes: a layer of 8 MB that no other test has
             "gamma": make_wheel(src, "gamma", "1.0", files={"gamma/noise.bin": os.urandom(8 << 20)})}
    return {"files": files, "url": make_index(src / "index", list(files.values()))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, session_cache, base_ref, wheel_index) -> dict:
    """The project's image built on a cache with room, and what that cache holds after it, by part."""
    root = tmp_path_factory.mktemp("full-disk-reference")
    proj = make_project(root / "p", base_ref, wheel_index["files"])
    cache = root / "cache"
    base_blobs = copy_base(session_cache, cache)
    base = sum(-(-(cache / "oci" / "blobs" / "sha256" / d[7:]).stat().st_size // PAGE) * PAGE for d in base_blobs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_CONFIG_FILE", os.devnull)
        for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
            mp.delenv(var, raising=False)
        mp.setenv("PIP_INDEX_URL", wheel_index["url"])
        built = build_json(proj, "--no-load", env={"HERMETIC_CACHE": str(cache)})
    ours = sum(x["size"] for x in built["layers"] if x["digest"] not in base_blobs)
    return {"built": built, "base": base, "wheels": footprint(cache / "wheels"), "bases": footprint(cache / "bases"),
            "ours": ours, "total": footprint(cache)}


@pytest.mark.docker
@pytest.mark.parametrize("runs_out_in", ["wheels", "bases", "oci"])
def test_a_build_on_a_full_disk_says_so_in_one_line_and_a_rerun_with_room_gives_the_same_image(
        tmp_path, small_disk, session_cache, base_ref, wheel_index, reference, isolated_pip, monkeypatch, runs_out_in):
    """The build fills the disk while fetching (wheels), copying the base's interpreter to compile
    bytecode with (bases), or writing its layers (oci): each says where, in one line."""
    monkeypatch.setenv("PIP_INDEX_URL", wheel_index["url"])
    proj = make_project(tmp_path / "p", base_ref, wheel_index["files"])
    r = reference
    room = {"wheels": r["base"] + r["wheels"] // 2,
            "bases": r["base"] + r["wheels"] + r["bases"] // 2,
            "oci": r["total"] - r["ours"] // 2}[runs_out_in]
    disk = small_disk(room)
    copy_base(session_cache, disk.path)
    env = {"HERMETIC_CACHE": str(disk.path)}
    index_before = (disk.path / "oci" / "index.json").read_bytes()
    proc = run_cli("build", "-C", str(proj), "--no-load", env=env)
    line = assert_disk_full(proc, disk.path / runs_out_in)
    if runs_out_in == "oci":
        assert "while writing a blob into the OCI store" in line and "needed" in line, line
    assert temp_files(disk.path) == []
    assert (disk.path / "oci" / "index.json").read_bytes() == index_before  # no ref to a partial image
    assert not (proj / "hermetic.image.json").exists()

    disk.grow(r["total"] + (64 << 20))
    again = build_json(proj, "--no-load", env=env)
    assert (again["manifest_digest"], again["image_id"]) == (r["built"]["manifest_digest"], r["built"]["image_id"])
    assert temp_files(disk.path) == []
