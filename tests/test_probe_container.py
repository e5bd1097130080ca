"""The probe inside a real container: read-only root, no network, nothing installed but python3.

The image is HERMETIC_TEST_PYTHON_IMAGE when set (any image with python3), else the rootfs
of the session's bootstrapped base (conftest's base_ref: a Debian bookworm minbase + python3
made by mmdebstrap once per run of the suite) `docker import`ed for this module, removed afterwards.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from hermetic.inimage.probe import PROBE_DIR

from test_probe import assert_shape

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def python_image(docker_client, session_cache, base_ref):
    given = os.environ.get("HERMETIC_TEST_PYTHON_IMAGE")
    if given:
        yield given
        return
    # The base's one layer is mmdebstrap's rootfs (minbase + python3): imported as it is, an image
    # with no configuration of its own (no Env, no Cmd), for this module; removed afterwards.
    blobs = session_cache / "oci" / "blobs" / "sha256"
    manifest = json.loads((blobs / base_ref.split("@sha256:")[1]).read_bytes())
    [layer] = manifest["layers"]
    repo = f"hermetic-test-probe-{uuid.uuid4().hex[:8]}"
    with open(blobs / layer["digest"][7:], "rb") as f:
        docker_client.api.import_image_from_data(f, repository=repo, tag="bookworm")
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
