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
from hermetic.errors import UsageError
from hermetic.paths import CachePaths
from hermetic.record import new_group_id, write_group
from hermetic.record.group import group_outcome
from hermetic.run.plan import RunRequest
from hermetic.record import liveness
from hermetic.run.detach import announce
from hermetic.run.runner import Log, RunResult, execute


SEED_MAX = 2**32 - 1


def parse_seeds(text: str, first: int) -> list[int]:
    """The seeds of ``--seeds``: ``N`` (one integer) is N seeds from ``first`` (hermetic.yaml's seed) on;
    ``0,1,2``, ``0-4`` (inclusive) and mixes like ``0-2,10`` are the seeds themselves."""
    def bad(why: str) -> UsageError:
        return UsageError(f"--seeds {text!r}: {why} (a count such as 5, or seeds such as 0,1,2 or 0-4)")

    text = text.strip()
    if text.isdigit():
        count = int(text)
        if count < 2:
            raise bad("a group needs at least two seeds")
        values = list(range(first, first + count))
    else:
        values = []
        for part in (p.strip() for p in text.split(",")):
            lo, dash, hi = part.partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                raise bad(f"{part!r} is not a seed or a range A-B")
            a, b = int(lo), int(hi) if dash else int(lo)
            if b < a:
                raise bad(f"range {part} runs backwards")
            values += range(a, b + 1)
        if len(values) < 2:
            raise bad("a group needs at least two seeds")
        if len(set(values)) != len(values):
            raise bad("a seed is given twice")
    if max(values) > SEED_MAX:
        raise bad(f"seeds go up to {SEED_MAX}")
    return values


@dataclass
class GroupResult:
    group_id: str
    group_json: Path
    group: dict[str, Any]  # the group document as written ({} when no member got a record)
    members: list[RunResult]
    exit_code: int  # the first failing member's, else 0

    @property
    def outcome(self) -> str:
        """``3 of 3 runs succeeded``, ``interrupted: 1 of 3 seeds ran, 0 succeeded`` (record.group)."""
        return group_outcome(self.group) if self.group else f"{len(self.members)} run(s), no summary written"


def run_seed_group(cfg: LoadedConfig, paths: CachePaths, template: RunRequest, seeds: list[int], *,
                   log: Log | None = None, progress: bool = False,
                   on_member: Callable[[RunResult], None] | None = None) -> GroupResult:
    gid = new_group_id(name=template.name)
    gdir = cfg.runs_path / gid
    gdir.mkdir(parents=True)
    with liveness.hold(gdir):
        if announce("group", gid, gdir, gdir / "logs"):  # --detach: the group's ID; the terminal is gone
            template = dataclasses.replace(template, echo=False)
        return _run_members(cfg, paths, template, seeds, gid, log=log, progress=progress, on_member=on_member)


def _run_members(cfg: LoadedConfig, paths: CachePaths, template: RunRequest, seeds: list[int], gid: str, *,
                 log: Log | None, progress: bool, on_member: Callable[[RunResult], None] | None) -> GroupResult:
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
        group_json = write_group(cfg.runs_path, gid, [m.run_id for m in members], name=template.name,
                                 planned=seeds) / "group.json"
        if result.status == "interrupted":
            break
    group = json.loads(group_json.read_text()) if group_json.is_file() else {}
    return GroupResult(gid, group_json, group, members, first_failure)
