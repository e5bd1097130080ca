"""``hermetic submit``: every check first (controller, partition, an image the nodes can get, paths the nodes
see, data matching its manifest, no NAME=VALUE secret), each one line; then, once: the snapshot, the manifests,
the prepared run directories, submit.json, the scripts and the jobs (submitted held, so every file names its
job first, then released; a group's summary ``afterany``). A failure removes what was made.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hermetic.config.load import LoadedConfig
from hermetic.config.containerpaths import OUTPUTS_MOUNT, RUNTIME_MOUNT
from hermetic.core.errors import NotFound, UsageError
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.core.paths import CachePaths, inside
from hermetic.record import create_run_dir, new_group_id, new_run_id
from hermetic.config.secretnames import is_secret_name
from hermetic.run.distributed import DistributedPlan, plan_distributed
from hermetic.config.seedargs import script_args
from hermetic.run.plan import RunRequest, passed_env, plan_datasets, resolve_script, snapshot_excludes
from hermetic.slurm import ctl
from hermetic.slurm.script import PyxisStep, SbatchOptions, docker_task_script, pyxis_task_script, summary_script
from hermetic.slurm.state import write_state
from hermetic.slurm.shared import ImageSource
from hermetic.slurm.submission import DIFF_PATCH, SUBMISSION_FILE, Member, Submission, request_fields

Log = Callable[[str], None]
NODE_LOCAL_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "zram"})  # never shared between machines
CONTAINERS = ("docker", "pyxis")
JOB_SCRIPT = "slurm/job.sbatch"
SUMMARY_SCRIPT = "slurm/summary.sbatch"
LOG_DIR = "slurm/logs"
_NODE_CACHE_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class ImageNotPushed(NotFound):
    """The nodes could not get the image: never pushed, or gone from where it was pushed (exit 66)."""


class NotOnTheNodes(UsageError):
    """A path the tasks need is on a filesystem only this machine sees (exit 64)."""


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    nodes: int = 1
    sbatch_args: tuple[str, ...] = ()
    container: str = "docker"
    node_cache: str | None = None  # HERMETIC_CACHE on the nodes, {node} = SLURMD_NODENAME
    shared_roots: tuple[Path, ...] = ()  # when given, every path the tasks need must lie below one
    engine: str | None = None  # what runs the container on the nodes (None: hermetic.yaml's run.engine)
    shared_store: Path | None = None  # a cache every node mounts: the tasks take the image from it, no registry


@dataclass
class SubmitResult:
    submission: Submission
    script: Path
    job_id: int
    summary_job_id: int | None
    held: bool
    warnings: list[str] = field(default_factory=list)


def node_local_reason(path: Path, shared_roots: tuple[Path, ...]) -> str | None:
    """Why the nodes could not see ``path`` (None when nothing says they cannot).

    hermetic cannot look at the nodes before submitting; it refuses what is
    certainly local to this machine: a RAM filesystem (tmpfs, ramfs...), and,
    when --shared-root is given, anything outside those roots. The task
    verifies the data again on its node.
    """
    real = Path(os.path.realpath(path))
    if shared_roots:
        roots = [Path(os.path.realpath(r)) for r in shared_roots]
        if not any(inside(str(real), str(r)) for r in roots):
            return f"{path} is outside every --shared-root ({', '.join(map(str, roots))})"
    from hermetic.hostfs.filesystems import filesystem_of

    best = filesystem_of(real)  # (mount point, fs type) of the mount holding it
    if best is not None and best[1] in NODE_LOCAL_FS:
        return f"{path} is on {best[1]} (mounted at {best[0]}), which only this machine sees"
    return None


def check_visible(what: str, path: Path, shared_roots: tuple[Path, ...], fix: str) -> None:
    reason = node_local_reason(path, shared_roots)
    if reason:
        raise NotOnTheNodes(f"{what}: {reason}; the nodes could not read it: {fix}")


def check_node_cache(template: str | None) -> None:
    if template is None:
        return
    for m in _NODE_CACHE_PLACEHOLDER.finditer(template):
        if m.group(1) != "node":
            raise UsageError(f"--node-cache {template!r}: unknown placeholder {m.group(0)} (the one there is "
                              "is {node}, the node's name)")
    if not template.startswith("/"):
        raise UsageError(f"--node-cache {template!r}: must be an absolute path")


def check_env(items: list[str]) -> None:
    """Secrets travel in the job's environment (sbatch exports it), never in the shared runs directory."""
    for item in items:
        name, eq, _ = item.partition("=")
        if eq and is_secret_name(name):
            raise UsageError(f"--env {name}=...: a secret's value would be written into the submission in the "
                              f"shared runs directory; export {name} and pass --env {name} (the job's "
                              "environment carries it to the nodes)")
    passed_env(items)  # a bare NAME must be set now, NAME=VALUE well formed


