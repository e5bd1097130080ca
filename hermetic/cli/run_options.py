"""What ``hermetic run`` and ``hermetic submit`` share: the options that describe one run, and the request
they make of it (a RunRequest template), written once for both."""

from __future__ import annotations

from typing import Any, Callable

import click

from hermetic.cli.common import config_option
from hermetic.engines.base import ENGINES
from hermetic.config.seedargs import MAX_GROUP_SEEDS
from hermetic.core.errors import UsageError

# Where the two commands say a shared option differently (what the option does is the same).
_HELP = {
    "run": {
        "gpus": ("all|N|device=ID,...", "GPUs for the container, as `docker run --gpus`: all, a count, or "
                                        "device=ID[,ID...]."),
        "data": "Use PATH for dataset NAME (still verified against its manifest). Repeatable.",
        "seeds": ("One run per seed, plus a group record with mean, SD and 95% CI. N alone: N seeds from "
                  "hermetic.yaml's seed on. The script gets each seed as $HERMETIC_SEED, and in place of "
                  "{seed} in its arguments. "),
        "network": "Container network. Runs have none unless asked.",
        "engine": "What runs the container (default: hermetic.yaml's run.engine, else docker).",
        "env": ("Pass a variable into the container. Names with TOKEN/SECRET/KEY/PASSWORD/CREDENTIAL "
                "are passed but never recorded. Repeatable."),
        "name": "A name for the run (appended to its ID).",
        "resume_from": ("Start with a copy of RUN's outputs, each where RUN's script wrote it: in /outputs, or at "
                        "its path in the working directory (out/model.pt); e.g. to resume from its checkpoint."),
        "nproc_per_node": ("Run N processes with torchrun in the container (gloo on CPU, NCCL with --gpus); "
                           "each rank gets its own seed from the runtime (docs/scale-out.md)."),
    },
    "submit": {
        "gpus": ("N", "GPUs per node: Slurm allocates N, the container gets those."),
        "data": "Use PATH for dataset NAME (a path the nodes see; verified here and on the node).",
        "seeds": "A job array, one task (one run) per seed, and a dependent job that writes the group summary. ",
        "network": "Container network (--nodes > 1 needs host, and gets it).",
        "engine": ("What runs the container on each node (default: hermetic.yaml's run.engine, else docker): "
                   "docker, podman (rootless, no daemon) or charliecloud (unprivileged, no image import)."),
        "env": "Pass a variable into the container; secrets by NAME only (the job's environment carries them).",
        "name": "A name for the run or group (appended to its ID, and the job's name).",
        "resume_from": ("Start with a copy of RUN's outputs, each where RUN's script wrote it: in /outputs, or at "
                        "its path in the working directory (as `hermetic run --resume-from`)."),
        "nproc_per_node": "N processes per node with torchrun in each node's container.",
    },
}


def run_options(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of one run, as ``command`` ("run" or "submit") says them."""
    h = _HELP[command]
    options = [
        config_option,
        click.option("--gpus", metavar=h["gpus"][0], callback=lambda c, p, v: check_gpus(v), help=h["gpus"][1]),
        click.option("--data", "data", multiple=True, metavar="NAME=PATH", help=h["data"]),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="Seed for this run (default: determinism.seed)."),
        click.option("--seeds", metavar="N|0,1,2|0-4", callback=lambda c, p, v: check_seeds(v),
                     help=h["seeds"] + f"At most {MAX_GROUP_SEEDS} seeds in one group."),
        click.option("--network", type=click.Choice(["none", "host"]), default="none", show_default=True,
                     help=h["network"]),
        click.option("--engine", type=click.Choice(ENGINES), default=None, help=h["engine"]),
        click.option("--env", "env", multiple=True, metavar="NAME[=VALUE]", help=h["env"]),
        click.option("--name", help=h["name"]),
        click.option("--resume-from", "resume_from", metavar="RUN", help=h["resume_from"]),
        click.option("--nproc-per-node", "nproc_per_node", type=click.IntRange(1), metavar="N",
                     help=h["nproc_per_node"]),
    ]

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):  # the first listed is the first shown in --help
            f = option(f)
        return f

    return apply


def request_template(shared: dict[str, Any], *, script: str, args: tuple[str, ...], argv: list[str],
                     nnodes: int = 1, echo: bool = True) -> tuple[Any, Any, list[int] | None]:
    """(the LoadedConfig, the RunRequest every run starts from, --seeds expanded or None for one run) the
    shared options describe, everything in them checked before anything is built or asked: --seed with
    --seeds, the seeds' range, --data's form, --resume-from's run, --nproc-per-node's plan (over ``nnodes``
    nodes)."""
    from hermetic.config.load import load_config
    from hermetic.run.plan import RunRequest
    from hermetic.config.seedargs import parse_seeds

    cfg = load_config(shared["config_path"])
    seed, seeds = shared["seed"], shared["seeds"]
    if seeds and seed is not None:
        raise UsageError("--seed and --seeds together: pick one")
    seed_list = parse_seeds(seeds, cfg.model.determinism.seed) if seeds else None  # before anything is built
    data_paths = parse_data(shared["data"])
    resume_dir = None
    if shared["resume_from"]:
        from hermetic.record import resolve_run

        resume_dir = resolve_run(shared["resume_from"], cfg.runs_path).resolve()
    distributed = None
    if shared["nproc_per_node"] is not None:
        from hermetic.run.distributed import plan_distributed

        distributed = plan_distributed(shared["nproc_per_node"], gpus=shared["gpus"], nnodes=nnodes)
    request = RunRequest(script=script, args=list(args), argv=argv, gpus=shared["gpus"], data_paths=data_paths,
                         seed=seed, seed_policy="cli" if seed is not None else "config", network=shared["network"],
                         env=list(shared["env"]), name=shared["name"], echo=echo, resume_from=resume_dir,
                         distributed=distributed, engine=shared["engine"])
    return cfg, request, seed_list


def check_gpus(value: str | None) -> str | None:
    """``--gpus`` checked as it is parsed, before the config, the engine or anything else (hermetic.config.gpus)."""
    from hermetic.config.gpus import parse_gpus

    parse_gpus(value)
    return value


def check_seeds(value: str | None) -> str | None:
    """``--seeds`` checked as it is parsed: its form and its size (hermetic.config.seedargs.MAX_GROUP_SEEDS), by
    arithmetic. A count's end (determinism.seed + N - 1) is checked once the config is read."""
    if value:
        from hermetic.config.seedargs import seed_ranges

        seed_ranges(value, 0)
    return value


def parse_data(items) -> dict[str, str]:
    """``--data NAME=PATH`` items -> {NAME: PATH}."""
    out = {}
    for item in items:
        n, eq, p = item.partition("=")
        if not eq or not n or not p:
            raise UsageError(f"--data {item!r}: expected NAME=PATH")
        out[n] = p
    return out
