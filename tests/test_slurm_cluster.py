"""The Slurm test cluster itself (scripts/ensure-slurm), on real slurmctld/slurmd:
what `hermetic submit` will rely on. Arrays with their Slurm variables and Docker
inside the tasks, a dependent job after an array, exit codes of failed tasks (from
slurmctld and from the jobcomp log, without slurmdbd), submissions rejected at once,
and one task per node for a 2-node step."""

from __future__ import annotations

import io
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from slurm_support import PARTITION, SlurmCluster, parse_record

pytestmark = [pytest.mark.slurm, pytest.mark.docker]

BUSYBOX = Path("/bin/busybox")


@pytest.fixture(scope="module")
def busybox_image() -> str:
    """A one-file image (Debian's static busybox) imported into the engine; removed after."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tar.gettarinfo(str(BUSYBOX), arcname="bin/busybox")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with BUSYBOX.open("rb") as f:
            tar.addfile(info, f)
    ref = f"hermetic-test/slurm-busybox:{uuid.uuid4().hex[:12]}"  # one per session: sessions share the engine
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True,
                   capture_output=True, timeout=120)
    yield ref
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, timeout=120)


def read_kv(path: Path) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)


def test_cluster_layout(slurm_cluster: SlurmCluster):
    # scripts/ensure-slurm: two slurmd on this host (Debian builds with multiple-slurmd).
    assert slurm_cluster.partition == PARTITION
    assert slurm_cluster.nodes == ("node1", "node2"), slurm_cluster.nodes
    assert slurm_cluster.jobcomp_log is not None
    assert {slurm_cluster.node_addr(n) for n in slurm_cluster.nodes} == {"127.0.0.1"}


def test_array_tasks_see_slurm_ids_and_run_docker(slurm_cluster: SlurmCluster, busybox_image, tmp_path):
    script = f"""#!/bin/sh
set -e
out={tmp_path}/task-$SLURM_ARRAY_TASK_ID
{{
  echo "job_id=$SLURM_JOB_ID"
  echo "array_job_id=$SLURM_ARRAY_JOB_ID"
  echo "array_task_id=$SLURM_ARRAY_TASK_ID"
  echo "node=$SLURMD_NODENAME"
  echo "partition=$SLURM_JOB_PARTITION"
  docker run --rm --pull never --network none -e TASK="$SLURM_ARRAY_TASK_ID" {busybox_image} \\
    /bin/busybox sh -c 'echo "container=task $TASK"'
}} > "$out.tmp"
mv "$out.tmp" "$out"
"""
    job = slurm_cluster.sbatch("--array=0-2", "-o", f"{tmp_path}/%A_%a.out", script=script)
    tasks = slurm_cluster.wait(job, timeout=90)

    logs = {p.name: p.read_text() for p in tmp_path.glob("*.out")}
    assert [t.array_task_id for t in tasks] == [0, 1, 2], (tasks, logs)
    for t in tasks:
        assert (t.state, t.exit_code, t.signal) == ("COMPLETED", 0, 0), (t, logs)
        assert t.array_job_id == job and t.partition == PARTITION
        seen = read_kv(tmp_path / f"task-{t.array_task_id}")
        assert seen == {
            "job_id": str(t.job_id), "array_job_id": str(job), "array_task_id": str(t.array_task_id),
            "node": t.nodes, "partition": PARTITION, "container": f"task {t.array_task_id}",
        }
        assert t.nodes in slurm_cluster.nodes
    assert len({t.job_id for t in tasks}) == 3  # each task its own job id


def test_dependent_job_runs_after_every_array_task(slurm_cluster: SlurmCluster, tmp_path):
    # Task 1 fails: afterany waits for the end, whatever the outcome (a group summary must run).
    array = slurm_cluster.sbatch(
        "--array=0-2", "-o", "/dev/null", script=f"""#!/bin/sh
