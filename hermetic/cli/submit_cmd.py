"""``hermetic submit`` (Slurm), and the two commands its jobs run on the nodes (hidden)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hermetic.cli.common import ScriptCommand, emit_json
from hermetic.cli.run_options import request_template, run_options
from hermetic.core.errors import UsageError
from hermetic.core.paths import cache_paths


@click.command(cls=ScriptCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@run_options("submit")
@click.option("-p", "--partition", help="Slurm partition (default: the cluster's default partition).")
@click.option("-t", "--time", "time_limit", metavar="TIME", help="Time limit, as sbatch --time (e.g. 2:00:00).")
@click.option("-c", "--cpus", "cpus", type=click.IntRange(1), metavar="N", help="CPUs per task (sbatch -c).")
@click.option("-N", "--nodes", type=click.IntRange(1), default=1, show_default=True,
              help="Nodes: one container per node, started by srun; torchrun ranks meet at the first node.")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="ARG",
              help="Passed to sbatch as is (repeatable), e.g. --sbatch-arg=--account=ml --sbatch-arg=--qos=low.")
@click.option("--container", type=click.Choice(["docker", "pyxis"]), default="docker", show_default=True,
              help="docker: hermetic runs the container on each node (Docker Engine there). pyxis: the sbatch "
                   "script runs it with srun --container-image=REGISTRY#REPO@sha256:... (pyxis/enroot >= 4.0).")
@click.option("--shared-store", "shared_store", metavar="DIR", type=click.Path(file_okay=False),
              help="A hermetic cache every node mounts: the image is put there and the tasks take it by digest, "
                   "every blob verified; no registry. (HERMETIC_CACHE below a --shared-root, or on a network "
                   "filesystem, serves as one by itself.)")
@click.option("--node-cache", "node_cache", metavar="PATH",
              help="HERMETIC_CACHE on the nodes ({node} = the node's name), e.g. /scratch/hermetic-{node}. "
                   "Default: the one this command uses.")
@click.option("--shared-root", "shared_roots", multiple=True, metavar="DIR",
              help="A directory every node mounts (repeatable): when given, the runs directory and the "
                   "datasets must lie below one.")
@click.option("--wait", is_flag=True, help="Block until the job (and a group's summary) ended; exit like "
                                           "hermetic run.")
@click.option("--json", "as_json", is_flag=True, help="Print what was submitted (with --wait: the record or group).")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(partition, time_limit, cpus, nodes, sbatch_args, container, shared_store, node_cache, shared_roots, wait,
           as_json, script, args, **shared) -> int:
    """Submit SCRIPT [ARGS...] to Slurm: the same run `hermetic run` makes, on a node.

    Before anything is submitted: the controller must answer, the partition
    exist, the image be where the nodes get it (a store they all mount:
    --shared-store, or HERMETIC_CACHE on a shared filesystem; else the
    registry it was pushed to, pulled by digest), the datasets verify against their manifests and
    lie where the nodes see them. Then the code is snapshotted once, here,
    into runs/<id>/slurm/ (what the tasks run, whatever the checkout holds
    when they start), with the sbatch script, and submitted. Each task runs
    the steps of `hermetic run` on its node into runs/<id>/: the record
    holds Slurm's job ID, array task ID, node and partition. `hermetic runs`
    shows pending, running and finished Slurm runs. docs/scale-out.md.

    \b
    Examples:
      hermetic submit -p gpu --gpus 1 -t 2:00:00 train.py --epochs 3
      hermetic submit --seeds 0-4 train.py --seed {seed}     # a 5-task array + group summary
      hermetic submit -N 2 --nproc-per-node 4 --gpus 4 train.py   # 8 ranks on 2 nodes
      hermetic submit --engine podman --shared-store /scratch/hermetic train.py   # no daemon, no registry
      hermetic submit --container pyxis train.py             # srun --container-image=...@sha256:...
      hermetic submit --wait train.py                        # block; exit like hermetic run
    """
    from hermetic.cli.run_cmd import run_log
    from hermetic.slurm.submit import SlurmOptions, submit as do_submit

    argv = ["hermetic", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["hermetic", "submit", script, *args]
    cfg, template, seed_list = request_template(shared, script=script, args=args, argv=argv, nnodes=nodes)
    opts = SlurmOptions(partition=partition, time=time_limit, cpus_per_task=cpus, nodes=nodes,
                        sbatch_args=tuple(sbatch_args), container=container, node_cache=node_cache,
                        shared_roots=tuple(Path(r) for r in shared_roots), engine=template.engine,
                        shared_store=Path(shared_store).expanduser().resolve() if shared_store else None)
    log, progress = run_log(True)
    result = do_submit(cfg, cache_paths(), template, seed_list, opts, log=log, progress=progress)
    for w in result.warnings:
        log(f"warning: {w}")
    sub = result.submission
    doc = {"kind": sub.kind, "id": sub.submission_id, "dir": str(sub.dir), "script": str(result.script),
           "job_id": result.job_id, "summary_job_id": result.summary_job_id, "partition": sub.partition,
           "held": result.held, "members": [{"index": m.index, "seed": m.seed, "run_id": m.run_id}
                                            for m in sub.members]}
    what = (f"group {sub.submission_id}: {len(sub.members)} tasks as array job {result.job_id}, "
            f"summary job {result.summary_job_id}" if sub.kind == "group"
            else f"run {sub.submission_id} as job {result.job_id}")
    click.echo(f"hermetic: submitted {what} (partition {sub.partition}{', held' if result.held else ''}); "
               f"script {result.script}", err=True)
    if not wait:
        if as_json:
            emit_json(doc)
        else:
            click.echo(sub.submission_id)
        return 0
    from hermetic.slurm.state import wait_for

    last = result.summary_job_id or result.job_id
    if sub.kind == "group":
        wait_for(result.job_id, on_change=lambda s: log(f"array job {result.job_id}: {s}"))
    wait_for(last, on_change=lambda s: log(f"job {last}: {s}"))
    return _report(sub, as_json)


def _report(sub, as_json: bool) -> int:
    """After the end: what `hermetic run` would have printed, and its exit code."""
    from hermetic.cli.run_cmd import say_hint, summary_line
    from hermetic.record import load_record
    from hermetic.run.seal import RunFailed
    from hermetic.slurm.state import read_state

    first_failure = 0
    for m in sub.members:
        state = read_state(sub.run_dir(m))
        code = state.get("exit_code")
        if code is None and state.get("state") != "finished":
            code = RunFailed.exit_code  # the task ended without hermetic's word (killed, cancelled)
        first_failure = first_failure or int(code or 0)
        if sub.kind == "group" and not as_json:
            reason = f"  ({state['reason']})" if state.get("reason") else ""
            click.echo(f"{m.run_id}  seed {m.seed}  {state.get('status') or state.get('state')}  exit {code}{reason}")
            say_hint(sub.run_dir(m), state.get("status") == "failed")
    if sub.kind == "run":
        m = sub.members[0]
        if not (sub.run_dir(m) / "run.json").is_file():  # ``state``: the one member's
            click.echo(f"hermetic: error: run {m.run_id} left no record: "
                       f"{state.get('reason') or state.get('state')}", err=True)
            return first_failure
        rec = load_record(sub.run_dir(m))
        if as_json:
            emit_json(rec)
        else:
            click.echo(summary_line(m.run_id, rec["record"]["status"], first_failure, rec))
            say_hint(sub.run_dir(m), rec["record"]["status"] == "failed")
        return first_failure
    group_json = sub.dir / "group.json"
    state = read_state(sub.dir)
    if as_json:
        emit_json(json.loads(group_json.read_text()) if group_json.is_file() else state)
    else:
        click.echo(f"group {sub.submission_id}: {state.get('summary') or state.get('state')} -> "
                   f"{group_json if group_json.is_file() else sub.dir / 'slurm.json'}")
    return first_failure


@click.command("slurm-task", hidden=True)
@click.argument("submission", type=click.Path(path_type=Path))
@click.option("--phase", type=click.Choice(["run", "begin", "end"]), default="run", show_default=True,
              help="run: the whole run (Docker). begin/end: the record steps around a pyxis container.")
@click.option("--exit-code", "exit_code", type=int, default=None, help="--phase end: the container's exit code.")
def slurm_task(submission: Path, phase: str, exit_code: int | None) -> int:
    """Run one task of a submission on this node (the job script calls this; not for people)."""
    from hermetic.cli.run_cmd import run_log

    log, _ = run_log(True)
    if phase == "run":
        from hermetic.slurm.task import run_task

        return run_task(submission, log=log)
    from hermetic.slurm.pyxis import begin, end

    if phase == "begin":
        begin(submission, log=log)
        return 0
    if exit_code is None:
        raise UsageError("--phase end needs --exit-code (the container's)")
    return end(submission, exit_code, log=log)


@click.command("slurm-summary", hidden=True)
@click.argument("submission", type=click.Path(path_type=Path))
def slurm_summary(submission: Path) -> int:
    """Write a submitted group's summary (the dependent job calls this; not for people)."""
    from hermetic.slurm.summary import summarize

    path, line = summarize(submission)
    click.echo(f"hermetic: {line}; summary: {path}", err=True)
    return 0
