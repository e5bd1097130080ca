"""What a run will be, decided before anything is built, verified or started (pure, or reads only).

``RunRequest`` (``hermetic run`` options, or a record for ``replay``) and the config become typed plans.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.config.load import LoadedConfig, is_env_name
from hermetic.config.containerpaths import RUNTIME_MOUNT
from hermetic.core.errors import NotFound, UsageError
from hermetic.run.distributed import DistributedPlan

RUNTIME_REPORT = f"{RUNTIME_MOUNT}/runtime.json"


@dataclass
class RunRequest:
    """What `hermetic run` (or submit, replay, a group's member) was asked to run, as parsed from its command line."""

    script: str
    args: list[str]
    argv: list[str]
    gpus: str | None = None
    data_paths: dict[str, str] = field(default_factory=dict)  # NAME -> host path (overrides hermetic.yaml)
    seed: int | None = None
    seed_policy: str = "config"
    network: str = "none"
    env: list[str] = field(default_factory=list)  # NAME or NAME=VALUE
    name: str | None = None
    echo: bool = True  # stream the container's output to this terminal
    replay_of: str | None = None
    group: str | None = None
    # replay: run exactly this image and this source snapshot
    image_manifest: str | None = None
    source_tar: Path | None = None
    replay_git: dict[str, Any] | None = None  # the original run's git facts, kept for reference
    manifest_paths: dict[str, Path] = field(default_factory=dict)  # NAME -> manifest (replay: the run's copy)
    resume_from: Path | None = None  # a previous run dir whose outputs/ seed this one's
    # scale-out (issue 16): torchrun in the container; a run directory `hermetic submit` prepared;
    # the record's `slurm` section (job, array task, node, partition) when a Slurm task runs it
    distributed: DistributedPlan | None = None
    run_dir: Path | None = None
    slurm: dict[str, Any] | None = None
    engine: str | None = None  # docker | podman | charliecloud: --engine (None: hermetic.yaml's run.engine)


@dataclass(frozen=True)
class DatasetPlan:
    """A dataset as the run will mount it: where it is here, its manifest, where the container sees it."""

    name: str
    host_path: Path  # absolute, on this machine
    manifest_path: Path
    mount: str | None  # hermetic.yaml's mount:, if any
    config_path: str  # the path as hermetic.yaml writes it
    container_paths: tuple[str, ...]  # everywhere the container sees it, read-only
    workdir_path: str | None  # its path relative to the working directory, when it lies inside the project


def resolve_script(cfg: LoadedConfig, script: str) -> str:
    """SCRIPT as a path inside /workspace (relative to the project root)."""
    p = Path(script)
    if p.is_absolute() or (Path.cwd() / p).exists():
        full = (Path.cwd() / p).resolve()
        try:
            return full.relative_to(cfg.root).as_posix()
        except ValueError:
            raise UsageError(f"{script}: not inside the project ({cfg.root}); only the project's code is "
                                "snapshotted and mounted at /workspace") from None
    if (cfg.root / p).exists():
        return posixpath.normpath(p.as_posix())
    raise NotFound(f"{script}: no such file in the project {cfg.root}")


def plan_datasets(cfg: LoadedConfig, overrides: dict[str, str],
                  manifests: dict[str, Path] | None = None) -> list[DatasetPlan]:
    known = {d.name for d in cfg.model.datasets}
    for n in overrides:
        if n not in known:
            raise UsageError(f"--data {n}=...: hermetic.yaml declares no dataset {n!r} "
                                f"(declared: {', '.join(sorted(known)) or 'none'})")
    out = []
    workdir = cfg.model.build.workdir
    for d in cfg.model.datasets:
        host = Path(overrides[d.name]).resolve() if d.name in overrides else cfg.resolve(d.path)
        manifest = (manifests or {}).get(d.name) or cfg.resolve(d.manifest)
        inner = d.path if d.in_project else None
        paths = ([posixpath.join(workdir, inner)] if inner else []) + ([d.mount] if d.mount else [])
        out.append(DatasetPlan(d.name, host, manifest, d.mount, d.path, tuple(paths), inner))
    return out


def snapshot_excludes(cfg: LoadedConfig, datasets: list[DatasetPlan]) -> list[str]:
    # The datasets and their manifests are the data section's (a copy of each manifest is
    # kept in the run's data/): in the code snapshot too, a data update would read as a code change.
    # A dataset's project path is left out even when --data takes it from elsewhere: the container sees
    # the dataset there, never the project's copy, and the copy is not code.
    ex = {".git", ".hermetic"}
    for p in ([cfg.runs_path] + [d.host_path for d in datasets] + [cfg.resolve(d.config_path) for d in datasets]
              + [d.manifest_path for d in datasets]):
        try:
            ex.add(Path(p).resolve().relative_to(cfg.root).as_posix())
        except ValueError:
            pass
    # The project path itself, not resolved: a dataset that is a link out of the project (data -> /mnt/big/data),
    # or lies beyond one, is mounted there; the link is not code (git lists it as a file, even under `data/`).
    for d in datasets:
        if d.workdir_path:
            rel = posixpath.normpath(d.workdir_path)
            parts = rel.split("/")
            ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
            ex.update(a for a in ancestors if (cfg.root / a).is_symlink())
            ex.add(rel)
    return sorted(ex)


def check_source_links(cfg: LoadedConfig, datasets: list[DatasetPlan]) -> tuple[list[str], bool]:
    """DataError naming the first symbolic link of the code that the snapshot could not hold (absolute, or
    out of the project: the container's working directory is the project's copy, and nothing else), and the
    dataset it leads into when it does; before anything is built or a run directory made. Returns the source
    files as listed for it (hermetic.run.snapshot.list_source_files), which the run's snapshot takes."""
    from hermetic.core.errors import DataError
    from hermetic.run.snapshot import links_out, list_source_files

    listed = list_source_files(cfg.root, snapshot_excludes(cfg, datasets))
    bad = links_out(cfg.root, listed[0])
    if not bad:
        return listed
    rel, target = bad[0]
    real = (cfg.root / rel).resolve()
    into = next((d for d in datasets if real == d.host_path or d.host_path in real.parents), None)
    more = f" (+{len(bad) - 1} more: {', '.join(r for r, _ in bad[1:4])})" if len(bad) > 1 else ""
    if into is not None:
        where = ", ".join(into.container_paths) or "its mount"
        raise DataError(f"{rel}: a symbolic link to dataset {into.name} ({target}), out of the project; the code "
                        f"snapshot holds the project only{more} — nothing was started",
                        hint=f"read the dataset where the container sees it ({where}), and remove the link or keep "
                             f"it out of the snapshot (.gitignore: `{rel}`, without a trailing slash)")
    kind = "with an absolute target" if target.startswith("/") else "out of the project"
    raise DataError(f"{rel}: a symbolic link {kind} ({target}); the code snapshot holds the project only, and the "
                    f"container could not follow it{more} — nothing was started",
                    hint=f"make it relative and inside the project, or keep it out of the snapshot (.gitignore: "
                         f"`{rel}`, without a trailing slash); data from elsewhere is a dataset (hermetic.yaml "
                         "datasets:)")


def passed_env(items: list[str]) -> dict[str, str]:
    """``--env NAME[=VALUE]`` items -> {NAME: VALUE} (a bare NAME takes this environment's value)."""
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not is_env_name(k):
            raise UsageError(f"--env {item!r}: not NAME or NAME=VALUE")
        if eq:
            out[k] = v
        elif k in os.environ:
            out[k] = os.environ[k]
        else:
            raise UsageError(f"--env {k}: not set in this environment (pass NAME=VALUE to set it)")
    return out


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the value of each secret-named ``--env NAME=VALUE`` replaced by ``<redacted>``."""
    from hermetic.config.secretnames import REDACTED, is_secret_name

    def item(text: str) -> str:
        name, eq, _ = text.partition("=")
        return f"{name}={REDACTED}" if eq and is_secret_name(name) else text

    out, value_next = [], False
    for a in argv:
        if value_next:
            out.append(item(a))
        elif a.startswith("--env="):
            out.append("--env=" + item(a[len("--env="):]))
        else:
            out.append(a)
        value_next = a == "--env" and not value_next
    return out


@dataclass(frozen=True)
class ContainerUser:
    """The user the script runs as in the container, as docker takes it and as numbers."""

    spec: str  # "UID:GID" as docker takes it
    uid: int
    gid: int


def container_user(cfg: LoadedConfig) -> ContainerUser:
    """The image's non-root user when hermetic runs as root, else the caller (so outputs stay theirs)."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        u, g = (int(x) for x in cfg.model.build.user.split(":"))
        return ContainerUser(f"{u}:{g}", u, g)
    return ContainerUser(f"{uid}:{gid}", uid, gid)
