"""runs/<id>/README.md: how to reproduce the run, in plain words, from its record. Record text reaches it escaped:
as Markdown (``_md``), or in a code span or block (``_span``)."""

from __future__ import annotations

import shlex
import textwrap
from string import Template
from typing import Any

from hermetic.core.escape import shown
from hermetic.core.resources import read_template
from hermetic.record.schema import Code, Dataset, Env, Record, RecordMeta

TEMPLATE_NAME = "run-README.md"
FIGURE_NAME = "metrics.png"  # where the README's command draws the run's figure: beside run.json


def render_readme(record: Record | dict[str, Any], *, run_dir: str | None = None) -> str:
    """The README text for a (sealed) record's model (or the record: its shape checked); ``run_dir`` defaults to
    ``runs/<id>``."""
    r = record if isinstance(record, Record) else Record.model_validate(record)
    meta, image = r.record, r.image
    run_dir = _span(run_dir or f"{r.invocation.config.get('runs_dir') or 'runs'}/{meta.run_id}")
    values = {
        "run_id": meta.run_id,
        "run_dir": run_dir,
        "status_line": _status_line(meta),
        "figure_text": _figure_text(r, run_dir),
        "tool": _md(meta.tool),
        "record_sha256": meta.record_sha256 or "(not sealed)",
        "image_id": _code(image.id),
        "manifest_digest": _code(image.manifest_digest),
        "repo_digests": "".join(f", pushed as {_code(d)}" for d in image.repo_digests),
        "base": _span(image.base),
        "lock_sha256": _code(image.lock_sha256),
        "package_count": len(image.packages),
        "code_text": _code_text(r.code, meta.run_id, run_dir),
        "data_text": _data_text(r.data, run_dir),
        "seed": r.seed.value,
        "seed_policy": {"config": "hermetic.yaml", "cli": "the --seed option",
                        "group": "a --seeds group"}.get(r.seed.policy, r.seed.policy),
        "env_text": _env_text(r.env),
        "docker_run": textwrap.indent(docker_run_command(r), " " * 7),
        "prepare_text": _prepare_text(r),
        "output_count": len(r.outputs.files),
    }
    return Template(read_template(TEMPLATE_NAME)).substitute(values)


def _md(text: object) -> str:
    return shown(text, "markdown")


def _span(text: object) -> str:
    """``text`` for a Markdown code span or block: escaped, and no backtick in it that could end the span."""
    return shown(text).replace("`", "\\x60")


def _code(text: object) -> str:
    return f"`{_span(text)}`"


def _status_line(meta: RecordMeta) -> str:
    code = "" if meta.exit_code is None else f", exit code {meta.exit_code}"
    end = f", finished {meta.finished_at}" if meta.finished_at else ""
    return f"Status: **{meta.status}**{code}. Started {meta.started_at}{end}."


def _figure_text(r: Record, run_dir: str) -> str:
    """Under the status line of a finished run that logged metrics: the command that draws them. On demand:
    matplotlib's import and drawing are too slow to pay on every run."""
    if r.record.finished_at is None or not (r.metrics.series or r.metrics.file):
        return ""
    return (f"\n\nTo draw its metrics over steps (from the project directory; needs `hermetic[plots]`):\n\n"
            f"    hermetic runs plot {r.record.run_id} -o {run_dir}/{FIGURE_NAME}\n")


def _code_text(code: Code, run_id: str, run_dir: str) -> str:
    snap, git = code.snapshot, code.git
    lines = [f"{_code(run_dir + '/code/source.tar')} ({len(snap.files)} files, sha256",
             f"   {_code(snap.sha256)}) is the exact source tree the run saw. Extract it:",
             "",
             f"       mkdir code-{run_id} && tar -xf {run_dir}/code/source.tar -C code-{run_id}"]
    if git is None:
        lines += ["", "   The project was not a git checkout; the snapshot is the only copy."]
        return "\n".join(lines)
    branch = f" (branch {_md(git.branch)})" if git.branch else ""
    lines += ["", f"   Or from git: commit {_code(git.commit)}{branch}"]
    if git.dirty:
        extra = []
        if git.diff_file:
            extra.append(f"apply {_code(git.diff_file)} (`git apply`, sha256 {_code(git.diff_sha256)})")
        if git.untracked:
            extra.append(f"add the {len(git.untracked)} untracked files (their sha256s are in "
                         "`code.git.untracked`; their bytes are in the snapshot)")
        lines.append("   with uncommitted changes: " + ("; ".join(extra) if extra else "see the snapshot") + ".")
    else:
        lines.append("   (clean working tree).")
    return "\n".join(lines)


