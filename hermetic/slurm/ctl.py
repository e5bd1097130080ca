"""The Slurm edge: scontrol, sinfo, squeue and sbatch as subprocesses, each failure one line (no client, no
controller -- ``scontrol ping`` answers at once --, an unknown partition). Without slurmdbd a finished job's
state comes from ``scontrol show job``, then from the jobcomp/filetxt log when the cluster keeps one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from hermetic.core.errors import Unavailable, UsageError

# Job states after which nothing changes (squeue(1) "JOB STATE CODES").
TERMINAL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                             "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT"})
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")
TIMEOUT_S = 60


class SlurmUnavailable(Unavailable):
    """No Slurm client, or no controller answering (exit 69, like a missing Docker Engine)."""


class SlurmRefused(UsageError):
    """Slurm would not take the job as asked: an unknown partition, more nodes than it has (exit 64)."""


def _run(*cmd: str, input_text: str | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        raise SlurmUnavailable(f"{cmd[0]}: not found; install the Slurm client (Debian: slurm-client) or run "
                               "hermetic submit on a login node")
    try:
        return subprocess.run(list(cmd), input=input_text, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{' '.join(cmd[:3])} did not answer in {timeout:.0f} s; is slurmctld up?") from None


def parse_record(line: str) -> dict[str, str]:
    """One ``Key=Value Key=Value ...`` line (scontrol -o, jobcomp/filetxt) -> {Key: Value}."""
    marks = list(_FIELD.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        end = nxt.start() if nxt is not None else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def ping() -> None:
    """SlurmUnavailable unless the controller answers."""
    proc = _run("scontrol", "ping", timeout=30)
    if proc.returncode != 0 or "is UP" not in proc.stdout:
        said = (proc.stdout.strip() or proc.stderr.strip()).splitlines()[:1] or ["no answer"]
        raise SlurmUnavailable(f"no Slurm controller answers ({said[0]}); start slurmctld or check "
                               "SLURM_CONF / the Slurm config on this machine")


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: int
    available: bool


def partitions() -> list[Partition]:
    proc = _run("sinfo", "-h", "-o", "%P %D %a")
    if proc.returncode != 0:
        raise SlurmUnavailable(f"sinfo failed: {proc.stderr.strip() or proc.returncode}")
    found: dict[str, Partition] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, count, avail = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        prev = found.get(name)
        nodes = (prev.nodes if prev else 0) + (int(count) if count.isdigit() else 0)
        found[name] = Partition(name, default or bool(prev and prev.default), nodes, avail == "up")
    return list(found.values())


def check_partition(name: str | None, nodes: int) -> Partition:
    """The partition the job goes to (the default one when ``name`` is None), or SlurmRefused."""
    parts = partitions()
    known = ", ".join(sorted(p.name for p in parts)) or "none"
    if name is None:
        chosen = next((p for p in parts if p.default), None)
        if chosen is None:
            raise SlurmRefused(f"this cluster has no default partition; pass --partition (partitions: {known})")
    else:
        chosen = next((p for p in parts if p.name == name), None)
        if chosen is None:
            raise SlurmRefused(f"--partition {name}: no such partition on this cluster (partitions: {known})")
    if not chosen.available:
        raise SlurmRefused(f"partition {chosen.name} is not up (sinfo says so); pick another with --partition")
    if nodes > chosen.nodes:
        raise SlurmRefused(f"--nodes {nodes}: partition {chosen.name} has {chosen.nodes} node(s)")
    return chosen


def sbatch(script: Path, *args: str) -> int:
    """``sbatch --parsable ARGS SCRIPT``; the job ID. Slurm's own complaint, as one line, when it refuses."""
    proc = _run("sbatch", "--parsable", *args, str(script))
    if proc.returncode != 0:
        lines = [ln.removeprefix("sbatch: error: ").strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raise SlurmRefused(f"sbatch refused {script.name}: {'; '.join(lines) or f'exit {proc.returncode}'}")
    return int(proc.stdout.strip().split(";")[0])


def scancel(job_id: int) -> None:
    _run("scancel", str(job_id))


def release(job_id: int) -> None:
    _run("scontrol", "release", str(job_id))


@dataclass(frozen=True)
class JobTask:
    """One job, or one task of an array, as slurmctld (or its jobcomp log) reports it."""

    job_id: int
    array_job_id: int | None
    array_task_id: int | None  # None also for an array's pending rest ("ArrayTaskId=1-2")
    state: str
    exit_code: int
    signal: int
    nodes: str
    partition: str
    reason: str
    fields: Mapping[str, str] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_record(cls, rec: Mapping[str, str]) -> "JobTask":
        code, _, sig = rec.get("ExitCode", "0:0").partition(":")
        array_job = rec.get("ArrayJobId", "")
        task = rec.get("ArrayTaskId", "")
        return cls(int(rec["JobId"]), int(array_job) if array_job.isdigit() and array_job != "0" else None,
                   int(task) if task.isdigit() else None,
                   (rec.get("JobState") or "").split()[0] if rec.get("JobState") else "",
                   int(code or 0) if (code or "0").isdigit() else 0, int(sig or 0) if (sig or "0").isdigit() else 0,
                   rec.get("NodeList", ""), rec.get("Partition", ""), rec.get("Reason", ""), dict(rec))

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def jobcomp_log() -> Path | None:
    proc = _run("scontrol", "show", "config")
    if proc.returncode != 0:
        return None
    conf = dict((k.strip(), v.strip()) for k, _, v in (ln.partition("=") for ln in proc.stdout.splitlines()))
    if conf.get("JobCompType") == "jobcomp/filetxt" and conf.get("JobCompLoc"):
        return Path(conf["JobCompLoc"])
    return None


def job_tasks(job_id: int) -> list[JobTask]:
    """The job's tasks now (one per array task once split), sorted; [] when Slurm has no trace of it."""
    proc = _run("scontrol", "-o", "show", "job", str(job_id))
    if proc.returncode == 0:
        found = [JobTask.from_record(parse_record(ln)) for ln in proc.stdout.splitlines() if ln.strip()]
    elif "Invalid job id" in proc.stderr:
        found = _from_jobcomp(job_id)
    else:
        raise SlurmUnavailable(f"scontrol show job {job_id}: {proc.stderr.strip()}")
    return sorted(found, key=lambda t: (t.array_task_id is None, t.array_task_id or 0, t.job_id))


def _from_jobcomp(job_id: int) -> list[JobTask]:
    log = jobcomp_log()
    if log is None or not log.is_file():
        return []
    found: dict[int, JobTask] = {}
    for line in log.read_text(errors="replace").splitlines():
        rec = parse_record(line)
        if str(job_id) in (rec.get("JobId"), rec.get("ArrayJobId")):
            t = JobTask.from_record(rec)
            found[t.job_id] = t
    return list(found.values())


def queue_states(job_ids: list[int]) -> dict[str, str]:
    """``squeue``'s view of these jobs: {"123" or "123_4": "PENDING" | "RUNNING" | ...}; finished
    jobs are absent (squeue shows only what is queued or running)."""
    if not job_ids:
        return {}
    proc = _run("squeue", "-h", "-o", "%i %T", "-j", ",".join(str(j) for j in sorted(set(job_ids))))
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}
        raise SlurmUnavailable(f"squeue failed: {proc.stderr.strip() or proc.returncode}")
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def node_addr(node: str) -> str:
    """A node's address (NodeAddr; the node name itself where Slurm knows no other)."""
    proc = _run("scontrol", "-o", "show", "node", node)
    if proc.returncode != 0:
        return node
    return parse_record(proc.stdout).get("NodeAddr") or node


def hostnames(nodelist: str) -> list[str]:
    """``node[1-2]`` -> ["node1", "node2"]."""
    proc = _run("scontrol", "show", "hostnames", nodelist)
    return proc.stdout.split() if proc.returncode == 0 else [nodelist]
