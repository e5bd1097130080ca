"""After the container: what the script left behind, collected without trusting any of it.

The script could write three trees on the host: /outputs (``runs/<id>/outputs``),
its working directory (a scratch copy of the snapshot) and the runtime's
directory (``runs/<id>/.runtime``: the runtime's report, torchrun's per-rank
logs, the other ranks' outputs). Everything read or moved from them after it
exits happens here, in one step, in a child process that runs as the
container's user (hermetic.privdrop; hermetic itself is often root) and
through hermetic.safetree (no link followed, no FIFO or device opened, names
escaped for the record). The result is plain JSON, which the record step
seals: nothing the script made is read again as root.

What the script left can never cost it its exit code or the record: a link
is recorded as a link, a FIFO by kind, a malformed metrics file or runtime
report as a note (``outputs.notes``), a working-directory file that cannot be
kept where it was written as a conflict (the run fails with that reason).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from hermetic import safetree
from hermetic.privdrop import call_as
from hermetic.record.build import summarize_metrics_at
from hermetic.record.outputs import hash_outputs_at
from hermetic.run.workdir import WorkdirResult, collect_at

RUNTIME_REPORT_NAME = "runtime.json"
RUNTIME_REPORT_LIMIT = 16 << 20  # bytes: a report is a few KB; a bigger one is not read


@dataclass(frozen=True)
class CollectPlan:
    run_dir: str
    runtime_dir: str | None  # runs/<id>/.runtime; None when there is none (a pyxis task's report is elsewhere)
    workspace: str | None  # the working directory's scratch copy; None: nothing to collect from it
    snapshot_files: dict[str, str] = field(default_factory=dict)
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)  # dataset mount points inside the working directory
    ranks: dict[str, int] | None = None  # {"node_rank", "nproc_per_node"}: torchrun's files to collect


@dataclass
class Collected:
    workdir: WorkdirResult
    outputs: dict[str, Any]  # {"files": {...}}, as hash_outputs records it
    metrics: dict[str, Any]  # the record's metrics section
    runtime_report: dict[str, Any]
    rank_logs: dict[str, dict[str, str]] | None
    notes: list[str]


def collect_run(plan: CollectPlan, *, uid: int, gid: int) -> Collected:
    """Everything the record needs from the script's trees, gathered as ``uid:gid`` (module doc)."""
    dirs = [plan.run_dir, *(d for d in (plan.workspace, plan.runtime_dir) if d is not None)]
    doc = call_as(uid, gid, _collect, asdict(plan), open_dirs=dirs)
    return Collected(WorkdirResult.from_json(doc["workdir"]), doc["outputs"], doc["metrics"],
                     doc["runtime_report"], doc["rank_logs"], doc["notes"])


def _collect(fds: dict[str, int], plan_doc: dict[str, Any]) -> dict[str, Any]:
    plan = CollectPlan(**plan_doc)
    runfd = fds[plan.run_dir]
    notes: list[str] = []
    report: dict[str, Any] = {}
    rank_logs = None
    if plan.runtime_dir is not None:
        rtfd = fds[plan.runtime_dir]
        report = read_runtime_report_at(rtfd, notes)
        if plan.ranks is not None:
            from hermetic.run.distributed import DistributedPlan, collect_rank_files_at

            dist = DistributedPlan(nproc_per_node=plan.ranks["nproc_per_node"], backend="gloo",
                                   node_rank=plan.ranks["node_rank"])
            rank_logs = collect_rank_files_at(rtfd, runfd, dist)
    outfd = safetree.open_dir(runfd, "outputs")
    try:
        kept = WorkdirResult()
        if plan.workspace is not None:
            kept = collect_at(fds[plan.workspace], plan.snapshot_files, outfd, include=plan.include,
                              exclude=plan.exclude, skip=plan.skip)
        outputs = hash_outputs_at(outfd, notes)
        for rel, f in outputs["files"].items():
            if f.get("type"):
                notes.append(f"outputs/{rel}: a {f['type']}, recorded by kind (never opened)")
        metrics, metric_notes = summarize_metrics_at(outfd)
    finally:
        os.close(outfd)
    notes += metric_notes
    return {"workdir": kept.to_json(), "outputs": outputs, "metrics": metrics, "runtime_report": report,
            "rank_logs": rank_logs, "notes": notes}


def read_runtime_report_at(runtime_fd: int, notes: list[str] | None = None) -> dict[str, Any]:
    """What the in-image runtime wrote (seeds applied, determinism set); {} when it wrote nothing.

    The container can write there too: a link, a FIFO or an oversized file is not read (a note says so)."""
    try:
        data = safetree.read_limited(runtime_fd, RUNTIME_REPORT_NAME, RUNTIME_REPORT_LIMIT)
    except FileNotFoundError:
        return {}
    except (safetree.UnsafePath, OSError) as e:
        if notes is not None:
            notes.append(f"the runtime's report was not read: {getattr(e, 'message', e)}")
        return {}
    try:
        doc = json.loads(data)
    except ValueError:
        if notes is not None:
            notes.append("the runtime's report is not JSON: not read")
        return {}
    return doc if isinstance(doc, dict) else {}
