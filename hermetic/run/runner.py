"""The order of a run: image -> data -> run dir -> container (at its gate) -> code -> probe -> record -> run.

Every input is pinned or verified before the script starts; the container's command waits at a gate
(engines.base.Gate) until the code, probe and early record (``interrupted``) are in place. Nothing here prints:
progress goes to ``log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from hermetic.builder.image_record import ImageInfo
from hermetic.config.load import LoadedConfig, size_bytes
from hermetic.config.containerpaths import OUTPUTS_MOUNT, RUNTIME_MOUNT
from hermetic.core.errors import NotFound, Unavailable
from hermetic.hostfs.fsutil import owned_temp_dir
from hermetic.core.paths import CachePaths
from hermetic.record.ids import new_run_id
from hermetic.record.rundir import adopt_run_dir, create_run_dir, write_record
from hermetic.engines import get_engine
from hermetic.engines.base import (
    HOLDS_LABEL, RUN_DIR_LABEL, RUN_LABEL, ContainerSpec, Gate, Mount, container_hostname,
)
from hermetic.record import liveness
from hermetic.run.data import VerifiedDataset, changed_during_run, verify_datasets
from hermetic.run.detach import announce
from hermetic.run.distributed import container_env as dist_container_env
from hermetic.run.distributed import finish_section, launch_command, plan_section
from hermetic.config.seedargs import has_placeholder, script_args
from hermetic.run.plan import (
    ContainerUser, RunRequest, check_source_links, container_user, passed_env, plan_datasets, redact_argv,
    resolve_script, snapshot_excludes,
)
from hermetic.run.recording import RunEnvironment, data_section, image_section, run_environment, write_run_files
from hermetic.run.seal import RUNTIME_DIR, Log, RunResult, after_failure, collect_outputs, reserve_space, seal_run
from hermetic.store.oci import OciStore

if TYPE_CHECKING:
    from hermetic.run.resume import ResumeSource  # imported when a run resumes from another's outputs


_BESIDE = ThreadPoolExecutor(1, thread_name_prefix="hermetic-beside")  # the source listing, beside the image check


def _quiet(_msg: str) -> None:
    pass


def execute(cfg: LoadedConfig, paths: CachePaths, req: RunRequest, *, log: Log | None = None,
            progress: bool = False) -> RunResult:
    from hermetic.run.orphans import reap_orphans

    log = log or _quiet
    engine = get_engine(req.engine or cfg.model.run.engine)  # hermetic.yaml's run.engine, or --engine
    engine.connect()
    for reaped in reap_orphans(by="hermetic run", engines=(engine.name,)):  # before the build's sweep of dead files
        log(f"note: {reaped.note}")
    engine.check_spec(limits_spec(cfg))  # a limit the engine cannot give: refused before anything is built
    if req.gpus:
        engine.check_gpus(req.gpus)  # before anything is built, verified or created
    script = req.script if req.source_tar else resolve_script(cfg, req.script)
    script_args(req.args, 0)  # an unknown placeholder is refused before anything is built
    passed = passed_env(req.env)
    store = OciStore(paths.oci)

    plans = plan_datasets(cfg, req.data_paths, req.manifest_paths)
    # The source files, listed once (for the links check here, the snapshot later) by git, in a thread beside
    # the image's no-op check (git's time, not ours); a link the code snapshot could not hold is refused before
    # anything is built or a run directory made.
    listing = _BESIDE.submit(check_source_links, cfg, plans) if not req.source_tar else None
    try:
        info = prepare_image(cfg, paths, store, req, log, engine,  # 1. the image
                             before_build=listing.result if listing is not None else None)
    except BaseException:
        if listing is not None:
            listing.result()  # a link refused is said first, as when it was checked first
        raise
    listed = listing.result() if listing is not None else None
    reader = container_user(cfg)
    datasets = verify_datasets(plans, progress=progress, log=log,  # 2. the data
                               say_how_to_accept=not req.manifest_paths, reader=reader)
    # 2b. the earlier run's outputs, as its record says: an input too
    resume = None
    if req.resume_from is not None:
        from hermetic.run.resume import check_resume_source

        resume = check_resume_source(req.resume_from, uid=reader.uid, gid=reader.gid)
    for warning in resume.warnings() if resume is not None else []:  # it failed, it left nothing: say what it means
        log(f"warning: {warning}")
    run_id, run_dir = open_run(cfg, req)  # 3. the run directory
    opened = Opened()
    with liveness.hold(run_dir):  # `hermetic stop`, `logs -f`, `runs wait` find the run's process by this
        try:
            if announce("run", run_id, run_dir, run_dir / "logs"):  # --detach: the terminal is gone from here on
                req = dataclasses.replace(req, echo=False)
            return _run_in_dir(engine, cfg, paths, store, req, info, datasets, resume, script, passed, run_id,
                               run_dir, opened, log, listed)
        except BaseException as e:
            raised = after_failure(cfg, req, run_dir, opened.record, e, log)
            if raised is None:
                raise
            raise raised from None


@dataclass
class Opened:
    """The run's record once it exists: what a failure seals (after_failure)."""

    record: dict[str, Any] | None = None


