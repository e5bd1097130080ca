"""Loading into the Docker Engine while the build goes on (hermetic/engines/dockerfeed.py), on the real engine."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import tarfile
import time

import pytest

from buildsupport import build_json, make_project
from wheelfactory import make_index, make_wheel

pytestmark = pytest.mark.docker


def _layer(store, name: str):
    from hermetic.store.oci import MT_LAYER, Descriptor

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        data = os.urandom(4096)  # new to the engine
        ti = tarfile.TarInfo(f"feed/{name}.bin")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    blob = buf.getvalue()
    return Descriptor(MT_LAYER, store.put_bytes(blob), len(blob))


def _wait(cond, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_a_ready_prefix_is_loaded_while_later_layers_are_still_building(session_cache, base_ref, docker_client):
    import docker.errors

    from hermetic.builder.base import resolve_base
    from hermetic.engines.dockerfeed import PARTIAL_LABEL, EngineFeed
    from hermetic.core.canonical import canonical_json
    from hermetic.engines.dockerimages import layers_engine_has, load_layers, remove_image
    from hermetic.store.oci import OciStore

    store = OciStore(session_cache / "oci")
    base = resolve_base(store, base_ref)
    ours = [_layer(store, f"l{i}") for i in range(3)]
    everything = base.diff_ids + [d.digest for d in ours]
    feed = EngineFeed(store, base.config, base.layers, len(base.layers) + 3, repo_tag=None)
    feed.start()
    final = None
    try:
        feed.layer_ready(0, ours[0], True)
        _wait(lambda: len(feed.loads) == 1 or feed.error is not None)
        assert feed.error is None
        [partial] = feed.partial_images
        shown = docker_client.api.inspect_image(partial)
        assert shown["RootFS"]["Layers"] == everything[:len(base.layers) + 1]
        assert shown["Config"]["Labels"][PARTIAL_LABEL] == f"{socket.gethostname()}:{os.getpid()}"  # its build
        feed.layer_ready(2, ours[2], True)  # out of order: layer 1 is missing, so no longer prefix yet
        time.sleep(1.0)
        assert len(feed.loads) == 1
        feed.layer_ready(1, ours[1], True)  # all there: the image's own load sends the rest
        feed.close()
        assert len(feed.loads) == 1 and feed.error is None
        have = layers_engine_has(everything, candidates=feed.partial_images)
        assert have == len(base.layers) + 1
        config = canonical_json({"architecture": "amd64", "os": "linux", "config": {},
                                 "rootfs": {"type": "layers", "diff_ids": everything}})
        final = load_layers(store, config, [(d.digest, d.size) for d in base.layers + ours], None, have)
        assert docker_client.api.inspect_image(final)["RootFS"]["Layers"] == everything
    finally:
        feed.close()
        feed.remove_partials()
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(partial)
    assert docker_client.api.inspect_image(final)["RootFS"]["Layers"] == everything  # the layers stayed
    remove_image(final)


def test_a_build_that_loads_leaves_no_partial_image(tmp_path, use_session_cache, base_ref, isolated_pip, monkeypatch,
                                                    docker_client):
    src = tmp_path / "wheels"
    files = {"big": make_wheel(src, "bigfeed", "1.0", payload_bytes=70 * 1024 * 1024),
             "small": make_wheel(src, "smallfeed", "1.0"), "other": make_wheel(src, "otherfeed", "1.0")}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    proj = make_project(tmp_path / "p", base_ref, files,
                        extra=f"build:\n  source_date_epoch: {int(time.time())}\n")  # layers new to the engine
    def partial_images() -> dict[str, set[str]]:
        """The engine's prefix images: ID -> its layers (diff IDs)."""
        ids = subprocess.run(["docker", "images", "-q", "--no-trunc", "--filter", "label=org.hermetic.partial"],
                             capture_output=True, text=True, check=True).stdout.split()
        return {i: set(docker_client.api.inspect_image(i)["RootFS"]["Layers"]) for i in ids}

    out = build_json(proj)
    assert out["loaded"] is True
    image = docker_client.api.inspect_image(out["image_id"])
    assert len(image["RootFS"]["Layers"]) == len(out["layers"])
    # The engine is shared (other builds run beside this one under pytest-xdist): ours are the prefix images
    # holding a layer only this build made (its source_date_epoch is now), and there must be none left.
    ours = {row["digest"] for row in out["layers"]
            if any(p.partition("==")[0] in ("bigfeed", "smallfeed", "otherfeed") for p in row["packages"])}
    assert ours and ours <= set(image["RootFS"]["Layers"])  # uncompressed layers: digest = diff ID
    assert not [i for i, layers in partial_images().items() if layers & ours]


def test_a_killed_builds_prefix_images_are_removed_by_the_next_feed_and_a_live_ones_kept(session_cache, base_ref,
                                                                                           docker_client):
    import docker.errors

    from hermetic.builder.base import resolve_base
    from hermetic.engines.dockerfeed import PARTIAL_LABEL, sweep_stale_partials
    from hermetic.core.canonical import canonical_json
    from hermetic.engines.dockerimages import load_layers, remove_image
    from hermetic.store.oci import OciStore

    store = OciStore(session_cache / "oci")
    base = resolve_base(store, base_ref)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID that has just ended: a build that was SIGKILLed
    loaded = {}
    for who, owner in (("dead", f"{socket.gethostname()}:{dead.pid}"), ("alive", f"{socket.gethostname()}:{os.getpid()}"),
                       ("elsewhere", f"another-host.invalid:{dead.pid}")):
        layer = _layer(store, who)
        config = canonical_json({"architecture": "amd64", "os": "linux", "config": {"Labels": {PARTIAL_LABEL: owner}},
                                 "rootfs": {"type": "layers", "diff_ids": base.diff_ids + [layer.digest]}})
        loaded[who] = load_layers(store, config, [(d.digest, d.size) for d in base.layers + [layer]], None, 0)
    try:
        removed = sweep_stale_partials()
        # a build on another worker sweeps too, and may have been first to the dead one
        assert loaded["alive"] not in removed and loaded["elsewhere"] not in removed
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(loaded["dead"])
        docker_client.images.get(loaded["alive"])
        docker_client.images.get(loaded["elsewhere"])
    finally:
        for image_id in loaded.values():
            remove_image(image_id)
