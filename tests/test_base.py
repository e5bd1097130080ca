"""Base images from every accepted source, always by digest (issue 3, part 1)."""

from __future__ import annotations

import json
import tarfile

import pytest

from buildsupport import build_json, clone_cache, make_project, serve_wheels
from conftest import assert_clean_error, run_cli

pytestmark = [pytest.mark.docker]


@pytest.fixture
def wheels(tmp_path, isolated_pip, monkeypatch):
    return serve_wheels(tmp_path / "wheels", monkeypatch, alpha="1.0")


def _run_alpha(docker_client, image_id: str) -> bytes:
    return docker_client.containers.run(image_id, ["python", "-c", "import alpha; print('ok')"], remove=True).strip()


@pytest.mark.registry
def test_base_from_a_registry_and_base_pin(tmp_path, session_cache, base_ref, registry, wheels, docker_client,
                                           cache_dir):
    digest = base_ref.split("@")[1]
    # pushed from a clone of the session's store: the push is recorded there, not in the session's
    push = run_cli("push", f"{registry.host}/bases/debian:bookworm", "--image", digest, "--json",
                   env={"HERMETIC_CACHE": str(clone_cache(session_cache, tmp_path / "pusher"))})
    assert push.returncode == 0, push.stderr
    proj = make_project(tmp_path / "p", "hermetic/placeholder@sha256:" + "0" * 64, wheels)
    pin = run_cli("base", "pin", f"{registry.host}/bases/debian:bookworm", "-C", str(proj))
    assert pin.returncode == 0, pin.stderr
    pinned = f"{registry.host}/bases/debian:bookworm@{digest}"
    assert pin.stdout.strip() == pinned
    assert f"base: {pinned}\n" in (proj / "hermetic.yaml").read_text()
    # a fresh cache: the base comes over the Distribution API, verified, then the build proceeds
    out = build_json(proj)
    assert (cache_dir / "oci" / "blobs" / "sha256" / digest[7:]).is_file()
    assert _run_alpha(docker_client, out["image_id"]) == b"ok"


def test_base_from_the_engine_by_id(tmp_path, session_cache, base_ref, wheels, docker_client, cache_dir):
    from hermetic.engines.dockerimages import load_image
    from hermetic.store.oci import OciStore

    store = OciStore(session_cache / "oci")
    image_id = load_image(store, base_ref.split("@")[1])
    proj = make_project(tmp_path / "p", f"docker:{image_id}", wheels)
    out = build_json(proj)
    assert _run_alpha(docker_client, out["image_id"]) == b"ok"
    info = json.loads(run_cli("inspect", "-C", str(proj), "--json").stdout)
    base_cfg = json.loads((session_cache / "oci" / "blobs" / "sha256" / image_id[7:]).read_bytes())
    # the engine's layers came back byte-identical: same diff_ids
    ours = json.loads((cache_dir / "oci" / "blobs" / "sha256" / info["image_id"][7:]).read_bytes())
    assert ours["rootfs"]["diff_ids"][: len(base_cfg["rootfs"]["diff_ids"])] == base_cfg["rootfs"]["diff_ids"]


def test_base_from_an_oci_archive(tmp_path, session_cache, base_ref, wheels, docker_client):
    digest = base_ref.split("@")[1]
    src = session_cache / "oci"
    manifest = json.loads((src / "blobs" / "sha256" / digest[7:]).read_bytes())
    archive = tmp_path / "base.oci.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(src / "oci-layout", "oci-layout")
        for d in [digest, manifest["config"]["digest"]] + [layer["digest"] for layer in manifest["layers"]]:
            tf.add(src / "blobs" / "sha256" / d[7:], f"blobs/sha256/{d[7:]}")
        index = {"schemaVersion": 2, "manifests": [{"mediaType": manifest["mediaType"], "digest": digest,
                                                     "size": (src / "blobs" / "sha256" / digest[7:]).stat().st_size}]}
        data = json.dumps(index).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        import io

        tf.addfile(info, io.BytesIO(data))
    proj = make_project(tmp_path / "p", f"oci-archive:{archive}@{digest}", wheels)
    out = build_json(proj)
    assert _run_alpha(docker_client, out["image_id"]) == b"ok"


def test_base_without_the_configured_interpreter(tmp_path, session_cache, base_ref, wheels, monkeypatch):
    monkeypatch.setenv("HERMETIC_CACHE", str(session_cache))
    proj = make_project(tmp_path / "p", base_ref, wheels, extra="python:\n  path: /usr/bin/python3.99\n  version: '3.11'\n")
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 78, "no interpreter at python.path /usr/bin/python3.99")


def test_store_only_base_missing_says_how_to_get_it(tmp_path, cache_dir, wheels):
    proj = make_project(tmp_path / "p", "hermetic/debian-bookworm-python3@sha256:" + "1" * 64, wheels)
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 66, "is not in the local store")
    assert "hermetic base bootstrap" in proc.stderr
