"""Containers whose driver died (SIGKILL, OOM; engines.base.DRIVER_LABEL names it, liveness.driver_gone tells):
stopped, their output kept as the run's logs, the record sealed ``interrupted``, the container and its working
directory removed. Each reaper holds the run's liveness lock, so no run is sealed twice."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

from hermetic.engines.base import (
    DRIVER_LABEL, HOLDS_LABEL, LOG_FILES, RUN_DIR_LABEL, RUN_LABEL, remove_container, rewrite_logs, stop_container,
)
from hermetic.core.errors import HermeticError
from hermetic.hostfs.fsutil import sweep_dead
from hermetic.record import liveness

RUNTIME_DIR = ".runtime"  # seal.RUNTIME_DIR (seal is not imported: `hermetic runs` stays light)
GATE_LINE = b"hermetic: the process that drove this run is gone; stopping the script"  # hermetic.inimage.gate's


@dataclass(frozen=True)
class Orphan:
    """A container of the engine whose driver is gone."""

    id: str
    driver: liveness.Driver
    run_id: str | None  # None: not a training container (the probe's)
    run_dir: Path | None
    workspace: Path | None
    running: bool
    engine: str  # the engine's name (hermetic.engines.get_engine)


@dataclass(frozen=True)
class Reaped:
    """An orphaned container removed, and what was done for its run's record."""

    container: str  # its ID, short
    run_id: str | None
    run_dir: Path | None
    sealed: bool  # its run's record was sealed here
    note: str  # one line, for the CLI to print


def find_orphans(run_ids: Collection[str] | None = None, engines: Collection[str] | None = None) -> list[Orphan]:
    """The containers whose driver is gone (of ``run_ids`` when given; on ``engines``, default every engine
    whose containers can outlive their driver); [] when no engine answers.
    """
    from hermetic.engines import get_engine, orphan_engines

    found = []
    for name in orphan_engines() if engines is None else engines:
        try:
            engine = get_engine(name)
            if not engine.outlives_driver:
                continue
            rows = engine.containers_labelled(DRIVER_LABEL) or []
        except HermeticError:
            continue
        for row in rows:
            labels = row.get("Labels") or {}
            driver = liveness.parse_driver(str(labels.get(DRIVER_LABEL) or ""))
            run_id = labels.get(RUN_LABEL)
            if driver is None or (run_ids is not None and run_id not in run_ids) or not liveness.driver_gone(driver):
                continue
            run_dir, holds = labels.get(RUN_DIR_LABEL), labels.get(HOLDS_LABEL)
            found.append(Orphan(str(row.get("Id") or ""), driver, run_id, Path(run_dir) if run_dir else None,
                                Path(holds) if holds else None, row.get("State") == "running", name))
    return found


def reap_orphans(*, by: str, run_ids: Collection[str] | None = None,
                 engines: Collection[str] | None = None) -> list[Reaped]:
    """Stop and remove every orphan (as find_orphans) and seal its run's record (reason names ``by``); what
    was reaped. Nothing raises for one orphan's sake: its note says what could not be done.
    """
    orphans = find_orphans(run_ids, engines)
    if not orphans:
        return []
    from hermetic.engines import get_engine

    reaped = []
    for orphan in orphans:
        try:
            done = _reap(get_engine(orphan.engine), orphan, by)
        except Exception as e:  # another run's leftover never fails the command that found it
            done = Reaped(orphan.id[:12], orphan.run_id, orphan.run_dir, False,
                          f"container {orphan.id[:12]} (run {orphan.run_id or '-'}) of a hermetic process that died "
                          f"(pid {orphan.driver.pid}) could not be reaped: {' '.join(str(e).split())[:200]}")
        if done is not None:
            reaped.append(done)
    return reaped


def _reap(engine: Any, orphan: Orphan, by: str) -> Reaped | None:
    if orphan.run_id is None or orphan.run_dir is None:  # a probe's: nothing to seal
        container = engine.container(orphan.id)  # its handle (docker-py's Container, or alike); None when gone
        if container is None:
            return None
        remove_container(container)
        return Reaped(orphan.id[:12], None, None, False,
                      f"removed container {orphan.id[:12]}, left by a hermetic process that died (pid {orphan.driver.pid})")
    run_dir = orphan.run_dir
    if not (run_dir / "run.json").is_file() or run_dir.name != orphan.run_id:
        return _remove_unsealed(engine, orphan, run_dir, f" ({run_dir} has no record to seal)")
    if liveness.is_running(run_dir):  # another process (a reaper) is at it
        return None
    try:
        with liveness.hold(run_dir):
            return _reap_run(engine, orphan, run_dir, by)
    except OSError as e:  # the run directory is not ours to write: still, the container goes
        return _remove_unsealed(engine, orphan, run_dir,
                                f", but could not seal its record: {run_dir}: {e.strerror or e}")


