"""The quick no-op (hermetic/builder/quick.py): the same answer and checks, without the schema import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from buildsupport import build_json, make_project, share_base
from conftest import run_cli
from wheelfactory import make_index, make_wheel

pytestmark = pytest.mark.docker


@pytest.fixture
def proj(tmp_path, cache_dir, session_cache, base_ref, isolated_pip, monkeypatch):
    src = tmp_path / "wheels"
    files = {"alpha": make_wheel(src, "alpha", "1.0"), "beta": make_wheel(src, "beta", "2.0")}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    share_base(session_cache, cache_dir)
    return make_project(tmp_path / "p", base_ref, files, name=NAME)


# What the engine's hermetic/NAME:latest names is asserted here: not the other modules' "demo", which their
# builds on other workers move meanwhile.
NAME = "quick-noop"


def _quick(proj, cache_dir, load: bool = False):
    from hermetic.builder.quick import quick_noop
    from hermetic.paths import CachePaths

    return quick_noop(str(proj), CachePaths(cache_dir), load=load)


def test_a_noop_build_answers_without_importing_the_schema_or_docker(proj, cache_dir):
    first = build_json(proj)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermetic", "build", "-C", str(proj), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["noop"], out["loaded"], out["image_id"], out["manifest_digest"]) == (
        True, False, first["image_id"], first["manifest_digest"])
    assert [layer["digest"] for layer in out["layers"]] == [layer["digest"] for layer in first["layers"]]
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert not {"pydantic", "docker", "requests", "hermetic.config"} & imported
    # from a subdirectory of the project, as `hermetic build` finds hermetic.yaml there: the same quick answer
    (proj / "src").mkdir()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermetic", "build", "--no-load", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=proj / "src")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["manifest_digest"] == first["manifest_digest"]
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert not {"pydantic", "docker", "requests", "hermetic.config"} & imported


def test_any_changed_input_goes_the_full_way(proj, cache_dir, docker_client):
    first = build_json(proj)
    assert _quick(proj, cache_dir, load=True) is not None
    record = (proj / "hermetic.image.json").read_text()
    # a comment in hermetic.yaml: other bytes, so no quick answer; the full path finds the same image
    (proj / "hermetic.yaml").write_text((proj / "hermetic.yaml").read_text() + "# a comment\n")
    assert _quick(proj, cache_dir) is None
    again = build_json(proj)
    assert again["noop"] is True and again["image_id"] == first["image_id"]
    assert _quick(proj, cache_dir) is not None  # noted for these bytes now
    # the lock's bytes
    lock = proj / "requirements.lock"
    lock.write_text(lock.read_text() + "\n")
    assert _quick(proj, cache_dir) is None
    assert build_json(proj)["noop"] is False  # the lock is an input of the image: a new image
    # the provenance file beside the config, removed: the full path writes it again
    (proj / "hermetic.provenance.json").unlink()
    assert _quick(proj, cache_dir) is None
    build_json(proj)
    assert (proj / "hermetic.provenance.json").is_file() and _quick(proj, cache_dir) is not None
    # the engine lost the image: only the full path loads
    docker_client.images.remove(json.loads((proj / "hermetic.image.json").read_text())["image_id"], force=True)
    assert _quick(proj, cache_dir, load=True) is None
    assert _quick(proj, cache_dir, load=False) is not None
    assert build_json(proj)["loaded"] is True
    assert record != (proj / "hermetic.image.json").read_text()  # (the lock changed the image)


def test_the_quick_answer_is_the_full_answer(proj, cache_dir):
    from hermetic.builder.quick import _note_path
    from hermetic.paths import CachePaths

    build_json(proj, "--no-load")
    note = _note_path(CachePaths(cache_dir), (proj / "hermetic.yaml").resolve(), (proj / "hermetic.yaml").read_bytes())
    answers = {}
    for way in ("quick", "full"):
        if way == "full":
            note.unlink()  # no note: the full no-op
        text = run_cli("build", "-C", str(proj), "--no-load")
        assert text.returncode == 0 and text.stdout.startswith("up to date in "), text.stdout
        doc = build_json(proj, "--no-load") if way == "quick" else None
        if way == "full":
            note.unlink()
            doc = build_json(proj, "--no-load")
        answers[way] = (text.stdout.split("\n", 1)[1], {k: v for k, v in doc.items() if k != "seconds"})
    assert answers["quick"] == answers["full"]


def test_a_noop_points_the_name_back_at_its_image_in_the_store_and_the_engine(proj, cache_dir, tmp_path, base_ref,
                                                                             docker_client):
    # Two projects of one name in one cache (this module's NAME, or two clones): building the other one
    # moves NAME:latest; a no-op of the first must point it back, in the store and in the engine.
    from hermetic.store.oci import OciStore

    first = build_json(proj)
    other = make_project(tmp_path / "other", base_ref, {"alpha": next((tmp_path / "wheels").glob("alpha-*.whl"))},
                         name=NAME)
    second = build_json(other)
    assert second["manifest_digest"] != first["manifest_digest"]
    name = NAME
    store = OciStore(cache_dir / "oci")
    assert store.resolve(f"{name}:latest").digest == second["manifest_digest"]
    again = build_json(proj)
    assert again["noop"] is True
    assert store.resolve(f"{name}:latest").digest == first["manifest_digest"]
    assert docker_client.images.get(f"hermetic/{name}:latest").id == first["image_id"]
    quick = build_json(proj)  # and the quick path, now that the name is right again, answers
    assert quick["noop"] is True and store.resolve(f"{name}:latest").digest == first["manifest_digest"]
