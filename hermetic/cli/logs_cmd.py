"""``hermetic logs [-f] [RUN]``, ``hermetic stop RUN`` and ``hermetic runs wait RUN``: runs that are still going.

``wait`` is added to the ``runs`` group by hermetic/cli/runs_cmd.py (this module does not import that one).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from hermetic.cli.common import emit, runs_options
from hermetic.core.errors import EXIT_INTERRUPTED, EXIT_SOFTWARE, NotFound, TempFail
from hermetic.core.escape import shown

FOLLOW_POLL_S = 0.2


def _run_dir(run: str | None, runs_dir: str | None, config_path: str | None) -> Path:
    """RUN as given, else the newest run (what `hermetic run --detach` just started, usually)."""
    from hermetic.record.index import list_entries
    from hermetic.record.locate import resolve_ref, runs_root

    if run:
        return resolve_ref(run, runs_dir, config_path)
    root = runs_root(runs_dir, config_path)
    newest = next((e for e in list_entries(root) if e["kind"] == "run"), None)
    if newest is None:
        raise NotFound(f"no runs in {root}")
    return root / newest["id"]


def _log_file(run_dir: Path) -> Path:
    """The run's combined output; a group's own log (it has no container of its own)."""
    from hermetic.record.index import is_group_dir
    from hermetic.run.detach import HERMETIC_LOG

    if is_group_dir(run_dir) or not (run_dir / "logs" / "combined.log").exists():
        own = run_dir / "logs" / HERMETIC_LOG
        if own.exists():
            return own
    return run_dir / "logs" / "combined.log"


@click.command()
@click.argument("run", required=False, metavar="[RUN]")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the run writes, until it ends.")
@click.option("--raw", is_flag=True, help="The bytes as the script wrote them, terminal escapes and all.")
@runs_options(with_json=False)
def logs(run: str | None, follow: bool, raw: bool, runs_dir: str | None, config_path: str | None) -> int:
    """Print a run's output (stdout and stderr, as they came); the newest run when RUN is left out.

    With -f the output is followed until the run ends; Ctrl-C stops
    following, never the run (`hermetic stop RUN` does that). Control
    characters other than newline and tab (terminal escapes, carriage
    returns) are shown as escapes such as \\x1b, so that a script's output
    cannot retitle the terminal or forge lines in a CI log; --raw prints
    the bytes as written.

    \b
    Examples:
      hermetic run --detach train.py && hermetic logs -f
      hermetic logs 20261201-0815 | tail
    """
    from hermetic.record import liveness

    import codecs

    run_dir = _run_dir(run, runs_dir, config_path)
    out = sys.stdout.buffer
    text = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    offset = 0
    try:
        while True:
            path = _log_file(run_dir)
            running = liveness.is_running(run_dir)  # read before the file: no line written after it is missed
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                out.write(chunk if raw else shown(text.decode(chunk), "text").encode())
                out.flush()
                offset += len(chunk)
            if not follow or not running:
                return 0
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return 130  # only the following stops; the run is another process


@click.command()
@click.argument("run", metavar="RUN")
@click.option("--no-wait", is_flag=True, help="Return once asked, without waiting for the run to end.")
@runs_options()
def stop(run: str, no_wait: bool, runs_dir: str | None, config_path: str | None, as_json: bool) -> int:
    """Stop a running run: its container is stopped and its record says interrupted.

    A run whose hermetic process was killed (kill -9) while its container
    went on is stopped too: the container is stopped and removed, and the
    record sealed as interrupted, saying why.

    \b
    Example:
      hermetic stop 20261201-0815
    """
    from hermetic.record import liveness
    from hermetic.record.index import entry_from_dir, ran_note

    run_dir = _run_dir(run, runs_dir, config_path)
    if not liveness.stop(run_dir):
        if _stop_orphan(run_dir):
            entry = entry_from_dir(run_dir)
            emit(as_json, {"id": run_dir.name, "stopped": True, "status": entry["status"], "orphan": True},
                 f"{run_dir.name}: {entry['status']} (its hermetic process had died; its container was stopped "
                 "and removed)")
            return 0
        raise NotFound(f"{run_dir.name}: not running (see `hermetic runs show {run_dir.name}`)")
    if not no_wait:
        liveness.wait(run_dir)
    entry = entry_from_dir(run_dir)
    status = "running" if liveness.is_running(run_dir) else entry["status"]  # --no-wait: it may still be
    emit(as_json, {"id": run_dir.name, "stopped": True, "status": status}, f"{run_dir.name}: {status}{ran_note(entry)}")
    return 0


def _stop_orphan(run_dir: Path) -> bool:
    """Reap the run's container when its driver died (hermetic.run.orphans); whether there was one."""
    import os

    from hermetic.run.orphans import reap_orphans

    reaped = reap_orphans(by="hermetic stop", run_ids={run_dir.name})
    for r in reaped:
        if r.run_dir is None or os.path.realpath(r.run_dir) != os.path.realpath(run_dir):
            click.echo(f"hermetic: note: {r.note}", err=True)  # another copy of the run directory
    return any(r.run_dir is not None and os.path.realpath(r.run_dir) == os.path.realpath(run_dir) for r in reaped)


