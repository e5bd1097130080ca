"""``slurm.json`` beside each prepared run (and group): ``submitted``, ``running``, ``finished`` or ``failed``
(with the reason); `hermetic runs` asks ``squeue`` whether a run without a record is pending or running, and
``--wait`` polls ``scontrol`` for the job's end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.record.ids import iso_utc
from hermetic.record.index import SLURM_JSON
from hermetic.slurm import ctl

SCHEMA = "hermetic-slurm/1"
OPEN_STATES = ("submitted", "running")  # hermetic has not heard the end of it yet


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((run_dir / SLURM_JSON).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into ``run_dir/slurm.json`` (written atomically; one writer per file at a time:
    submit before the job exists, then the task that runs it)."""
    doc = {**read_state(run_dir), **fields, "schema": SCHEMA, "updated_at": iso_utc()}
    atomic_write_text(run_dir / SLURM_JSON, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def slurm_job_label(doc: dict[str, Any]) -> str | None:
    """``123`` or ``123_4`` (array job ID and task), as squeue names it."""
    job = doc.get("job_id")
    if job is None:
        return None
    task = doc.get("array_task_id")
    return f"{job}_{task}" if task is not None else str(job)


def refresh_entries(entries: list[dict[str, Any]]) -> None:
    """Runs and groups still open in their slurm.json: ``pending`` / ``running`` as squeue has them now,
    else Slurm's final state (``CANCELLED``, ``NODE_FAIL``...) when the job ended without hermetic's word.
    Best effort: without a controller the entries keep what slurm.json said."""
    open_entries = [e for e in entries if e.get("slurm") and e.get("status") in OPEN_STATES]
    jobs = [int(e["slurm"]["job_id"]) for e in open_entries if isinstance((e["slurm"] or {}).get("job_id"), int)]
    if not jobs:
        return
    try:
        queued = ctl.queue_states(jobs)
    except ctl.SlurmUnavailable:
        return
    for e in open_entries:
        label = slurm_job_label(e["slurm"])
        if label is None:
            continue
        job = str(e["slurm"]["job_id"])
        if e["kind"] == "group":  # the array as a whole: running while any task runs
            mine = {v for k, v in queued.items() if k == job or k.startswith(f"{job}_")}
            state = "RUNNING" if "RUNNING" in mine else next(iter(sorted(mine)), None)
        else:
            state = queued.get(label)
        if state is None and e["slurm"].get("array_task_id") is not None:
            # An array's pending rest is one squeue line: "123_[1-2] PENDING".
            state = next((v for k, v in queued.items() if k.startswith(f"{job}_[")), None)
        if state is not None:
            e["status"] = state.lower()
            continue
        try:
            tasks = ctl.job_tasks(int(job))
        except ctl.SlurmUnavailable:
            continue
        mine = [t for t in tasks if e["slurm"].get("array_task_id") in (None, t.array_task_id)]
        if mine and all(t.finished for t in mine) and e["kind"] == "run":
            e["status"] = mine[0].state.lower()


def wait_for(job_id: int, *, poll: float = 1.0, timeout: float | None = None,
             on_change: Callable[[str], None] | None = None) -> list[ctl.JobTask]:
    """Block until every task of the job has ended; its tasks. Polls scontrol (no slurmdbd needed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        tasks = ctl.job_tasks(job_id)
        states = ", ".join(sorted({t.state for t in tasks})) or "gone"
        if on_change is not None and states != last:
            on_change(states)
        last = states
        if not tasks or all(t.finished for t in tasks):
            return tasks
        if deadline is not None and time.monotonic() > deadline:
            raise ctl.SlurmUnavailable(f"job {job_id} has not ended after {timeout:.0f} s ({states})")
        time.sleep(poll)
