"""The end of a run: what the script left collected, the record sealed, or sealed ``failed`` after a failure.

Also the room set aside in a run directory for its final record (reserve_space, release_space), so that
a script that filled the disk still gets one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hermetic.config.load import LoadedConfig
from hermetic.core.errors import EXIT_SOFTWARE, CannotCreate
from hermetic.engines.base import RunOutcome
from hermetic.record.rundir import write_record
from hermetic.run.data import DataChanged, record_data_changes
from hermetic.run.plan import ContainerUser, RunRequest, container_user
from hermetic.run.recording import outcome_status

if TYPE_CHECKING:
    from hermetic.run.collect import Collected  # imported by collect_outputs, after the container
    from hermetic.run.workdir import WorkdirResult

Log = Callable[[str], None]
NODES_DIR = "nodes"  # in a multi-node run's dir: the other nodes' run directories (hermetic.slurm.task)
RUNTIME_DIR = ".runtime"  # in the run dir while the container runs: the runtime's report, mounted at RUNTIME_MOUNT


@dataclass
class RunResult:
    """A finished run as `hermetic run` reports it: its ID, directory, status, exit code and sealed record."""

    run_id: str
    run_dir: Path
    status: str
    exit_code: int  # the script's, passed through; hermetic's own when hermetic failed the run (reason says why)
    record: dict[str, Any]
    reason: str | None = None


class RunFailed(CannotCreate):
    """hermetic failed a run the script finished (a limit broken, outputs not kept as written):
    the exit code when the script itself exited 0; record.reason says why."""


def collect_outputs(rec: dict[str, Any], workspace: Path | None, run_dir: Path, user: ContainerUser,
                    distributed: Any = None) -> "Collected":
    """What the script left (hermetic.run.collect, as ``user``, as its early record says), then the run directory
    given back to hermetic's user; a failed collection still leaves a record to seal (empty outputs, a note).
    """
    from hermetic.hostfs import privdrop
    from hermetic.core.errors import HermeticError
    from hermetic.run.collect import Collected, collect_run, give_back, record_plan

    ranks = None
    if distributed is not None:
        ranks = {"node_rank": distributed.node_rank, "nproc_per_node": distributed.nproc_per_node}
        (run_dir / "ranks").mkdir(exist_ok=True)
    plan = record_plan(run_dir, rec, workspace, run_dir / RUNTIME_DIR, ranks)
    if privdrop.will_drop(user.uid):  # where the collecting user must be able to write: its own trees, and
        for d in ("logs", "ranks"):   # (only the directories themselves) the rank logs' and outputs' places
            if (run_dir / d).is_dir() and not (run_dir / d).is_symlink():
                os.chown(run_dir / d, user.uid, user.gid)
    full = full_disk(run_dir, workspace)  # as the script left it, before the collection writes
    try:
        collected = collect_run(plan, uid=user.uid, gid=user.gid)
    except (HermeticError, OSError) as e:
        from hermetic.run.workdir import WorkdirResult

        why = getattr(e, "message", None) or f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}".lstrip(": ")
        collected = Collected(WorkdirResult(errors=[f"collecting the outputs failed: {why}"]), {"files": {}},
                              {"final": {}, "steps": None, "file": None}, {}, None,
                              [f"outputs not recorded: {why}"])
    finally:
        # nodes/: the other nodes' run directories (hermetic.slurm.task), each given back by its
        # own node when it is done; taking them now would take them from a node still collecting.
        give_back(run_dir, skip=lambda rel: rel == NODES_DIR)
    collected.full_disk = full
    return collected


FULL_BELOW = 1 << 20  # bytes an unprivileged writer may still use: a filesystem with less is full


def full_disk(run_dir: Path, workspace: Path | None) -> str | None:
    """Which of runs/'s and the working directory's filesystems had no room left as the script ended, and what
    was lost (the script's writes there after it filled): one line, or None."""
    from hermetic.hostfs.filesystems import filesystem_of

    said, seen = [], set()
    for path, what in ((run_dir / "outputs", "outputs/"), (workspace, "its working directory")):
        try:
            st = os.statvfs(path) if path is not None else None
        except OSError:
            continue
        if st is None or st.f_bavail * st.f_frsize >= FULL_BELOW or st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        mount, kind = filesystem_of(path) or (str(path), "unknown")
        said.append(f"the filesystem at {mount} ({kind}) was full when the script ended: what it wrote to {what} "
                    "after that was lost")
    return "; ".join(said) or None


def failure_reason(outcome: RunOutcome, kept: WorkdirResult) -> str | None:
    """Why hermetic fails a run the script may have finished, or None."""
    if outcome.stopped_because:
        return outcome.stopped_because
    if outcome.oom_reason:
        return outcome.oom_reason
    if kept.errors:
        more = f" (+{len(kept.errors) - 2} more)" if len(kept.errors) > 2 else ""
        return f"outputs were not all kept: {'; '.join(kept.errors[:2])}{more}"
    if kept.conflicts:
        return (f"the script wrote {', '.join(kept.conflicts[:3])} in its working directory where /outputs already "
                "holds other bytes or a link; the /outputs entries were kept")
    if kept.deleted:
        more = f" (+{len(kept.deleted) - 3} more)" if len(kept.deleted) > 3 else ""
        return (f"the script deleted {len(kept.deleted)} file(s) of its own code snapshot: "
                f"{', '.join(kept.deleted[:3])}{more}")
    return None


def seal_run(req: RunRequest, run_id: str, run_dir: Path, rec: dict[str, Any], outcome: RunOutcome,
             collected: "Collected", log: Log, data_changes: dict | None = None) -> RunResult:
    """What the runtime applied, the outcome, output hashes and metrics: the final, sealed record.
    ``data_changes``: the datasets that changed after they were verified (hermetic.run.data)."""
    from hermetic.record.build import finish_record, seed_section

    meta = run_dir / RUNTIME_DIR
    kept = collected.workdir
    rec["seed"] = seed_section(rec["seed"]["value"], req.seed_policy, collected.runtime_report)
    status, code = outcome_status(outcome)
    reason = None if outcome.interrupted else failure_reason(outcome, kept)
    if collected.full_disk and not outcome.interrupted:  # whatever the script's exit code
        reason = f"{reason}; also: {collected.full_disk}" if reason else collected.full_disk
    if reason is not None:
        # The script's own failure keeps its code; a run hermetic stopped or failed gets hermetic's.
        status, code = "failed", code if code != 0 and not outcome.stopped_because else RunFailed.exit_code
    changed = record_data_changes(rec["data"], data_changes or {})
    if changed is not None and not outcome.interrupted:  # the first cause: what the script read is unknown
        script_failed = code == outcome.exit_code and code != 0 and not outcome.stopped_because
        status, code = "failed", code if script_failed else DataChanged.exit_code
        reason = changed + (f"; also: {reason}" if reason else "")
    shutil.rmtree(meta, ignore_errors=True)
    rec = finish_record(rec, run_dir, status=status, exit_code=None if outcome.interrupted else outcome.exit_code,
                        reason=reason, workdir=kept.section(), outputs=collected.outputs, metrics=collected.metrics,
                        notes=collected.notes, hermetic_exit_code=None if code == outcome.exit_code else code)
    for note in collected.notes:
        log(f"note: {note}")
    release_space(run_dir)
    sealed = write_record(run_dir, rec)
    log(f"run {run_id} {status} (exit {code}); record: {run_dir / 'run.json'}")
    return RunResult(run_id, run_dir, status, code, sealed, reason)


def after_failure(cfg: LoadedConfig, req: RunRequest, run_dir: Path, rec: dict[str, Any] | None,
                  exc: BaseException, log: Log) -> BaseException | None:
    """Nothing half-written after a failure: a run directory without a record yet is removed (unless
    `hermetic submit` prepared it); an early record is sealed ``failed`` (``interrupted`` for Ctrl-C or
    SIGTERM) with the reason. Returns the exception to raise instead of ``exc`` (a full disk as one
    line, exit 73), or None to re-raise ``exc``."""
    from hermetic.core.errors import HermeticError
    from hermetic.record.build import finish_record
    from hermetic.record.index import RUN_JSON

    error = no_space_error(exc) or (exc if isinstance(exc, HermeticError) else None)
    if not (run_dir / RUN_JSON).exists() or rec is None:
        if req.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        return error if error is not exc else None
    try:  # the record on disk: a refusal (refuse_unfit_gpu) sealed its own copy of ``rec``
        if json.loads((run_dir / RUN_JSON).read_bytes())["record"]["finished_at"] is not None:
            return error if error is not exc else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return error if error is not exc else None
    interrupted = isinstance(exc, KeyboardInterrupt)
    reason = error.message if error is not None else f"hermetic failed: {type(exc).__name__}: {exc}"
    code = error.exit_code if error is not None else EXIT_SOFTWARE
    try:
        collected = collect_outputs(rec, None, run_dir, container_user(cfg))
        release_space(run_dir)
        sealed = finish_record(rec, run_dir, status="interrupted" if interrupted else "failed", exit_code=None,
                               reason=None if interrupted else reason, outputs=collected.outputs,
                               metrics=collected.metrics, notes=collected.notes,
                               hermetic_exit_code=None if interrupted else code)
        write_record(run_dir, sealed)
        log(f"run {run_dir.name} {'interrupted' if interrupted else 'failed'}; record: {run_dir / RUN_JSON}")
    except Exception:  # sealing failed too (the disk is still full): the early record says interrupted
        pass
    return error if error is not exc else None


def no_space_error(exc: BaseException) -> CannotCreate | None:
    """A full disk or quota (ENOSPC, EDQUOT) as one line naming the path (errors.DiskFull); None otherwise."""
    from hermetic.core.errors import disk_full, is_disk_full

    return disk_full(exc, what="the run's files") if is_disk_full(exc) else None  # type: ignore[arg-type]


RESERVE_NAME = ".space-reserve"
RESERVE_BYTES = 4 << 20  # the final record, README and index of a run with many outputs fit in it


def reserve_space(run_dir: Path) -> None:
    """Set aside room for the final record before the script can fill the disk (released just before it
    is written). A disk too full for it refuses the run now, before anything started."""
    fd = os.open(run_dir / RESERVE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError as e:
        if e.filename is None:
            e.filename = str(run_dir)
        raise
    finally:
        os.close(fd)


def release_space(run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / RESERVE_NAME)
