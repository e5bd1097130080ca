"""runs/.index.jsonl: one summary line per run or group, so listing never parses run.json.

Appended under a flock (the last line for an ID wins) and repaired by the reader. A cache: deleting it is safe.
Standard library, core and hostfs only (no pydantic), so ``hermetic runs`` starts fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hermetic.core.canonical import canonical_json
from hermetic.hostfs.filelocks import file_lock
from hermetic.hostfs.fsutil import atomic_write_bytes
from hermetic.record.ids import RUN_ID_RE
from hermetic.record.liveness import is_running

INDEX_NAME = ".index.jsonl"
LOCK_NAME = ".index.lock"
INDEX_VERSION = 1
RUN_JSON = "run.json"
GROUP_JSON = "group.json"
SLURM_JSON = "slurm.json"  # beside a run or group `hermetic submit` prepared (hermetic.slurm.state)


def is_group_dir(path: Path) -> bool:
    """A seed group's directory: its group.json, and no run.json (a member's own directory has one)."""
    return (path / GROUP_JSON).is_file() and not (path / RUN_JSON).is_file()


def _head(kind: str, entry_id: str, meta: dict[str, Any], finished_at: str | None) -> dict[str, Any]:
    """The keys that lead every index line, from a record's ``record`` or a group's ``group`` section."""
    return {"v": INDEX_VERSION, "kind": kind, "id": entry_id, "started_at": meta["started_at"],
            "finished_at": finished_at, "status": meta["status"]}


def run_entry(record: dict[str, Any], dir_name: str | None = None) -> dict[str, Any]:
    """The index line for a run record (what ``hermetic runs`` shows)."""
    meta, inv = record["record"], record["invocation"]
    return {
        **_head("run", dir_name or meta["run_id"], meta, meta["finished_at"]),
        "exit_code": meta["exit_code"],
        "image": record["image"]["id"],
        "data": {name: ds["manifest_sha256"] for name, ds in sorted(record["data"].items())},
        "seed": record["seed"]["value"],
        "final": record["metrics"]["final"],
        "name": inv["name"],
        "group": inv["group"],
        "replay_of": inv["replay_of"],
        "record_sha256": meta["record_sha256"],
    }


def group_entry(group: dict[str, Any], dir_name: str | None = None) -> dict[str, Any]:
    """The index line for a multi-seed group (group.json)."""
    meta = group["group"]
    return {
        **_head("group", dir_name or meta["group_id"], meta, meta["written_at"]),
        "exit_code": None,
        "image": group["inputs"]["image"],
        "data": group["inputs"]["data"],
        "seeds": [m["seed"] for m in group["members"]],
        "planned": len(meta.get("seeds") or group["members"]),  # seeds asked for (seeds: those that ran)
        "final": {k: v["mean"] for k, v in group["metrics"].items()},
        "sd": {k: v["sd"] for k, v in group["metrics"].items()},
        "name": meta["name"],
        "group": None,
        "replay_of": None,
        "record_sha256": meta["group_sha256"],
    }


def _ran_planned(entry: dict[str, Any]) -> tuple[int, int]:
    """(seeds that ran, seeds asked for) of a group's index entry."""
    ran = len(entry.get("seeds") or [])
    return ran, entry.get("planned") or ran


def group_size(entry: dict[str, Any]) -> str:
    """A group's size for a listing: ``3``, or ``1/3`` when 1 of its 3 seeds ran."""
    ran, planned = _ran_planned(entry)
    return f"{ran}/{planned}" if ran < planned else str(ran)


def ran_note(entry: dict[str, Any]) -> str:
    """`` (1 of 3 seeds ran)`` for a group that stopped short, else nothing."""
    ran, planned = _ran_planned(entry)
    return f" ({ran} of {planned} seeds ran)" if entry.get("kind") == "group" and ran < planned else ""


def read_index(runs_root: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """``({id: latest entry}, number of lines)``; unparsable lines are skipped."""
    try:
        data = (Path(runs_root) / INDEX_NAME).read_bytes()
    except FileNotFoundError:
        return {}, 0
    entries: dict[str, dict[str, Any]] = {}
    lines = data.split(b"\n")
    for raw in filter(None, lines):
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a torn or crafted line: its directory gets re-read by list_entries
        if isinstance(entry, dict) and entry.get("v") == INDEX_VERSION and isinstance(entry.get("id"), str):
            entries[entry["id"]] = entry
    return entries, len(lines)


def entry_from_dir(run_dir: Path) -> dict[str, Any]:
    """Index entry read from the directory itself (run.json or group.json), or a placeholder (``incomplete``,
    ``unreadable``) that is shown but never written to the index.
    """
    for fname, make in ((RUN_JSON, run_entry), (GROUP_JSON, group_entry)):
        path = run_dir / fname
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError):
            return _placeholder(run_dir.name, "unreadable")
        try:
            return make(doc, run_dir.name)
        except (KeyError, TypeError, AttributeError):
            return _placeholder(run_dir.name, "unreadable")
    return _submitted_placeholder(run_dir) or _placeholder(run_dir.name, "incomplete")


