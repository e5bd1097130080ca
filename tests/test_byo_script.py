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
    assert_clean_error(proc, 64, "{sed}", "{seed}")
    assert run_dirs(project) == before


@pytest.mark.docker
def test_a_script_that_deletes_its_own_code_fails_with_a_record_that_says_so(project):
    (project / "notes.txt").write_text("part of the code\n")
    (project / "cleaner.py").write_text("import os\nos.remove('notes.txt')\nprint('cleaned')\n")
    proc = run_cli("run", "--json", "cleaner.py", cwd=project)
    assert_clean_error(proc, 73, "deleted 1 file(s) of its own code snapshot: notes.txt")
    rec = json.loads(proc.stdout)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 0
    assert "notes.txt" in rec["record"]["reason"] and rec["record"]["hermetic_exit_code"] == 73
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
    assert_clean_error(proc, 73, "run.workdir_size (2m)")
    rec = json.loads(proc.stdout)
    assert rec["record"]["status"] == "failed" and "past run.workdir_size" in rec["record"]["reason"]
    assert rec["record"]["hermetic_exit_code"] == 73  # what hermetic returned; exit_code is the stopped container's
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
        assert_clean_error(proc, 78, message, "hermetic.yaml:")
    (tmp_path / "hermetic.yaml").write_text(base + "datasets:\n  - {name: b, path: /srv/b, manifest: b.sha256}\n")
    assert_clean_error(run_cli("config", "show", "-C", str(tmp_path)), 78,
                       "datasets[0].mount: required, because path /srv/b is outside the project")
    (tmp_path / "hermetic.yaml").write_text(base + "datasets:\n  - {name: a, path: data, manifest: a.sha256}\n"
                                                   "run:\n  outputs:\n    include: ['data/**']\n")
    assert_clean_error(run_cli("config", "show", "-C", str(tmp_path)), 78,
                       "run.outputs.include[0]: 'data/**' reaches into dataset 'a'")


NEVER_SEEDS = """import random
import numpy as np
draws = [random.random(), float(np.random.rand())]
try:
    import torch
    draws.append(float(torch.randn(1)))
except ImportError:
    pass
open("draws.txt", "w").write(repr(draws) + "\\n")
"""


def _seeded_at_startup(rec: dict) -> list:
    return rec["seed"]["applied"]["startup"]["seeded"]


@pytest.mark.docker
def test_numpy_is_seeded_when_its_global_generator_is_imported_not_at_import_numpy(project):
    # numpy 2 imports numpy.random on first use; seeding it at `import numpy` cost every script ~10 ms
    (project / "nodraw.py").write_text("import numpy\nopen('v.txt', 'w').write(numpy.__version__)\n")
    (project / "draws.py").write_text("import numpy\nopen('v.txt', 'w').write(repr(numpy.random.rand()))\n")
    _, quiet = hermetic_run(project, "nodraw.py")
    _, drew = hermetic_run(project, "draws.py")
    assert "numpy" not in _seeded_at_startup(quiet)
    assert "numpy" in _seeded_at_startup(drew)


