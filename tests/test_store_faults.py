"""The store under faults: dead writers' leftovers (found by their locks, listed, removed, counted),
corrupt blobs (real byte flips) refused by name before an image is trusted, and a missing base
found before anything is fetched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildsupport import build_json, make_project, share_base
from conftest import assert_clean_error, run_cli, tree_digest
from kill_support import sigkill, start_hermetic, survivors, wait_for
from slow_server import SlowWheels
from wheelfactory import make_index, make_wheel

pytestmark = pytest.mark.docker


@pytest.fixture
def small_wheels(tmp_path_factory, isolated_pip, monkeypatch) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("wheels")
    files = {"alpha": make_wheel(src, "alpha", "1.0"), "beta": make_wheel(src, "beta", "2.0"),
             # random bytes: its layer is one no engine or other test has
             "gamma": make_wheel(src, "gamma", "1.0", files={"gamma/noise.bin": os.urandom(256 * 1024)})}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    return files


def flip_byte(path: Path, at: int = 1000) -> None:
    """One byte of the file, inverted in place (a real write: size kept, mtime/ctime move)."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([old[0] ^ 0xFF]), at)
    finally:
        os.close(fd)


def our_layer(cache: Path, built: dict, contents: str) -> Path:
    """The blob of the image's layer holding ``contents`` (never a base layer: those are hardlinked
    from the session cache)."""
    layer = next(x for x in built["layers"] if contents in " ".join(x["packages"]))
    return cache / "oci" / "blobs" / "sha256" / layer["digest"].split(":")[1]


def settle(paths: list[Path]) -> None:
    """Wait until none of these files is racy any more (fsutil.is_racy): what a check then trusts
    from the stat alone."""
    from hermetic.fsutil import is_racy

    while any(is_racy(st.st_mtime_ns, st.st_ctime_ns, time.time_ns()) for st in (p.stat() for p in paths)):
        time.sleep(0.01)


def dead_temp_files(env: dict | None = None) -> dict:
    proc = run_cli("cache", "verify", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["dead_temp_files"]


# --- 3. dead writers' temp files -------------------------------------------------------------


def test_a_killed_fetchs_download_is_listed_removed_and_counted(tmp_path, cache_dir, isolated_pip):
    big = make_wheel(tmp_path / "w", "bigpkg", "1.0", files={"bigpkg/blob.bin": os.urandom(24 << 20)})
    proj = make_project(tmp_path / "p", "hermetic/none@sha256:" + "0" * 64, {"bigpkg": big})
    partial = cache_dir / "wheels" / "tmp"
    with SlowWheels([big], bytes_per_s=4 << 20) as server:
        env = {"PIP_FIND_LINKS": server.url, "PIP_NO_INDEX": "1"}

        def killed_midway() -> int:
            p = start_hermetic("fetch", "-C", str(proj), env=env)
            wait_for(p, lambda: any(f.stat().st_size > (1 << 20) for f in partial.glob("wheel.*")),
                     "a download midway")
            assert not survivors(sigkill(p))
            (left,) = partial.glob("wheel.*")
            return left.stat().st_size

        size = killed_midway()
        from hermetic.fsutil import OwnedTemp

        with OwnedTemp(partial, "wheel.") as live:  # a live writer's file: never counted, never removed
            os.write(live.fd, b"x" * 1000)
            assert dead_temp_files() == {"count": 1, "bytes": size, "paths": [str(next(
                p for p in partial.glob("wheel.*") if p != live.path))]}
            proc = run_cli("cache", "gc")
            assert proc.returncode == 0, proc.stderr
            assert f"1 temp file(s) of dead writers ({size / 1e6:.1f} MB)" in proc.stdout, proc.stdout
            assert list(partial.glob("wheel.*")) == [live.path]
        assert dead_temp_files()["count"] == 0

        # The next writer removes a dead writer's file by itself.
        killed_midway()
        p = start_hermetic("fetch", "-C", str(proj), env=env)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert not list(partial.iterdir())
    assert dead_temp_files()["count"] == 0


def test_a_killed_builds_blob_is_removed_by_the_next_build(tmp_path, cache_dir, session_cache, base_ref,
                                                           small_wheels):
    """A blob writer SIGKILLed midway (a real BlobWriter in a real process) leaves oci/tmp/blob.*;
    the next build that writes removes it; gc's count is true (its JSON and its line)."""
    share_base(session_cache, cache_dir)
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from hermetic.store.oci import OciStore\n"
        "w = OciStore(sys.argv[1]).writer()\n"
        "w.write(b'z' * 777777)\n"
        "w._f.flush()\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"), str(cache_dir / "oci")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert writer.stdout.readline().strip() == "ready"
    sigkill(writer)
    assert dead_temp_files() == {"count": 1, "bytes": 777777,
                                 "paths": [str(p) for p in (cache_dir / "oci" / "tmp").glob("blob.*")]}
    gc = run_cli("cache", "gc", "--dry-run", "--json")
    assert (json.loads(gc.stdout)["temp_files"], json.loads(gc.stdout)["temp_bytes"]) == (1, 777777)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": small_wheels["alpha"]})
    build_json(proj, "--no-load")
    assert not list((cache_dir / "oci" / "tmp").glob("blob.*"))


