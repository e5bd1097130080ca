"""`hermetic build` on the real engine: reproducible digests, cache behaviour, refusals."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import assert_clean_error, run_cli, tree_digest
from buildsupport import build_json, make_project, share_base as _share_base
from wheelfactory import make_index, make_wheel, sha256_of
from hermetic.store.intact import noted_intact
from hermetic.store.oci import OciStore

pytestmark = pytest.mark.docker


@pytest.fixture
def wheels(tmp_path_factory, isolated_pip, monkeypatch):
    src = tmp_path_factory.mktemp("wheels")
    files = {
        "alpha": make_wheel(src, "alpha", "1.0", console_scripts={"alpha-hello": "alpha:main"},
                            files={"alpha/__main__.py": b"print('alpha says hi')\n"}),
        "beta": make_wheel(src, "beta", "2.0"),
        "beta3": make_wheel(src, "beta", "3.0"),
    }
    url = make_index(src / "index", list(files.values()))
    monkeypatch.setenv("PIP_INDEX_URL", url)
    return files


def test_build_runs_and_id_matches_engine(tmp_path, use_session_cache, base_ref, wheels, docker_client):
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"]})
    out = build_json(proj)
    assert out["image_id"].startswith("sha256:") and out["manifest_digest"].startswith("sha256:")
    assert {"digest", "size", "contents"} <= set(out["layers"][-1])
    image = docker_client.images.get(out["image_id"])
    assert image.id == out["image_id"]
    logs = docker_client.containers.run(out["image_id"], ["sh", "-c", "alpha-hello; python -c 'import alpha, beta, hermetic_runtime; print(beta.__version__)'; id -u"],
                                        remove=True, network_mode="none")
    assert logs.decode().split() == ["alpha", "says", "hi", "2.0", "1000"] or b"2.0" in logs, logs
    # console script shebang is the image's interpreter
    head = docker_client.containers.run(out["image_id"], ["head", "-1", "/opt/venv/bin/alpha-hello"], remove=True)
    assert head.decode().strip() == "#!/opt/venv/bin/python"
    record = json.loads((proj / "hermetic.image.json").read_text())
    assert record["image_id"] == out["image_id"]
    assert {p["name"] for p in record["packages"]} == {"alpha", "beta"}
    assert str(tmp_path) not in (proj / "hermetic.image.json").read_text()
    # second build: no-op
    again = build_json(proj)
    assert again["noop"] is True and again["image_id"] == out["image_id"] and again["loaded"] is False


def test_image_env_and_labels(tmp_path, use_session_cache, base_ref, wheels):
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"]},
                        extra="determinism:\n  mode: strict\n  threads: 3\n  env:\n    NCCL_ALGO: Tree\nenv:\n  MY_FLAG: '1'\n")
    build_json(proj, "--no-load")
    proc = run_cli("inspect", "-C", str(proj), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    env = dict(e.split("=", 1) for e in info["env"])
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["PYTHONHASHSEED"] == "0"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    assert env["NCCL_ALGO"] == "Tree" and env["MY_FLAG"] == "1" and env["TZ"] == "UTC"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert info["user"] == "1000:1000" and info["created"] == "1970-01-01T00:00:00Z"
    labels = info["labels"]
    assert labels["org.hermetic.version"] and len(labels["org.hermetic.lock.sha256"]) == 64
    assert labels["org.hermetic.base.digest"] == base_ref.split("@")[1]
    # statistical mode: seeds and threads only
    (proj / "hermetic.yaml").write_text((proj / "hermetic.yaml").read_text().replace("mode: strict", "mode: statistical"))
    build_json(proj, "--no-load")
    env2 = dict(e.split("=", 1) for e in json.loads(run_cli("inspect", "-C", str(proj), "--json").stdout)["env"])
    assert "CUBLAS_WORKSPACE_CONFIG" not in env2 and env2["OMP_NUM_THREADS"] == "3"


def test_reproducible_across_checkouts_caches_tz_umask_mtimes(tmp_path, use_session_cache, base_ref, wheels):
    """Two checkouts, two caches (the second holding only the base, none of the first's layers or notes),
    other TZ/umask/mtimes. The base's own bootstrap under another TZ and umask, into an empty cache, is the
    first GitLab pipeline's (tests/test_ci_templates.py): the same digest, which the project pins."""
    a = make_project(tmp_path / "one" / "checkout", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"]})
    first = build_json(a, "--no-load")
    b = tmp_path / "elsewhere" / "deeper" / "copy"
    shutil.copytree(a, b)
    (b / "hermetic.image.json").unlink()
    for p in b.iterdir():
        os.utime(p, (1_000_000_000, 1_000_000_000))
    other_cache = tmp_path / "other-cache"
    _share_base(use_session_cache, other_cache)
    env = {"HERMETIC_CACHE": str(other_cache), "TZ": "Pacific/Kiritimati"}
    script = f"umask 077; exec {sys.executable} -m hermetic "
    proc = subprocess.run(["sh", "-c", script + f"build -C {b} --json --no-load"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)
    assert second["noop"] is False
    assert (second["manifest_digest"], second["image_id"]) == (first["manifest_digest"], first["image_id"])
    assert (a / "hermetic.image.json").read_text() == (b / "hermetic.image.json").read_text()


def test_skopeo_reads_the_store(tmp_path, use_session_cache, base_ref, wheels):
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"]})
    out = build_json(proj, "--no-load")
    proc = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{use_session_cache / 'oci'}:demo:latest"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import hashlib

    assert "sha256:" + hashlib.sha256(proc.stdout).hexdigest() == out["manifest_digest"]
    cfg = subprocess.run(["skopeo", "inspect", "--config", f"oci:{use_session_cache / 'oci'}:demo:latest"],
                         capture_output=True, text=True, timeout=120)
    assert cfg.returncode == 0 and json.loads(cfg.stdout)["config"]["User"] == "1000:1000"


def test_one_package_change_rebuilds_only_its_layer(tmp_path, cache_dir, base_ref, session_cache, wheels, monkeypatch):
    # A >= 64 MB wheel gets its own layer; it must come from the layer cache after a small change.
    big = make_wheel(tmp_path / "big", "bigpkg", "1.0", files={"bigpkg/blob.bin": os.urandom(65 * 1024 * 1024)})
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "big"))
    _share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"], "bigpkg": big})
    first = build_json(proj, "--no-load")
    by_contents = {layer["contents"]: layer for layer in first["layers"]}
    big_layer = by_contents["bigpkg==1.0"]
    assert big_layer["cached"] is False
    assert first["layers"].index(big_layer) == 1  # biggest first, right above the base
    make_project(proj, base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta3"], "bigpkg": big})
    second = build_json(proj, "--no-load")
    layers = {layer["contents"]: layer for layer in second["layers"]}
    assert layers["bigpkg==1.0"]["cached"] is True and layers["bigpkg==1.0"]["digest"] == big_layer["digest"]
    rebuilt = [layer for layer in second["layers"] if not layer["cached"]]
    assert len(rebuilt) == 1 and "beta==3.0" in rebuilt[0]["packages"]  # only beta's group
    assert second["image_id"] != first["image_id"]


def test_a_loaded_build_leaves_the_layers_it_wrote_trusted_from_their_stat(tmp_path, cache_dir, base_ref, session_cache,
                                                                    wheels, docker_client):
    """The image is sealed after its load into the engine: a blob written a moment before the seal is within the
    racy window (intact.py) and would be rehashed by the next build (the torch layer, when it finishes last)."""
    _share_base(session_cache, cache_dir)
    # a fresh epoch: an image no engine holds, so that this build loads it
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"]},
                        extra=f"build:\n  source_date_epoch: {random.randrange(10 ** 8, 10 ** 9)}\n")
    built = build_json(proj)
    try:
        assert built["loaded"] is True
        store = OciStore(cache_dir / "oci")
        # (the layers: the config and manifest, a few hundred bytes, may be written as the load ends)
        written = [layer["digest"] for layer in built["layers"] if not layer["cached"]]
        assert len(written) >= 2
        for digest in written:
            assert noted_intact(store.root, store.blob_path(digest), digest.split(":", 1)[1]), digest
    finally:
        docker_client.images.remove(built["image_id"], force=True)


def test_floating_tag_is_refused_with_pin_hint(tmp_path, cache_dir):
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text("name: demo\nbase: registry.example/team/python:3.11\n")
    proc = run_cli("build", "-C", str(proj))
    assert_clean_error(proc, 78, "base", "tag without a digest", "hermetic base pin registry.example/team/python:3.11")
    assert tree_digest(cache_dir) == {}


def test_base_blob_with_wrong_digest_is_refused(tmp_path, cache_dir, session_cache, base_ref, wheels):
    """An OCI layout whose layer blob was tampered with never enters the store."""
    layout = tmp_path / "layout"
    digest = base_ref.split("@")[1]
    src = session_cache / "oci"
    manifest = json.loads((src / "blobs" / "sha256" / digest.split(":")[1]).read_text())
    (layout / "blobs" / "sha256").mkdir(parents=True)
    shutil.copy(src / "oci-layout", layout / "oci-layout")
    for d in [digest, manifest["config"]["digest"]]:
        shutil.copy(src / "blobs" / "sha256" / d.split(":")[1], layout / "blobs" / "sha256" / d.split(":")[1])
    layer = manifest["layers"][0]["digest"].split(":")[1]
    data = bytearray((src / "blobs" / "sha256" / layer).read_bytes())
    data[5000] ^= 0xFF
    (layout / "blobs" / "sha256" / layer).write_bytes(bytes(data))
    proj = make_project(tmp_path / "p", f"oci:{layout}@{digest}", {"alpha": wheels["alpha"]})
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 65, "digest mismatch", layer)
    assert not (cache_dir / "oci" / "blobs" / "sha256" / layer).exists()


