"""``hermetic run`` and ``hermetic replay``."""

from __future__ import annotations

import sys

import click

from hermetic.cli.common import config_option, emit_json
from hermetic.cli.mlflow_opt import MlflowCommand, export_after_run, mlflow_option, mlflow_target


@click.command(cls=MlflowCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_option
@click.option("--gpus", metavar="all|N|device=ID,...", help="GPUs for the container, as `docker run --gpus`.")
@click.option("--data", "data", multiple=True, metavar="NAME=PATH",
              help="Use PATH for dataset NAME (still verified against its manifest). Repeatable.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="Seed for this run (default: determinism.seed).")
@click.option("--seeds", metavar="0,1,2,...", help="One run per seed, plus a group record with mean, std and 95% CI.")
@click.option("--network", type=click.Choice(["none", "host"]), default="none", show_default=True,
              help="Container network. Runs have none unless asked.")
@click.option("--env", "env", multiple=True, metavar="NAME[=VALUE]",
              help="Pass a variable into the container. Names with TOKEN/SECRET/KEY/PASSWORD/CREDENTIAL "
                   "are passed but never recorded. Repeatable.")
@click.option("--name", help="A name for the run (appended to its ID).")
@click.option("--resume-from", "resume_from", metavar="RUN",
              help="Start with a copy of RUN's outputs/ (e.g. to resume from its checkpoint).")
@mlflow_option
@click.option("--json", "as_json", is_flag=True, help="Print the sealed run record (JSON) instead of a summary.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(config_path, gpus, data, seed, seeds, network, env, name, resume_from, mlflow_uri, as_json, script,
        args) -> int:
    """Run SCRIPT [ARGS...] inside the pinned image and record everything.

    In order: build the image if needed (a no-op when up to date); verify every
    dataset against its manifest (on failure, stop before any container
    exists); create runs/<id>/; snapshot the code; probe the hardware in the
    same image with the same devices; run. The container is locked down: the
    code read-only at /workspace, datasets read-only at their mounts, /outputs
    writable, a non-root user, a read-only root filesystem, no capabilities,
    no network. Logs stream here and into runs/<id>/logs/. The exit code is the
    container's.

    \b
    Examples:
      hermetic run train.py --epochs 3
      hermetic run --gpus all train.py --epochs 3
      hermetic run --seeds 0,1,2,3,4 train.py         # a seed group with intervals
      hermetic run --data synth=/mnt/big/synth -- train.py --lr 0.1
      hermetic run --mlflow http://127.0.0.1:5000 train.py  # then export the run to MLflow
    """
    from hermetic.config import load_config
    from hermetic.errors import HermeticError
    from hermetic.paths import cache_paths
    from hermetic.run.runner import RunRequest, execute

    cfg = load_config(config_path)
    mlflow = mlflow_target(mlflow_uri)  # checked before the run: a URI, and hermetic[mlflow] installed
    data_paths = {}
    for item in data:
        n, eq, p = item.partition("=")
        if not eq or not n or not p:
            raise HermeticError(f"--data {item!r}: expected NAME=PATH", exit_code=2)
        data_paths[n] = p
    resume_dir = None
    if resume_from:
        from hermetic.record import resolve_run

        resume_dir = resolve_run(resume_from, cfg.runs_path)
    argv = ["hermetic", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["hermetic", "run", script, *args]
    base = dict(script=script, args=list(args), argv=argv, gpus=gpus, data_paths=data_paths, network=network,
                env=list(env), name=name, echo=not as_json, resume_from=resume_dir)
    paths = cache_paths()
    if seeds:
        if seed is not None:
            raise HermeticError("--seed and --seeds together: pick one", exit_code=2)
        return _seed_group(cfg, paths, base, seeds, as_json, mlflow)
    result = execute(cfg, paths, RunRequest(seed=seed, seed_policy="cli" if seed is not None else "config", **base))
    if as_json:
        emit_json(result.record)
    else:
        _summary(result)
    return export_after_run(mlflow, [result.run_dir], result.exit_code)


def _summary(result) -> None:
    metrics = result.record.get("metrics", {}).get("final") or {}
    shown = ", ".join(f"{k}={v}" for k, v in list(metrics.items())[:4])
    click.echo(f"{result.run_id}  {result.status}  exit {result.exit_code}" + (f"  {shown}" if shown else ""))


def _seed_group(cfg, paths, base: dict, seeds: str, as_json: bool, mlflow=None) -> int:
    from hermetic.errors import HermeticError
    from hermetic.record import new_group_id, write_group
    from hermetic.run.runner import RunRequest, execute

    try:
        values = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise HermeticError(f"--seeds {seeds!r}: expected comma-separated integers, e.g. 0,1,2,3,4", exit_code=2) from None
    if len(values) < 2 or len(set(values)) != len(values):
        raise HermeticError(f"--seeds {seeds!r}: give at least two distinct seeds", exit_code=2)
    gid = new_group_id(name=base.get("name"))
    members, first_failure = [], 0
    for s in values:
        result = execute(cfg, paths, RunRequest(seed=s, seed_policy="group", group=gid, **base))
        members.append(result.run_id)
        if result.exit_code != 0 and not first_failure:
            first_failure = result.exit_code
        if not as_json:
            _summary(result)
        group_path = write_group(cfg.runs_path, gid, members, name=base.get("name")) / "group.json"
        if result.status == "interrupted":
            break
    import json

    group = json.loads(group_path.read_text()) if group_path.is_file() else {}
    if as_json:
        emit_json(group)
    else:
        click.echo(f"group {gid}: {len(members)} runs -> {group_path}")
        for metric, st in (group.get("metrics") or {}).items():
            if st.get("mean") is None:
                continue
            ci = st.get("ci95")
            interval = f"[{ci[0]:.6g}, {ci[1]:.6g}]" if ci else "n/a"
            sd = f"{st['sd']:.3g}" if st.get("sd") is not None else "n/a"
            click.echo(f"  {metric}: mean {st['mean']:.6g}  sd {sd}  95% CI {interval}  (n={st['n']})")
    return export_after_run(mlflow, [group_path.parent], first_failure)


@click.command()
@click.argument("run_ref", metavar="RUN")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the diff against the original as JSON.")
def replay(run_ref: str, config_path: str | None, as_json: bool) -> int:
    """Re-execute a recorded run exactly, then say whether it matched.

    Uses the recorded image (by digest; pulled from the registry the record
    names if the store lacks it), the recorded source snapshot (not today's
    working tree), the recorded config, seed, arguments and env, and the same
    data verified against the run's own manifest copies. Refuses, naming the
    input, when one can no longer be had. Exit 0 only when the replay is
    bitwise identical to the original.

    \b
    Example:
      hermetic replay runs/20261129-214500-1a2b3c
    """
    from hermetic.cli.runs_cmd import resolve_ref
    from hermetic.diff import diff_paths
    from hermetic.diff.render import render
    from hermetic.paths import cache_paths
    from hermetic.record import load_record
    from hermetic.run.replay import replay_request
    from hermetic.run.runner import execute

    run_dir = resolve_ref(run_ref, None, config_path)
    record = load_record(run_dir)
    paths = cache_paths()
    argv = ["hermetic", *sys.argv[1:]]
    cfg, req = replay_request(run_dir, record, paths, echo=not as_json, argv=argv)
    result = execute(cfg, paths, req)
    d = diff_paths(run_dir, result.run_dir)
    if as_json:
        emit_json({"replay": result.run_id, "original": record["record"]["run_id"], "diff": d.to_json()})
    else:
        click.echo(f"replay {result.run_id} of {record['record']['run_id']}: {result.status}")
        click.echo(render(d))
    return d.verdict.exit_code
