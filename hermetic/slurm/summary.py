"""The group summary job, ``afterany`` the array: members with a record enter group.json as `hermetic run
--seeds` groups do; the ``slurm`` section lists each task's final state, exit code, node and reason. Without any
record the summary lands in the group's slurm.json alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic.core.errors import NotFound
from hermetic.record.index import RUN_JSON
from hermetic.slurm import ctl
from hermetic.slurm.state import read_state, write_state
from hermetic.slurm.submission import Submission, load_submission


class NothingToSummarize(NotFound):
    """No task of the array left a record (the reasons are in the group's slurm.json)."""


def task_rows(sub: Submission, tasks: list[ctl.JobTask]) -> list[dict[str, Any]]:
    by_index = {t.array_task_id: t for t in tasks if t.array_task_id is not None}
    rows = []
    for m in sub.members:
        t = by_index.get(m.index)
        state = read_state(sub.run_dir(m))
        has_record = (sub.run_dir(m) / RUN_JSON).is_file()
        status = state.get("status") if has_record else None
        reason = state.get("reason") if not has_record or status != "succeeded" else None
        if t is None:
            slurm_state, code, node = state.get("state", "unknown").upper(), state.get("exit_code"), state.get("node")
        else:
            slurm_state, code, node = t.state, state.get("exit_code", t.exit_code), t.nodes or state.get("node")
            if not has_record and reason is None:
                reason = f"Slurm: {t.state}" + (f" ({t.reason})" if t.reason and t.reason != "None" else "")
        rows.append({"index": m.index, "seed": m.seed, "run_id": m.run_id, "state": slurm_state,
                     "exit_code": code, "node": node or None, "reason": reason, "_record": has_record,
                     "_status": status})
    return rows


def summary_line(rows: list[dict[str, Any]]) -> str:
    ok = [r for r in rows if r["_status"] == "succeeded"]
    line = f"{len(ok)} of {len(rows)} tasks succeeded"
    bad = [r for r in rows if r["_status"] != "succeeded"]
    for r in bad[:5]:
        what = r["_status"] or "no record"
        line += f"; task {r['index']} (seed {r['seed']}) {what}, {r['state']}"
        if r["exit_code"] is not None:
            line += f" exit {r['exit_code']}"
        if r["reason"]:
            line += f": {r['reason']}"
    if len(bad) > 5:
        line += f"; +{len(bad) - 5} more"
    return line


def summarize(submission_path: Path) -> tuple[Path | None, str]:
    """(group.json, or None when no task left a record; the one-line summary)."""
    from hermetic.record import write_group

    sub = load_submission(submission_path)
    if sub.kind != "group" or sub.job_id is None:
        raise NotFound(f"{submission_path}: not a submitted group")
    rows = task_rows(sub, ctl.job_tasks(sub.job_id))
    line = summary_line(rows)
    with_records = [r["run_id"] for r in rows if r["_record"]]
    section = {"array_job_id": sub.job_id, "partition": sub.partition, "total": len(rows),
               "succeeded": sum(r["_status"] == "succeeded" for r in rows), "summary": line,
               "tasks": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]}
    if not with_records:
        write_state(sub.dir, state="failed", summary=line, slurm=section)
        raise NothingToSummarize(f"group {sub.submission_id}: {line}")
    gdir = write_group(sub.runs_dir, sub.submission_id, with_records, name=sub.request.get("name"),
                       extra={"slurm": section})
    write_state(sub.dir, state="summarized", summary=line)
    return gdir / "group.json", line