NO_SHARED_STORE = ("or put it where every node reads it: --shared-store DIR (a directory they all mount; the "
                   "tasks take it from there by digest, no registry)")


def pushed_location(store, manifest_digest: str, image_id: str) -> tuple[list[str], str]:
    """(repo digests, the first one a registry still answers for), or ImageNotPushed."""
    from hermetic.core.reference import parse_image_name
    from hermetic.registry import repo_digests
    from hermetic.registry.client import RegistryClient

    pushed = repo_digests(store, manifest_digest)
    if not pushed:
        raise ImageNotPushed(f"image {image_id} (manifest {manifest_digest}) was never pushed, so the nodes could "
                             "not get it; push it first: hermetic push REGISTRY/REPOSITORY (the tasks pull it "
                             f"by digest), {NO_SHARED_STORE}")
    why = []
    for rd in pushed:
        name = parse_image_name(rd)
        try:
            found = RegistryClient(name.host).head_manifest(name.repository, manifest_digest)
        except Exception as e:  # noqa: BLE001 - RegistryError, connection errors: try the next location
            why.append(f"{rd}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        if found is not None:
            return pushed, rd
        why.append(f"{rd}: not in the registry")
    raise ImageNotPushed(f"image {image_id} (manifest {manifest_digest}) cannot be pulled from where it was "
                         f"pushed ({'; '.join(why)}); push it again: hermetic push REGISTRY/REPOSITORY, "
                         f"{NO_SHARED_STORE}")


def image_source(store, paths: CachePaths, info, opts: "SlurmOptions") -> tuple[ImageSource, list[str]]:
    """(how the tasks get the image, its repo digests): a store every node mounts (``--shared-store``, or this
    HERMETIC_CACHE when it is below a --shared-root or on a network filesystem), else the registry it was pushed
    to (hermetic.slurm.shared); ImageNotPushed when neither."""
    from hermetic.registry import repo_digests
    from hermetic.slurm.shared import ImageSource, copy_image, shared_because
    from hermetic.store.images import check_image
    from hermetic.store.oci import OciStore

    digest = info.manifest_digest
    if opts.container == "pyxis" and opts.shared_store is None:  # enroot imports from a registry, or a file
        pushed, pull_from = pushed_location(store, digest, info.image_id)
        return ImageSource("registry", None, pull_from, f"pyxis: the nodes import it by digest from {pull_from}"), pushed
    if opts.shared_store is not None:
        root = Path(os.path.realpath(opts.shared_store))
        check_visible("--shared-store", root, opts.shared_roots, "name a directory every node mounts")
        because = shared_because(root, opts.shared_roots) or "as --shared-store says"
        if root != Path(os.path.realpath(paths.root)):
            copied = copy_image(store, OciStore(root / "oci"), digest, f"{info.labels.get('org.opencontainers.image.title') or 'image'}:latest")
            note = f"{copied} blob(s) copied there" if copied else "already there"
        else:
            note = "this command's own cache"
        check_image(OciStore(root / "oci"), digest)
        return (ImageSource("store", str(root), None, f"image {info.image_id[:19]}: the tasks take it from the store "
                            f"in {root} ({because}; {note}), by digest, every blob verified; no registry"),
                repo_digests(store, digest))
    because = shared_because(paths.root, opts.shared_roots)
    if because is not None:  # this cache is the nodes' too: nothing to pull
        how = (f"each node copies it from HERMETIC_CACHE {paths.root} ({because}) into its --node-cache"
               if opts.node_cache is not None else f"the tasks take it from HERMETIC_CACHE {paths.root} ({because})")
        return (ImageSource("store", str(paths.root), None, f"image {info.image_id[:19]}: {how}, by digest, every "
                            "blob verified; no registry"), repo_digests(store, digest))
    pushed, pull_from = pushed_location(store, digest, info.image_id)
    return (ImageSource("registry", None, pull_from, f"image {info.image_id[:19]}: a node whose store lacks it "
                        f"pulls it by digest from {pull_from} (HERMETIC_CACHE {paths.root} is not known to be on a "
                        "filesystem the nodes mount: --shared-store or --shared-root says so)"), pushed)


def submit(cfg: LoadedConfig, paths: CachePaths, template: RunRequest, seeds: list[int] | None,
           opts: SlurmOptions, *, log: Log, progress: bool = False) -> SubmitResult:
    from hermetic.builder.build import build
    from hermetic.registry import pull_base
    from hermetic.run.data import verify_datasets
    from hermetic.store.oci import OciStore

    # 1. everything that can be refused, before anything is written or submitted
    if opts.container not in CONTAINERS:
        raise UsageError(f"--container {opts.container}: one of {', '.join(CONTAINERS)}")
    engine = opts.engine or cfg.model.run.engine
    if opts.container == "pyxis" and (opts.nodes > 1 or template.distributed is not None):
        raise UsageError("--container pyxis with --nodes/--nproc-per-node: the pyxis export runs one process "
                          "per task; use the Docker path for multi-process runs")
    ctl.ping()
    partition = ctl.check_partition(opts.partition, opts.nodes)
    check_node_cache(opts.node_cache)
    script = resolve_script(cfg, template.script)
    script_args(template.args, 0)
    check_env(template.env)
    distributed = template.distributed
    network = template.network
    warnings = []
    if opts.nodes > 1:
        distributed = plan_distributed(distributed.nproc_per_node if distributed else 1, gpus=template.gpus,
                                       nnodes=opts.nodes)
        if network != "host":
            warnings.append(f"--nodes {opts.nodes}: the containers use the host's network (--network host) to "
                            "meet at the first node")
            network = "host"
    roots = opts.shared_roots
    check_visible("the runs directory", cfg.runs_path, roots, "put the project on a shared filesystem")
    check_visible("hermetic itself", Path(sys.executable), roots,
                  "install hermetic where the nodes see it (the tasks run this interpreter)")
    plans = plan_datasets(cfg, template.data_paths)
    for d in plans:
        check_visible(f"dataset {d.name}", d.host_path, roots,
                      f"put it on a filesystem the nodes mount, or point --data {d.name}=PATH at a copy there")
    if template.resume_from is not None:
        check_visible("--resume-from", template.resume_from, roots, "resume from a run in the shared runs directory")
    verified = verify_datasets(plans, progress=progress, log=log)
    store = OciStore(paths.oci)
    # built (a no-op when up to date) but not loaded: the login node needs no Docker Engine; the nodes load it
    built = build(cfg, paths, log=log, pull_base=pull_base, load=False)
    if not built.noop:
        log(f"built image {built.image_id}")
    info = built.info
    source, pushed = image_source(store, paths, info, opts)
    log(source.why)  # which way the nodes get the image, and why
    squashfs = _squashfs_for_nodes(engine, source, opts, info.manifest_digest, log)
    pull_from = source.pull_from or ""

    # 2. the submission: directories, snapshot, manifests, scripts (removed again if anything fails)
    made: list[Path] = []
    try:
        sub = _prepare(cfg, template, seeds, opts, partition.name, script, distributed, network, verified, info,
                       pushed, made, log, engine=engine, source=source, squashfs=squashfs)
        job_script = _write_scripts(sub, opts, pull_from, script, cfg)
        held = "--hold" in opts.sbatch_args or "-H" in opts.sbatch_args
        job_id = ctl.sbatch(job_script, "--hold")  # released below, once every file names the job
        summary_id = None
        try:
            if sub.kind == "group":
                summary_id = ctl.sbatch(sub.dir / SUMMARY_SCRIPT, f"--dependency=afterany:{job_id}",
                                        "--kill-on-invalid-dep=yes")
            sub.job_id, sub.summary_job_id = job_id, summary_id
            sub.write()
            for m in sub.members:
                write_state(sub.run_dir(m), job_id=job_id,
                            array_task_id=m.index if sub.kind == "group" else None)
            if sub.kind == "group":
                write_state(sub.dir, job_id=job_id, summary_job_id=summary_id)
            if not held:
                ctl.release(job_id)
        except BaseException:
            ctl.scancel(job_id)
            if summary_id is not None:
                ctl.scancel(summary_id)
            raise
    except BaseException:
        for p in reversed(made):
            shutil.rmtree(p, ignore_errors=True)
        raise
    return SubmitResult(sub, job_script, job_id, summary_id, held, warnings)


def _prepare(cfg: LoadedConfig, template: RunRequest, seeds: list[int] | None, opts: SlurmOptions, partition: str,
             script: str, distributed: DistributedPlan | None, network: str, verified, info, pushed: list[str],
             made: list[Path], log: Log, engine: str = "docker", source: "ImageSource | None" = None,
             squashfs: dict[str, str] | None = None) -> Submission:
    from hermetic.run.snapshot import take_snapshot

    runs = cfg.runs_path
    runs.mkdir(parents=True, exist_ok=True)
    if seeds is not None:
        submission_id = new_group_id(name=template.name)
        os.mkdir(runs / submission_id)
        made.append(runs / submission_id)
        members = []
        for i, seed in enumerate(seeds):
            rid = new_run_id(name=template.name)
            made.append(create_run_dir(runs, rid))
            members.append(Member(i, seed, rid))
        policy = "group"
    else:
        submission_id = new_run_id(name=template.name)
        made.append(create_run_dir(runs, submission_id))
        seed = template.seed if template.seed is not None else cfg.model.determinism.seed
        members = [Member(0, seed, submission_id)]
        policy = template.seed_policy
    sub_dir = runs / submission_id
    (sub_dir / LOG_DIR).mkdir(parents=True)
    snap = take_snapshot(cfg.root, sub_dir / "slurm", snapshot_excludes(cfg, [v.plan for v in verified]))
    for w in snap.warnings:
        log(f"warning: {w}")
    if not (Path(snap.tar_path).is_file() and script in snap.files):
        raise NotFound(f"{script}: not in the source snapshot (untracked and ignored by git?)")
    manifests = {}
    for v in verified:
        rel = f"slurm/data/{v.plan.name}.sha256"
        (sub_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (sub_dir / rel).write_bytes(v.manifest_bytes)
        manifests[v.plan.name] = rel
    req = dataclasses.replace(template, distributed=distributed, network=network)
    fields = request_fields(req, script=script, git=snap.git, manifests=manifests,
                            data_paths={v.plan.name: str(v.plan.host_path) for v in verified})
    sub = Submission(
        kind="group" if seeds is not None else "run", submission_id=submission_id, project_root=cfg.root,
        runs_dir=runs, config=cfg.resolved(), request=fields, members=members,
        image=dataclasses.asdict(info), repo_digests=pushed, container=opts.container, partition=partition,
        nnodes=opts.nodes, node_cache=opts.node_cache, python=sys.executable, seed_policy=policy,
        engine=engine, shared_store=source.store if source is not None else None, squashfs=squashfs,
    )
    for m in members:
        rd = sub.run_dir(m)
        if (sub_dir / DIFF_PATCH).is_file():  # the record's code.git.diff_file names it in each run dir
            shutil.copyfile(sub_dir / DIFF_PATCH, rd / "code" / "diff.patch")
        write_state(rd, kind="run", run_id=m.run_id, state="submitted", seed=m.seed, name=template.name,
                    group=submission_id if seeds is not None else None, submission=submission_id,
                    partition=partition)
    if seeds is not None:
        write_state(sub_dir, kind="group", state="submitted", seeds=list(seeds), name=template.name,
                    members=[m.run_id for m in members], partition=partition)
    sub.write()
    return sub


def _write_scripts(sub: Submission, opts: SlurmOptions, pull_from: str, script: str, cfg: LoadedConfig) -> Path:
    submission = str(sub.dir / SUBMISSION_FILE)
    logs = sub.dir / LOG_DIR
    name = f"hermetic-{sub.request['name'] or cfg.model.name or 'run'}"
    gpus = sub.request["gpus"]
    options = SbatchOptions(
        job_name=name, partition=sub.partition,
        output=str(logs / ("task-%a.out" if sub.kind == "group" else "job-%j.out")),
        array=f"0-{len(sub.members) - 1}" if sub.kind == "group" else None, nodes=opts.nodes,
        cpus_per_task=opts.cpus_per_task, time=opts.time,
        gpus_per_node=_gpus_per_node(gpus), extra=tuple(a for a in opts.sbatch_args if a not in ("--hold", "-H")),

    )
    comment = [f"{'group' if sub.kind == 'group' else 'run'} {sub.submission_id}: "
               + ", ".join(f"task {m.index} seed {m.seed} -> {m.run_id}" for m in sub.members[:8])
               + (f", ... ({len(sub.members)} tasks)" if len(sub.members) > 8 else ""),
               f"image {sub.image['manifest_digest']} " + (f"(from the store in {sub.shared_store}, every blob verified)"
                                                            if sub.shared_store else
                                                            f"(pulled by digest from {pull_from} where a node lacks it)"),
               f"engine {sub.engine}"]
    if opts.container == "pyxis":
        text = pyxis_task_script(options, _pyxis_step(sub, pull_from, script, cfg), python=sub.python,
                                 submission=submission, cache=_node_cache_shell(opts.node_cache), comment=comment)
    else:
        text = docker_task_script(options, python=sub.python, submission=submission, comment=comment)
    path = sub.dir / JOB_SCRIPT
    atomic_write_text(path, text)
    if sub.kind == "group":
        sopts = SbatchOptions(job_name=f"{name}-summary", partition=sub.partition,
                              output=str(logs / "summary-%j.out"), cpus_per_task=1, time="10")
        atomic_write_text(sub.dir / SUMMARY_SCRIPT, summary_script(
            sopts, python=sub.python, submission=submission,
            comment=[f"after array job (afterany): the summary of group {sub.submission_id} -> group.json"]))
    return path


def _squashfs_for_nodes(engine: str, source: "ImageSource", opts: SlurmOptions, digest: str,
                        log: Log) -> dict[str, str] | None:
    """The image as one SquashFS file in the store every node mounts, made there once, where the nodes run it
    from a file: pyxis from a --shared-store, and an engine that runs one (Charliecloud) unless
    HERMETIC_IMAGE_FORM=directory. None otherwise."""
    from hermetic.engines import get_engine
    from hermetic.engines import squashfs as sqfs
    from hermetic.store.oci import OciStore

    if source.store is None:
        return None
    if opts.container != "pyxis" and not (get_engine(engine).runs_squashfs and sqfs.wanted_form() != "directory"):
        return None
    root = Path(source.store)
    made = sqfs.make(OciStore(root / "oci"), digest, sqfs.store_path(root, digest))
    log(f"the image as one file for the nodes: {made.path} ({made.size:,} bytes, sha256 {made.sha256[:12]}…, "
        f"{'made now' if made.made else 'already there'}); each task checks its sha256 before it mounts it")
    return {"path": str(made.path), "sha256": made.sha256}


def _gpus_per_node(gpus: str | None) -> str | None:
    from hermetic.config.gpus import gpu_count

    if not gpus:
        return None
    n = gpu_count(gpus)
    if n is None:
        raise UsageError(f"--gpus {gpus}: give a count for Slurm to allocate (e.g. --gpus 2); the task passes "
                          "the GPUs Slurm gave it to the container")
    return str(n)


def _node_cache_shell(template: str | None) -> str | None:
    return None if template is None else template.replace("{node}", "${SLURMD_NODENAME}")


def _pyxis_step(sub: Submission, pull_from: str, script: str, cfg: LoadedConfig) -> PyxisStep:
    """The pyxis container: the same mounts and variables hermetic's Docker container gets."""
    from hermetic.core.reference import parse_image_name
    from hermetic.run.plan import passed_env

    if sub.squashfs:  # pyxis mounts the file as it is (enroot imports nothing)
        image, image_sha256 = sub.squashfs["path"], sub.squashfs["sha256"]
    else:
        name = parse_image_name(pull_from)
        image, image_sha256 = f"{name.host}#{name.repository}@{sub.image['manifest_digest']}", None
    workdir = cfg.model.build.workdir
    mounts: list[tuple[str, str, bool]] = [("$WORK", workdir, False), ("$RUN_DIR/outputs", OUTPUTS_MOUNT, False),
                                           ("$RUN_DIR/.runtime", RUNTIME_MOUNT, False)]
    for d in plan_datasets(cfg, sub.request["data_paths"]):
        mounts += [(str(d.host_path), where, True) for where in d.container_paths]
    passed = passed_env(sub.request["env"])
    exports = {k: v for k, v in passed.items() if not is_secret_name(k)}
    env_names = ["HERMETIC_SEED", "HERMETIC_RUN_ID", "HERMETIC_OUTPUTS", "HERMETIC_RUNTIME_REPORT", *sorted(passed)]
    python = f"{cfg.model.build.prefix}/bin/python"
    command = [python, script] if script.endswith(".py") else [f"./{script}"]
    args = [script_args(sub.request["args"], m.seed) for m in sub.members]
    return PyxisStep(image=image, image_sha256=image_sha256, mounts=mounts, workdir=workdir, env_names=env_names,
                     command=command, run_dirs=[str(sub.run_dir(m)) for m in sub.members],
                     seeds=[m.seed for m in sub.members], args=args, exports=exports)


__all__ = ["ImageNotPushed", "NotOnTheNodes", "SlurmOptions", "SubmitResult", "check_visible", "node_local_reason",
           "submit"]
