"""The store under faults: dead writers' leftovers (found by their locks, listed, removed, counted),
corrupt blobs (real byte flips) refused by name before an image is trusted, and a missing base
found before anything is fetched."""

from __future__ import annotations

import contextlib
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
    from hermetic.hostfs.fsutil import is_racy

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
        from hermetic.hostfs.fsutil import OwnedTemp

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
    # The base's blobs are hard links into the session's cache (share_base): another test linking them
    # meanwhile moves their ctime, and a changed stat is rehashed (and, racy again, not noted), rightly.
    # This cache's own blobs are not.
    shared = {n for n in image_blobs | set(settled) if (blobs / n).stat().st_nlink > 1}
    assert image_blobs - shared <= set(settled)
    settle([notes / n for n in settled])
    assert build_json(proj, "--no-load")["noop"] is True
    now = {p.name: p.stat().st_mtime_ns for p in notes.iterdir()}
    assert {n for n in now if now[n] != settled[n]} - shared == set()  # nothing of this cache's was rehashed
    blob = our_layer(cache_dir, first, "gamma")
    blob.write_bytes(blob.read_bytes())  # the same bytes, a new stat
    settle([blob])
    assert build_json(proj, "--no-load")["noop"] is True
    now = {p.name: p.stat().st_mtime_ns for p in notes.iterdir()}
    assert {n for n in now if now[n] != settled[n]} - shared == {blob.name}


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
    from hermetic.engines.dockerimages import engine_has_image, load_image
    from hermetic.core.errors import IntegrityError
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


# --- 9. gc never removes what a running build or run needs; verify finds an incomplete image (issue 24) --


def test_gc_during_a_build_waits_for_it_and_removes_nothing_it_needs(tmp_path, cache_dir, session_cache, base_ref,
                                                                      isolated_pip, monkeypatch):
    """The build is frozen (SIGSTOP, with its layer workers) once its first layer is in the store and
    before any ref names it: gc says it waits, and does, until the build has finished; then both
    succeed and the image is complete. Before, gc removed the new layer blobs at once and the build
    died on a missing blob (exit 70), or left an image that `cache verify` called fine."""
    import signal

    from hermetic.store.oci import OciStore

    share_base(session_cache, cache_dir)
    src = tmp_path / "w"
    files = {"alpha": make_wheel(src, "alpha", "1.0"), "beta": make_wheel(src, "beta", "2.0"),
             "noise": make_wheel(src, "noise", "1.0", files={"noise/noise.bin": os.urandom(32 << 20)})}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    # gzip: after the layers, seconds of compressing them, from the blobs just written
    proj = make_project(tmp_path / "p", base_ref, files, extra="build:\n  compression: gzip\n")
    assert run_cli("fetch", "-C", str(proj)).returncode == 0  # the build goes straight to its layers
    store = OciStore(cache_dir / "oci")
    build = start_hermetic("build", "-C", str(proj), "--no-load", "--json")
    gc = None
    try:
        wait_for(build, lambda: any((cache_dir / "layers").glob("*.json")), "the build's first layer in the store")
        os.killpg(build.pid, signal.SIGSTOP)
        assert not [n for n in store.refs() if n.startswith("demo:")], "stopped too late: the build had finished"
        gc = start_hermetic("cache", "gc", "--keep-builds", "0", "--json")
        waiting = gc.stderr.readline()
        assert "waiting for the build(s) writing to the store" in waiting and str(build.pid) in waiting, waiting
        assert gc.poll() is None  # blocked on the lock while the build is stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(build.pid, signal.SIGCONT)
    out, err = build.communicate(timeout=300)
    assert build.returncode == 0, err
    gc_out, gc_err = gc.communicate(timeout=300)
    assert gc.returncode == 0, gc_err
    collected = json.loads(gc_out)  # it ran after the build: it saw the build's refs
    assert "demo:latest" in collected["kept_refs"] and collected["dropped_refs"][0].startswith("demo:bk-"), collected
    built = json.loads(out)
    assert store.has_image(built["manifest_digest"])
    verify = run_cli("cache", "verify", "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"], verify.stdout
    again = build_json(proj, "--no-load")
    assert (again["noop"], again["manifest_digest"]) == (True, built["manifest_digest"])


def _drop_refs(store, prefix: str) -> None:
    for name in [n for n in store.refs() if n.startswith(prefix)]:
        store.remove_ref(name)