def _run_in_dir(engine, cfg: LoadedConfig, paths: CachePaths, store: OciStore, req: RunRequest, info: ImageInfo,
                datasets: list[VerifiedDataset], resume: ResumeSource | None, script: str, passed: dict[str, str],
                run_id: str, run_dir: Path, opened: Opened, log: Log,
                listed: tuple[list[str], bool] | None = None) -> RunResult:
    m = cfg.model
    user = container_user(cfg)
    seed = run_seed(cfg, req)
    env = run_environment(info, run_id, seed, passed)
    python = f"{m.build.prefix}/bin/python"
    command = script_command(req, script, script_args(req.args, seed), python, run_id)
    # (closing: the container's removal, which goes on while the outputs are collected and the record sealed,
    # is awaited last, after the working copy is removed)
    with contextlib.ExitStack() as closing, _workspace(paths, run_id) as workspace, \
            _gate(engine, paths, run_id) as gate:
        spec = container_spec(cfg, req, info, datasets, env, command, python, user, run_id, run_dir, workspace, gate)
        # 4. the container, started now where the engine can (its command waiting at the gate), while the
        # record, the code snapshot and the probe are made beside the engine's start of it (mostly runc's)
        launched = engine.launch(spec, run_dir / "logs", echo=req.echo)
        closing.callback(launched.close)
        try:
            rec = opened.record = open_record(cfg, store, req, info, datasets, script, run_id, run_dir, env, seed)
            rec["invocation"]["user"] = user.spec  # who the script ran as: the run README's by-hand command says it
            rec["invocation"]["limits"] = {"pids": m.run.pids, "memory": m.run.memory}  # what it is held to
            rec["invocation"]["engine"] = engine.info(spec).section()  # which engine, its version, notes, image form
            rec["invocation"]["hostname"] = container_hostname(req.network)  # fixed: files named by host match
            rec["code"] = snapshot_code(cfg, req, run_dir, workspace, datasets, script, log, listed)  # 5. the code
            probe = probe_image(engine, info, python, user, req.gpus, paths, env)  # 6. same image, devices, env
            rec["software"], rec["hardware"] = probe.get("software", {}), probe.get("hardware", {})
            if req.distributed is not None:  # world size, backend, each rank's seed and device
                rec["distributed"] = plan_section(req.distributed, rec, env)
            write_record(run_dir, rec)  # early: a hard kill still leaves a record
            if req.gpus:
                refuse_unfit_gpu(rec, run_dir, probe, info)
            hand_over(workspace, run_dir, resume, user)
        except BaseException:
            launched.cancel()  # its command never ran: the gate was never opened
            raise
        log(f"run {run_id}: {' '.join(command)}")
        from hermetic.run.workdir import SizeWatch

        if gate is not None:
            gate.open()  # 7. the run
            # what the run's end imports (the outputs' collection: safetree, the metrics' reading) imported by a
            # thread as the script starts, on the core it leaves: not after it (no module cycle, so no deadlock
            # between this import and one of the main thread's: tests/test_architecture.py)
            threading.Thread(target=_import_for_the_end, name="hermetic-imports", daemon=True).start()
        outcome = launched.finish(SizeWatch(workspace, size_bytes(m.run.workdir_size), m.run.workdir_size))
        data_changes = changed_during_run(datasets)  # 7b. the data, by stat, against what was verified
        # 8. what the script left (outputs, working directory, the runtime's report), as its user, no link followed
        collected = collect_outputs(rec, workspace, run_dir, user, req.distributed)
        if req.distributed is not None:  # per-rank logs kept, what each rank reported
            rec["distributed"] = finish_section(rec["distributed"], collected.runtime_report, collected.rank_logs or {})
        # 9. the record, sealed while the engine removes the container (awaited as this block ends, after the
        # working copy's removal: the container is gone when the run returns, as after `docker run --rm`)
        return seal_run(req, run_id, run_dir, rec, outcome, collected, log, data_changes)


