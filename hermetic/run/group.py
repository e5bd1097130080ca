"""``hermetic run --seeds``: the same run once per seed, summarized into a group record.

Members run one after another with the seed as their only difference; the
group's group.json (hermetic.record.group) is rewritten after each member,
so an interrupted sweep still leaves a summary of the members that ran.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermetic.config import LoadedConfig
from hermetic.errors import HermeticError
from hermetic.paths import CachePaths
from hermetic.record import new_group_id, write_group
from hermetic.run.plan import RunRequest
from hermetic.run.runner import Log, RunResult, execute


def parse_seeds(text: str) -> list[int]:
    """``0,1,2,3`` -> [0, 1, 2, 3]: at least two distinct seeds."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise HermeticError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2,3,4", exit_code=2) from None
    if len(values) < 2 or len(set(values)) != len(values):
        raise HermeticError(f"--seeds {text!r}: give at least two distinct seeds", exit_code=2)
    return values


@dataclass
class GroupResult:
    group_id: str
    group_json: Path
    group: dict[str, Any]  # the group document as written ({} when no member got a record)
    members: list[RunResult]
    exit_code: int  # the first failing member's, else 0


def run_seed_group(cfg: LoadedConfig, paths: CachePaths, template: RunRequest, seeds: list[int], *,
                   log: Log | None = None, progress: bool = False,
                   on_member: Callable[[RunResult], None] | None = None) -> GroupResult:
    gid = new_group_id(name=template.name)
    members: list[RunResult] = []
    first_failure = 0
    group_json = cfg.runs_path / gid / "group.json"
    for seed in seeds:
        req = dataclasses.replace(template, seed=seed, seed_policy="group", group=gid)
        result = execute(cfg, paths, req, log=log, progress=progress)
        members.append(result)
        if result.exit_code != 0 and not first_failure:
            first_failure = result.exit_code
        if on_member is not None:
            on_member(result)
        group_json = write_group(cfg.runs_path, gid, [m.run_id for m in members], name=template.name) / "group.json"
        if result.status == "interrupted":
            break
    group = json.loads(group_json.read_text()) if group_json.is_file() else {}
    return GroupResult(gid, group_json, group, members, first_failure)