def _remove_unsealed(engine: Any, orphan: Orphan, run_dir: Path, why: str) -> Reaped | None:
    """A run's orphan stopped and removed with its working copy, its record left as it is (``why``, the
    note's end); None when the container is gone already."""
    container = engine.container(orphan.id)
    if container is None:
        return None
    stop_container(container)
    remove_container(container)
    _remove_workspace(orphan.workspace)
    return Reaped(orphan.id[:12], orphan.run_id, run_dir, False,
                  f"run {orphan.run_id}: its driver (pid {orphan.driver.pid}) died; stopped and removed its "
                  f"container{why}")


def _reap_run(engine: Any, orphan: Orphan, run_dir: Path, by: str) -> Reaped | None:
    container = engine.container(orphan.id)  # asked again under the lock: another reaper may have been first
    if container is None:
        return None
    was_running = _state(container).get("Running", orphan.running)
    stop_container(container)
    state = _state(container)
    _keep_logs(container, run_dir / "logs")
    if was_running:
        what = f"its driver (hermetic, pid {orphan.driver.pid}) died while the container ran"
        done = f"`{by}` stopped it"
    else:
        ended = f"exited {state.get('ExitCode', '?')}" + (" (out of memory)" if state.get("OOMKilled") else "")
        what = f"its driver (hermetic, pid {orphan.driver.pid}) died; " + (
            f"the container stopped the script itself when it saw its driver gone; the script {ended}"
            if state.get("ExitCode") != 0 and _stopped_by_gate(run_dir / "logs" / "stderr.log")
            else f"the script went on and {ended} unwatched")
        done = f"`{by}` found its container"
    reason = f"{what}; {done}"
    sealed, problem = _seal(run_dir, reason, orphan.workspace)
    remove_container(container)
    _remove_workspace(orphan.workspace)
    note = (f"run {orphan.run_id}: {what}; {'stopped and removed' if was_running else 'removed'} its container; "
            + ("record sealed interrupted" if sealed else problem))
    return Reaped(orphan.id[:12], orphan.run_id, run_dir, sealed, note)


def _seal(run_dir: Path, reason: str, workspace: Path | None) -> tuple[bool, str]:
    """(sealed, why not): the early record, finished as ``interrupted`` with ``reason``; what the script
    left collected as its driver would have (hermetic.run.collect: as the container's user, no link
    followed), the working directory's files included when it is still there."""
    from hermetic.record import finish_record, load_record, write_record

    try:
        rec = load_record(run_dir)
    except HermeticError as e:
        return False, f"its record was not sealed: {e.message}"
    if rec["record"]["finished_at"] is not None:
        return False, "its record was sealed already"
    try:
        collected = _collect(run_dir, rec, workspace)
        shutil.rmtree(run_dir / RUNTIME_DIR, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir / ".space-reserve")  # hermetic.run.seal.RESERVE_NAME: room for this record
        write_record(run_dir, finish_record(rec, run_dir, status="interrupted", exit_code=None, reason=reason,
                                            workdir=collected.workdir.section(), outputs=collected.outputs,
                                            metrics=collected.metrics, notes=collected.notes))
    except Exception as e:  # whatever the script left in outputs/: the container still goes
        return False, f"its record was not sealed: {getattr(e, 'message', None) or ' '.join(str(e).split())[:200]}"
    return True, ""


def _collect(run_dir: Path, rec: dict[str, Any], workspace: Path | None):
    from hermetic.run.collect import collect_run, give_back, record_plan

    user = str(rec["invocation"].get("user") or f"{os.getuid()}:{os.getgid()}")
    uid, gid = (int(x) for x in user.split(":"))
    try:
        return collect_run(record_plan(run_dir, rec, workspace, run_dir / RUNTIME_DIR), uid=uid, gid=gid)
    finally:
        give_back(run_dir)


def _keep_logs(container: Any, log_dir: Path) -> None:
    """The run's log files from the engine's copy of all the container printed (its driver stopped
    reading when it died)."""
    try:
        log_dir.mkdir(exist_ok=True)
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(log_dir / name, "ab")) for name in LOG_FILES]
            for f in files:
                f.seek(0)
            rewrite_logs(container, files)
    except OSError:
        pass


def _stopped_by_gate(stderr_log: Path) -> bool:
    """The container's log ends with the gate's line: it stopped the script when its driver died (with a script
    that exited 0, the gate saw its driver gone only after the script had finished by itself)."""
    try:
        with open(stderr_log, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - (64 << 10), 0))
            return GATE_LINE in f.read()
    except OSError:
        return False


def _remove_workspace(workspace: Path | None) -> None:
    """The orphan's working directory, now that no container holds it (only while its owner is dead)."""
    if workspace is not None:
        name = workspace.name + ".lock"
        sweep_dead(workspace.parent, lambda n: n == name)


def _state(container: Any) -> dict[str, Any]:
    try:
        container.reload()
        return container.attrs.get("State") or {}
    except Exception:
        return {}