# --- 4. a corrupt blob is refused by name ---------------------------------------------------------


def test_a_noop_build_refuses_a_corrupt_blob_by_name(tmp_path, cache_dir, session_cache, base_ref, small_wheels):
    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": small_wheels["alpha"], "gamma": small_wheels["gamma"]})
    first = build_json(proj, "--no-load")
    assert build_json(proj, "--no-load")["noop"] is True
    blob = our_layer(cache_dir, first, "gamma")
    flip_byte(blob)
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 65, f"sha256:{blob.name}", "corrupt", "hermetic cache verify --repair")
    repair = run_cli("cache", "verify", "--repair")
    assert repair.returncode == 65 and blob.name in repair.stdout
    again = build_json(proj, "--no-load")
    assert (again["noop"], again["manifest_digest"]) == (False, first["manifest_digest"])  # the same bytes again
    assert build_json(proj, "--no-load")["noop"] is True


def test_a_noop_build_rehashes_only_what_changed(tmp_path, cache_dir, session_cache, base_ref, small_wheels):
    """The check is a stat per blob: a settled store is not read again (no note is rewritten), and a
    blob whose stat changed (rewritten with the same bytes) is rehashed, alone."""
    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": small_wheels["alpha"], "gamma": small_wheels["gamma"]})
    first = build_json(proj, "--no-load")
    notes = cache_dir / "oci" / ".verified"
    blobs = cache_dir / "oci" / "blobs" / "sha256"
    image_blobs = {x["digest"].split(":")[1] for x in first["layers"]} | {first["image_id"].split(":")[1],
                                                                        first["manifest_digest"].split(":")[1]}
    settle([blobs / b for b in image_blobs])
    build_json(proj, "--no-load")  # rehashes what was racy at the end of the build (its last blobs)
    settled = {p.name: p.stat().st_mtime_ns for p in notes.iterdir()}
    assert image_blobs <= set(settled)
    settle([notes / n for n in settled])
    assert build_json(proj, "--no-load")["noop"] is True
    assert {p.name: p.stat().st_mtime_ns for p in notes.iterdir()} == settled  # nothing was rehashed
    blob = our_layer(cache_dir, first, "gamma")
    blob.write_bytes(blob.read_bytes())  # the same bytes, a new stat
    settle([blob])
    assert build_json(proj, "--no-load")["noop"] is True
    now = {p.name: p.stat().st_mtime_ns for p in notes.iterdir()}
    assert {n for n in now if now[n] != settled[n]} == {blob.name}


def test_a_run_refuses_an_image_with_a_corrupt_blob(tmp_path, cache_dir, session_cache, base_ref, small_wheels):
    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"gamma": small_wheels["gamma"]})
    (proj / "train.py").write_text("print('trained')\n")
    first = build_json(proj)
    flip_byte(our_layer(cache_dir, first, "gamma"))
    proc = run_cli("run", "train.py", cwd=proj)
    assert_clean_error(proc, 65, "corrupt", "hermetic cache verify --repair")
    assert not (proj / "runs").exists() or not any((proj / "runs").iterdir())


def test_the_engine_load_names_a_corrupt_layer(tmp_path, cache_dir, session_cache, base_ref, small_wheels,
                                               docker_client):
    """Corruption the stat cannot see (a blob changed behind the checks' back) is named by the load,
    which streams nothing the engine keeps."""
    from hermetic.engine import engine_has_image, load_image
    from hermetic.errors import IntegrityError
    from hermetic.store.oci import OciStore

    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"gamma": small_wheels["gamma"]})
    first = build_json(proj, "--no-load")
    blob = our_layer(cache_dir, first, "gamma")
    flip_byte(blob)
    with pytest.raises(IntegrityError, match=f"layer blob sha256:{blob.name} .* is corrupt.*nothing was loaded"):
        load_image(OciStore(cache_dir / "oci"), first["manifest_digest"])
    assert not engine_has_image(first["image_id"])


# --- 8. the base is checked before any fetch -----------------------------------------------------


@pytest.mark.parametrize("base, code", [("hermetic/not-bootstrapped@sha256:" + "1" * 64, 66),  # not found
                                        ("127.0.0.1:9/team/base@sha256:" + "2" * 64, 69)])  # unreachable
def test_a_missing_base_is_found_before_any_wheel_is_fetched(tmp_path, cache_dir, small_wheels, base, code):
    proj = make_project(tmp_path / "p", base, {"alpha": small_wheels["alpha"], "beta": small_wheels["beta"]})
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert proc.returncode == code and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert base.split("@")[0] in proc.stderr, proc.stderr
    assert tree_digest(cache_dir / "wheels") == {}