def _import_for_the_end() -> None:
    with contextlib.suppress(Exception):  # the import where the module is used says what is wrong
        importlib.import_module("hermetic.run.collect")


def prepare_image(cfg: LoadedConfig, paths: CachePaths, store: OciStore, req: RunRequest, log: Log,
                  engine=None, before_build: Callable[[], Any] | None = None) -> ImageInfo:
    """The image the run uses: the recorded one by digest (replay), else the config's, built if needed; in
    the run's engine (hermetic.engines: Docker by default). ``before_build``: called before a build (not
    on a no-op), and may refuse it."""
    engine = engine or get_engine(req.engine or cfg.model.run.engine)
    if req.image_manifest:
        from hermetic.store.images import check_image

        if not store.has_image(req.image_manifest):
            raise NotFound(f"image {req.image_manifest} is not in the local store")
        check_image(store, req.image_manifest)  # every blob still what its digest says, before it is trusted
        info = ImageInfo.from_store(store, req.image_manifest)
        if not engine.has_image(req.image_manifest, info.image_id):  # removed from the engine since (docker rmi)
            import time

            size = sum(int(layer.get("size") or 0) for layer in info.layers)
            log(f"image {info.image_id[:19]}: not in {engine.image_home}; loading it from "
                "the store" + (f" ({size / 1e9:.1f} GB of layers)" if size else "") + " ...")
            t = time.monotonic()
            engine.ensure_image(store, req.image_manifest)
            log(f"image {info.image_id[:19]}: loaded in {time.monotonic() - t:.1f} s")
        return info
    from hermetic.builder.build import build
    from hermetic.registry import pull_base

    # The build's own no-op check (the image up to date, in the run's engine too); else the build.
    res = build(cfg, paths, log=log, pull_base=pull_base, engine=engine.name, before_build=before_build)
    if not res.noop:
        log(f"built image {res.image_id}")
    for note in res.notes:  # what `hermetic build` warns about (a torchvision for the other torch): said here too
        log(f"warning: {note}")
    return res.info


def open_run(cfg: LoadedConfig, req: RunRequest) -> tuple[str, Path]:
    """A new run directory (or the one `hermetic submit` prepared), room set aside in it for the final record;
    nothing left behind when that fails."""
    if req.run_dir is not None:  # prepared by `hermetic submit`
        run_id, run_dir = req.run_dir.name, adopt_run_dir(req.run_dir)
    else:
        run_id = new_run_id(name=req.name)
        run_dir = create_run_dir(cfg.runs_path, run_id)
    try:
        reserve_space(run_dir)  # the final record is written even when the script filled the disk
    except BaseException as e:
        raised = after_failure(cfg, req, run_dir, None, e, _quiet)
        if raised is None:
            raise
        raise raised from None
    return run_id, run_dir


def run_seed(cfg: LoadedConfig, req: RunRequest) -> int:
    """The run's seed: ``--seed`` (or its member's, in a seed group), else hermetic.yaml's."""
    return req.seed if req.seed is not None else cfg.model.determinism.seed


def open_record(cfg: LoadedConfig, store: OciStore, req: RunRequest, info: ImageInfo,
                 datasets: list[VerifiedDataset], script: str, run_id: str, run_dir: Path, env: RunEnvironment,
                 seed: int) -> dict[str, Any]:
    """The record's input sections, and the files beside it that define the run."""
    from hermetic.record.build import begin_record, env_section, seed_section
    from hermetic.registry import repo_digests

    m = cfg.model
    argv = redact_argv(req.argv)
    rec = begin_record(run_id, argv=argv, script=script, args=script_args(req.args, seed), config=cfg.resolved(),
                       config_sha256=cfg.sha256, name=req.name, replay_of=req.replay_of, group=req.group,
                       gpus=req.gpus, network=req.network,
                       resume_from=req.resume_from.name if req.resume_from is not None else None)
    if has_placeholder(req.args):
        rec["invocation"]["args_template"] = list(req.args)
    rec["image"] = image_section(info, repo_digests(store, info.manifest_digest), m.base)
    rec["data"] = data_section(run_dir, datasets)
    rec["seed"] = seed_section(seed, req.seed_policy)
    rec["env"] = env_section(env.determinism, env.passed)
    if req.slurm is not None:
        rec["slurm"] = dict(req.slurm)
    write_run_files(run_dir, cfg, argv)
    return rec


