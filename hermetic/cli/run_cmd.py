"""``hermetic run`` and ``hermetic replay``."""

from __future__ import annotations

import dataclasses
import sys

import click

from hermetic.cli.common import MlflowCommand, config_option, emit_json, export_after_run, mlflow_option, mlflow_target
from hermetic.cli.run_options import parse_data, request_template, run_options
from hermetic.core import escape
from hermetic.engines.base import ENGINES
from hermetic.core.paths import cache_paths


@click.command(cls=MlflowCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@run_options("run")
@mlflow_option
@click.option("--detach", is_flag=True,
              help="Print the run's ID once it has started and return; the run goes on in the background "
                   "(follow it with `hermetic logs -f`, wait with `hermetic runs wait`, end it with `hermetic stop`).")
@click.option("--json", "as_json", is_flag=True, help="Print the sealed run record (JSON) instead of a summary.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(mlflow_uri, detach, as_json, script, args, **shared) -> int:
    """Run SCRIPT [ARGS...] inside the pinned image and record everything.

    In order: build the image if needed (a no-op when up to date); verify every
    dataset against its manifest (on failure, stop before any container
    exists); create runs/<id>/; snapshot the code; probe the hardware in the
    same image with the same devices; run.

    The script runs unmodified in a locked-down container: its working
    directory (/workspace) is a writable copy of the code snapshot, each
    dataset is there read-only at its project path (and at its mount:, if
    any), /outputs is writable, the root filesystem is read-only, the user is
    not root, no capabilities, no network. Files the script writes in its
    working directory and in /outputs are the run's outputs (runs/<id>/outputs/),
    hashed and compared by `hermetic diff`. Logs stream here and into
    runs/<id>/logs/. The exit code is the script's, unchanged; hermetic's own
    refusals and failures are 64-78 (README, "Exit codes"), and the record's
    status says which it was.

    \b
    Examples:
      hermetic run train.py --epochs 3
      hermetic run --gpus all train.py --epochs 3
      hermetic run --seeds 5 train.py --seed {seed}   # 5 seeds; {seed} reaches argparse too
      hermetic run --data synth=/mnt/big/synth -- train.py --lr 0.1
      hermetic run --mlflow http://127.0.0.1:5000 train.py  # then export the run to MLflow
      hermetic run --detach train.py && hermetic logs -f   # the newest run's log, followed
      hermetic run --nproc-per-node 2 train.py         # DDP: 2 ranks, gloo, per-rank logs kept

    A closed terminal or pipe does not stop a run (`hermetic run ... | head`):
    its output keeps going to runs/<id>/logs/ and the record is completed.
    """
    if detach:
        return _start_detached(script, as_json)
    keep_running_without_a_terminal()
    from hermetic.run.runner import execute

    argv = ["hermetic", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["hermetic", "run", script, *args]
    cfg, template, seeds_list = request_template(shared, script=script, args=args, argv=argv, echo=not as_json)
    mlflow = mlflow_target(mlflow_uri)  # checked before the run: a URI, and hermetic[mlflow] installed
    paths = cache_paths()
    log, progress = run_log(not as_json)
    if seeds_list is not None:
        return _seed_group(cfg, paths, template, seeds_list, as_json, log, progress, mlflow)
    result = execute(cfg, paths, template, log=log, progress=progress)
    if as_json:
        emit_json(result.record)
        _say_reason(result)
    else:
        _summary(result)
    return export_after_run(mlflow, [result.run_dir], result.exit_code)


def run_log(show: bool):
    """(log, progress) for a run: hermetic's messages on stderr, bars when it is a terminal."""
    if not show:
        return None, False

    def say(msg: str) -> None:
        try:
            click.echo(f"hermetic: {msg}", err=True)
        except OSError:  # a closed pipe, a hung-up terminal: the run goes on, its logs are in the run dir
            pass

    return say, sys.stderr.isatty()


def keep_running_without_a_terminal() -> None:
    """A hang-up (the terminal closed) must not end a run: the record still gets finished."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _start_detached(script: str, as_json: bool) -> int:
    from hermetic.run.detach import start_detached

    tokens = sys.argv[1:]
    upto = tokens.index(script) if script in tokens else len(tokens)
    argv = [t for i, t in enumerate(tokens) if not (t == "--detach" and i < upto)]
    started = start_detached(argv)
    if as_json:
        emit_json({"detached": True, "kind": started.kind, "id": started.ident, "dir": str(started.path)})
    else:
        click.echo(started.ident)
        click.echo(f"hermetic: {started.kind} {started.ident} goes on in the background: "
                   f"`hermetic logs -f {started.ident}`, `hermetic runs wait {started.ident}`, "
                   f"`hermetic stop {started.ident}`", err=True)
    return 0


def _summary(result) -> None:
    try:
        click.echo(summary_line(result.run_id, result.status, result.exit_code, result.record))
        _say_reason(result)
    except OSError:  # nobody reads any more; the record says it all
        pass


def summary_line(run_id: str, status: str, code: int, record: dict) -> str:
    """``ID  STATUS  exit N  loss=0.1, ...``: a finished run in one line (its first four final metrics)."""
    metrics = record.get("metrics", {}).get("final") or {}
    shown = escape.shown(", ".join(f"{k}={v}" for k, v in list(metrics.items())[:4]))
    return f"{run_id}  {status}  exit {code}" + (f"  {shown}" if shown else "")


def _say_reason(result) -> None:
    """hermetic failed the run itself (not the script): one error line, and where it is recorded."""
    if result.reason:
        click.echo(f"hermetic: error: run {result.run_id}: {escape.shown(result.reason)} (recorded in "
                   f"{result.run_dir / 'run.json'})", err=True)
    say_hint(result.run_dir, result.status == "failed" and result.record.get("invocation", {}).get("network") != "host")


def say_hint(run_dir, failed: bool) -> None:
    """The script failed for want of network (a download in its stderr): one hint line (hermetic.run.hints)."""
    if failed:
        from hermetic.run.hints import failure_hint

        hint = failure_hint(run_dir)
        if hint:
            click.echo(f"hermetic: hint: {escape.shown(hint)}", err=True)


def _seed_group(cfg, paths, template, seeds: list[int], as_json: bool, log, progress, mlflow=None) -> int:
    from hermetic.run.group import run_seed_group

    result = run_seed_group(cfg, paths, template, seeds, log=log, progress=progress,
                            on_member=None if as_json else _summary)
    if as_json:
        emit_json(result.group)
        return export_after_run(mlflow, [result.group_json.parent], result.exit_code)
    click.echo(f"group {result.group_id}: {result.outcome} -> {result.group_json}")
    metrics = result.group.get("metrics") or {}
    for metric, st in metrics.items():
        if st.get("mean") is None:
            continue
        ci = st.get("ci95")
        interval = f"[{ci[0]:.6g}, {ci[1]:.6g}]" if ci else "n/a"
        sd = f"{st['sd']:.3g}" if st.get("sd") is not None else "n/a"
        click.echo(f"  {escape.shown(metric)}: mean {st['mean']:.6g}  sd {sd}  95% CI {interval}  (n={st['n']})")
    if not metrics:
        from hermetic.record.group import NOTHING_TO_COMPARE_FLAG

        wrote_nothing = any(f.startswith(NOTHING_TO_COMPARE_FLAG) for f in result.group.get("flags") or [])
        click.echo("  no metrics: the script logged none (hermetic_runtime.log_metrics, or lines of JSON in "
                   "/outputs/metrics.jsonl)" + ("" if wrote_nothing else
                                                "; compare members' outputs with `hermetic diff`"))
    for flag in result.group.get("flags") or []:
        click.echo(f"hermetic: warning: {escape.shown(flag)}", err=True)
    return export_after_run(mlflow, [result.group_json.parent], result.exit_code)


@click.command()
@click.argument("run_ref", metavar="RUN")
@config_option
@click.option("--data", "data", multiple=True, metavar="NAME=PATH",
              help="Dataset NAME is at PATH on this machine, not where the run read it (still verified "
                   "against the run's own manifest copy). Repeatable.")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="What runs the container (default: the engine the original run used).")
@click.option("--json", "as_json", is_flag=True, help="Print the diff against the original as JSON.")
def replay(run_ref: str, config_path: str | None, data: tuple[str, ...], engine: str | None, as_json: bool) -> int:
    """Re-execute a recorded run exactly, then say whether it matched.

    Uses the recorded image (by digest; pulled from the registry the record
    names if the store lacks it), the recorded source snapshot (not today's
    working tree), the recorded config, seed, arguments and env, and the same
    data verified against the run's own manifest copies. Refuses, naming the
    input, when one can no longer be had. Exit 0 only when the replay is
    bitwise identical to the original (or identical but for wall-clock fields,
    such as a run's duration: the verdict says so); 1 when it differs, 66 when nothing
    could be compared, 65 when an input is no longer as recorded.

    \b
    Examples:
      hermetic replay runs/20261129-214500-1a2b3c
      hermetic replay --data synth=/scratch/synth runs/20261129-214500-1a2b3c   # the data moved
    """
    from hermetic.cli.common import reading
    from hermetic.diff import diff_paths
    from hermetic.diff.render import render
    from hermetic.record import load_record
    from hermetic.record.locate import resolve_ref
    from hermetic.run.replay import replay_request
    from hermetic.run.runner import execute

    keep_running_without_a_terminal()

    run_dir = resolve_ref(run_ref, None, config_path)
    paths = cache_paths()
    argv = ["hermetic", *sys.argv[1:]]
    with reading(run_dir):
        record = load_record(run_dir)
        cfg, req = replay_request(run_dir, record, paths, echo=not as_json, argv=argv, data_paths=parse_data(data))
        recorded = ((record.get("invocation") or {}).get("engine") or {}).get("name")
    req = dataclasses.replace(req, engine=engine or recorded or None)
    log, progress = run_log(not as_json)
    result = execute(cfg, paths, req, log=log, progress=progress)
    with reading(run_dir, result.run_dir):
        d = diff_paths(run_dir, result.run_dir)
    if as_json:
        emit_json({"replay": result.run_id, "original": record["record"]["run_id"], "diff": d.to_json()})
    else:
        click.echo(f"replay {result.run_id} of {record['record']['run_id']}: {result.status}")
        click.echo(render(d))
    return d.verdict.exit_code