def test_missing_wheel_offline_names_it(tmp_path, use_session_cache, base_ref, wheels):
    fresh = make_wheel(tmp_path / "w", "neverfetched", "9.9")
    proj = make_project(tmp_path / "p", base_ref, {"neverfetched": fresh})
    proc = run_cli("build", "-C", str(proj), "--offline", "--no-load")
    assert_clean_error(proc, 69, "neverfetched==9.9", "network is off")


def test_tampered_wheel_in_store_is_refused(tmp_path, cache_dir, session_cache, base_ref, wheels):
    _share_base(session_cache, cache_dir)
    # the layers no wheel decides (the runtime's, the interpreter's) made first, by another project: the refused
    # build may not add a blob of its own (a fresh cache's build makes those beside the wheels' and keeps them)
    build_json(make_project(tmp_path / "warm", base_ref, {"beta": wheels["beta"]}), "--no-load")
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"]})
    assert run_cli("fetch", "-C", str(proj)).returncode == 0
    stored = next((cache_dir / "wheels").rglob("alpha-1.0-*.whl"))
    stored.write_bytes(stored.read_bytes() + b"tampered")
    before = tree_digest(cache_dir / "oci")
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 65, "alpha==1.0", "corrupt", sha256_of(wheels["alpha"]))
    after = tree_digest(cache_dir / "oci")
    assert {k: v for k, v in after.items() if k.startswith("blobs")} == {k: v for k, v in before.items() if k.startswith("blobs")}
    verify = run_cli("cache", "verify")
    assert verify.returncode == 65 and "alpha-1.0" in verify.stdout
    assert run_cli("cache", "verify", "--repair").returncode == 65
    assert run_cli("cache", "verify").returncode == 0
    assert run_cli("build", "-C", str(proj), "--no-load").returncode == 0  # refetched, rebuilt