@contextlib.contextmanager
def _gate(engine, paths: CachePaths, run_id: str) -> Iterator[Gate | None]:
    """The gate a container that starts early waits at (engines.base.Gate), in a directory tied to this
    process, which also ends a container that could outlive it; None for an engine that needs neither."""
    if not (engine.starts_early or engine.outlives_driver):
        yield None
        return
    with owned_temp_dir(paths.tmpdir(), f"gate-{run_id}.") as where:
        os.chmod(where, 0o755)  # the container's (non-root) user opens the FIFO in it
        gate = Gate(where)
        try:
            yield gate
        finally:
            gate.close()


@contextlib.contextmanager
def _workspace(paths: CachePaths, run_id: str) -> Iterator[Path]:
    """A scratch directory the snapshot is extracted into: the container's writable working directory.

    Tied to this process (fsutil.owned_temp_dir): a killed run's workspace is removed by the next writer."""
    with owned_temp_dir(paths.tmpdir(), f"workspace-{run_id}.") as workspace:
        os.chmod(workspace, 0o755)  # the container's (non-root) user must reach /workspace
        yield workspace


def snapshot_code(cfg: LoadedConfig, req: RunRequest, run_dir: Path, workspace: Path,
                  datasets: list[VerifiedDataset], script: str, log: Log,
                  listed: tuple[list[str], bool] | None = None) -> dict[str, Any]:
    """The code section; the snapshot (the recorded one for a replay) extracted into ``workspace``.
    ``listed``: the source files as the links check listed them (else listed here)."""
    from hermetic.run.snapshot import extract_snapshot, take_snapshot

    if req.source_tar:
        (run_dir / "code").mkdir(exist_ok=True)
        shutil.copyfile(req.source_tar, run_dir / "code" / "source.tar")
        extract_snapshot(req.source_tar, workspace)
        snap = take_snapshot(workspace, run_dir, [], use_git=False)
        code = {"git": req.replay_git, "snapshot": snap.section()["snapshot"]}
    else:
        snap = take_snapshot(cfg.root, run_dir, snapshot_excludes(cfg, [d.plan for d in datasets]), listed=listed)
        for w in snap.warnings:
            log(f"warning: {w}")
        extract_snapshot(snap.tar_path, workspace)
        code = snap.section()
    if not (workspace / script).is_file():
        raise NotFound(f"{script}: not in the source snapshot (untracked and ignored by git?)")
    return code


def probe_image(engine, info: ImageInfo, python: str, user: ContainerUser, gpus: str | None,
                paths: CachePaths, env: RunEnvironment) -> dict[str, Any]:
    """The probe in the training run's image, with its devices and the variables it was given (not its
    secrets, nor hermetic's per-run bookkeeping: neither changes what the machine is)."""
    from hermetic.config.secretnames import is_secret_name
    from hermetic.run.probe import run_probe

    given = {k: v for k, v in env.given.items() if not is_secret_name(k)}
    probe, _cached = run_probe(engine, image_id=info.image_id, python=python, user=user.spec, gpus=gpus,
                               cache_dir=paths.root / "probes", env=given, manifest_digest=info.manifest_digest)
    return probe


def refuse_unfit_gpu(rec: dict[str, Any], run_dir: Path, probe: dict[str, Any], info: ImageInfo) -> None:
    """Refuse, and record the refusal, when the probed GPU or driver cannot run the image."""
    from hermetic.gpu.findings import failures
    from hermetic.gpu.runtime import run_checks
    from hermetic.record.build import finish_record

    fails = failures(run_checks(probe, info.labels, strict=True))
    if fails:
        refusal = Unavailable(fails[0].message)
        write_record(run_dir, finish_record(rec, run_dir, status="refused", exit_code=None, reason=refusal.message,
                                            hermetic_exit_code=refusal.exit_code))
        raise refusal


