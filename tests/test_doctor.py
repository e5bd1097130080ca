"""`hermetic doctor` against the real Docker Engine and real stores in a temp HERMETIC_CACHE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.cli import doctor_cmd
from hermetic.store.oci import MT_CONFIG, MT_LAYER, MT_MANIFEST, Descriptor, OciStore
from hermetic.store.wheels import WheelStore

HERMETIC = str(Path(sys.executable).parent / "hermetic")
NAMES = ["docker engine", "podman", "charliecloud", "gpu runtime", "nvidia driver", "disk", "dataset hashing", "squashfs",
         "oci store", "wheel store"]


def doctor(cache: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "HERMETIC_CACHE": str(cache), **(env or {})}
    return subprocess.run([HERMETIC, "doctor", *args], capture_output=True, text=True, env=full, timeout=300)


def by_name(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    doc = json.loads(proc.stdout)
    assert [c["name"] for c in doc["checks"]] == NAMES
    return {c["name"]: c for c in doc["checks"]}


def small_image(store: OciStore) -> tuple[str, str]:
    """A config, a layer and a manifest in the store, under ref test:1. Returns (manifest, layer) digests."""
    layer = store.put_bytes(b"layer bytes " * 100)
    config, config_size, _ = store.put_json({"architecture": "amd64", "os": "linux",
                                             "rootfs": {"type": "layers", "diff_ids": [layer]}})
    manifest, size, _ = store.put_json({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config, "size": config_size},
        "layers": [{"mediaType": MT_LAYER, "digest": layer, "size": store.blob_size(layer)}],
    })
    store.set_ref("test:1", Descriptor(MT_MANIFEST, manifest, size))
    return manifest, layer


def add_wheel(cache: Path, tmp_path: Path) -> Path:
    import hashlib

    src = tmp_path / "demo-1.0-py3-none-any.whl"
    src.write_bytes(b"PK not really a zip, the store only hashes it")
    return WheelStore(cache / "wheels").admit_file(src, {hashlib.sha256(src.read_bytes()).hexdigest()}).path


@pytest.mark.docker
def test_healthy_machine_exits_zero(tmp_path):
    import docker

    cache = tmp_path / "cache"
    store = OciStore(cache / "oci").ensure()
    small_image(store)
    add_wheel(cache, tmp_path)
    proc = doctor(cache, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = by_name(proc)
    version = docker.from_env().version()["Version"]
    assert checks["docker engine"]["status"] == "ok"
    assert f"Docker Engine {version} (API " in checks["docker engine"]["detail"]
    assert checks["oci store"] == {"name": "oci store", "status": "ok", "hint": "",
                                   "detail": checks["oci store"]["detail"]}
    assert checks["oci store"]["detail"].startswith("3 blobs rehashed")
    assert checks["wheel store"]["status"] == "ok"
    assert checks["wheel store"]["detail"].startswith("1 wheels rehashed")
    gpu_here = Path("/proc/driver/nvidia/version").exists()
    if not gpu_here:
        assert checks["nvidia driver"]["status"] == "warn"
        assert checks["gpu runtime"]["status"] in ("ok", "warn")  # never fail without a GPU
    assert json.loads(proc.stdout)["ok"] is True


@pytest.mark.docker
def test_corrupted_blob_fails_naming_its_file(tmp_path):
    cache = tmp_path / "cache"
    store = OciStore(cache / "oci").ensure()
    _manifest, layer = small_image(store)
    bad = store.blob_path(layer)
    bad.write_bytes(b"flipped" + bad.read_bytes()[7:])
    proc = doctor(cache, "--json")
    assert proc.returncode == 69
    oci = by_name(proc)["oci store"]
    assert oci["status"] == "fail"
    assert oci["detail"] == f"1 of 3 blobs corrupt: {bad}"
    assert "hermetic build" in oci["hint"]
    text = doctor(cache)
    assert text.returncode == 69
    assert any(line.startswith("FAIL  oci store") for line in text.stdout.splitlines())
    # --quick lists without reading every byte, so it cannot see the flip
    quick = by_name(doctor(cache, "--json", "--quick"))["oci store"]
    assert quick["status"] == "ok" and "not rehashed" in quick["detail"]


@pytest.mark.docker
def test_missing_blob_of_a_ref_warns(tmp_path):
    cache = tmp_path / "cache"
    store = OciStore(cache / "oci").ensure()
    _manifest, layer = small_image(store)
    store.blob_path(layer).unlink()
    oci = by_name(doctor(cache, "--json"))["oci store"]
    assert oci["status"] == "warn" and "test:1" in oci["detail"]


@pytest.mark.docker
def test_corrupted_wheel_fails(tmp_path):
    cache = tmp_path / "cache"
    wheel = add_wheel(cache, tmp_path)
    wheel.write_bytes(b"tampered")
    proc = doctor(cache, "--json")
    assert proc.returncode == 69
    w = by_name(proc)["wheel store"]
    assert w["status"] == "fail" and str(wheel) in w["detail"] and "content hashes to" in w["detail"]


def test_no_engine_fails_with_the_hint(tmp_path):
    # no Docker Engine answering, and neither podman nor ch-run on PATH: no engine can run
    proc = doctor(tmp_path / "cache", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock",
                                                     "PATH": str(tmp_path / "nothing")})
    assert proc.returncode == 69
    checks = by_name(proc)
    assert checks["docker engine"]["status"] == "fail"
    assert "scripts/ensure-docker" in checks["docker engine"]["hint"]
    assert checks["gpu runtime"] == {"name": "gpu runtime", "status": "warn",
                                     "detail": "not checked (no Docker Engine)", "hint": "run scripts/ensure-docker"}


def test_disk_thresholds(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor_cmd, "DISK_WARN_BYTES", 1 << 62)
    c = doctor_cmd.check_disk(tmp_path / "not" / "yet")
    assert c.status == "warn" and str(tmp_path / "not" / "yet") in c.detail
    monkeypatch.setattr(doctor_cmd, "DISK_FAIL_BYTES", 1 << 62)
    assert doctor_cmd.check_disk(tmp_path).status == "fail"


def test_data_hashing_check_names_the_loop_and_warns_on_the_python_fallback(monkeypatch):
    from hermetic.data import hashing

    if hashing._native is not None:
        c = doctor_cmd.check_data_hashing()
        assert c.status == "ok" and c.detail == f"C loop: {hashing._native.backend()}"
    monkeypatch.setattr(hashing, "_native", None)
    monkeypatch.delenv("HERMETIC_PURE_PYTHON", raising=False)
    c = doctor_cmd.check_data_hashing()
    assert c.status == "warn" and "the C extension is not built" in c.detail and "ensure-build-deps" in c.hint
    monkeypatch.setenv("HERMETIC_PURE_PYTHON", "1")
    assert "HERMETIC_PURE_PYTHON is set" in doctor_cmd.check_data_hashing().detail


def test_driver_check_reads_what_the_probe_reads():
    gpus, errors, tried = doctor_cmd.host_gpus()
    c = doctor_cmd.check_driver(gpus, errors, tried)
    if gpus:
        assert c.status in ("ok", "warn") and gpus[0]["name"] in c.detail
    elif not Path("/proc/driver/nvidia/version").exists():
        assert c.status == "warn" and c.detail == "no NVIDIA driver or GPU on this host: CPU runs only"
