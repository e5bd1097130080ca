"""The sbatch scripts `hermetic submit` writes into ``slurm/`` before submitting (pure: text from typed options):
``job.sbatch`` (each task runs ``hermetic slurm-task``; for pyxis, ``srun --container-image`` between the record
steps) and ``summary.sbatch`` (``afterany`` on the array). Every value is shell-quoted; a line break in an
option is refused.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Sequence

from hermetic.core.errors import UsageError

MARK = "# Written by hermetic submit; what Slurm runs for this submission. Do not edit: submit again."


@dataclass(frozen=True)
class SbatchOptions:
    job_name: str
    partition: str | None
    output: str  # %A, %a, %j as sbatch(1) expands them
    array: str | None = None  # "0-2"
    nodes: int = 1
    cpus_per_task: int | None = None
    time: str | None = None
    gpus_per_node: str | None = None
    extra: tuple[str, ...] = ()  # --sbatch-arg, verbatim

    def lines(self) -> list[str]:
        given = {"job-name": self.job_name, "output": self.output, "partition": self.partition, "array": self.array,
                 "nodes": self.nodes, "ntasks-per-node": 1, "cpus-per-task": self.cpus_per_task, "time": self.time,
                 "gpus-per-node": self.gpus_per_node}  # in this order; an option not given is left out
        opts = [f"--{k}={v}" for k, v in given.items() if v] + list(self.extra)
        for o in opts:
            if "\n" in o or "\r" in o:
                raise UsageError(f"sbatch option {o!r}: holds a line break")
        return [f"#SBATCH {o}" for o in opts]


def q(value: str) -> str:
    return shlex.quote(value)


def _header(options: SbatchOptions, comment: Sequence[str]) -> list[str]:
    return ["#!/bin/bash", *options.lines(), MARK, *(f"# {c}" for c in comment)]


def docker_task_script(options: SbatchOptions, *, python: str, submission: str, comment: Sequence[str]) -> str:
    """Each task: ``hermetic slurm-task SUBMISSION`` on its node (one per node, by srun, across nodes)."""
    task = f"{q(python)} -m hermetic slurm-task {q(submission)}"
    body = [
        "set -euo pipefail",
        # One task per node: each starts one container; node 0's is the run's record (the others' nest in it).
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 {task}" if options.nodes > 1 else f"exec {task}",
    ]
    return "\n".join(_header(options, comment) + body) + "\n"


def summary_script(options: SbatchOptions, *, python: str, submission: str, comment: Sequence[str]) -> str:
    body = ["set -euo pipefail", f"exec {q(python)} -m hermetic slurm-summary {q(submission)}"]
    return "\n".join(_header(options, comment) + body) + "\n"


@dataclass(frozen=True)
class PyxisStep:
    """What ``srun --container-image`` needs for one submission (the per-task parts are bash arrays)."""

    image: str  # REGISTRY#REPO@sha256:… (enroot's form; digests need enroot >= 4.0), or a SquashFS file's path
    mounts: list[tuple[str, str, bool]]  # (host path, container path, read-only); host may use $RUN_DIR/$WORK
    workdir: str
    env_names: list[str]  # every variable the container must get from the job, over the image's own
    command: list[str]  # interpreter and script; the arguments are ARGS (per task)
    run_dirs: list[str]  # per task
    seeds: list[int]  # per task
    args: list[list[str]]  # per task, {seed} already filled in
    exports: dict[str, str] = field(default_factory=dict)  # the same for every task (passed --env values)
    image_sha256: str | None = None  # ``image`` is a file: its sha256, checked before any container starts


def _mount_spec(mounts: list[tuple[str, str, bool]]) -> str:
    parts = []
    for src, dst, ro in mounts:
        for p in (src, dst):
            if "," in p or ":" in p.replace("$RUN_DIR", "").replace("$WORK", ""):
                raise UsageError(f"{p}: pyxis cannot mount a path holding ',' or ':' (--container-mounts splits "
                                  "on them); move it or give the dataset another path with --data")
        parts.append(f"{src}:{dst}" + (":ro" if ro else ""))
    return ",".join(parts)


def _image_file_check(step: PyxisStep) -> list[str]:
    """Where the image is a file: its sha256 checked before any container starts (65 otherwise)."""
    if step.image_sha256 is None:
        return []
    said = (f"hermetic: {step.image}: its sha256 is not the submitted {step.image_sha256} (truncated or altered); "
            "nothing was run: export it again with hermetic export --squashfs")
    return ["# 0. the image file is the one submitted, or nothing runs (exit 65)",
            f"echo {q(step.image_sha256 + '  ' + step.image)} | sha256sum --check --status || "
            f"{{ echo {q(said)} >&2; exit 65; }}"]


def pyxis_task_script(options: SbatchOptions, step: PyxisStep, *, python: str, submission: str,
                      cache: str | None, comment: Sequence[str]) -> str:
    """Probe and training containers by pyxis, hermetic's record steps around them (not run here: no enroot)."""
    hermetic = f"{q(python)} -m hermetic slurm-task"
    mounts = _mount_spec(step.mounts)
    # srun --export: the container step gets exactly the run's variables, PATH (for enroot; the image's own
    # PATH wins inside) and SLURM_*, never the login shell's PYTHONPATH & co.; --container-env makes the
    # run's variables win over the image's own values.
    pyxis = [f"--export={','.join(['PATH', *step.env_names])}", f"--container-image={step.image}",
             f'--container-mounts="{mounts}"',
             f"--container-workdir={step.workdir}", "--no-container-mount-home", "--no-container-remap-root",
             "--container-writable", "--no-container-entrypoint",
             f"--container-env={','.join(step.env_names)}"]
    probe_mount = '--container-mounts="$PROBE_SRC:/run/hermetic-probe:ro"'
    body = [
        "set -uo pipefail",
        "TASK=${SLURM_ARRAY_TASK_ID:-0}",
        "RUN_DIRS=(" + " ".join(q(d) for d in step.run_dirs) + ")",
        "SEEDS=(" + " ".join(str(s) for s in step.seeds) + ")",
        *(f"ARGS_{i}=(" + " ".join(q(a) for a in args) + ")" for i, args in enumerate(step.args)),
        'RUN_DIR=${RUN_DIRS[$TASK]}',
        'ARGS_NAME="ARGS_${TASK}[@]"',
        'WORK="$RUN_DIR/.workspace"',
        *( [f"export HERMETIC_CACHE={q(cache)}"] if cache else []),
        f"PROBE_SRC=$({q(python)} -c 'import hermetic.inimage.probe as p; print(p.PROBE_DIR)')",
        *_image_file_check(step),
        "# 1. the probe, in the same image with the same devices (hermetic folds it into the record)",
        f"srun --ntasks=1 --export=PATH --container-image={step.image} {probe_mount} --no-container-mount-home "
        "--no-container-remap-root --no-container-entrypoint "
        f"{q(step.command[0])} /run/hermetic-probe/probe.py > \"$RUN_DIR/.probe.json\" || exit $?",
        "# 2. on this node: the data verified, the run directory opened, the snapshot extracted into $WORK, "
        "the record written early",
        f"{hermetic} --phase begin {q(submission)} || exit $?",
        "# 3. the run: the image by digest, the determinism env from the image, the run's own variables over it",
        'export HERMETIC_SEED=${SEEDS[$TASK]} HERMETIC_RUN_ID=$(basename "$RUN_DIR")',
        "export HERMETIC_OUTPUTS=/outputs HERMETIC_RUNTIME_REPORT=/run/hermetic/runtime.json",
        *(f"export {k}={q(v)}" for k, v in sorted(step.exports.items())),
        "srun --ntasks=1 " + " ".join(pyxis) + " " + " ".join(q(c) for c in step.command) + ' "${!ARGS_NAME}"',
        "rc=$?",
        "# 4. on this node: outputs hashed and the record sealed, with the container's exit code",
        f'exec {hermetic} --phase end --exit-code "$rc" {q(submission)}',
    ]
    return "\n".join(_header(options, comment) + body) + "\n"
