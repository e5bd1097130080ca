"""The real Slurm test cluster for the tests that submit jobs.

- ``slurm_cluster`` (session fixture): runs scripts/ensure-slurm once (it installs
  and starts the cluster when needed, and is a no-op when it answers) and yields a
  ``SlurmCluster``: the partition, its nodes, and helpers to submit and to wait.
- ``SlurmCluster.wait(job_id)``: blocks until the job has ended (every task, for an
  array) and returns one ``SlurmTask`` per task: state, exit code, signal, node,
  array job/task ids. There is no slurmdbd (``sacct`` answers "Slurm accounting
  storage is disabled"), so it reads ``scontrol -o show job`` while slurmctld holds
  the record (MinJobAge: a day), and falls back to the jobcomp/filetxt log (one line
  per finished job or array task) when slurmctld has purged it.
- ``parse_records``: ``Key=Value`` lines (scontrol -o, the jobcomp log) to dicts.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO, run_once
from hermetic.slurm.ctl import parse_record  # `Key=Value ...` lines (scontrol -o, jobcomp): submit's parser

ENSURE_SLURM = REPO / "scripts" / "ensure-slurm"
PARTITION = "debug"  # what scripts/ensure-slurm configures (the default partition)

# Job states after which nothing changes (slurm.conf(5), squeue(1) "JOB STATE CODES").
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT",
})



def parse_records(text: str) -> list[dict[str, str]]:
    return [parse_record(ln) for ln in text.splitlines() if ln.strip()]


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@dataclass(frozen=True)
class SlurmTask:
    """One job, or one task of a job array, as slurmctld (or its jobcomp log) reports it."""

    job_id: int  # this task's own id (each array task gets one; SLURM_JOB_ID in the task)
    array_job_id: int | None  # SLURM_ARRAY_JOB_ID; None for a job that is no array
    array_task_id: int | None  # SLURM_ARRAY_TASK_ID; None also for an array's pending rest
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...; PENDING/RUNNING before the end
    exit_code: int  # the batch script's exit status (ExitCode=CODE:SIGNAL)
    signal: int  # the signal that ended it, 0 if none
    nodes: str  # NodeList: "node1", "node[1-2]"; "" or "(null)" while pending
    partition: str
    fields: Mapping[str, str] = field(repr=False, compare=False)  # every Key=Value as reported

    @classmethod
    def from_record(cls, rec: Mapping[str, str]) -> "SlurmTask":
        code, _, sig = rec.get("ExitCode", "0:0").partition(":")
        array_job = _int_or_none(rec.get("ArrayJobId"))
        return cls(
            job_id=int(rec["JobId"]),
            array_job_id=array_job if array_job else None,  # scontrol says 0 for no array
            array_task_id=_int_or_none(rec.get("ArrayTaskId")),
            state=rec.get("JobState", "").split()[0] if rec.get("JobState") else "",
            exit_code=int(code or 0),
            signal=int(sig or 0),
            nodes=rec.get("NodeList", ""),
            partition=rec.get("Partition", ""),
            fields=dict(rec),
        )

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def _run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass(frozen=True)
class SlurmCluster:
    partition: str
    nodes: tuple[str, ...]  # sorted node names of the partition
    jobcomp_log: Path | None  # JobCompLoc when JobCompType=jobcomp/filetxt

    @classmethod
    def discover(cls, partition: str = PARTITION) -> "SlurmCluster":
        names = _run("sinfo", "-h", "-N", "-p", partition, "-o", "%N").stdout.split()
        config = dict(
            (k.strip(), v.strip()) for k, _, v in
            (ln.partition("=") for ln in _run("scontrol", "show", "config").stdout.splitlines())
        )
        log = Path(config["JobCompLoc"]) if config.get("JobCompType") == "jobcomp/filetxt" else None
        return cls(partition=partition, nodes=tuple(sorted(set(names))), jobcomp_log=log)

    def sbatch(self, *args: str, script: str | None = None, cwd: Path | None = None) -> int:
        """`sbatch --parsable -p PARTITION ARGS` (the script on stdin); the job id."""
        proc = subprocess.run(["sbatch", "--parsable", "-p", self.partition, *args],
                              input=script, capture_output=True, text=True, cwd=cwd, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def node_addr(self, node: str) -> str:
        """The address of a node (NodeAddr; 127.0.0.1 for every node of the test cluster)."""
        rec = parse_record(_run("scontrol", "-o", "show", "node", node).stdout)
        return rec["NodeAddr"]

    def live_tasks(self, job_id: int) -> list[SlurmTask] | None:
        """The job's records in slurmctld (one per array task once split); None once purged."""
        proc = _run("scontrol", "-o", "show", "job", str(job_id), check=False)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            raise RuntimeError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
        return [SlurmTask.from_record(r) for r in parse_records(proc.stdout)]

    def jobcomp_tasks(self, job_id: int) -> list[SlurmTask]:
        """The finished tasks of a job (by JobId or ArrayJobId) in the jobcomp log; last line wins."""
        if self.jobcomp_log is None or not self.jobcomp_log.exists():
            return []
        found: dict[int, SlurmTask] = {}
        for rec in parse_records(self.jobcomp_log.read_text(errors="replace")):
            if str(job_id) in (rec.get("JobId"), rec.get("ArrayJobId")):
                task = SlurmTask.from_record(rec)
                found[task.job_id] = task
        return list(found.values())

    def tasks(self, job_id: int) -> list[SlurmTask]:
        """The job's tasks now, sorted by array task id (slurmctld, else the jobcomp log)."""
        live = self.live_tasks(job_id)
        found = live if live is not None else self.jobcomp_tasks(job_id)
        return sorted(found, key=lambda t: (t.array_task_id is None, t.array_task_id or 0, t.job_id))

    def wait(self, job_id: int, timeout: float = 60.0, poll: float = 0.2) -> list[SlurmTask]:
        """Block until every task of the job has ended; its tasks, sorted by array task id."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.tasks(job_id)
            if found and all(t.finished for t in found):
                return found
            if time.monotonic() > deadline:
                states = ", ".join(f"{t.job_id}:{t.state}({t.fields.get('Reason', '')})" for t in found)
                raise TimeoutError(f"job {job_id} has not ended after {timeout:.0f} s: {states or 'no records'}")
            time.sleep(poll)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> SlurmCluster:
    """The real cluster. Not skipped: `make test` starts it (scripts/ensure-test-deps); one worker
    at a time asks scripts/ensure-slurm (it installs and starts what is missing)."""
    with run_once(tmp_path_factory, "slurm-ready"):
        proc = subprocess.run([str(ENSURE_SLURM)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/ensure-slurm exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return SlurmCluster.discover()