def _data_text(data: dict[str, Dataset], run_dir: str) -> str:
    if not data:
        return "\n   (this run used no datasets)"
    out = []
    for name, ds in sorted(data.items()):
        where = ", ".join(_code(w) for w in ds.seen_at)
        out.append(f"   - {_code(name)}: {_code(ds.path)} mounted read-only at {where}; {ds.count} files, "
                   f"{ds.bytes} bytes; manifest {_code(ds.manifest_file)} (sha256 {_code(ds.manifest_sha256)},"
                   " the dataset's ID). Check it with:")
        out.append("")
        out.append(f"         (cd {_span(shlex.quote(ds.path))} && sha256sum -c --quiet "
                   f"\"$OLDPWD/{run_dir}/{_span(ds.manifest_file)}\")")
        out.append("")
    return "\n" + "\n".join(out).rstrip()


def _env_text(env: Env) -> str:
    lines = [f"   - {_code(f'{k}={v}')} (determinism)" for k, v in sorted(env.determinism.items())]
    lines += [f"   - {_code(f'{k}={v}')}" for k, v in sorted(env.passed.items())]
    lines += [f"   - {_code(k)} (a secret: recorded by name only; supply your own value)" for k in env.secrets]
    return "\n".join(lines) if lines else "   (nothing)"


def _prepare_text(r: Record) -> str:
    """Step 5's first lines: who the script ran as, and ./outputs and the code made writable for that user."""
    run_id, user = r.record.run_id, r.invocation.user and _span(r.invocation.user)
    if not user:  # an older record: it does not say; run as yourself
        return ("With the code extracted to `./code-" + run_id + "` (the script's working\n"
                "   directory: it may write there) and an empty `./outputs`, made writable for\n"
                "   you (`mkdir -p outputs`), this `docker run` is equivalent to the container\n"
                "   hermetic started:")
    return (f"hermetic ran the script as user {_code(user)} (`invocation.user`). With the code\n"
            f"   extracted to `./code-{run_id}` (the script's working directory: it may write\n"
            f"   there) and an empty `./outputs`, both writable by that user:\n\n"
            f"       mkdir -p outputs && chown -R {user} outputs code-{run_id}\n\n"
            f"   (that is as root; as user {_md(user)} itself, `mkdir -p outputs` is enough),\n"
            f"   this `docker run` is equivalent to the container hermetic started:")


def docker_run_command(r: Record) -> str:
    """A ``docker run`` line equivalent to the run's container (for a person to read and paste): the same
    locked-down container, seed, variables (secrets by name), code, datasets and outputs, as the run's user
    (an older record's: the caller, ``id -u``).
    """
    inv, env = r.invocation, r.env
    build = inv.config.get("build") or {}
    run = inv.config.get("run") or {}
    workdir = build.get("workdir", "/workspace")
    python = f"{build.get('prefix', '/opt/venv')}/bin/python"
    groups: list[list[str]] = [["docker", "run", "--rm", "--network", inv.network, "--read-only",
                                "--tmpfs", f"/tmp:rw,exec,size={run.get('tmp_size', '4g')}",
                                "--shm-size", run.get("shm_size", "1g"), "--cap-drop", "ALL",
                                "--security-opt", "no-new-privileges", "--init"]]
    limits = inv.limits
    if limits and (limits.pids or limits.memory):  # run.pids, run.memory (absent from older records)
        groups.append((["--pids-limit", str(limits.pids)] if limits.pids else [])
                      + (["--memory", limits.memory, "--memory-swap", limits.memory] if limits.memory else []))
    if inv.gpus:
        groups.append(["--gpus", inv.gpus])
    if inv.hostname:  # fixed, so that files named by host come out the same (absent in older records)
        groups.append(["--hostname", inv.hostname])
    groups.append(["--user", inv.user or "$(id -u):$(id -g)", "--workdir", workdir, "-e", "HOME=/tmp"])
    run_env = {"HERMETIC_SEED": str(r.seed.value), "HERMETIC_OUTPUTS": "/outputs"}
    groups += [["-e", f"{k}={v}"] for k, v in sorted({**run_env, **env.determinism, **env.passed}.items())]
    groups += [["-e", k] for k in env.secrets]
    groups.append(["-v", f"$PWD/code-{r.record.run_id}:{workdir}"])
    # docker takes a relative host path for a volume name: make data paths absolute
    for _, ds in sorted(r.data.items()):
        host = ds.path if ds.path.startswith("/") else f"$PWD/{ds.path}"
        groups += [["-v", f"{host}:{where}:ro"] for where in ds.seen_at]
    groups.append(["-v", "$PWD/outputs:/outputs"])
    groups.append([r.image.id])
    groups.append([python, inv.script, *inv.args])
    return " \\\n    ".join(" ".join(_quote(a) for a in g) for g in groups)


def _quote(arg: str) -> str:
    """Shell-quote, but keep a leading $PWD and the caller's $(id ...) expandable; escaped for the README."""
    if arg == "$(id -u):$(id -g)":
        return f'"{arg}"'
    if arg.startswith("$PWD"):
        rest = "".join("\\" + c if c in '"\\$`' else c for c in arg[4:])
        return _span(f'"$PWD{rest}"')
    return _span(shlex.quote(arg))
