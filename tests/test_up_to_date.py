"""The one up-to-date check: the build's own no-op (hermetic/builder/build.py), which `hermetic build` and
`hermetic run` both ask. When the inputs did not change, the identity did not; a changed input of the image
is never taken as unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from buildsupport import build_json, make_project, share_base
from conftest import run_cli
from wheelfactory import make_index, make_wheel, requirements_lock

BASE = "hermetic/debian-bookworm-python3@sha256:" + "a" * 64
OTHER_BASE = "hermetic/debian-bookworm-python3@sha256:" + "b" * 64
LOCK = requirements_lock([("alpha", "1.0", ["1" * 64]), ("beta", "2.0", ["2" * 64])])

# Every way hermetic.yaml can change what reaches the image: each one a new build key.
IMAGE_CHANGES = [
    ("name: keyed", "name: keyed2"),
    (f"base: {BASE}", f"base: {OTHER_BASE}"),
    ("  version: '3.11'", "  version: '3.12'"),
    ("  path: /usr/bin/python3", "  path: /usr/local/bin/python3"),
    ("  mode: strict", "  mode: statistical"),
    ("  threads: 1", "  threads: 2"),
    ("  env: {}", "  env: {CUBLAS_WORKSPACE_CONFIG: ':16:8'}"),
    ("\nenv: {}", "\nenv: {TOKENIZERS_PARALLELISM: 'false'}"),
    ("  source_date_epoch: 0", "  source_date_epoch: 1"),
    ("  prefix: /opt/venv", "  prefix: /opt/env"),
    ("  compression: none", "  compression: gzip"),
    ("  bytecode: unchecked-hash", "  bytecode: none"),
    ("  user: '1000:1000'", "  user: '1001:1001'"),
    ("  workdir: /workspace", "  workdir: /work"),
]
# ... and ways it changes without touching the image: the same key.
SAME_IMAGE = [
    ("name: keyed", "# a comment\nname: keyed"),
    ("python:\n", "python:  # the interpreter\n"),
    ("  version: '3.11'", '  version: "3.11"'),
    ("  seed: 0", "  seed: 7"),
    ("runs_dir: runs", "runs_dir: elsewhere"),
    ("  shm_size: 1g", "  shm_size: 2g"),
    ("lock: requirements.lock", "lock: ./requirements.lock"),
]
CONFIG = f"""name: keyed
base: {BASE}
python:
  path: /usr/bin/python3
  version: '3.11'
lock: requirements.lock
determinism:
  mode: strict
  seed: 0
  threads: 1
  env: {{}}
env: {{}}
runs_dir: runs
build:
  source_date_epoch: 0
  prefix: /opt/venv
  compression: none
  bytecode: unchecked-hash
  user: '1000:1000'
  workdir: /workspace
run:
  shm_size: 1g
