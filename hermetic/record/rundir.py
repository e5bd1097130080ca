"""The run directory on disk (run.json, README.md, outputs/, logs/, code/, data/): create it, write and load
run.json, find a run by ID.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.core.canonical import pretty_json
from hermetic.core.errors import CannotCreate, EXIT_SOFTWARE, HermeticError, IntegrityError, NotFound, UsageError
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.record.index import GROUP_JSON, INDEX_NAME, RUN_JSON, append_entries, run_entry
from hermetic.record.seal import seal, verify_seal
from hermetic.config.secretnames import REDACTED, is_secret_name

if TYPE_CHECKING:
    from hermetic.record.schema import Record

RUN_SUBDIRS = ("outputs", "logs", "code", "data")
README_NAME = "README.md"


class RunNotFound(NotFound):
    """A run reference (ID, prefix or path) names no run."""


def create_run_dir(runs_root: str | os.PathLike[str], run_id: str) -> Path:
    """Make ``runs_root/run_id`` and its subfolders; refuse if it already exists (``os.mkdir``: never shared)."""
    from hermetic.record.ids import is_run_id

    if not is_run_id(run_id):
        raise HermeticError(f"{run_id!r} is not a run ID (use hermetic.record.new_run_id)", exit_code=EXIT_SOFTWARE)
    root = Path(runs_root)
    root.mkdir(parents=True, exist_ok=True)
    run_dir = root / run_id
    try:
        os.mkdir(run_dir)
    except FileExistsError:
        raise CannotCreate(f"{run_dir}: already exists; a run directory is never reused") from None
    for sub in RUN_SUBDIRS:
        os.mkdir(run_dir / sub)
    return run_dir


def adopt_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """A run directory prepared ahead of the run (``hermetic submit``): it must exist, be named by a run ID and
    hold no record yet (a requeued job's second task is refused); its missing subfolders are made.
    """
    from hermetic.record.ids import is_run_id

    path = Path(run_dir)
    if not is_run_id(path.name) or not path.is_dir():
        raise NotFound(f"{path}: not a prepared run directory")
    if (path / RUN_JSON).exists():
        raise CannotCreate(f"{path}: already holds a run record; a run directory is never reused")
    for sub in RUN_SUBDIRS:
        (path / sub).mkdir(exist_ok=True)
    return path


def redact_secrets(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` in which no secret-named variable keeps its value: env.passed and env.determinism
    lose them to env.secrets; strings under secret-looking keys of invocation.config become ``<redacted>``.
    """
    out = copy.deepcopy(record)
    env = out.get("env")
    if isinstance(env, dict):
        names = set(env.get("secrets") or [])
        for section in ("passed", "determinism"):
            values = env.get(section)
            if isinstance(values, dict):
                for k in [k for k in values if is_secret_name(k)]:
                    del values[k]
                    names.add(k)
        env["secrets"] = sorted(names)
    inv = out.get("invocation")
    if isinstance(inv, dict) and isinstance(inv.get("config"), dict):
        inv["config"] = redact_tree(inv["config"])
    return out


def redact_tree(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (REDACTED if isinstance(v, str) and is_secret_name(str(k)) else redact_tree(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [redact_tree(v) for v in node]
    return node


def write_record(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> dict[str, Any]:
    """Validate, redact, seal and write ``run_dir/run.json`` (+ README.md, + index line); return the sealed record.

    May be called again (early record, then the final one): run.json is replaced atomically. RecordError
    naming the key when the record is malformed; nothing is written then.
    """
    from hermetic.record.readme import render_readme
    from hermetic.record.schema import RecordError, parse_record

    run_dir = Path(run_dir)
    source = str(run_dir / RUN_JSON)
    clean = redact_secrets(record)
    model = parse_record(clean, source=source, sealed=False)
    run_id = clean["record"]["run_id"]
    if run_dir.name != run_id:
        raise RecordError(f"{source}: record.run_id: {run_id!r} does not match the directory name "
                          f"{run_dir.name!r}")
    try:
        sealed = seal(clean, copy=False)  # clean is this call's own copy already
    except ValueError as e:  # NaN/Infinity somewhere: JSON cannot hold them
        raise RecordError(f"{source}: {e} (store non-finite numbers as 'NaN'/'Infinity' strings)") from None
    atomic_write_text(run_dir / RUN_JSON, pretty_json(sealed))
    model.record.record_sha256 = sealed["record"]["record_sha256"]  # the one key sealing set
    atomic_write_text(run_dir / README_NAME, render_readme(model))
    update_index(run_dir.parent, run_entry(sealed, run_dir.name))
    return sealed


def update_index(runs_root: Path, entry: dict[str, Any]) -> None:
    """Best effort: the index is a cache that listing repairs, so failing to write it
    must not fail a run; a stale index is removed so that it is rebuilt."""
    try:
        append_entries(runs_root, [entry])
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(runs_root / INDEX_NAME)


def record_path(run_dir_or_run_json: str | os.PathLike[str]) -> Path:
    p = Path(run_dir_or_run_json)
    return p if p.name == RUN_JSON or p.is_file() else p / RUN_JSON


def load_json_doc(path: Path, what: str) -> Any:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        where = path.parent
        raise RunNotFound(f"{where}: no {path.name} here (not a {what} directory, or the run has not "
                          "finished writing its record)") from None
    except OSError as e:
        raise RunNotFound(f"{path}: cannot read: {e.strerror}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        from hermetic.record.schema import RecordError

        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise RecordError(f"{path}: not valid JSON: {why}") from None


def load_record(run_dir_or_run_json: str | os.PathLike[str]) -> dict[str, Any]:
    """Read, validate and check the seal of a run.json (a run dir or the file itself) and its directory's name:
    the one place commands load a record. RunNotFound (66) when there is none, RecordError (65) when malformed,
    IntegrityError (65) when edited or renamed. The files beside it: hermetic.record.verify.
    """
    return load_run(run_dir_or_run_json)[0]


def load_run(run_dir_or_run_json: str | os.PathLike[str]) -> tuple[dict[str, Any], Record]:
    """load_record's record, and its model (hermetic.record.schema.Record: the typed view) from the one validation."""
    from hermetic.record.schema import parse_record

    path = record_path(run_dir_or_run_json)
    doc = load_json_doc(path, "run")
    model = parse_record(doc, source=str(path))
    if not verify_seal(doc):
        raise IntegrityError(f"{path}: record_sha256 does not match the content; the record was changed "
                             "after hermetic wrote it")
    run_id = doc["record"]["run_id"]
    where = path.parent.resolve().name if path.parent.name in ("", ".", "..") else path.parent.name
    if where != run_id:
        raise IntegrityError(f"{path.parent}: the directory is named {where!r} but its record is run {run_id!r}; "
                             "a run directory is never renamed", hint=f"rename it back to {run_id}")
    return doc, model


def resolve_run(ref: str, runs_root: str | os.PathLike[str] | None) -> Path:
    """A run or group directory from a path, an ID, or a unique ID prefix; RunNotFound (exit 66) otherwise."""
    p = Path(ref)
    if "/" in ref or ref in (".", "..") or p.is_file():
        if p.is_dir():
            return p
        if p.is_file() and p.name in (RUN_JSON, GROUP_JSON):
            return p.parent
        raise RunNotFound(f"{ref}: no such run directory")
    if runs_root is not None and ref and (Path(runs_root) / ref).is_dir():
        return Path(runs_root) / ref
    if p.is_dir() and ref:
        return p
    if runs_root is None or not ref:
        raise RunNotFound(f"{ref!r}: no such run directory")
    root = Path(runs_root)
    try:
        matches = sorted(e.name for e in os.scandir(root)
                         if e.name.startswith(ref) and not e.name.startswith(".") and e.is_dir())
    except FileNotFoundError:
        raise RunNotFound(f"{ref}: no such run ({root} does not exist)") from None
    if len(matches) == 1:
        return root / matches[0]
    if not matches:
        raise RunNotFound(f"{ref}: no run with this ID or prefix in {root} (see `hermetic runs`)")
    shown = ", ".join(matches[:4]) + (f" and {len(matches) - 4} more" if len(matches) > 4 else "")
    raise UsageError(f"{ref}: ambiguous run ID prefix: {len(matches)} runs match ({shown})")