def test_concurrent_builds_give_one_image(tmp_path, cache_dir, session_cache, base_ref, wheels):
    _share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"]})
    cmd = [sys.executable, "-m", "hermetic", "build", "-C", str(proj), "--json", "--no-load"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    ids = {json.loads(o[0])["image_id"] for o in outs}
    assert len(ids) == 1
    assert run_cli("cache", "verify").returncode == 0


def test_sigkill_mid_build_leaves_store_valid(tmp_path, cache_dir, session_cache, base_ref, wheels, monkeypatch):
    _share_base(session_cache, cache_dir)
    big = make_wheel(tmp_path / "big", "bigpkg", "1.0", files={"bigpkg/blob.bin": os.urandom(80 * 1024 * 1024)})
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "big"))
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "bigpkg": big})
    assert run_cli("fetch", "-C", str(proj)).returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "hermetic", "build", "-C", str(proj), "--no-load"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # Kill it while a layer blob is being written (a temp file in the OCI store's tmp/).
    deadline = time.monotonic() + 120
    tmp = cache_dir / "oci" / "tmp"
    while time.monotonic() < deadline and p.poll() is None and not (tmp.is_dir() and any(tmp.glob("blob.*"))):
        time.sleep(0.02)
    assert p.poll() is None, "the build finished before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)  # the build and its layer-building workers
    p.wait()
    assert run_cli("cache", "verify").returncode == 0
    out = build_json(proj, "--no-load")
    assert out["noop"] is False
    assert run_cli("cache", "verify").returncode == 0


