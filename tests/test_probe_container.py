"""The probe inside a real container: read-only root, no network, nothing installed but python3.

The image is HERMETIC_TEST_PYTHON_IMAGE when set (any image with python3),
else a Debian bookworm minbase + python3 rootfs made with mmdebstrap (~30 s)
and `docker import`ed for this module, removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from hermetic.probe import PROBE_DIR

from test_probe import assert_shape

pytestmark = pytest.mark.docker
REUSABLE_IMAGES = ("hermetic/debian-bookworm-python3:bookworm",)


@pytest.fixture(scope="module")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as e:
        pytest.skip(f"no Docker Engine ({e.__class__.__name__}); run scripts/ensure-docker")
    return client


@pytest.fixture(scope="module")
def python_image(docker_client, tmp_path_factory):
    given = os.environ.get("HERMETIC_TEST_PYTHON_IMAGE")
    if given:
        yield given
        return
    for candidate in REUSABLE_IMAGES:  # the lead's bootstrapped base, when loaded already
        try:
            docker_client.images.get(candidate)
        except Exception:
            continue
        yield candidate
        return
    exe = shutil.which("mmdebstrap")
    if exe is None:
        pytest.skip("mmdebstrap is not installed (scripts/ensure-test-deps), and HERMETIC_TEST_PYTHON_IMAGE is unset")
    tar = tmp_path_factory.mktemp("rootfs") / "bookworm-python3.tar"
    proc = subprocess.run([exe, "--variant=minbase", "--include=python3", "--quiet", "bookworm", str(tar)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"mmdebstrap failed (Debian mirror unreachable?): {proc.stderr.strip()[-300:]}")
    repo = f"hermetic-test-probe-{uuid.uuid4().hex[:8]}"
    with open(tar, "rb") as f:
        docker_client.api.import_image_from_data(f, repository=repo, tag="bookworm")
    tar.unlink()
    ref = f"{repo}:bookworm"
    try:
        yield ref
    finally:
        docker_client.images.remove(ref, force=True)


def run_in_container(client, image: str, **kwargs) -> tuple[dict, str]:
    container = client.containers.run(
        image, ["python3", "/run/hermetic-probe/probe.py"], detach=True, read_only=True, network_mode="none",
        volumes={str(PROBE_DIR): {"bind": "/run/hermetic-probe", "mode": "ro"}}, **kwargs,
    )
    try:
        status = container.wait(timeout=120)
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0]), err


def test_probe_runs_in_read_only_container_with_nothing_installed(docker_client, python_image):
    doc, _ = run_in_container(docker_client, python_image,
                              environment={"PYTHONHASHSEED": "0", "HERMETIC_RUN_ID": "test"})
    assert_shape(doc)
    hw, sw = doc["hardware"], doc["software"]
    assert sw["python"]["executable"] == "/usr/bin/python3"
    assert sw["env"] == {"HERMETIC_RUN_ID": "test", "PYTHONHASHSEED": "0"}
    assert hw["gpus"] == [] and hw["gpu_note"] == "no GPU visible"
    assert "nvidia-smi: not on PATH" in hw["gpu_sources_tried"]
    assert any(e.startswith("software.torch: not importable") for e in doc["errors"])
    if "bookworm" in python_image:
        assert hw["os"] == "Debian GNU/Linux 12 (bookworm)"
        assert hw["glibc"] == "2.36"


def test_probe_reports_cgroup_limits(docker_client, python_image):
    doc, _ = run_in_container(docker_client, python_image, mem_limit="512m", nano_cpus=1_500_000_000)
    assert doc["hardware"]["memory_limit_bytes"] == 512 * 1024 * 1024
    assert doc["hardware"]["cpu"]["cgroup_cpus"] == 1.5