@click.command("wait")
@click.argument("run", metavar="RUN")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Give up after this long (exit 75, the run goes on).")
@runs_options()
def wait(run: str, timeout: float | None, runs_dir: str | None, config_path: str | None, as_json: bool) -> int:
    """Block until a run (or a seed group) ends, then exit as `hermetic run` would have.

    The exit status is the script's (0 when it succeeded), hermetic's own
    (64-78) when hermetic failed or refused the run, 128+N when signal N
    ended it (130 Ctrl-C, 143 `hermetic stop`); a group's is its first
    failing member's. 75 when --timeout passed first.

    \b
    Example:
      id=$(hermetic run --detach train.py) && hermetic runs wait "$id"
    """
    from hermetic.record import liveness
    from hermetic.record.index import entry_from_dir, ran_note

    run_dir = _run_dir(run, runs_dir, config_path)
    if not liveness.wait(run_dir, timeout_s=timeout):
        raise TempFail(f"{run_dir.name}: still running after {timeout:g} s")
    entry = entry_from_dir(run_dir)
    code = exit_code_of(run_dir, entry)
    exit_text = f"  exit {entry['exit_code']}" if entry.get("exit_code") is not None else ""
    emit(as_json, {**entry, "exit": code}, f"{run_dir.name}  {entry['status']}{ran_note(entry)}{exit_text}")
    return code


def exit_code_of(run_dir: Path, entry: dict) -> int:
    """What `hermetic run` returned for this run (or seed group), from its record."""
    import json

    status = entry["status"]
    if status == "succeeded":
        return 0
    if entry.get("kind") == "group":
        # `hermetic run --seeds` returns the first failing member's code
        try:
            members = json.loads((run_dir / "group.json").read_text())["members"]
        except (FileNotFoundError, ValueError, KeyError):
            return EXIT_SOFTWARE  # it ended without a summary: see logs/hermetic.log
        for m in members:
            member_dir = run_dir.parent / m["run_id"]
            code = exit_code_of(member_dir, {"status": m["status"]})
            if code:
                return code
        return EXIT_INTERRUPTED if status == "interrupted" else 0  # stopped between two members
    try:
        meta = json.loads((run_dir / "run.json").read_text())["record"]
    except (FileNotFoundError, ValueError, KeyError):
        return EXIT_SOFTWARE  # it ended without a record: see logs/hermetic.log
    if meta.get("hermetic_exit_code") is not None:
        return int(meta["hermetic_exit_code"])
    if status == "interrupted":
        return EXIT_INTERRUPTED
    return meta.get("exit_code") or EXIT_SOFTWARE