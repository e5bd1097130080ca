"""`hermetic replay` and `hermetic diff` on real runs (issue 7).

Replays of examples/numpy-logreg: bitwise identical; refused when the data or
the image can no longer be had. Planted differences: one real run, then exactly
one thing changed and a second run; `hermetic diff` must name that cause, and
only that one.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from run_support import (containers_created_since, copy_project, diff_json, hermetic_run,
                         material_causes, output_digests, run_dir_of, run_dirs)

pytestmark = pytest.mark.docker


def flip_byte(path: Path, offset: int = 1000) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def replay(run_dir: Path, *, env: dict[str, str] | None = None):
    return run_cli("replay", str(run_dir), "--json", env=env)


def test_replay_is_bitwise_identical_and_uses_the_recorded_code(project):
    _, original = hermetic_run(project, "train.py", "--epochs", "6")
    rd = run_dir_of(project, original)
    # today's working tree is not what the run used: the replay must not see this
    (project / "train.py").write_text("raise SystemExit('the working tree is not the recorded snapshot')\n")
    proc = replay(rd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["original"] == original["record"]["run_id"]
    assert out["diff"]["verdict"]["line"].startswith("bitwise identical (")
    new = json.loads((project / "runs" / out["replay"] / "run.json").read_text())
    assert new["invocation"]["replay_of"] == original["record"]["run_id"]
    assert new["invocation"]["args"] == ["--epochs", "6"] and new["seed"]["value"] == 1234
    assert new["code"]["snapshot"]["sha256"] == original["code"]["snapshot"]["sha256"]
    assert new["image"]["manifest_digest"] == original["image"]["manifest_digest"]
    assert output_digests(project / "runs" / out["replay"]) == output_digests(rd)
    # the text form says it in its first line after the replay's own
    text = run_cli("replay", original["record"]["run_id"], cwd=project)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1].startswith("bitwise identical (4 files and 5 metrics compared")


def test_replay_after_the_data_changed_is_refused(project, docker_client):
    name = "t" + uuid.uuid4().hex[:10]
    _, original = hermetic_run(project, "--name", name, "train.py", "--epochs", "2")
    flip_byte(project / "data" / "test-x.f32")
    before, t0 = run_dirs(project), time.time()
    proc = replay(run_dir_of(project, original))
    assert_clean_error(proc, 65, "logreg", "test-x.f32", "no container was started")
    assert "logreg: changed  test-x.f32" in proc.stderr  # the lines `hermetic data verify` prints
    assert "hint:" not in proc.stderr  # a replay cannot accept a change: the data must be as recorded
    assert run_dirs(project) == before
    assert containers_created_since(docker_client, t0, name) == []


def test_replay_with_the_data_moved_takes_it_from_where_it_is_now(project, tmp_path):
    """Data outside the project, or on another machine: `--data NAME=PATH` says where it is now; it is
    verified against the run's own manifest copy, and the replay matches."""
    import shutil

    _, original = hermetic_run(project, "train.py", "--epochs", "2")
    rd = run_dir_of(project, original)
    moved = tmp_path / "elsewhere" / "logreg"
    shutil.move(str(project / "data"), moved)
    gone = replay(rd)
    assert gone.returncode != 0 and "logreg" in gone.stderr and "Traceback" not in gone.stderr
    assert_clean_error(run_cli("replay", str(rd), "--data", f"nosuch={moved}"), 64, "nosuch", "its datasets: logreg")
    proc = run_cli("replay", str(rd), "--json", "--data", f"logreg={moved}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["diff"]["verdict"]["line"].startswith("bitwise identical ("), out["diff"]["verdict"]
    new = json.loads((project / "runs" / out["replay"] / "run.json").read_text())
    assert new["data"]["logreg"]["path"] == str(moved)
    assert new["data"]["logreg"]["manifest_sha256"] == original["data"]["logreg"]["manifest_sha256"]
    # data moved after verification is still the same bytes: changed by a flipped byte, refused
    flip_byte(moved / "test-x.f32")
    assert_clean_error(run_cli("replay", str(rd), "--data", f"logreg={moved}"), 65, "test-x.f32")


def test_replay_without_the_image_is_refused(project, docker_client, tmp_path):
    name = "t" + uuid.uuid4().hex[:10]
    _, original = hermetic_run(project, "--name", name, "train.py", "--epochs", "2")
    before, t0 = run_dirs(project), time.time()
    # a store without the image (e.g. after `hermetic cache gc` or on another machine); never pushed
    proc = replay(run_dir_of(project, original), env={"HERMETIC_CACHE": str(tmp_path / "empty-cache")})
    image = original["image"]
    assert_clean_error(proc, 65, image["manifest_digest"], image["id"], "never pushed")
    assert run_dirs(project) == before
    assert containers_created_since(docker_client, t0, name) == []


# --- planted differences --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def baseline(logreg, tmp_path_factory) -> tuple[Path, dict]:
    """One real run of the example (8 epochs); each plant starts from a copy of its project."""
    proj = copy_project(logreg, tmp_path_factory.mktemp("baseline") / "numpy-logreg")
    _, rec = hermetic_run(proj, "train.py", "--epochs", "8")
    return proj, rec


def plant_code(proj: Path) -> list[str]:
    src = (proj / "train.py").read_text()
    line = 'ap.add_argument("--l2", type=float, default=1e-4)'
    assert src.count(line) == 1
    (proj / "train.py").write_text(src.replace(line, 'ap.add_argument("--l2", type=float, default=1e-3)'))
    return ["train.py", "--epochs", "8"]


def plant_data(proj: Path) -> list[str]:
    data, manifest = proj / "data" / "train-x.f32", proj / "data.sha256"
    flip_byte(data)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    lines = [f"{digest}  train-x.f32" if line.endswith("  train-x.f32") else line
             for line in manifest.read_text().splitlines()]
    manifest.write_text("\n".join(lines) + "\n")
    return ["train.py", "--epochs", "8"]


# Each plant: (what to change, the one section the diff must name, a phrase its notes must hold).
# "config": hyperparameters reach the run as the script's arguments, recorded with the config
# ("config and arguments"). A hermetic.yaml key is no clean single cause: the keys that do not
# define the image (datasets[i].path/.manifest, determinism.seed, runs_dir) are restated by another
# section, and datasets[i].mount is also the data section's mount; the rest change the image.
PLANTS = {
    "code": (plant_code, "code", "train.py changed"),
    "seed": (lambda proj: ["--seed", "99", "train.py", "--epochs", "8"], "seed", "seed 1234 -> 99"),
    "config": (lambda proj: ["train.py", "--epochs", "8", "--lr", "0.1"], "config",
               "arguments '--epochs 8' -> '--epochs 8 --lr 0.1'"),
    "env": (lambda proj: ["--env", "EXTRA_FLAG=1", "train.py", "--epochs", "8"], "env", "EXTRA_FLAG unset -> 1"),
    "data": (plant_data, "data", "logreg: train-x.f32 changed"),
}


def checkpoint_restated(diff: dict) -> dict:
    """The diff without seed.applied.checkpoint.* changes: the runtime's report of the checkpoint
    it saved is an output (its digest follows from the outputs), which hermetic/diff/compare.py's
    compare_seed still counts as a material seed change (reported; see the xfail test below)."""
    out = json.loads(json.dumps(diff))
    for s in out["sections"]:
        if s["name"] == "seed":
            s["changes"] = [c for c in s["changes"] if not c["key"].startswith("applied.checkpoint.")]
            s["differs"] = any(c["material"] for c in s["changes"])
    return out


@pytest.mark.parametrize("plant", list(PLANTS))
def test_diff_names_the_one_planted_cause(plant, baseline, tmp_path):
    base_proj, a = baseline
    change, cause, phrase = PLANTS[plant]
    proj = copy_project(base_proj, tmp_path / "numpy-logreg")
    args = change(proj)
    _, b = hermetic_run(proj, *args)
    code, d = diff_json(run_dir_of(base_proj, a), run_dir_of(proj, b))
    assert code == 1
    assert d["verdict"]["kind"] == "inputs" and d["verdict"]["causes"][0] == cause
    assert d["verdict"]["line"].startswith(f"inputs differ: {cause} (")
    causes = material_causes(checkpoint_restated(d))
    assert list(causes) == [cause], causes  # that cause, and only that one
    assert any(phrase in note for note in causes[cause]), causes[cause]
    if plant != "env":  # an unused variable changes nothing the script computes
        assert not d["outputs"]["identical"]
    text = run_cli("diff", str(run_dir_of(base_proj, a)), str(run_dir_of(proj, b)))
    assert text.returncode == 1 and text.stdout.startswith(f"inputs differ: {cause} (")


def test_diff_of_an_unchanged_rerun_is_bitwise_identical(baseline, tmp_path):
    base_proj, a = baseline
    proj = copy_project(base_proj, tmp_path / "numpy-logreg")  # another checkout, same bytes
    _, b = hermetic_run(proj, "train.py", "--epochs", "8")
    code, d = diff_json(run_dir_of(base_proj, a), run_dir_of(proj, b))
    assert code == 0 and d["verdict"]["line"].startswith("bitwise identical (")
    assert material_causes(d) == {}


def test_checkpoint_digest_is_not_a_seed_cause(baseline, tmp_path):
    base_proj, a = baseline
    proj = copy_project(base_proj, tmp_path / "numpy-logreg")
    _, b = hermetic_run(proj, "train.py", "--epochs", "8", "--lr", "0.1")
    _, d = diff_json(run_dir_of(base_proj, a), run_dir_of(proj, b))
    assert d["verdict"]["causes"] == ["config"]
