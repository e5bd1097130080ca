"""Run directories with real metrics.jsonl files, for the plot and export tests.

The record is the synthetic one (tests/synthetic_records.py) finished the way
``hermetic run`` finishes one: outputs hashed, metrics summarized from the
file, then ``write_record``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Callable

from hermetic.record import finish_record, write_group, write_record
from hermetic.record.rundir import create_run_dir
from synthetic_records import DATA_MANIFEST, T0, synthetic_record


def loss_curve(step: int) -> float:
    return 1.0 / step


def make_run(root: Path, run_id: str, curve: Callable[[int], float] = loss_curve, *, steps: int = 30,
             seed: int = 0, group: str | None = None, minutes: int = 0) -> dict:
    """A finished run whose metrics.jsonl logs loss, acc, a nested val.loss and an epoch counter."""
    rec = synthetic_record(run_id, seed=seed, minutes=minutes)
    rec["invocation"]["group"] = group
    if group:
        rec["seed"]["policy"] = "group"
    run_dir = create_run_dir(root, run_id)
    (run_dir / "data" / "mnist.sha256").write_text(DATA_MANIFEST)
    with open(run_dir / "outputs" / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s * 10, "epoch": s // 10, "loss": curve(s), "acc": 1 - curve(s),
                                "val": {"loss": 2 * curve(s)}}) + "\n")
    done = finish_record(rec, run_dir, status="succeeded", exit_code=0,
                         finished_at=T0 + timedelta(minutes=minutes + 3))
    return write_record(run_dir, done)


def make_group(root: Path, group_id: str, curves: list[Callable[[int], float]], *, prefix: str) -> Path:
    """A seed group (group.json) of one run per curve, seeds 0, 1, 2...; ``prefix`` is YYYYMMDD-HHMM."""
    ids = [f"{prefix}{i:02d}-{i + 0xabc000:06x}" for i in range(len(curves))]
    for i, (rid, curve) in enumerate(zip(ids, curves)):
        make_run(root, rid, curve, seed=i, group=group_id, minutes=i)
    return write_group(root, group_id, ids, now=T0)

