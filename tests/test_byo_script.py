"""Bring your own script (issue 13): scripts written before hermetic run unmodified, and every verdict is true.

Each test writes a small script of the project's own into a copy of the
numpy example (its image, its dataset at data/) and runs it for real.
"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import assert_clean_error, run_cli
from run_support import diff_json, hermetic_run, run_dir_of, run_dirs

# Reads its data and writes its outputs where it stands, as scripts written for a laptop do.
WHERE_IT_STANDS = """import hashlib, os
data = open("data/train-x.f32", "rb").read()
open("model.pt", "wb").write(b"model " + hashlib.sha256(data).digest())
os.makedirs("out", exist_ok=True)
open("out/ckpt.pt", "wb").write(b"ckpt")
os.makedirs("__pycache__", exist_ok=True)
open("__pycache__/junk.pyc", "wb").write(b"never an output")
print("wrote model.pt and out/ckpt.pt")
"""

ARGPARSE_SEED = """import argparse, random
ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, required=True)
args = ap.parse_args()
random.seed(args.seed)
open("result.txt", "w").write(f"seed {args.seed}: {random.random()!r}\\n")
"""


@pytest.mark.docker
def test_outputs_written_where_the_script_stands_are_collected_and_compared(project):
    (project / "stands.py").write_text(WHERE_IT_STANDS)
    _, a = hermetic_run(project, "stands.py")
    _, b = hermetic_run(project, "stands.py")
    for rec in (a, b):
        assert set(rec["outputs"]["files"]) == {"model.pt", "out/ckpt.pt"}
        assert rec["outputs"]["workdir"] == {"collected": ["model.pt", "out/ckpt.pt"], "deleted": []}
        rd = run_dir_of(project, rec)
        assert (rd / "outputs" / "out" / "ckpt.pt").read_bytes() == b"ckpt"
    code, d = diff_json(run_dir_of(project, a), run_dir_of(project, b))
    assert code == 0 and d["verdict"]["kind"] == "identical"
    assert [f["path"] for f in d["outputs"]["files"]] == ["model.pt", "out/ckpt.pt"]
    # the snapshot in the record is the code as it was, not what the script left beside it
    assert "model.pt" not in a["code"]["snapshot"]["files"]


@pytest.mark.docker
def test_seed_placeholder_reaches_argparse_and_the_record_keeps_both(project):
    (project / "argseed.py").write_text(ARGPARSE_SEED)
    proc = run_cli("run", "--json", "--seeds", "3", "argseed.py", "--seed", "{seed}", cwd=project)
    assert proc.returncode == 0, proc.stderr
    group = json.loads(proc.stdout)
    first = yaml.safe_load((project / "hermetic.yaml").read_text())["determinism"]["seed"]
    assert [m["seed"] for m in group["members"]] == [first, first + 1, first + 2]
    results = set()
    for m in group["members"]:
        rec = json.loads((project / "runs" / m["run_id"] / "run.json").read_text())
        assert rec["invocation"]["args"] == ["--seed", str(m["seed"])]
        assert rec["invocation"]["args_template"] == ["--seed", "{seed}"]
        assert "{seed}" in rec["invocation"]["argv"]  # the command line as typed
        results.add(rec["outputs"]["files"]["result.txt"]["sha256"])
    assert len(results) == 3  # the seed reached the script: three different outputs


@pytest.mark.docker
def test_unknown_placeholder_is_refused_before_anything_runs(project):
    (project / "argseed.py").write_text(ARGPARSE_SEED)
    before = run_dirs(project)
    proc = run_cli("run", "argseed.py", "--seed", "{sed}", cwd=project)
    assert_clean_error(proc, 2, "{sed}", "{seed}")
    assert run_dirs(project) == before


@pytest.mark.docker
def test_a_script_that_deletes_its_own_code_fails_with_a_record_that_says_so(project):
    (project / "notes.txt").write_text("part of the code\n")
    (project / "cleaner.py").write_text("import os\nos.remove('notes.txt')\nprint('cleaned')\n")
    proc = run_cli("run", "--json", "cleaner.py", cwd=project)
    assert_clean_error(proc, 3, "deleted 1 file(s) of its own code snapshot: notes.txt")
    rec = json.loads(proc.stdout)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 0
    assert "notes.txt" in rec["record"]["reason"]
    assert rec["outputs"]["workdir"]["deleted"] == ["notes.txt"]
    assert (project / "notes.txt").is_file()  # the project itself is never touched


@pytest.mark.docker
def test_a_working_directory_that_outgrows_its_limit_is_stopped(project):
    cfg = yaml.safe_load((project / "hermetic.yaml").read_text())
    cfg.setdefault("run", {})["workdir_size"] = "2m"
    (project / "hermetic.yaml").write_text(yaml.safe_dump(cfg))
    (project / "hog.py").write_text("import time\nwith open('big.bin', 'wb') as f:\n"
                                    "    for _ in range(60):\n        f.write(b'x' * (1 << 20)); f.flush(); time.sleep(0.1)\n")
    proc = run_cli("run", "--json", "hog.py", cwd=project)
    assert_clean_error(proc, 3, "run.workdir_size (2m)")
    rec = json.loads(proc.stdout)
    assert rec["record"]["status"] == "failed" and "past run.workdir_size" in rec["record"]["reason"]
    assert rec["outputs"]["files"]["big.bin"]["size"] < 60 << 20  # stopped well before it wrote it all


def test_mounts_that_collide_are_refused_when_the_config_loads(tmp_path):
    base = "base: x@sha256:" + "0" * 64 + "\nname: t\n"
    cases = {
        "mount: /workspace/data/x": "datasets[1].mount: /workspace/data/x collides with datasets[0].path",
        "mount: /outputs/d": "datasets[1].mount: /outputs/d is inside /outputs",
        "mount: /usr/local/d": "is inside /usr, which the container needs",
        "mount: /opt": "datasets[1].mount: /opt would hide /opt/venv",
        "mount: /workspace": "would hide the working directory /workspace",
    }
    for mount, message in cases.items():
        (tmp_path / "hermetic.yaml").write_text(
            base + "datasets:\n  - {name: a, path: data, manifest: a.sha256}\n"
                   f"  - {{name: b, path: /srv/b, manifest: b.sha256, {mount}}}\n")
        proc = run_cli("config", "show", "-C", str(tmp_path))
        assert_clean_error(proc, 2, message, "hermetic.yaml:")
    (tmp_path / "hermetic.yaml").write_text(base + "datasets:\n  - {name: b, path: /srv/b, manifest: b.sha256}\n")
    assert_clean_error(run_cli("config", "show", "-C", str(tmp_path)), 2,
                       "datasets[0].mount: required, because path /srv/b is outside the project")
    (tmp_path / "hermetic.yaml").write_text(base + "datasets:\n  - {name: a, path: data, manifest: a.sha256}\n"
                                                   "run:\n  outputs:\n    include: ['data/**']\n")
    assert_clean_error(run_cli("config", "show", "-C", str(tmp_path)), 2,
                       "run.outputs.include[0]: 'data/**' reaches into dataset 'a'")
