"""``hermetic run --seeds``: the same run once per seed, summarized into a group record.

group.json is rewritten after members (within GROUP_WRITE_SHARE) and at the end; each member's record is
loaded once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermetic.config.load import LoadedConfig
from hermetic.core.paths import CachePaths
from hermetic.record import load_record, new_group_id
from hermetic.record.group import group_outcome, write_group_records
from hermetic.run.plan import RunRequest
from hermetic.record import liveness
from hermetic.run.detach import announce
from hermetic.run.runner import execute
from hermetic.run.seal import Log, RunResult


# How much of a sweep's time its group.json may take: rewritten after every member while that costs at
# most this share of the time the members took (always, for members that run a container), less often
# when the summary of a large group costs more than that (issue 24: no O(n^2) sweep).
GROUP_WRITE_SHARE = 0.05


def group_write_due(spent_writing_s: float, elapsed_s: float) -> bool:
    """Whether to rewrite group.json after a member: when the writes so far took at most
    GROUP_WRITE_SHARE of the sweep's time (the first write is always due)."""
    return spent_writing_s <= GROUP_WRITE_SHARE * elapsed_s


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
    records: list[dict[str, Any]] = []  # each member's record, loaded once (not once per rewrite)
    first_failure = 0
    group_json = cfg.runs_path / gid / "group.json"
    started = time.monotonic()
    spent_writing = 0.0
    written = 0  # members in group.json as last written

    def write() -> None:
        nonlocal spent_writing, written
        t0 = time.monotonic()
        write_group_records(cfg.runs_path, gid, records, name=template.name, planned=seeds)
        spent_writing += time.monotonic() - t0
        written = len(records)

    try:
        for seed in seeds:
            req = dataclasses.replace(template, seed=seed, seed_policy="group", group=gid)
            result = execute(cfg, paths, req, log=log, progress=progress)
            members.append(result)
            records.append(load_record(result.run_dir))
            if result.exit_code != 0 and not first_failure:
                first_failure = result.exit_code
            if on_member is not None:
                on_member(result)
            if result.status == "interrupted":
                break
            if group_write_due(spent_writing, time.monotonic() - started):
                write()
    except BaseException:  # a member's error (or Ctrl-C between members): still summarize those that ran
        if len(records) > written:
            with contextlib.suppress(Exception):
                write()
        raise
    if len(records) > written:  # the end: the whole group, however often it was written on the way
        write()
    group = json.loads(group_json.read_text()) if group_json.is_file() else {}
    return GroupResult(gid, group_json, group, members, first_failure)