@pytest.mark.docker
def test_a_script_that_never_seeds_is_seeded_at_interpreter_start(project):
    (project / "never.py").write_text(NEVER_SEEDS)
    _, a = hermetic_run(project, "never.py")
    _, b = hermetic_run(project, "never.py")
    assert _seeded_at_startup(a) == ["random", "numpy"]  # as they were first imported; no torch in this image
    code, d = diff_json(run_dir_of(project, a), run_dir_of(project, b))
    assert code == 0 and d["verdict"]["kind"] == "identical"
    proc = run_cli("run", "--json", "--seeds", "3", "never.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    group = json.loads(proc.stdout)
    draws = {json.loads((project / "runs" / m["run_id"] / "run.json").read_text())["outputs"]["files"]["draws.txt"]
             ["sha256"] for m in group["members"]}
    assert len(draws) == 3 and group["flags"] == []


@pytest.mark.docker
def test_a_sweep_whose_seed_never_reaches_the_script_is_flagged(project):
    (project / "fixed.py").write_text("import random\nrandom.seed(42)\nopen('r.txt', 'w').write(str(random.random()))\n")
    proc = run_cli("run", "--seeds", "0,1", "fixed.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "hermetic: warning: all 2 members' outputs are bitwise identical: the seed did not reach" in proc.stderr


@pytest.mark.docker
def test_runs_that_compared_nothing_are_never_bitwise_identical(project):
    (project / "silent.py").write_text("print('trained, saved nowhere hermetic looks')\n")
    _, a = hermetic_run(project, "silent.py")
    _, b = hermetic_run(project, "silent.py")
    proc = run_cli("diff", str(run_dir_of(project, a)), str(run_dir_of(project, b)), "--json")
    assert proc.returncode == 66, proc.stderr  # errors.EXIT_NOTHING_COMPARED, not success
    d = json.loads(proc.stdout)
    assert d["verdict"]["kind"] == "nothing_compared" and "nothing to compare" in d["verdict"]["line"]
    assert d["logs"] == {"stdout": 0, "stderr": 0}
    text = run_cli("diff", str(run_dir_of(project, a)), str(run_dir_of(project, b)))
    assert "bitwise identical" not in text.stdout and "logs" in text.stdout


@pytest.mark.docker
@pytest.mark.slow
def test_torch_is_seeded_at_start_and_a_tf32_change_after_enable_determinism_is_named(torch_project):
    proj = torch_project
    (proj / "never.py").write_text(NEVER_SEEDS)
    _, a = hermetic_run(proj, "never.py")
    _, b = hermetic_run(proj, "never.py")
    assert set(_seeded_at_startup(a)) == {"random", "numpy", "torch"}
    assert diff_json(run_dir_of(proj, a), run_dir_of(proj, b))[0] == 0
    (proj / "tf32.py").write_text(
        "import sys, torch, hermetic_runtime as hr\nhr.enable_determinism()\n"
        "if '--tf32' in sys.argv:\n    torch.backends.cuda.matmul.allow_tf32 = True\n"
        "hr.log_metrics(0, x=float(torch.ones(2) @ torch.ones(2)))\n")
    _, plain = hermetic_run(proj, "tf32.py")
    _, changed = hermetic_run(proj, "tf32.py", "--tf32")
    final = changed["seed"]["applied"]["final"]
    assert final["changed_after_enable_determinism"]["cuda.matmul.fp32_precision"] == ["ieee", "tf32"]
    assert final["torch"]["cuda.matmul.fp32_precision"] == "tf32"
    _, d = diff_json(run_dir_of(proj, plain), run_dir_of(proj, changed))
    seed = next(s for s in d["sections"] if s["name"] == "seed")
    assert any("final.torch.cuda.matmul.fp32_precision" in c["key"] and c["material"] for c in seed["changes"])
    assert any("changed after enable_determinism() (ieee -> tf32)" in k for k in d["verdict"]["knobs_not_set"])
    shown = run_cli("runs", "show", changed["record"]["run_id"], cwd=proj).stdout
    assert "at exit: " in shown and "cuda.matmul.fp32_precision=tf32" in shown


@pytest.mark.docker
def test_the_run_readme_reproduce_by_hand_command_runs_and_matches(project, tmp_path):
    import re
    import subprocess
    import tarfile

    (project / "stands.py").write_text(WHERE_IT_STANDS)
    _, rec = hermetic_run(project, "stands.py")
    rd = run_dir_of(project, rec)
    readme = (rd / "README.md").read_text()
    block = re.search(r"\n( {7}docker run .*?)\n\n", readme, re.S).group(1)
    command = "\n".join(line[7:] for line in block.splitlines())
    # the user hermetic ran the script as (1000:1000 here when the tests run as root), never `id -u`'s
    user = rec["invocation"]["user"]
    assert f"--user {user} " in command and "id -u" not in command
    prepare = re.search(r"\n {7}(mkdir -p outputs && chown .*)\n", readme).group(1)
    here = tmp_path / "by-hand"
    code_dir = here / f"code-{rec['record']['run_id']}"
    code_dir.mkdir(parents=True)
    with tarfile.open(rd / "code" / "source.tar") as tf:
        tf.extractall(code_dir, filter="data")
    prep = subprocess.run(["bash", "-c", prepare], cwd=here, capture_output=True, text=True, timeout=60)
    assert prep.returncode == 0, (prepare, prep.stderr)
    proc = subprocess.run(["bash", "-c", command], cwd=here, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (command, proc.stderr)
    import hashlib

    for rel, f in rec["outputs"]["files"].items():
        where = here / "outputs" / rel if not (code_dir / rel).is_file() else code_dir / rel
        assert hashlib.sha256(where.read_bytes()).hexdigest() == f["sha256"], rel


@pytest.mark.docker
def test_init_takes_a_fresh_clone_to_its_first_recorded_run_in_two_commands(tmp_path, module_cache, base_ref):
    import subprocess

    upstream = tmp_path / "upstream"
    (upstream / "data").mkdir(parents=True)
    (upstream / "data" / "train.txt").write_text("1 2 3\n4 5 6\n")
    (upstream / "requirements.in").write_text("numpy==2.4.6\n")
    (upstream / "train.py").write_text(
        "import numpy as np\nx = np.loadtxt('data/train.txt')\nnp.save('weights.npy', x.mean(axis=0))\n")

    def git(cwd, *args):
        subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                       check=True, capture_output=True)

    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "a project that never heard of hermetic")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)

    first = run_cli("init", "--data", "data", cwd=clone)  # 1
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "next: hermetic run train.py"
    cfg = yaml.safe_load((clone / "hermetic.yaml").read_text())
    assert cfg["base"] == base_ref and cfg["lock"] == "requirements.lock" and cfg["name"] == "clone"
    assert cfg["datasets"] == [{"name": "data", "path": "data", "manifest": "data.sha256"}]
    assert "runs/" in (clone / ".gitignore").read_text().splitlines()
    _, rec = hermetic_run(clone, "train.py")  # 2
    assert rec["record"]["status"] == "succeeded"
    assert set(rec["outputs"]["files"]) == {"weights.npy"}
    assert rec["data"]["data"]["count"] == 1
    again = run_cli("init", cwd=clone)
    assert_clean_error(again, 73, "hermetic.yaml already exists; pass --force")


