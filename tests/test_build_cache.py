"""`hermetic build --cache REGISTRY/REPO`: CI runners share images by build key (issue 8)."""

from __future__ import annotations

import json
import subprocess

import pytest

from buildsupport import make_project, serve_wheels, share_base
from conftest import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.registry]


@pytest.fixture
def wheels(tmp_path, isolated_pip, monkeypatch):
    return serve_wheels(tmp_path / "wheels", monkeypatch, alpha="1.0", beta="2.0")


def test_miss_builds_and_publishes_then_a_fresh_runner_pulls(tmp_path, session_cache, base_ref, wheels, registry,
                                                               docker_client):
    repo = f"{registry.host}/ci/cache"
    runner1 = tmp_path / "runner1-cache"
    share_base(session_cache, runner1)
    proj = make_project(tmp_path / "checkout1", base_ref, wheels)
    first = run_cli("build", "-C", str(proj), "--cache", repo, "--json", env={"HERMETIC_CACHE": str(runner1)})
    assert first.returncode == 0, first.stderr
    one = json.loads(first.stdout)
    assert one["noop"] is False and any("cache miss: published" in n for n in one["notes"])

    # A fresh runner: empty cache, no base image, no wheels. It must not build (nor fetch).
    runner2 = tmp_path / "runner2-cache"
    proj2 = make_project(tmp_path / "checkout2", base_ref, wheels)
    docker_client.images.remove(one["image_id"], force=True)
    second = run_cli("build", "-C", str(proj2), "--cache", repo, "--json", env={
        "HERMETIC_CACHE": str(runner2), "PIP_INDEX_URL": "http://127.0.0.1:9/unreachable"})
    assert second.returncode == 0, second.stderr
    two = json.loads(second.stdout)
    assert any("cache hit" in n for n in two["notes"]), two["notes"]
    assert (two["image_id"], two["manifest_digest"]) == (one["image_id"], one["manifest_digest"])
    assert not list((runner2 / "wheels").rglob("*.whl"))  # nothing fetched
    assert docker_client.images.get(two["image_id"]).id == two["image_id"]  # loaded
    assert (proj / "hermetic.image.json").read_text() == (proj2 / "hermetic.image.json").read_text()
    # The provenance came along with the cache hit (the fresh runner has no wheels to make one from).
    assert (proj2 / "hermetic.provenance.json").read_bytes() == (proj / "hermetic.provenance.json").read_bytes()

    # The tag is a pure function of the build key; an independent client agrees on the digest.
    tag = "hk-" + one["build_key"]
    inspect = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{repo}:{tag}"],
                             capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["Digest"] == one["manifest_digest"]

    # Same runner again: a local no-op, nothing pulled.
    third = json.loads(run_cli("build", "-C", str(proj2), "--cache", repo, "--json",
                               env={"HERMETIC_CACHE": str(runner2)}).stdout)
    assert third["noop"] is True


def test_unreachable_cache_registry_still_builds(tmp_path, session_cache, base_ref, wheels):
    cache = tmp_path / "cache"
    share_base(session_cache, cache)
    proj = make_project(tmp_path / "p", base_ref, wheels)
    proc = run_cli("build", "-C", str(proj), "--cache", "127.0.0.1:9/nope/cache", "--json", "--no-load",
                   env={"HERMETIC_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert any(n.startswith("cache unavailable, building here") for n in notes), notes
    assert any(n.startswith("could not publish to the cache") for n in notes), notes


def test_bad_cache_reference_is_a_clear_error(tmp_path, cache_dir, base_ref, wheels):
    proj = make_project(tmp_path / "p", base_ref, wheels)
    proc = run_cli("build", "-C", str(proj), "--cache", "no-host-here", "--json")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--cache no-host-here" in proc.stderr
