"""`hermetic submit` on the real Slurm test cluster (scripts/ensure-slurm: slurmctld + two slurmd), the
real registry (docker-registry on 127.0.0.1) and the real Docker Engine on the "nodes".

The numpy example: a 3-seed array -> three records with Slurm's IDs and a group summary in the shared
runs directory, the image pulled by digest on nodes whose stores lacked it; the snapshot made at submit
time, not when the task starts; a failing task's record and the group's "how many of how many"; every
refusal before anything is submitted; the pyxis export's script (enroot is not installable here: its
content is what is tested).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from buildsupport import clone_cache
from conftest import assert_clean_error, run_cli
from run_support import sha256_file
from slurm_support import PARTITION

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.registry]


@pytest.fixture(scope="module")
def module_cache(session_cache, tmp_path_factory):
    """This module's own clone of the session cache, for every `hermetic` it starts: its push is recorded
    in the store (pushed.json), and the records of this module's runs name it, but other modules' runs of
    the same image, beside this one under pytest-xdist, expect it never pushed."""
    cache = clone_cache(session_cache, tmp_path_factory.mktemp("slurm-submit") / "cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("HERMETIC_CACHE", str(cache))
    yield cache
    mp.undo()


@pytest.fixture(scope="module")
def pushed(logreg, registry, module_cache) -> dict:
    """The numpy example's image pushed to the test registry (what the nodes pull it from)."""
    proc = run_cli("push", f"{registry.host}/hermetic/logreg", "-C", str(logreg), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def submit(project: Path, *args: str, expect: int | None = 0, env: dict | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    proc = run_cli("submit", *args, cwd=project, env=env, timeout=timeout)
    if expect is not None:
        assert proc.returncode == expect, (proc.returncode, proc.stdout[-3000:], proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def lines_with(text: str, needle: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if needle in ln)


def jobs_named(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_seed_array_gives_three_records_with_slurm_ids_and_a_group_summary(logreg, pushed, slurm_cluster,
                                                                           tmp_path):
    node_caches = tmp_path / "nodes"  # each node's own, empty store: the image must come from the registry
    proc = submit(logreg, "--seeds", "3", "--node-cache", f"{node_caches}/{{node}}", "--name", "sweep",
                  "--wait", "--json", "train.py", "--epochs", "3", "--seed", "{seed}")
    group = json.loads(proc.stdout)
    runs = logreg / "runs"
    gid = group["group"]["group_id"]
    assert (runs / gid / "group.json").is_file() and (runs / gid / "slurm" / "job.sbatch").is_file()
    members = group["members"]
    assert [m["seed"] for m in members] == [1234, 1235, 1236]
    assert {m["status"] for m in members} == {"succeeded"}
    sl = group["slurm"]
    assert (sl["total"], sl["succeeded"], sl["summary"]) == (3, 3, "3 of 3 tasks succeeded")
    assert sl["partition"] == PARTITION
    pulled_from = set()
    nodes_used = set()
    for i, m in enumerate(members):
        rec = json.loads((runs / m["run_id"] / "run.json").read_text())  # all in the shared runs directory
        s = rec["slurm"]
        assert s["array_job_id"] == sl["array_job_id"] and s["array_task_id"] == i
        assert s["job_id"] > 0 and s["partition"] == PARTITION and s["node"] in slurm_cluster.nodes
        assert s["container"] == "docker" and s["submitted_from"] == gid
        assert rec["invocation"]["group"] == gid and rec["seed"]["value"] == m["seed"]
        assert rec["invocation"]["args"] == ["--epochs", "3", "--seed", str(m["seed"])]
        assert sl["tasks"][i]["node"] == s["node"] and sl["tasks"][i]["state"] == "COMPLETED"
        nodes_used.add(s["node"])
        if s["image_pulled_from"]:
            pulled_from.add(s["image_pulled_from"])
    # every node that ran a task had an empty store and now holds the image, pulled by digest from
    # where it was pushed (the record's repo digests: this push, and any earlier one of the same image)
    assert pulled_from and all(p.endswith("@" + pushed["manifest_digest"]) for p in pulled_from), pulled_from
    assert pulled_from <= set(rec["image"]["repo_digests"]) and pushed["repo_digest"] in rec["image"]["repo_digests"]
    for node in nodes_used:
        index = json.loads((node_caches / node / "oci" / "index.json").read_text())
        assert any(m["digest"] == pushed["manifest_digest"] for m in index["manifests"]), node
    listing = run_cli("runs", "--json", cwd=logreg)
    shown = {e["id"]: e for e in json.loads(listing.stdout)}
    assert shown[gid]["kind"] == "group" and all(shown[m["run_id"]]["status"] == "succeeded" for m in members)


def test_the_snapshot_is_made_at_submit_time_and_a_held_run_shows_as_pending(project, pushed, slurm_cluster):
    before = sha256_file(project / "train.py")
    proc = submit(project, "--sbatch-arg=--hold", "--json", "train.py", "--epochs", "2")
    doc = json.loads(proc.stdout)
    run_id, job = doc["id"], doc["job_id"]
    try:
        listing = json.loads(run_cli("runs", "--json", cwd=project).stdout)
        entry = next(e for e in listing if e["id"] == run_id)
        assert entry["status"] == "pending" and entry["slurm"]["job_id"] == job
        table = run_cli("runs", cwd=project).stdout
        assert f"pending (slurm {job})" in table
        # the checkout changes before the task starts: the task must run what was submitted
        (project / "train.py").write_text((project / "train.py").read_text() + "\nraise SystemExit(9)\n")
    finally:
        subprocess.run(["scontrol", "release", str(job)], check=True, capture_output=True)
    (task,) = slurm_cluster.wait(job, timeout=180)
    assert task.state == "COMPLETED", task
    rec = json.loads((project / "runs" / run_id / "run.json").read_text())
    assert rec["record"]["status"] == "succeeded"
    assert rec["code"]["snapshot"]["files"]["train.py"] == before
    assert rec["slurm"]["job_id"] == job and rec["slurm"]["array_job_id"] is None
    assert rec["slurm"]["array_task_id"] is None
    assert (project / "runs" / run_id / "slurm" / "logs" / f"job-{job}.out").is_file()


def test_a_failing_task_leaves_its_record_and_the_summary_counts_it(project, pushed, slurm_cluster):
    (project / "flaky.py").write_text(
        "import sys\nimport hermetic_runtime as hr\n"
        "seed = int(sys.argv[1])\nhr.seed_everything(seed)\nhr.log_metrics(0, loss=float(seed))\n"
        "sys.exit(3 if seed == 1 else 0)\n")
    proc = submit(project, "--seeds", "0,1,2", "--wait", "flaky.py", "{seed}", expect=3)
    gid = next(p.name for p in (project / "runs").iterdir() if (p / "group.json").is_file())
    group = json.loads((project / "runs" / gid / "group.json").read_text())
    assert group["slurm"]["summary"].startswith("2 of 3 tasks succeeded; task 1 (seed 1) failed, FAILED exit 3")
    assert group["group"]["status"] == "failed"
    failed = next(m for m in group["members"] if m["seed"] == 1)
    rec = json.loads((project / "runs" / failed["run_id"] / "run.json").read_text())
    assert (rec["record"]["status"], rec["record"]["exit_code"]) == ("failed", 3)
    assert rec["slurm"]["array_task_id"] == 1 and rec["slurm"]["array_job_id"] == group["slurm"]["array_job_id"]
    assert "2 of 3 tasks succeeded" in proc.stdout


def test_one_run_waits_and_exits_like_hermetic_run(project, pushed, slurm_cluster):
    proc = submit(project, "--wait", "--json", "train.py", "--epochs", "1")
    rec = json.loads(proc.stdout)
    assert rec["record"]["status"] == "succeeded" and rec["slurm"]["node"] in slurm_cluster.nodes
    assert rec["slurm"]["image_pulled_from"] is None  # the submitting machine's cache already had it
    assert rec["metrics"]["final"]


# --- refused before anything is submitted -------------------------------------------------------------

def _nothing_submitted(project: Path, name: str, runs_before: set[str]) -> None:
    runs = project / "runs"
    assert (set(p.name for p in runs.iterdir()) if runs.is_dir() else set()) == runs_before
    assert jobs_named(f"hermetic-{name}") == []


def _runs(project: Path) -> set[str]:
    runs = project / "runs"
    return set(p.name for p in runs.iterdir()) if runs.is_dir() else set()


def test_no_controller_is_one_line_before_anything(project, pushed, tmp_path):
    conf = Path("/etc/slurm/slurm.conf").read_text().replace("SlurmctldPort=6817", "SlurmctldPort=6999")
    (tmp_path / "slurm.conf").write_text(conf)
    before = _runs(project)
    proc = submit(project, "--name", "noctl", "train.py", expect=69, env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert_clean_error(proc, 69, "no Slurm controller answers", "slurmctld")
    _nothing_submitted(project, "noctl", before)


def test_a_partition_that_does_not_exist_is_named(project, pushed, slurm_cluster):
    before = _runs(project)
    proc = submit(project, "-p", "nope", "--name", "nopart", "train.py", expect=64)
    assert_clean_error(proc, 64, "--partition nope", "no such partition", PARTITION)
    _nothing_submitted(project, "nopart", before)


def test_more_nodes_than_the_partition_has_is_refused(project, pushed, slurm_cluster):
    before = _runs(project)
    proc = submit(project, "-N", "3", "--name", "toomany", "train.py", expect=64)
    assert_clean_error(proc, 64, "--nodes 3", "2 node(s)")
    _nothing_submitted(project, "toomany", before)


def test_an_image_never_pushed_is_refused(project, slurm_cluster):
    # another image (one more thread): built, but never pushed anywhere
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text().replace("threads: 1", "threads: 2"))
    before = _runs(project)
    proc = submit(project, "--name", "unpushed", "train.py", expect=66)
    assert_clean_error(proc, 66, "never pushed", "the nodes could not get it", "hermetic push")
    _nothing_submitted(project, "unpushed", before)


def test_a_dataset_the_nodes_cannot_see_is_refused(project, pushed, slurm_cluster, tmp_path):
    local = Path("/dev/shm") / f"hermetic-test-{tmp_path.name}"  # tmpfs: never shared between machines
    shutil.copytree(project / "data", local)
    try:
        before = _runs(project)
        proc = submit(project, "--data", f"logreg={local}", "--name", "shm", "train.py", expect=64)
        assert_clean_error(proc, 64, "dataset logreg", str(local), "tmpfs", "--data logreg=PATH")
        _nothing_submitted(project, "shm", before)
        proc = submit(project, "--shared-root", str(tmp_path / "elsewhere"), "--name", "shared", "train.py",
                      expect=64)
        assert_clean_error(proc, 64, "the runs directory", "outside every --shared-root")
        _nothing_submitted(project, "shared", before)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_a_secret_value_is_not_written_into_the_submission(project, pushed, slurm_cluster):
    before = _runs(project)
    proc = submit(project, "--env", "HF_TOKEN=abc", "--name", "secret", "train.py", expect=64)
    assert_clean_error(proc, 64, "--env HF_TOKEN=", "pass --env HF_TOKEN")
    _nothing_submitted(project, "secret", before)


# --- the pyxis/enroot export (not run: enroot is not installable here) --------------------------------

def test_pyxis_export_runs_the_image_by_digest_with_read_only_data(project, pushed, slurm_cluster):
    proc = submit(project, "--container", "pyxis", "--sbatch-arg=--hold", "--seeds", "0,1", "--json",
                  "--env", "LR_SCHEDULE=cosine", "train.py", "--epochs", "2", "--seed", "{seed}")
    doc = json.loads(proc.stdout)
    subprocess.run(["scancel", str(doc["job_id"])], capture_output=True)
    if doc["summary_job_id"]:
        subprocess.run(["scancel", str(doc["summary_job_id"])], capture_output=True)
    script = Path(doc["script"]).read_text()
    registry, _, repo_digest = pushed["repo_digest"].partition("/")
    repo, _, digest = repo_digest.partition("@")
    image = f"--container-image={registry}#{repo}@{digest}"
    assert digest == pushed["manifest_digest"]
    run_line = next(ln for ln in script.splitlines() if ln.startswith("srun ") and "--container-workdir" in ln)
    assert image in run_line
    data = project / "data"
    assert f"{data}:/workspace/data:ro" in run_line and f"{data}:/data/logreg:ro" in run_line
    assert '$WORK:/workspace,$RUN_DIR/outputs:/outputs,$RUN_DIR/.runtime:/run/hermetic' in run_line
    assert "--container-env=HERMETIC_SEED,HERMETIC_RUN_ID,HERMETIC_OUTPUTS,HERMETIC_RUNTIME_REPORT,LR_SCHEDULE" \
        in run_line
    for flag in ("--no-container-mount-home", "--no-container-remap-root", "--no-container-entrypoint",
                 "--container-workdir=/workspace"):
        assert flag in run_line, flag
    assert "/opt/venv/bin/python train.py" in run_line
    # only the run's variables reach the container (srun --export), over the image's (--container-env)
    assert "--export=PATH,HERMETIC_SEED,HERMETIC_RUN_ID,HERMETIC_OUTPUTS,HERMETIC_RUNTIME_REPORT,LR_SCHEDULE" \
        in run_line
    assert "export LR_SCHEDULE=cosine" in script and "--export=PATH " in lines_with(script, "probe.py")
    assert "ARGS_0=(--epochs 2 --seed 0)" in script and "ARGS_1=(--epochs 2 --seed 1)" in script
    assert "SEEDS=(0 1)" in script
    lines = script.splitlines()
    begin = next(i for i, ln in enumerate(lines) if "slurm-task --phase begin" in ln)
    end = next(i for i, ln in enumerate(lines) if "slurm-task --phase end" in ln)
    probe = next(i for i, ln in enumerate(lines) if "/run/hermetic-probe/probe.py" in ln)
    run = lines.index(run_line)
    assert probe < begin < run < end  # probe, record steps around the container
    assert subprocess.run(["bash", "-n", doc["script"]], capture_output=True).returncode == 0


def test_pyxis_record_steps_run_for_real_on_a_node(project, pushed, slurm_cluster, tmp_path):
    """hermetic's own steps of the pyxis script (``--phase begin`` / ``--phase end``) in a real Slurm job.
    The two ``srun --container-image`` steps (probe, run) are what cannot run here (no enroot): where the
    container would run, the job writes one file into the working directory, as a script would."""
    import sys

    proc = submit(project, "--container", "pyxis", "--sbatch-arg=--hold", "--json", "train.py", "--epochs", "2")
    doc = json.loads(proc.stdout)
    subprocess.run(["scancel", str(doc["job_id"])], capture_output=True)
    run_dir = Path(doc["dir"])
    submission = run_dir / "slurm" / "submit.json"
    steps = (f"#!/bin/bash\nset -euo pipefail\n"
             f"{sys.executable} -m hermetic slurm-task --phase begin {submission}\n"
             f"test -f {run_dir}/.workspace/train.py  # the submitted snapshot, where the container would see it\n"
             f"echo written-in-the-working-directory > {run_dir}/.workspace/result.txt\n"
             f"exec {sys.executable} -m hermetic slurm-task --phase end --exit-code 0 {submission}\n")
    job = slurm_cluster.sbatch("-o", str(tmp_path / "steps.out"), script=steps)
    (task,) = slurm_cluster.wait(job, timeout=120)
    assert (task.state, task.exit_code) == ("COMPLETED", 0), (tmp_path / "steps.out").read_text()
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["record"]["status"] == "succeeded" and rec["slurm"]["container"] == "pyxis"
    assert rec["slurm"]["job_id"] == job and rec["slurm"]["node"] in slurm_cluster.nodes
    assert rec["image"]["manifest_digest"] == pushed["manifest_digest"]
    assert pushed["repo_digest"] in rec["image"]["repo_digests"]
    assert rec["code"]["snapshot"]["files"]["train.py"] == sha256_file(project / "train.py")
    assert rec["data"]["logreg"]["verify_mode"] in ("stat-cache", "full")
    assert set(rec["outputs"]["files"]) == {"result.txt"} and rec["outputs"]["workdir"]["collected"] == ["result.txt"]
    assert not (run_dir / ".workspace").exists() and not (run_dir / ".runtime").exists()


def test_pyxis_export_can_take_the_image_as_one_file_checked_before_it_runs(project, slurm_cluster, tmp_path):
    """`--container pyxis --shared-store DIR`: the image as one SquashFS file in DIR (enroot imports nothing),
    named to pyxis by its path; the job script checks its sha256 before any container starts (exit 65)."""
    store = tmp_path / "store"
    proc = submit(project, "--container", "pyxis", "--shared-store", str(store), "--sbatch-arg=--hold", "--json",
                  "train.py", "--epochs", "2")
    doc = json.loads(proc.stdout)
    subprocess.run(["scancel", str(doc["job_id"])], capture_output=True)
    sub = json.loads((Path(doc["dir"]) / "slurm" / "submit.json").read_text())
    sqfs = Path(sub["squashfs"]["path"])
    assert sqfs.parent == store / "squashfs" and sub["squashfs"]["sha256"] == sha256_file(sqfs)
    script = Path(doc["script"]).read_text()
    run_line = next(ln for ln in script.splitlines() if ln.startswith("srun ") and "--container-workdir" in ln)
    assert f"--container-image={sqfs}" in run_line and f"--container-image={sqfs}" in lines_with(script, "probe.py")
    check = next(ln for ln in script.splitlines() if "sha256sum --check" in ln)
    lines = script.splitlines()
    assert lines.index(check) < next(i for i, ln in enumerate(lines) if "probe.py" in ln and ln.startswith("srun"))
    assert subprocess.run(["bash", "-c", check], capture_output=True).returncode == 0
    sqfs.write_bytes(sqfs.read_bytes()[:4096])  # truncated on the shared filesystem
    bad = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert bad.returncode == 65 and "truncated or altered" in bad.stderr and "nothing was run" in bad.stderr