def test_gc_keeps_the_image_a_live_process_checked(tmp_path, cache_dir, session_cache, base_ref, small_wheels):
    """What `hermetic run` does with the image it is about to run (run/runner.py: check_image) claims
    it: gc keeps all of it, named by a ref or not, while that process lives, and not after."""
    from hermetic.store.oci import OciStore

    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"gamma": small_wheels["gamma"]})
    digest = build_json(proj, "--no-load")["manifest_digest"]
    store = OciStore(cache_dir / "oci")
    user = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from hermetic.store.images import check_image\n"
        "from hermetic.store.oci import OciStore\n"
        "check_image(OciStore(sys.argv[1]), sys.argv[2])\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"), str(cache_dir / "oci"), digest], stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert user.stdout.readline().strip() == "ready"
        _drop_refs(store, "demo:")  # nothing names the image now
        proc = run_cli("cache", "gc")
        assert proc.returncode == 0, proc.stderr
        assert store.has_image(digest)
        blobs = store.live_blobs_from(digest)
        assert len(blobs) >= 3 and all(store.verify_blob(b) for b in blobs)
    finally:
        assert not survivors(sigkill(user))  # killed: its claim dies with it
    assert run_cli("cache", "gc").returncode == 0
    assert not store.has_blob(digest)
    assert not list((cache_dir / "oci" / "in-use").iterdir())  # the dead claim swept


@pytest.mark.docker
def test_gc_keeps_the_image_of_a_running_run(tmp_path, cache_dir, session_cache, base_ref, small_wheels):
    """A real `hermetic run` (detached, its script sleeping in the container): the refs that named
    its image are gone and gc runs, the image stays whole; once the run is stopped, gc removes it."""
    from hermetic.store.oci import OciStore

    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"gamma": small_wheels["gamma"]})
    (proj / "train.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    digest = build_json(proj)["manifest_digest"]
    started = run_cli("run", "--detach", "train.py", cwd=proj)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    try:
        log = proj / "runs" / run_id / "logs" / "stdout.log"
        deadline = time.monotonic() + 300
        while not (log.is_file() and "started" in log.read_text()):
            assert time.monotonic() < deadline, "the run's script never started"
            time.sleep(0.1)
        store = OciStore(cache_dir / "oci")
        _drop_refs(store, "demo:")
        proc = run_cli("cache", "gc")
        assert proc.returncode == 0, proc.stderr
        assert store.has_image(digest)
        assert run_cli("cache", "verify").returncode == 0
    finally:
        stopped = run_cli("stop", run_id, cwd=proj)
    assert stopped.returncode == 0, stopped.stderr
    from hermetic.store.inuse import claimed_images

    deadline = time.monotonic() + 120
    while claimed_images(store):  # until the run's process has exited (its claim goes with it)
        assert time.monotonic() < deadline, "the stopped run's process lives on"
        time.sleep(0.1)
    assert run_cli("cache", "gc").returncode == 0
    assert not store.has_blob(digest)


@pytest.mark.parametrize("role", ["config", "layer"])
def test_cache_verify_names_a_missing_blob_with_its_image(tmp_path, cache_dir, session_cache, base_ref,
                                                          small_wheels, role):
    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": small_wheels["alpha"], "gamma": small_wheels["gamma"]})
    first = build_json(proj, "--no-load")
    blob = (our_layer(cache_dir, first, "gamma") if role == "layer"
            else cache_dir / "oci" / "blobs" / "sha256" / first["image_id"].split(":")[1])
    blob.unlink()
    proc = run_cli("cache", "verify")
    assert proc.returncode == 65, (proc.stdout, proc.stderr)
    missing = [ln for ln in proc.stdout.splitlines() if ln.startswith("incomplete: ")]
    assert missing and all(f"blob sha256:{blob.name} is missing from the store" in ln for ln in missing), proc.stdout
    assert any(ln.startswith("incomplete: image demo:latest (" + first["manifest_digest"] + "): " + role)
               for ln in missing), proc.stdout
    assert "`hermetic cache verify --repair` drops their refs" in proc.stdout
    as_json = json.loads(run_cli("cache", "verify", "--json").stdout)
    assert {(m["ref"], m["digest"]) for m in as_json["missing"]} >= {("demo:latest", f"sha256:{blob.name}")}
    repair = run_cli("cache", "verify", "--repair")
    assert repair.returncode == 65 and "removed: ref demo:latest (incomplete: build it again" in repair.stdout, \
        repair.stdout
    assert run_cli("cache", "verify").returncode == 0  # what is left is complete
    again = build_json(proj, "--no-load")
    assert (again["noop"], again["manifest_digest"]) == (False, first["manifest_digest"])
    assert run_cli("cache", "verify").returncode == 0
