"""Multi-seed groups: runs/<group_id>/group.json summarizes the same run under several seeds.

Only succeeded members enter the statistics; non-finite values are counted but left out of mean and SD
(95% interval of the mean: hermetic.core.stats).
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from hermetic import __version__
from hermetic.core.canonical import canonical_sha256, pretty_json
from hermetic.config.determinism import without_seed
from hermetic.core.errors import IntegrityError
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.record.ids import is_run_id, iso_utc
from hermetic.record.index import GROUP_JSON, RUN_JSON, group_entry
from hermetic.record.outputs import compared_files, decode_number
from hermetic.record.rundir import load_json_doc, load_record, update_index
from hermetic.config.seedargs import args_as_input

GROUP_SCHEMA_VERSION = 1
INTERVAL_METHOD = "mean ± t(0.975, n-1)·sd/√n, Student t; members with status succeeded only"


def group_digest(group: dict[str, Any]) -> str:
    blank = dict(group)
    blank["group"] = {**group["group"], "group_sha256": ""}
    return canonical_sha256(blank)


def build_group(group_id: str, members: list[dict[str, Any]], *, now: datetime | None = None,
                name: str | None = None, extra: dict[str, Any] | None = None,
                planned: list[int] | None = None) -> dict[str, Any]:
    """The group document (sealed) from the members' loaded records, in seed order given; ``extra``:
    optional sections sealed with it (``slurm``: the array behind a submitted group); ``planned``: every
    seed the group was asked to run (``group.seeds``), of which ``members`` are those that ran so far."""
    from hermetic.record.schema import RecordError
    from hermetic.core.stats import summarize

    if not members:
        raise RecordError(f"group {group_id}: no member runs")
    ok = [m for m in members if m["record"]["status"] == "succeeded"]
    names = sorted({k for m in ok for k in m["metrics"]["final"]})
    metrics: dict[str, Any] = {}
    for metric in names:
        raw = [decode_number(m["metrics"]["final"][metric]) for m in ok if metric in m["metrics"]["final"]]
        finite = [float(v) for v in raw if math.isfinite(v)]
        s = summarize(finite)
        s["values"] = [m["metrics"]["final"].get(metric) for m in ok]
        s["nonfinite"] = len(raw) - len(finite)
        metrics[metric] = s
    first = members[0]
    group = {
        "group": {
            "schema_version": GROUP_SCHEMA_VERSION,
            "group_id": group_id,
            "tool": f"hermetic {__version__}",
            "name": name if name is not None else first["invocation"]["name"],
            "started_at": min(m["record"]["started_at"] for m in members),
            "written_at": iso_utc(now),
            "status": group_status(members, planned),
            "group_sha256": "",
            **({"seeds": list(planned)} if planned is not None else {}),
        },
        "members": [{"run_id": m["record"]["run_id"], "seed": m["seed"]["value"], "status": m["record"]["status"],
                     "record_sha256": m["record"]["record_sha256"]} for m in members],
        "inputs": {
            "image": first["image"]["id"],
            "config_sha256": first["invocation"]["config_sha256"],
            "code_sha256": first["code"]["snapshot"]["sha256"],
            "data": {k: v["manifest_sha256"] for k, v in sorted(first["data"].items())},
            "mixed": _mixed_inputs(members),
        },
        "metrics": metrics,
        "method": INTERVAL_METHOD,
        "flags": group_flags(ok),
        **(extra or {}),
    }
    group["group"]["group_sha256"] = group_digest(group)
    return group


def group_status(members: list[dict[str, Any]], planned: list[int] | None) -> str:
    """``interrupted`` while (or because) the sweep stopped before its last seed: a member was interrupted
    (Ctrl-C, `hermetic stop`), or fewer seeds ran than were asked for (the group.json written after
    each member says so until the last one, as a run's early record does); else ``succeeded`` when
    every member did, ``failed`` when one did not."""
    if any(m["record"]["status"] == "interrupted" for m in members) or (
            planned is not None and len(members) < len(planned)):
        return "interrupted"
    return "succeeded" if all(m["record"]["status"] == "succeeded" for m in members) else "failed"


def seeds_ran(group: dict[str, Any]) -> str:
    """``3 seeds: 0, 1, 2``, or ``1 of 3 seeds ran: 0`` for a sweep that stopped short (group.seeds)."""
    ran = [m["seed"] for m in group["members"]]
    planned = group["group"].get("seeds") or ran
    listed = ", ".join(map(str, ran))
    if len(ran) < len(planned):
        return f"{len(ran)} of {len(planned)} seeds ran: {listed}"
    return f"{len(ran)} seeds: {listed}"


def group_outcome(group: dict[str, Any]) -> str:
    """One phrase for a finished sweep: ``3 of 3 runs succeeded``, or ``interrupted: 1 of 3 seeds ran,
    0 succeeded``."""
    members, meta = group["members"], group["group"]
    ok = sum(1 for m in members if m["status"] == "succeeded")
    planned = len(meta.get("seeds") or members)
    if meta["status"] == "interrupted":
        return f"interrupted: {len(members)} of {planned} seeds ran, {ok} succeeded"
    return f"{ok} of {planned} runs succeeded"


NOTHING_TO_COMPARE_FLAG = "nothing to compare"  # how the flag for members that wrote nothing begins


def group_flags(succeeded: list[dict[str, Any]]) -> list[str]:
    """What makes the summary suspect: a sweep whose seed never reached the script, or whose members wrote
    nothing to compare."""
    if len(succeeded) < 2:
        return []
    flags = []
    if not any(compared_files(m) or m["metrics"]["final"] for m in succeeded):
        flags.append(f"{NOTHING_TO_COMPARE_FLAG}: no member wrote an output file or logged a metric, so the group "
                     "cannot tell whether the seed changed anything (hermetic keeps what the script writes to "
                     "/outputs or in its working directory, and metrics from /outputs/metrics.jsonl)")
    if not any(_used_seed(m) for m in succeeded):
        flags.append("the script used no seed: nothing seeded from $HERMETIC_SEED (no hermetic_runtime call, no "
                     "random/numpy/torch import seeded at start-up) and no {seed} in its arguments")
    # The files every member wrote, volatile ones aside (run.outputs.volatile): a log named by time or host
    # differs in every member and says nothing about whether the seed reached the training.
    files = [compared_files(m) for m in succeeded]
    common = set(files[0]).intersection(*files[1:])
    outputs = [({p: f[p] for p in common}, m["metrics"]["final"]) for f, m in zip(files, succeeded)]
    if (outputs[0][0] or outputs[0][1]) and all(o == outputs[0] for o in outputs[1:]):
        flags.append(f"all {len(succeeded)} members' outputs are bitwise identical: the seed did not reach the "
                     "script (it may set its own; pass --seed {seed}, or read $HERMETIC_SEED)")
    return flags


def _used_seed(record: dict[str, Any]) -> bool:
    applied = record["seed"]["applied"]
    seeded = bool((applied.get("seed") or {}).get("seeded")) or bool((applied.get("startup") or {}).get("seeded"))
    return seeded or bool(record["invocation"].get("args_template"))


def _mixed_inputs(members: list[dict[str, Any]]) -> list[str]:
    """Inputs other than the seed on which members disagree (should be none)."""
    probes = {
        "image": lambda r: r["image"]["id"],
        "code": lambda r: r["code"]["snapshot"]["sha256"],
        "config": lambda r: without_seed(r["invocation"]["config"]),
        "data": lambda r: sorted((k, v["manifest_sha256"]) for k, v in r["data"].items()),
        "env": lambda r: sorted(r["env"]["determinism"].items()) + sorted(r["env"]["passed"].items()),
        # `--seed {seed}`: one template, each member's own seed filled in, is one input (hermetic.config.seedargs)
        "args": lambda r: [r["invocation"]["script"], args_as_input(r["invocation"], r["seed"]["value"])],
    }
    return [k for k, f in probes.items() if any(f(m) != f(members[0]) for m in members[1:])]


def write_group(runs_root: str | os.PathLike[str], group_id: str, member_run_ids: list[str], *,
                now: datetime | None = None, name: str | None = None, extra: dict[str, Any] | None = None,
                planned: list[int] | None = None) -> Path:
    """Summarize the member runs (sealed, under ``runs_root``, of ``invocation.group`` ``group_id``) into
    ``runs_root/group_id/group.json``, replaced atomically on each call; return that directory.
    """
    root = Path(runs_root)
    members = [load_record(root / rid) for rid in member_run_ids]
    return write_group_records(root, group_id, members, now=now, name=name, extra=extra, planned=planned)


def write_group_records(runs_root: str | os.PathLike[str], group_id: str, members: list[dict[str, Any]], *,
                        now: datetime | None = None, name: str | None = None, extra: dict[str, Any] | None = None,
                        planned: list[int] | None = None) -> Path:
    """``write_group`` from the members' records as ``load_record`` returned them: a sweep that keeps
    them loads each member once, not once per rewrite of its group.json."""
    from hermetic.record.schema import RecordError

    root = Path(runs_root)
    if not is_run_id(group_id):
        raise RecordError(f"{group_id!r} is not a group ID (use hermetic.record.new_group_id)")
    for rec in members:
        if rec["invocation"]["group"] != group_id:
            rid = rec["record"]["run_id"]
            raise RecordError(f"{root / rid / RUN_JSON}: invocation.group: is {rec['invocation']['group']!r}, "
                              f"not {group_id!r}")
    group = build_group(group_id, members, now=now, name=name, extra=extra, planned=planned)
    gdir = root / group_id
    gdir.mkdir(parents=True, exist_ok=True)
    if (gdir / RUN_JSON).exists():
        raise RecordError(f"{gdir}: is a run directory; a group needs its own ID")
    atomic_write_text(gdir / GROUP_JSON, pretty_json(group))
    update_index(root, group_entry(group, gdir.name))
    return gdir


def load_group(group_dir_or_json: str | os.PathLike[str]) -> dict[str, Any]:
    """Read group.json, check its shape and seal."""
    from hermetic.record.schema import validate_group

    p = Path(group_dir_or_json)
    path = p if p.name == GROUP_JSON else p / GROUP_JSON
    doc = load_json_doc(path, "group")
    validate_group(doc, source=str(path))
    if doc["group"]["group_sha256"] != group_digest(doc):
        raise IntegrityError(f"{path}: group_sha256 does not match the content; the file was changed "
                             "after hermetic wrote it")
    return doc