def _submitted_placeholder(run_dir: Path) -> dict[str, Any] | None:
    """A run or group submitted to Slurm that has no record yet: its state as hermetic last wrote it
    (``hermetic runs`` asks Slurm for the live one); never stored in the index."""
    try:
        doc = json.loads((run_dir / SLURM_JSON).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    entry = _placeholder(run_dir.name, str(doc.get("state") or "submitted"))
    entry.update(kind="group" if doc.get("kind") == "group" else "run", name=doc.get("name"),
                 group=doc.get("group"), seed=doc.get("seed"), seeds=doc.get("seeds"),
                 slurm={k: doc.get(k) for k in ("job_id", "array_task_id", "node", "reason")})
    return entry


def _placeholder(name: str, status: str) -> dict[str, Any]:
    return {"v": INDEX_VERSION, "kind": "run", "id": name, "started_at": started_from_id(name), "finished_at": None,
            "status": status, "exit_code": None, "image": None, "data": {}, "final": {}, "name": None,
            "group": None, "replay_of": None, "record_sha256": None, "placeholder": True}


def started_from_id(run_id: str) -> str | None:
    """``20261129-214500-...`` -> ``2026-11-29T21:45:00.000Z`` (None for other names)."""
    if not RUN_ID_RE.match(run_id):
        return None
    d, t = run_id[:8], run_id[9:15]
    return f"{d[:4]}-{d[4:6]}-{d[6:]}T{t[:2]}:{t[2:4]}:{t[4:]}.000Z"


def list_entries(runs_root: str | os.PathLike[str], *, reindex: bool = False) -> list[dict[str, Any]]:
    """Every run and group under ``runs_root``, newest first, repairing the index (best effort) as needed;
    run.json is read only for directories the index does not know (all with ``reindex=True``).
    """
    root = Path(runs_root)
    try:
        names = {e.name for e in os.scandir(root) if not e.name.startswith(".") and e.is_dir()}
    except FileNotFoundError:
        return []
    known, nlines = ({}, 0) if reindex else read_index(root)
    live = {n: known[n] for n in names if n in known}
    fresh = [entry_from_dir(root / n) for n in sorted(names - live.keys())]
    to_store = [e for e in fresh if not e.get("placeholder")]
    dead = nlines - 1 - len(live)  # lines beyond one per live entry: superseded or removed runs
    try:
        if reindex or (nlines == 0 and to_store) or (dead > 1000 and dead > len(live)):
            _rewrite(root, names, to_store, keep_known=not reindex)
        elif to_store:
            append_entries(root, to_store)
    except OSError:
        pass
    out = list(live.values()) + fresh
    for e in out:
        # A record still saying what its early write said, with its driver alive: the run is running. A group's
        # summary is rewritten after each member (``interrupted`` until the last one), with its time each time.
        if e["status"] in ("interrupted", "incomplete") and (not e.get("finished_at") or e["kind"] == "group") \
                and is_running(root / e["id"]):
            e["status"] = "running"
    out.sort(key=lambda e: (e.get("started_at") or "", e["id"]), reverse=True)
    return out


def append_entries(root: Path, entries: list[dict[str, Any]]) -> None:
    """Append lines, atomically with respect to other writers (flock + one write)."""
    body = b"".join(canonical_json(e) + b"\n" for e in entries)
    with file_lock(root / LOCK_NAME):
        fd = os.open(root / INDEX_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            # A writer killed mid-line left no newline: end its line so ours parses.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                body = b"\n" + body
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def _rewrite(root: Path, names: set[str], fresh: list[dict[str, Any]], *, keep_known: bool) -> None:
    """Replace the index with one line per live directory, re-read under the lock (another process's lines stay)."""
    with file_lock(root / LOCK_NAME):
        current = read_index(root)[0] if keep_known else {}
        merged = {n: e for n, e in current.items() if n in names}
        for e in fresh:
            merged.setdefault(e["id"], e)
        body = b"".join(canonical_json(merged[k]) + b"\n" for k in sorted(merged))
        atomic_write_bytes(root / INDEX_NAME, body, fsync=False)
