"""``hermetic runs``: list recorded runs and seed groups, newest first; ``runs show ID``: one record.

Listing reads runs/.index.jsonl and one directory listing, never run.json, on click and the standard library
alone; ``show`` validates the record. What a record says is escaped before it is shown (hermetic.core.escape).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hermetic.cli.common import emit_json, reading, runs_location, runs_options
from hermetic.cli.logs_cmd import wait
from hermetic.cli.runs_tools_cmd import export_cmd, plot_cmd
from hermetic.core.escape import shown, shown_tree
from hermetic.record.index import group_size, is_group_dir, list_entries
from hermetic.record.locate import resolve_ref, runs_root
from hermetic.core.errors import IntegrityError, NotFound

if TYPE_CHECKING:
    from hermetic.record.schema import Record

KEY_METRICS = ("val_loss", "test_loss", "loss", "train_loss", "val_accuracy", "val_acc", "test_acc", "accuracy", "acc",
               "eval_loss")
NOT_KEY = ("lr",)  # the learning rate is a setting's schedule, not a result (a figure still draws it)


@click.group(invoke_without_command=True)
@runs_options()
@click.option("-n", "--limit", type=click.IntRange(min=1), default=None, metavar="N", help="Show the newest N only.")
@click.option("--reindex", is_flag=True, help="Rebuild runs/.index.jsonl from every run.json first.")
@click.pass_context
def runs(ctx: click.Context, runs_dir: str | None, config_path: str | None, as_json: bool, limit: int | None,
         reindex: bool) -> None:
    """List runs and seed groups, newest first.

    One line each: ID, start time (UTC), status, image ID (short), datasets
    (name and manifest sha256, short) and a key metric (val_loss, loss,
    accuracy... or the first one). Groups show the mean ± SD over seeds.

    \b
    Examples:
      hermetic runs                    # ./runs, or runs_dir from ./hermetic.yaml
      hermetic runs -n 20 --json       # the newest 20, as JSON
      hermetic runs show 20261129-21   # one run (a unique ID prefix is enough)
    """
    if ctx.invoked_subcommand is not None:
        return
    root = runs_root(runs_dir, config_path)
    entries = list_entries(root, reindex=reindex)
    if reap_listed_orphans(entries, by="hermetic runs"):
        entries = list_entries(root)
    if limit is not None:
        entries = entries[:limit]
    if any(e.get("slurm") for e in entries):  # submitted, no record yet: pending or running, as Slurm says now
        from hermetic.slurm.state import refresh_entries

        refresh_entries(entries)
    if as_json:
        emit_json_list(entries)
        return
    if not entries:
        click.echo(f"no runs in {root}", err=True)
        return
    sys.stdout.write(format_table(entries, colour=sys.stdout.isatty()))


# The subcommands defined in their own modules (below this one: they import only cli/common.py).
runs.add_command(export_cmd)
runs.add_command(plot_cmd)
runs.add_command(wait)


def reap_listed_orphans(entries: list[dict[str, Any]], *, by: str) -> bool:
    """Reap the containers of listed runs whose driver died (hermetic.run.orphans), saying so on stderr;
    True when a record changed. Asked only about runs that look so (an early record, no live driver): a
    listing of finished runs never reaches the engine."""
    candidates = {e["id"] for e in entries
                  if e["kind"] == "run" and e["status"] == "interrupted" and not e.get("finished_at")}
    if not candidates:
        return False
    from hermetic.run.orphans import reap_orphans

    reaped = reap_orphans(by=by, run_ids=candidates)
    for r in reaped:
        click.echo(f"hermetic: note: {shown(r.note)}", err=True)
    return any(r.sealed for r in reaped)


def emit_json_list(entries: list[dict[str, Any]]) -> None:
    """A JSON array, one entry per line: valid JSON for scripts, grep-able for people, and
    written by the C encoder (an indented dump goes through the pure-Python one, several times slower)."""
    import json

    body = ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries)
    sys.stdout.write(shown(f"[\n{body}\n]\n", "json") if entries else "[]\n")


def key_metric(final: dict[str, Any]) -> str | None:
    if not final:
        return None

    def bare(k: str) -> str:  # tensorboard/val_loss, trainer/eval_loss: by their own name (hermetic.record.metrics)
        return k.rsplit("/", 1)[-1]

    name = (next((k for k in KEY_METRICS if k in final), None)
            or next((k for m in KEY_METRICS for k in sorted(final) if bare(k) == m), None))
    if name is None:  # no usual name: the first that is neither a counter nor the learning rate
        from hermetic.record.metrics import is_counter  # only here: the listing's usual path stays light

        name = next((k for k in sorted(final) if not is_counter(k) and bare(k) not in NOT_KEY), None) \
            or sorted(final)[0]
    return name


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_row(e: dict[str, Any]) -> list[str]:
    started = (e.get("started_at") or "")[:16].replace("T", " ")
    status = e["status"] or "-"
    if e["kind"] == "group":
        status = f"group×{group_size(e)} {status}"
    if e.get("slurm") and e["slurm"].get("job_id") is not None:  # a submitted run without a record yet
        task = e["slurm"].get("array_task_id")
        status += f" (slurm {e['slurm']['job_id']}" + (f"_{task}" if task is not None else "") + ")"
    image = (e.get("image") or "-").removeprefix("sha256:")[:12]
    data = ",".join(f"{n}:{h[:8]}" for n, h in (e.get("data") or {}).items()) or "-"
    final = e.get("final") or {}
    name = key_metric(final)
    if name is None:
        metric = "-"
    else:
        sd = (e.get("sd") or {}).get(name)
        metric = f"{name}={_num(final[name])}" + (f"±{sd:.3g}" if isinstance(sd, float) else "")
    return [e["id"], started, status, image, data, metric]


_STATUS_COLOUR = {"succeeded": "green", "failed": "red", "interrupted": "yellow", "refused": "red",
                  "incomplete": "yellow", "unreadable": "red", "running": "cyan"}


def format_table(entries: list[dict[str, Any]], *, colour: bool) -> str:
    """Plain aligned columns (a rich Table takes seconds for 10,000 rows)."""
    header = ["ID", "STARTED (UTC)", "STATUS", "IMAGE", "DATA", "METRIC"]
    rows = [[shown(c) for c in format_row(e)] for e in entries]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(5)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header[:5], widths, strict=True)) + "  METRIC"]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:5], widths, strict=True)]
        if colour:
            word = r[2].split()[-1]
            cells[2] = click.style(cells[2], fg=_STATUS_COLOUR.get(word, "cyan" if r[2].startswith("group") else None))
        out.append("  ".join(cells) + "  " + r[5])
    return "\n".join(out) + "\n"


@runs.command("show")
@click.argument("run_id", metavar="ID")
@click.option("--no-rehash", is_flag=True, help="Do not rehash the output files (the line 'record' says so).")
@runs_options()
@click.pass_context
def show(ctx: click.Context, run_id: str, no_rehash: bool, runs_dir: str | None, config_path: str | None,
         as_json: bool) -> None:
    """Print one run's record (or one group's summary), checked against its seal.

    ID is a run ID, a unique prefix of one, or a path to a run directory.
    A record edited after hermetic wrote it, or a run directory renamed, is
    refused (exit 65). The output files are rehashed against the record
    (stat-cached: a second look reads only files changed since); one that
    changed or went missing is named and the exit status is 65 (`hermetic
    runs verify` checks the rest of the directory too).

    \b
    Examples:
      hermetic runs show 20261129-214500-1a2b3c
      hermetic runs show 20261129-2145 --json | jq .metrics.final
    """
    ref_dir = resolve_ref(run_id, *runs_location(ctx, runs_dir, config_path))
    with reading(ref_dir):
        _show(ref_dir, no_rehash, as_json)


def _show(ref_dir: Path, no_rehash: bool, as_json: bool) -> None:
    if is_group_dir(ref_dir):
        from hermetic.record.group import load_group

        group = load_group(ref_dir)
        if as_json:
            emit_json(group)
        else:
            click.echo(format_group(shown_tree(group), Path(shown(ref_dir))))
        return
    from hermetic.record.rundir import load_run
    from hermetic.record.verify import check_outputs

    record, model = load_run(ref_dir)
    check = None if no_rehash else check_outputs(ref_dir, record)
    if as_json:
        emit_json(record)
    else:
        click.echo(format_record(shown_tree(model), Path(shown(ref_dir)), check))
    if check is not None and not check.as_recorded:
        problems = [p for p in check.problems() if not p.endswith("(added since)")]
        raise IntegrityError(f"{ref_dir}: " + "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)"
                                                                         if len(problems) > 3 else ""),
                             hint=f"hermetic runs verify {ref_dir.name} lists what differs")


def _line(label: str, text: str) -> str:
    return f"  {click.style(label.ljust(9), bold=True)} {text}"


def format_record(r: Record, run_dir: Path, check: Any = None) -> str:
    """The record (its model, shown_tree'd) in lines; ``check``: what rehashing the outputs found
    (hermetic.record.verify.OutputsCheck), None when they were not rehashed."""
    meta, inv, img, code = r.record, r.invocation, r.image, r.code
    exit_text = f", exit {meta.exit_code}" if meta.exit_code is not None else ""
    lines = [click.style(f"run {meta.run_id}", bold=True) + "  "
             + click.style(f"{meta.status}{exit_text}", fg=_STATUS_COLOUR.get(meta.status))]

    def add(label: str, text: str) -> None:
        lines.append(_line(label, text))

    add("started", meta.started_at + (f"   finished {meta.finished_at}" if meta.finished_at else ""))
    if meta.reason:
        add("reason", meta.reason)
    if inv.limits:
        add("limits", f"pids {inv.limits.pids or 'unlimited'}, memory {inv.limits.memory or 'unlimited'}"
            " (run.pids, run.memory)")
    extra = "".join(f"  [{k} {v}]" for k, v in (("name", inv.name), ("group", inv.group), ("replay_of", inv.replay_of))
                    if v)
    add("command", " ".join(inv.argv) + extra)
    cuda = ", ".join(f"{k} {v}" for k, v in sorted(img.cuda) if v)  # as run.json has them
    add("image", f"{img.id}  ({len(img.packages)} packages, base {img.base}" + (f"; {cuda}" if cuda else "") + ")")
    add("", f"manifest {img.manifest_digest}" + "".join(f"; {d}" for d in img.repo_digests))
    engine = inv.engine
    if engine is not None and engine.image is not None:  # what the engine ran the image from (Charliecloud)
        form = (f"the SquashFS file {engine.image.path} (sha256 {engine.image.sha256})"
                if engine.image.form == "squashfs" else f"its layers as directories under {engine.image.path}")
        add("", f"run by {engine.name} {engine.version} from {form}")
    snap, git = code.snapshot, code.git
    git_text = "not a git checkout" if git is None else (
        f"commit {str(git.commit)[:12]}" + (f" on {git.branch}" if git.branch else "")
        + (f", dirty ({git.diff_file or 'no patch'}; {len(git.untracked)} untracked)" if git.dirty else ", clean"))
    add("code", f"source {snap.sha256[:16]} ({len(snap.files)} files); {git_text}")
    add("config", f"sha256 {inv.config_sha256[:16]}; {inv.script} {' '.join(inv.args)}"
        + f"; network {inv.network}" + (f"; --gpus {inv.gpus}" if inv.gpus else ""))
    if not r.data:
        add("data", "none")
    for name, ds in sorted(r.data.items()):
        add("data", f"{name} {ds.manifest_sha256[:16]}  {ds.count} files, {ds.bytes} bytes, "
            f"{ds.path} -> {', '.join(map(str, ds.seen_at))} ({ds.verify_mode})")
    if inv.resume_from:
        add("resumed", f"from run {inv.resume_from}'s outputs (checked against its record)")
    from hermetic.record.build import reseeded_text

    seed = r.seed
    reseed = reseeded_text(seed.reseeded or {})  # the seed used, when the script chose its own
    add("seed", f"{seed.value} (from {seed.policy}); " + (f"{reseed}; " if reseed else "") + _seeded_text(seed.applied))
    env_text = " ".join(f"{k}={v}" for k, v in sorted({**r.env.determinism, **r.env.passed}.items())) or "-"
    if r.env.secrets:
        env_text += f"  secrets (names only): {', '.join(r.env.secrets)}"
    add("env", env_text)
    if r.distributed:
        d = r.distributed
        seeds = ", ".join(f"{x.rank}:{x.seed}@{x.device}" for x in d.ranks[:4])
        add("ranks", f"world size {d.world_size} ({d.nnodes} node(s) x {d.nproc_per_node}), "
            f"{d.backend} {d.backend_version or ''}".rstrip() + f"; rank:seed@device {seeds}"
            + (" ..." if len(d.ranks) > 4 else ""))
    if r.slurm:
        sl = r.slurm
        array = f" (array {sl.array_job_id}_{sl.array_task_id})" if sl.array_job_id is not None else ""
        pulled = f"; image pulled from {sl.image_pulled_from}" if sl.image_pulled_from else ""
        add("slurm", f"job {sl.job_id}{array} on {sl.node}, partition {sl.partition}, {sl.container}{pulled}")
    add("software", _software_text(r.software, seed.applied))
    add("hardware", _hardware_text(r.hardware.model_dump(exclude_unset=True)))
    files, volatile = r.outputs.files, set(r.outputs.volatile or [])
    names = sorted(files, key=lambda p: (p in volatile, p))
    listed = ", ".join(p + (" (volatile)" if p in volatile else "") for p in names[:4])
    listed += f", +{len(names) - 4} more" if len(names) > 4 else ""
    size = sum(f.size for f in files.values())
    add("outputs", f"{len(files)} files, {size} bytes" + (f": {listed}" if listed else ""))
    steps = r.metrics.steps
    add("metrics", (", ".join(f"{k}={_num(v)}" for k, v in r.metrics.final.items()) or "none")
        + (f"  (steps {steps})" if steps is not None else ""))
    add("record", f"{run_dir}/run.json  sha256 {meta.record_sha256[:16]}  (seal verified; {_rehash_text(check)})")
    return "\n".join(lines)


def _rehash_text(check: Any) -> str:
    if check is None:
        return "output files not rehashed"
    if not check.as_recorded:
        return click.style("outputs differ from the record: " + shown("; ".join(check.problems()[:3])), fg="red")
    added = f"; {len(check.added)} not in the record: {shown(', '.join(check.added[:3]))}" if check.added else ""
    return (f"{check.files} output files rehashed, as recorded: {check.hashed} read, {check.cached} from the stat "
            f"cache{added}")


def _software_text(sw: dict[str, Any], applied: dict[str, Any]) -> str:
    """Versions from the probe; torch's flags as the training process had them (the probe is another process)."""
    final = (applied.get("final") or {}).get("torch")
    enabled = (applied.get("determinism") or {}).get("torch")
    parts = []
    for k, v in sw.items():
        if k == "env":
            continue  # shown on the env line
        if isinstance(v, dict):
            version = v.get("version")
            if k == "torch" and (final or enabled):
                state, when = (final, "at exit") if final else (enabled, "after enable_determinism()")
                flags = [f"{ik}={iv}" for ik, iv in state.items() if isinstance(iv, (bool, str))]
                parts.append(f"torch {version or ''} ({when}: {', '.join(flags)})")
                continue
            flags = [f"{ik}={iv}" for ik, iv in v.items() if isinstance(iv, bool)]
            if k == "torch" and flags:
                parts.append(f"torch {version or ''} (torch's defaults, from the probe; the script reported "
                             f"nothing: {', '.join(flags)})")
                continue
            parts.append(f"{k} {version or ''}".rstrip() + (f" ({', '.join(flags)})" if flags else ""))
        elif isinstance(v, list):
            parts.append(f"{k}: " + ", ".join(f"{x.get('internal_api')} {x.get('version')}" for x in v
                                              if isinstance(x, dict)))
        elif v is not None:
            parts.append(f"{k} {v}")
    return "; ".join(parts) or "-"


def _hardware_text(hw: dict[str, Any]) -> str:
    parts = []
    for g in hw.get("gpus") or []:
        if isinstance(g, dict):
            parts.append(f"{g.get('name')} (sm {g.get('sm_count')}, cc {g.get('compute_capability')}, "
                         f"MIG {g.get('mig_mode')}, driver {g.get('driver_version')})")
    if not hw.get("gpus") and hw.get("gpu_note"):
        parts.append(str(hw["gpu_note"]))
    cpu = hw.get("cpu")
    if isinstance(cpu, dict):
        parts.append(f"{cpu.get('model')} ({cpu.get('logical_cores', cpu.get('cores'))} cores)")
    kernel = hw.get("kernel")
    if isinstance(kernel, dict):
        kernel = kernel.get("release")
    if kernel:
        parts.append(f"kernel {kernel}")
    return "; ".join(parts) or "-"


def format_group(g: dict[str, Any], gdir: Path) -> str:
    from hermetic.record.group import seeds_ran

    meta = g["group"]
    lines = [click.style(f"group {meta['group_id']}", bold=True) + f"  {meta['status']}  ({seeds_ran(g)})"]
    lines += [_line("member", f"{m['run_id']}  seed {m['seed']}  {m['status']}") for m in g["members"]]
    lines.append(_line("inputs", f"image {g['inputs']['image'][:19]}  config {g['inputs']['config_sha256'][:12]}  "
                       f"code {g['inputs']['code_sha256'][:12]}"
                       + (f"  MIXED: {', '.join(g['inputs']['mixed'])}" if g["inputs"]["mixed"] else "")))
    for name, s in g["metrics"].items():
        if s["mean"] is None:
            lines.append(_line("metric", f"{name}: no finite values"))
            continue
        sd = f" ± {s['sd']:.4g} (sd)" if s["sd"] is not None else ""
        ci = f", 95% CI [{s['ci95'][0]:.6g}, {s['ci95'][1]:.6g}]" if s["ci95"] else ""
        nf = f", {s['nonfinite']} non-finite left out" if s["nonfinite"] else ""
        lines.append(_line("metric", f"{name}: mean {s['mean']:.6g}{sd}, n={s['n']}{ci}{nf}"))
    lines.append(_line("method", g["method"]))
    lines += [_line("warning", click.style(flag, fg="yellow")) for flag in g.get("flags") or []]
    lines.append(_line("record", f"{gdir}/group.json  sha256 {meta['group_sha256'][:16]}  (seal verified)"))
    return "\n".join(lines)


@runs.command("verify")
@click.argument("refs", nargs=-1, metavar="[RUN]...")
@runs_options()
@click.pass_context
def verify_cmd(ctx: click.Context, refs: tuple[str, ...], runs_dir: str | None, config_path: str | None,
               as_json: bool) -> None:
    """Check run directories against their sealed records; say per run ok or what differs.

    RUN is a run ID, a unique prefix, a path, or a seed group (its members);
    with none, every run in the runs directory. For each: the record's seal
    and schema, that the directory is named by its run ID, every output file
    rehashed (changed, missing, added since), the dataset manifest copies in
    data/, the source snapshot and the git patch against their recorded
    sha256. Rehashing is stat-cached (runs/<id>/.outputs.statcache): a second
    look reads only what changed since. A run still going, or a directory
    without a record, is skipped.

    Exit status: 0 every run checked is as recorded, 65 one or more differ,
    66 no run record was found.

    \b
    Examples:
      hermetic runs verify                       # every run in ./runs
      hermetic runs verify 20261129-2145 --json
    """
    from hermetic.record.verify import verify_run

    runs_dir, config_path = runs_location(ctx, runs_dir, config_path)
    root = None if refs else runs_root(runs_dir, config_path)
    dirs = ([d for ref in refs for d in _member_dirs(resolve_ref(ref, runs_dir, config_path))] if root is None
            else _all_run_dirs(root))
    with reading(*dirs):
        results = [verify_run(d) for d in dirs]
    checked = [r for r in results if r.status != "skipped"]
    differ = [r for r in checked if not r.ok]
    if as_json:
        emit_json({"ok": bool(checked) and not differ, "checked": len(checked), "differ": len(differ),
                   "runs": [r.to_json() for r in results]})
    else:
        for r in results:
            click.echo(_verify_line(r))
    if not checked:
        raise NotFound(f"no run records to verify in {root or ', '.join(refs)}")
    if differ:
        first = differ[0]
        more = f" (and {len(differ) - 1} more runs)" if len(differ) > 1 else ""
        raise IntegrityError(f"{len(differ)} of {len(checked)} runs differ from their records: "
                             f"{first.run_id or first.run_dir.name}: {first.problems[0]}{more}")


def _verify_line(r: Any) -> str:
    name = shown(r.run_id or r.run_dir.name)
    if r.status == "skipped":
        return f"{click.style('skipped', dim=True)}  {name}: {shown(r.skipped)}"
    if r.ok:
        o = r.outputs
        return (f"{click.style('ok', fg='green')}       {name}  ({o.files} outputs: {o.hashed} read, {o.cached} "
                "from the stat cache)")
    problems = "\n".join(f"           {shown(p)}" for p in r.problems[:20])
    more = f"\n           ... and {len(r.problems) - 20} more (--json lists all)" if len(r.problems) > 20 else ""
    return f"{click.style('DIFFERS', fg='red', bold=True)}  {name}\n{problems}{more}"


def _all_run_dirs(root: Path) -> list[Path]:
    """Every run directory under ``root`` (groups are not runs: their members are), by name."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir() and not is_group_dir(p))


def _member_dirs(ref_dir: Path) -> list[Path]:
    """A run directory itself; a group's member run directories."""
    if not is_group_dir(ref_dir):
        return [ref_dir]
    from hermetic.record.group import load_group

    return [ref_dir.parent / m["run_id"] for m in load_group(ref_dir)["members"]]


def _seeded_text(applied: dict) -> str:
    """What the seed reached: the generators seeded at start-up and by hermetic_runtime's seed_everything."""
    startup = (applied.get("startup") or {}).get("seeded") or []
    runtime = (applied.get("seed") or {}).get("seeded") or []
    parts = []
    if startup:
        parts.append(f"seeded at start-up: {', '.join(startup)}")
    if runtime:
        parts.append(f"by seed_everything: {', '.join(runtime)}")
    if not parts:
        return ("nothing was seeded from it (the script imported no generator hermetic seeds, or the run "
                "ended before the runtime reported)" if applied else "nothing reported")
    return "; ".join(parts)