def script_command(req: RunRequest, script: str, args: list[str], python: str, run_id: str) -> list[str]:
    """What the container runs: the script with its arguments (torchrun around it for ``--nproc-per-node``)."""
    if req.distributed is not None:
        return launch_command(req.distributed, python, script, args, run_id)
    return ([python, script] if script.endswith(".py") else [f"./{script}"]) + args


def container_spec(cfg: LoadedConfig, req: RunRequest, info: ImageInfo, datasets: list[VerifiedDataset],
                   env: RunEnvironment, command: list[str], python: str, user: ContainerUser, run_id: str,
                   run_dir: Path, workspace: Path, gate: Gate | None) -> ContainerSpec:
    """The locked-down training container: a writable copy of the code as the working directory (filled
    before the gate opens), the datasets read-only (at their project paths in it and their mounts),
    outputs/ and the runtime's report; behind ``gate`` when the engine starts it early."""
    m = cfg.model
    meta = run_dir / RUNTIME_DIR
    meta.mkdir()
    mounts = [Mount(workspace, m.build.workdir, False), Mount(run_dir / "outputs", OUTPUTS_MOUNT, False),
              Mount(meta, RUNTIME_MOUNT, False)]
    # The directory that was verified (symlinks resolved then), not the path again: it could point elsewhere now.
    mounts += [Mount(Path(d.report.root), where, True) for d in datasets for where in d.plan.container_paths]
    if gate is not None:
        mounts.append(gate.mount())
    container_env = {**(dist_container_env(req.distributed) if req.distributed else {}), **env.container}
    return ContainerSpec(image_id=info.image_id, command=command if gate is None else gate.command(python, command),
                         mounts=mounts, env=container_env, user=user.spec, workdir=m.build.workdir,
                         network=req.network, gpus=req.gpus, labels=run_labels(run_id, run_dir, workspace),
                         shm_size=m.run.shm_size, tmpfs_size=m.run.tmp_size, pids_limit=m.run.pids,
                         memory=m.run.memory, manifest_digest=info.manifest_digest,
                         driver=liveness.driver_token())  # this process: a container it leaves is an orphan


def run_labels(run_id: str, run_dir: Path, workspace: Path) -> dict[str, str]:
    """A training container's labels: its run, the run directory its end is sealed in, the working directory
    it writes (its driver's is the spec's ``driver``)."""
    return {RUN_LABEL: run_id, RUN_DIR_LABEL: os.path.realpath(run_dir), HOLDS_LABEL: os.path.realpath(workspace)}


def hand_over(workspace: Path, run_dir: Path, resume: ResumeSource | None, user: ContainerUser) -> None:
    """The trees the script writes made its user's (the snapshot's working copy, outputs/, the runtime's
    report directory), and a resumed run's earlier outputs put in place as that user."""
    outputs = run_dir / "outputs"
    for tree in (workspace, outputs, run_dir / RUNTIME_DIR):
        _chown_tree(tree, user.uid, user.gid)
    if resume is not None:  # as the container's user, into trees that are now its own
        from hermetic.run.resume import seed_outputs

        seed_outputs(resume, outputs, workspace, uid=user.uid, gid=user.gid)


def limits_spec(cfg: LoadedConfig) -> ContainerSpec:
    """The container as far as the config decides it before anything is built (what check_spec judges)."""
    m = cfg.model.run
    return ContainerSpec(image_id="", command=[], mounts=[], env={}, user=container_user(cfg).spec,
                         pids_limit=m.pids, memory=m.memory, shm_size=m.shm_size, tmpfs_size=m.tmp_size)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if os.getuid() != 0:
        return
    from hermetic.hostfs import safetree

    fd = safetree.open_root(root)
    try:
        safetree.lchown_tree(fd, uid, gid)
    except PermissionError as e:  # root that may not give owners: FAT, exFAT, an export with root_squash
        from hermetic.hostfs.filesystems import unfit_for_runs

        raise unfit_for_runs(root, f"give it to the container's user (uid {uid})", e) from None
    finally:
        os.close(fd)
