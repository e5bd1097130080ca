"""``hermetic runs``: list recorded runs and seed groups, newest first; ``runs show ID``: one record.

Listing reads runs/.index.jsonl (one line per run, kept by write_record) plus
one directory listing, never the run.json files themselves, so 10,000 runs
list in well under a second. Only click and the standard library are imported
on that path; pydantic is loaded by ``show`` (which validates the record).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hermetic.cli.common import config_option, emit_json, json_option
from hermetic.record.locate import resolve_ref, runs_root

KEY_METRICS = ("val_loss", "test_loss", "loss", "train_loss", "val_accuracy", "val_acc", "test_acc", "accuracy", "acc")
COUNTERS = ("epoch", "step", "batch", "iteration", "lr")


def runs_dir_option(f):  # noqa: ANN001, ANN201 - a click decorator
    return click.option("--runs-dir", "runs_dir", metavar="DIR", default=None,
                        help="The runs directory (default: runs_dir from hermetic.yaml, else ./runs).")(f)


@click.group(invoke_without_command=True)
@runs_dir_option
@config_option
@json_option
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
    ctx.obj = {"runs_dir": runs_dir, "config_path": config_path}
    if ctx.invoked_subcommand is not None:
        return
    from hermetic.record.index import list_entries

    root = runs_root(runs_dir, config_path)
    entries = list_entries(root, reindex=reindex)
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


def emit_json_list(entries: list[dict[str, Any]]) -> None:
    """A JSON array, one entry per line: valid JSON for scripts, grep-able for people, and
    written by the C encoder (an indented dump of 10,000 entries takes ~4x longer)."""
    import json

    body = ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries)
    sys.stdout.write(f"[\n{body}\n]\n" if entries else "[]\n")


def key_metric(final: dict[str, Any]) -> str | None:
    if not final:
        return None
    name = (next((k for k in KEY_METRICS if k in final), None)
            or next((k for k in sorted(final) if k not in COUNTERS), None) or sorted(final)[0])
    return name


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_row(e: dict[str, Any]) -> list[str]:
    from hermetic.record.index import group_size

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
    rows = [format_row(e) for e in entries]
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
@runs_dir_option
@config_option
@json_option
@click.pass_context
def show(ctx: click.Context, run_id: str, runs_dir: str | None, config_path: str | None, as_json: bool) -> None:
    """Print one run's record (or one group's summary), checked against its seal.

    ID is a run ID, a unique prefix of one, or a path to a run directory.
    A record edited after hermetic wrote it is reported (exit 65).

    \b
    Examples:
      hermetic runs show 20261129-214500-1a2b3c
      hermetic runs show 20261129-2145 --json | jq .metrics.final
    """
    parent = ctx.obj or {}
    ref_dir = resolve_ref(run_id, runs_dir or parent.get("runs_dir"), config_path or parent.get("config_path"))
    from hermetic.record.index import is_group_dir

    if is_group_dir(ref_dir):
        from hermetic.record.group import load_group

        group = load_group(ref_dir)
        if as_json:
            emit_json(group)
        else:
            click.echo(format_group(group, ref_dir))
        return
    from hermetic.record.rundir import load_record

    record = load_record(ref_dir)
    if as_json:
        emit_json(record)
    else:
        click.echo(format_record(record, ref_dir))


def _line(label: str, text: str) -> str:
    return f"  {click.style(label.ljust(9), bold=True)} {text}"


def format_record(r: dict[str, Any], run_dir: Path) -> str:
    meta, inv, img, code = r["record"], r["invocation"], r["image"], r["code"]
    colour = _STATUS_COLOUR.get(meta["status"])
    exit_text = f", exit {meta['exit_code']}" if meta["exit_code"] is not None else ""
    lines = [click.style(f"run {meta['run_id']}", bold=True) + "  "
             + click.style(f"{meta['status']}{exit_text}", fg=colour)]
    finished = f"   finished {meta['finished_at']}" if meta["finished_at"] else ""
    lines.append(_line("started", meta["started_at"] + finished))
    extra = "".join(f"  [{k} {inv[k]}]" for k in ("name", "group", "replay_of") if inv[k])
    lines.append(_line("command", " ".join(inv["argv"]) + extra))
    cuda = ", ".join(f"{k} {v}" for k, v in img["cuda"].items() if v)
    lines.append(_line("image", f"{img['id']}  ({len(img['packages'])} packages, base {img['base']}"
                       + (f"; {cuda}" if cuda else "") + ")"))
    lines.append(_line("", f"manifest {img['manifest_digest']}" + "".join(f"; {d}" for d in img["repo_digests"])))
    snap, git = code["snapshot"], code["git"]
    git_text = "not a git checkout" if git is None else (
        f"commit {str(git['commit'])[:12]}" + (f" on {git['branch']}" if git["branch"] else "")
        + (f", dirty ({git['diff_file'] or 'no patch'}; {len(git['untracked'])} untracked)" if git["dirty"]
           else ", clean"))
    lines.append(_line("code", f"source {snap['sha256'][:16]} ({len(snap['files'])} files); {git_text}"))
    lines.append(_line("config", f"sha256 {inv['config_sha256'][:16]}; {inv['script']} {' '.join(inv['args'])}"
                       + f"; network {inv['network']}" + (f"; --gpus {inv['gpus']}" if inv["gpus"] else "")))
    if not r["data"]:
        lines.append(_line("data", "none"))
    for name, ds in sorted(r["data"].items()):
        lines.append(_line("data", f"{name} {ds['manifest_sha256'][:16]}  {ds['count']} files, {ds['bytes']} bytes, "
                           f"{ds['path']} -> {', '.join(ds.get('mounts') or [ds['mount']])} ({ds['verify_mode']})"))
    if inv.get("resume_from"):
        lines.append(_line("resumed", f"from run {inv['resume_from']}'s outputs (checked against its record)"))
    from hermetic.record.build import reseeded_text

    reseed = reseeded_text(r["seed"].get("reseeded") or {})  # the seed used, when the script chose its own
    lines.append(_line("seed", f"{r['seed']['value']} (from {r['seed']['policy']}); " + (f"{reseed}; " if reseed else "")
                       + _seeded_text(r["seed"]["applied"])))
    env = r["env"]
    env_text = " ".join(f"{k}={v}" for k, v in sorted({**env["determinism"], **env["passed"]}.items())) or "-"
    if env["secrets"]:
        env_text += f"  secrets (names only): {', '.join(env['secrets'])}"
    lines.append(_line("env", env_text))
    if r.get("distributed"):
        d = r["distributed"]
        seeds = ", ".join(f"{x['rank']}:{x['seed']}@{x['device']}" for x in d["ranks"][:4])
        lines.append(_line("ranks", f"world size {d['world_size']} ({d['nnodes']} node(s) x {d['nproc_per_node']}), "
                           f"{d['backend']} {d['backend_version'] or ''}".rstrip() + f"; rank:seed@device {seeds}"
                           + (" ..." if len(d["ranks"]) > 4 else "")))
    if r.get("slurm"):
        sl = r["slurm"]
        array = f" (array {sl['array_job_id']}_{sl['array_task_id']})" if sl["array_job_id"] is not None else ""
        pulled = f"; image pulled from {sl['image_pulled_from']}" if sl.get("image_pulled_from") else ""
        lines.append(_line("slurm", f"job {sl['job_id']}{array} on {sl['node']}, partition {sl['partition']}, "
                           f"{sl['container']}{pulled}"))
    lines.append(_line("software", _software_text(r["software"], r["seed"]["applied"])))
    lines.append(_line("hardware", _hardware_text(r["hardware"])))
    files = r["outputs"]["files"]
    volatile = set(r["outputs"].get("volatile") or [])
    names = sorted(files, key=lambda p: (p in volatile, p))
    shown = ", ".join(p + (" (volatile)" if p in volatile else "") for p in names[:4])
    shown += f", +{len(names) - 4} more" if len(names) > 4 else ""
    lines.append(_line("outputs", f"{len(files)} files, {sum(f['size'] for f in files.values())} bytes"
                       + (f": {shown}" if names else "")))
    m = r["metrics"]
    metric_text = ", ".join(f"{k}={_num(v)}" for k, v in m["final"].items()) or "none"
    lines.append(_line("metrics", metric_text + (f"  (steps {m['steps']})" if m["steps"] is not None else "")))
    lines.append(_line("record", f"{run_dir}/run.json  sha256 {meta['record_sha256'][:16]}  (seal verified; "
                       "output files not rehashed)"))
    return "\n".join(lines)


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
    lines = [click.style(f"group {meta['group_id']}", bold=True) + f"  {meta['status']}  "
             f"({seeds_ran(g)})"]
    for m in g["members"]:
        lines.append(_line("member", f"{m['run_id']}  seed {m['seed']}  {m['status']}"))
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


from hermetic.cli import runs_tools_cmd  # noqa: E402,F401 - adds `runs export` and `runs plot` to the group above
from hermetic.cli import logs_cmd  # noqa: E402,F401 - adds `runs wait` to the group above


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