# What TensorBoard's SummaryWriter does (makemore): an event file named by time, host and PID, with wall
# times inside; beside it a model that seeds itself with a constant.
TENSORBOARD_LIKE = """import os, random, socket, time
random.seed(3407)
os.makedirs("out", exist_ok=True)
name = f"out/events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0"
open(name, "w").write(f"wall_time {time.time()!r}\\n")
open("out/model.pt", "w").write(repr([random.random() for _ in range(4)]))
"""


@pytest.mark.docker
def test_a_log_named_by_time_and_host_is_kept_but_not_compared(project):
    (project / "tb.py").write_text(TENSORBOARD_LIKE)
    _, a = hermetic_run(project, "tb.py")
    _, b = hermetic_run(project, "tb.py")
    [event] = a["outputs"]["volatile"]
    assert event.startswith("out/events.out.tfevents.") and event in a["outputs"]["files"]
    assert (run_dir_of(project, a) / "outputs" / event).is_file()  # kept, with the run
    code, d = diff_json(run_dir_of(project, a), run_dir_of(project, b))
    assert code == 0 and d["verdict"]["kind"] == "identical", d["verdict"]
    # one event file per run, named by its time: counted per run (the same name when both started in one second)
    assert d["verdict"]["line"] in (
        "bitwise identical (1 file and 0 metrics compared: out/model.pt; "
        "1 file in each run kept but not compared (run.outputs.volatile))",
        "bitwise identical (1 file and 0 metrics compared: out/model.pt; 1 file kept but not compared "
        "(run.outputs.volatile))")
    # A sweep whose seed never reached the model is still caught, though each member's log differs.
    proc = run_cli("run", "--json", "--seeds", "2", "tb.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert any("outputs are bitwise identical" in f for f in json.loads(proc.stdout)["flags"])


RESUMES_FROM_ITS_WORKDIR = """import os, sys
os.makedirs("out", exist_ok=True)
if "--resume" in sys.argv:  # makemore's way: reload the model from where it saved it
    before = open("out/model.pt").read()
    open("out/model.pt", "w").write(before + " +1")
else:
    open("out/model.pt", "w").write("step 500")
"""


@pytest.mark.docker
def test_resume_from_puts_a_workdir_output_back_where_the_script_wrote_it(project):
    (project / "resumes.py").write_text(RESUMES_FROM_ITS_WORKDIR)
    _, first = hermetic_run(project, "resumes.py")
    assert first["outputs"]["workdir"]["collected"] == ["out/model.pt"]
    _, resumed = hermetic_run(project, "--resume-from", first["record"]["run_id"], "resumes.py", "--resume")
    assert resumed["record"]["status"] == "succeeded", resumed["record"]
    assert (run_dir_of(project, resumed) / "outputs" / "out" / "model.pt").read_text() == "step 500 +1"
    assert resumed["outputs"]["workdir"]["collected"] == ["out/model.pt"]


@pytest.mark.docker
def test_a_resumed_from_output_that_changed_since_its_record_is_refused_and_named(project):
    # pytorch/examples' time_sequence_prediction: one run makes traindata.pt, the next resumes from it to train.
    (project / "resumes.py").write_text(RESUMES_FROM_ITS_WORKDIR)
    _, first = hermetic_run(project, "resumes.py")
    source = run_dir_of(project, first)
    _, resumed = hermetic_run(project, "--resume-from", first["record"]["run_id"], "resumes.py", "--resume")
    model = source / "outputs" / "out" / "model.pt"
    good = model.read_bytes()
    model.write_bytes(b"X" + good[1:])  # one byte of a sealed run's output
    try:
        before = run_dirs(project)
        proc = run_cli("run", "--resume-from", first["record"]["run_id"], "resumes.py", "--resume", cwd=project)
        assert_clean_error(proc, 65, f"--resume-from {first['record']['run_id']}: outputs/out/model.pt changed "
                           "since its record was sealed", "no container was started")
        assert run_dirs(project) == before  # refused before a run directory exists
        proc = run_cli("replay", str(run_dir_of(project, resumed)), cwd=project)
        assert_clean_error(proc, 65, "outputs/out/model.pt changed since its record was sealed")
    finally:
        model.write_bytes(good)
    (source / "outputs" / "out" / "stray.txt").write_text("added later")
    proc = run_cli("run", "--resume-from", first["record"]["run_id"], "resumes.py", "--resume", cwd=project)
    assert_clean_error(proc, 65, "outputs/out/stray.txt is not in its record (added since)")
    (source / "outputs" / "out" / "stray.txt").unlink()
    source.rename(source.with_name(source.name + "-moved"))  # the resumed-from run is gone: not found, 66
    proc = run_cli("replay", str(run_dir_of(project, resumed)), cwd=project)
    assert_clean_error(proc, 66, "which are gone")