"""


def _key(proj, text: str, lock: str = LOCK) -> str:
    from hermetic.builder.build import read_config_lock
    from hermetic.builder.key import build_key
    from hermetic.config.load import load_config

    (proj / "hermetic.yaml").write_text(text)
    (proj / "requirements.lock").write_text(lock)
    cfg = load_config(proj)
    return build_key(cfg, read_config_lock(cfg))


def test_every_input_of_the_image_changes_the_build_key_and_nothing_else_does(tmp_path, monkeypatch):
    from hermetic.builder import inputs

    first = _key(tmp_path, CONFIG)
    assert _key(tmp_path, CONFIG) == first  # unchanged inputs: the same key
    keys = {first}
    for old, new in IMAGE_CHANGES:
        assert CONFIG.count(old) == 1, old
        keys.add(_key(tmp_path, CONFIG.replace(old, new)))
    assert len(keys) == len(IMAGE_CHANGES) + 1  # each change a key of its own
    for old, new in SAME_IMAGE:
        assert CONFIG.count(old) == 1, old
        assert _key(tmp_path, CONFIG.replace(old, new)) == first, new
    # the lock's bytes, even a change no pin sees
    assert _key(tmp_path, CONFIG, LOCK + "\n") != first
    assert _key(tmp_path, CONFIG, LOCK.replace("2.0", "2.1")) != first
    # the runtime shipped into every image: one byte of one of its files
    runtime = tmp_path / "runtime"
    shutil.copytree(inputs.RUNTIME_DIR, runtime, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(inputs, "RUNTIME_DIR", runtime)
    inputs.runtime_sha256.cache_clear()
    try:
        assert _key(tmp_path, CONFIG) == first  # the same files, copied: the same key
        seeding = runtime / "seeding.py"
        seeding.write_bytes(seeding.read_bytes() + b"\n")
        inputs.runtime_sha256.cache_clear()
        assert _key(tmp_path, CONFIG) != first
    finally:
        inputs.runtime_sha256.cache_clear()


# What the engine's hermetic/NAME:latest names is asserted here: not the other modules' "demo", which their
# builds on other workers move meanwhile.
NAME = "up-to-date"


@pytest.fixture
def proj(tmp_path, cache_dir, session_cache, base_ref, isolated_pip, monkeypatch):
    src = tmp_path / "wheels"
    files = {"alpha": make_wheel(src, "alpha", "1.0"), "beta": make_wheel(src, "beta", "2.0")}
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    share_base(session_cache, cache_dir)
    return make_project(tmp_path / "p", base_ref, files, name=NAME)


# What only a real build (layers, the install) or a --cache build (the registry client) imports.
NOT_FOR_A_NOOP = {"hermetic.builder.layers", "hermetic.builder.tarlayer", "hermetic.builder.install",
                  "hermetic.registry.client"}


def _imports(proc: subprocess.CompletedProcess) -> set[str]:
    return {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}


@pytest.mark.docker
def test_a_noop_build_gives_the_same_image_without_a_real_builds_machinery(proj, cache_dir):
    first = build_json(proj)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermetic", "build", "-C", str(proj), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["noop"], out["loaded"], out["image_id"], out["manifest_digest"]) == (
        True, False, first["image_id"], first["manifest_digest"])
    assert [layer["digest"] for layer in out["layers"]] == [layer["digest"] for layer in first["layers"]]
    assert not NOT_FOR_A_NOOP & _imports(proc)
    # from a subdirectory of the project, as `hermetic build` finds hermetic.yaml there: the same answer
    (proj / "src").mkdir()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermetic", "build", "--no-load", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=proj / "src")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["manifest_digest"] == first["manifest_digest"]
    assert not NOT_FOR_A_NOOP & _imports(proc)


@pytest.mark.docker
def test_each_kind_of_input_change_is_seen_and_an_unchanged_tree_is_a_noop(proj, cache_dir, docker_client):
    cfg, lock = proj / "hermetic.yaml", proj / "requirements.lock"
    first = build_json(proj)
    assert first["noop"] is False
    again = build_json(proj)
    assert (again["noop"], again["image_id"]) == (True, first["image_id"])
    # hermetic.yaml, changed where the image does not see it: the same image, not rebuilt
    original = cfg.read_text()
    cfg.write_text("# a comment\n" + original + "determinism:\n  seed: 7\nruns_dir: elsewhere\n")
    same = build_json(proj)
    assert (same["noop"], same["image_id"]) == (True, first["image_id"])
    # hermetic.yaml, changed where the image sees it: built, another image; back again: the first one
    cfg.write_text(original + "env:\n  TOKENIZERS_PARALLELISM: 'false'\n")
    other = build_json(proj)
    assert other["noop"] is False and other["image_id"] != first["image_id"]
    cfg.write_text(original)
    back = build_json(proj)
    assert (back["noop"], back["image_id"]) == (True, first["image_id"])
    # the lock's bytes, even a change no pin sees: the lock is an input of the image
    lock.write_text(lock.read_text() + "\n")
    relocked = build_json(proj)
    assert relocked["noop"] is False and relocked["image_id"] != first["image_id"]
    # the provenance file beside the config, removed: a no-op writes it again
    (proj / "hermetic.provenance.json").unlink()
    assert build_json(proj)["noop"] is True and (proj / "hermetic.provenance.json").is_file()
    # the engine lost the image: a no-op loads it again
    docker_client.images.remove(relocked["image_id"], force=True)
    reloaded = build_json(proj)
    assert (reloaded["noop"], reloaded["loaded"], reloaded["image_id"]) == (True, True, relocked["image_id"])
    assert build_json(proj)["loaded"] is False


@pytest.mark.docker
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
    store = OciStore(cache_dir / "oci")
    assert store.resolve(f"{NAME}:latest").digest == second["manifest_digest"]
    again = build_json(proj)
    assert again["noop"] is True
    assert store.resolve(f"{NAME}:latest").digest == first["manifest_digest"]
    assert docker_client.images.get(f"hermetic/{NAME}:latest").id == first["image_id"]
    text = run_cli("build", "-C", str(proj))
    assert text.returncode == 0 and text.stdout.startswith("up to date in "), text.stdout