sleep 1
date +%s.%N > {tmp_path}/end-$SLURM_ARRAY_TASK_ID
[ "$SLURM_ARRAY_TASK_ID" != 1 ] || exit 3
""")
    summary = slurm_cluster.sbatch(f"--dependency=afterany:{array}", "-o", "/dev/null",
                                   script=f"#!/bin/sh\ndate +%s.%N > {tmp_path}/summary-start\n")
    (pending,) = slurm_cluster.live_tasks(summary)
    assert (pending.state, pending.fields["Reason"]) == ("PENDING", "Dependency"), pending.fields

    tasks = slurm_cluster.wait(array)
    (done,) = slurm_cluster.wait(summary)
    assert [(t.array_task_id, t.state, t.exit_code) for t in tasks] == [
        (0, "COMPLETED", 0), (1, "FAILED", 3), (2, "COMPLETED", 0)]
    assert (done.state, done.exit_code) == ("COMPLETED", 0)
    ends = [float((tmp_path / f"end-{i}").read_text()) for i in range(3)]
    assert float((tmp_path / "summary-start").read_text()) >= max(ends)


def test_failed_job_exit_code_and_signal_without_slurmdbd(slurm_cluster: SlurmCluster, tmp_path):
    failed = slurm_cluster.sbatch("-o", "/dev/null", script="#!/bin/sh\nexit 7\n")
    killed = slurm_cluster.sbatch("-o", "/dev/null", script="#!/bin/sh\nkill -KILL $$\n")
    (f,) = slurm_cluster.wait(failed)
    (k,) = slurm_cluster.wait(killed)
    assert (f.state, f.exit_code, f.signal) == ("FAILED", 7, 0)
    assert (k.state, k.exit_code, k.signal) == ("FAILED", 0, 9)
    # The jobcomp log holds the same facts (what remains once slurmctld purges a job).
    for live in (f, k):
        (logged,) = slurm_cluster.jobcomp_tasks(live.job_id)
        assert (logged.state, logged.exit_code, logged.signal, logged.nodes, logged.partition) == (
            live.state, live.exit_code, live.signal, live.nodes, live.partition)
    # ... also for array tasks: ArrayJobId and ArrayTaskId are in each task's line.
    array = slurm_cluster.sbatch("--array=0-1", "-o", "/dev/null",
                                 script="#!/bin/sh\nexit $((SLURM_ARRAY_TASK_ID + 4))\n")
    live = slurm_cluster.wait(array)
    logged = sorted(slurm_cluster.jobcomp_tasks(array), key=lambda t: t.array_task_id)
    assert [(t.array_job_id, t.array_task_id, t.exit_code) for t in logged] == [
        (array, 0, 4), (array, 1, 5)] == [(t.array_job_id, t.array_task_id, t.exit_code) for t in live]
    # No accounting daemon: sacct cannot answer (why the helper reads the two above).
    sacct = subprocess.run(["sacct", "-j", str(failed)], capture_output=True, text=True, timeout=30)
    assert "accounting storage is disabled" in (sacct.stdout + sacct.stderr)


def test_submissions_slurm_can_never_run_fail_at_once(slurm_cluster: SlurmCluster):
    name = f"hermetic-test-{uuid.uuid4().hex[:8]}"
    cases = {
        ("-p", "no-such-partition"): [
            "sbatch: error: invalid partition specified: no-such-partition",
            "sbatch: error: Batch job submission failed: Invalid partition name specified"],
        ("-p", PARTITION, "-N3"): [  # EnforcePartLimits=ALL: rejected, not left pending
            "sbatch: error: Batch job submission failed: Node count specification invalid"],
    }
    for args, lines in cases.items():
        proc = subprocess.run(["sbatch", "-J", name, *args, "--wrap", "true"],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 1 and proc.stdout == "", (args, proc)
        assert proc.stderr.splitlines() == lines, (args, proc.stderr)
    listed = subprocess.run(["squeue", "-h", "--states=all", "--name", name],
                            capture_output=True, text=True, timeout=30, check=True)
    assert listed.stdout == ""  # nothing was queued


def test_unreachable_controller_answers_ping_at_once(slurm_cluster: SlurmCluster, tmp_path):
    # `scontrol ping` says DOWN at once (sbatch would retry for ~9 s before failing).
    conf = Path("/etc/slurm/slurm.conf").read_text().replace("SlurmctldPort=6817", "SlurmctldPort=9")
    (tmp_path / "slurm.conf").write_text(conf)
    proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert proc.returncode == 1 and " is DOWN" in proc.stdout, proc


def test_two_node_step_runs_one_task_per_node(slurm_cluster: SlurmCluster, tmp_path):
    # The torchrun launch: srun starts one task per node; the rendezvous address is the first
    # node's NodeAddr (a node name is a host name on real clusters, not here).
    script = f"""#!/bin/sh
set -e
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol -o show node "$first" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
srun --ntasks-per-node=1 sh -c 'echo "$SLURMD_NODENAME $SLURM_PROCID $SLURM_NODEID"' > {tmp_path}/step
echo "$first $addr $SLURM_JOB_NUM_NODES" > {tmp_path}/master
"""
    job = slurm_cluster.sbatch("-N2", "--ntasks-per-node=1", "-o", f"{tmp_path}/out", script=script)
    (t,) = slurm_cluster.wait(job)
    assert (t.state, t.exit_code) == ("COMPLETED", 0), (tmp_path / "out").read_text()
    assert t.nodes == "node[1-2]"
    lines = sorted((tmp_path / "step").read_text().split("\n")[:-1])
    assert lines == ["node1 0 0", "node2 1 1"]
    assert (tmp_path / "master").read_text().split() == ["node1", "127.0.0.1", "2"]

    # And straight from the submitting host, as `srun -N2` in a test would.
    proc = subprocess.run(["srun", "-p", PARTITION, "-N2", "--ntasks-per-node=1", "sh", "-c",
                           'echo "$SLURMD_NODENAME $SLURM_PROCID"'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["node1 0", "node2 1"]


def test_parse_record_keeps_values_with_equals_and_blanks():
    rec = parse_record("JobId=5 JobName=a b TRES=cpu=1,mem=4G Socks/Node=* ExitCode=1:0")
    assert rec == {"JobId": "5", "JobName": "a b", "TRES": "cpu=1,mem=4G", "Socks/Node": "*",
                   "ExitCode": "1:0"}