def test_gc_removes_unreferenced_blobs(tmp_path, cache_dir, session_cache, base_ref, wheels):
    _share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta"]})
    first = build_json(proj, "--no-load")
    make_project(proj, base_ref, {"alpha": wheels["alpha"], "beta": wheels["beta3"]})
    build_json(proj, "--no-load")
    proc = run_cli("cache", "gc", "--keep-builds", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["removed_blobs"] >= 2 and len(rep["dropped_refs"]) == 1
    blobs = cache_dir / "oci" / "blobs" / "sha256"
    assert not (blobs / first["manifest_digest"].split(":")[1]).exists()
    assert (blobs / base_ref.split(":")[-1]).exists()
    assert run_cli("cache", "verify").returncode == 0
    assert build_json(proj, "--no-load")["noop"] is True


def test_gzip_is_a_recorded_transform(tmp_path, cache_dir, session_cache, base_ref, wheels, docker_client):
    """gzip layers: the manifest names the gzip blobs; diff_ids (and the image ID) stay uncompressed."""
    _share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, {"alpha": wheels["alpha"]}, extra="build:\n  compression: gzip\n")
    out = build_json(proj)
    manifest = json.loads((cache_dir / "oci" / "blobs" / "sha256" / out["manifest_digest"][7:]).read_bytes())
    config = json.loads((cache_dir / "oci" / "blobs" / "sha256" / out["image_id"][7:]).read_bytes())
    ours = manifest["layers"][1:]
    assert all(layer["mediaType"].endswith("tar+gzip") for layer in ours)
    assert manifest["annotations"]["org.hermetic.layers.gzip"].startswith("zlib ")
    import gzip
    import hashlib

    for layer, diff_id in zip(ours, config["rootfs"]["diff_ids"][1:]):
        raw = gzip.decompress((cache_dir / "oci" / "blobs" / "sha256" / layer["digest"][7:]).read_bytes())
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == diff_id
    assert docker_client.images.get(out["image_id"]).id == out["image_id"]
    logs = docker_client.containers.run(out["image_id"], ["python", "-c", "import alpha; print('ok')"], remove=True)
    assert logs.strip() == b"ok"
