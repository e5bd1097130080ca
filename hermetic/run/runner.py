"""The order of a run (issue 5): build -> verify data -> run dir -> snapshot -> probe -> run.

Every input is pinned or verified before the container exists: the image is
built (a no-op when up to date), each dataset is checked against its
manifest (a failure stops here, before any run directory or container), the
code is snapshotted into the new, never-reused run directory, and the probe
runs in the same image with the same devices. The record is written early
(status ``interrupted``) and again at the end, so even a hard kill leaves a
record behind; Ctrl-C and SIGTERM end with status ``interrupted``.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from hermetic.config import LoadedConfig, is_env_name
from hermetic.determinism import is_knob
from hermetic.errors import HermeticError
from hermetic.fsutil import atomic_write_text
from hermetic.paths import CachePaths

RUNTIME_MOUNT = "/run/hermetic"
RUNTIME_REPORT = f"{RUNTIME_MOUNT}/runtime.json"
OUTPUTS_MOUNT = "/outputs"


class DataRefused(HermeticError):
    exit_code = 3


@dataclass
class RunRequest:
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
    echo: bool = True
    replay_of: str | None = None
    group: str | None = None
    # replay: run exactly this image and this source snapshot
    image_manifest: str | None = None
    source_tar: Path | None = None
    replay_git: dict[str, Any] | None = None  # the original run's git facts, kept for reference
    manifest_paths: dict[str, Path] = field(default_factory=dict)  # NAME -> manifest (replay: the run's copy)
    resume_from: Path | None = None  # a previous run dir whose outputs/ seed this one's


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    exit_code: int
    record: dict[str, Any]


def _log(echo: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if echo:
            print(f"hermetic: {msg}", file=sys.stderr, flush=True)
    return log


def resolve_script(cfg: LoadedConfig, script: str) -> str:
    """SCRIPT as a path inside /workspace (relative to the project root)."""
    p = Path(script)
    if p.is_absolute() or (Path.cwd() / p).exists():
        full = (Path.cwd() / p).resolve()
        try:
            return full.relative_to(cfg.root).as_posix()
        except ValueError:
            raise HermeticError(f"{script}: not inside the project ({cfg.root}); only the project's code is "
                                "snapshotted and mounted at /workspace", exit_code=2) from None
    if (cfg.root / p).exists():
        return posixpath.normpath(p.as_posix())
    raise HermeticError(f"{script}: no such file in the project {cfg.root}", exit_code=2)


def dataset_plan(cfg: LoadedConfig, overrides: dict[str, str],
                 manifests: dict[str, Path] | None = None) -> list[dict[str, Any]]:
    known = {d.name for d in cfg.model.datasets}
    for n in overrides:
        if n not in known:
            raise HermeticError(f"--data {n}=...: hermetic.yaml declares no dataset {n!r} "
                                f"(declared: {', '.join(sorted(known)) or 'none'})", exit_code=2)
    out = []
    for d in cfg.model.datasets:
        host = Path(overrides[d.name]).resolve() if d.name in overrides else cfg.resolve(d.path)
        manifest = (manifests or {}).get(d.name) or cfg.resolve(d.manifest)
        out.append({"name": d.name, "path": host, "manifest": manifest, "mount": d.mount,
                    "config_path": d.path})
    return out


def verify_data(plan: list[dict[str, Any]], *, progress: bool, log) -> list[Any]:
    from hermetic.data.verify import verify_dataset

    reports, failed = [], []
    for d in plan:
        if not d["path"].is_dir():
            raise DataRefused(f"dataset {d['name']}: {d['path']} is not a directory")
        rep = verify_dataset(d["path"], d["manifest"], progress=progress)
        reports.append(rep)
        if rep.ok:
            log(f"data {d['name']}: {rep.file_count} files, {rep.total_bytes} bytes verified ({rep.mode})")
        else:
            failed.append((d["name"], rep))
    if failed:
        name, rep = failed[0]
        lines = [f"dataset {n}: {r.summary()}" for n, r in failed]
        for n, r in failed:
            for p, exp, act in r.changed[:20]:
                print(f"  {n}: changed {p}: expected {exp}, found {act}", file=sys.stderr)
            for p in r.missing[:20]:
                print(f"  {n}: missing {p}", file=sys.stderr)
            for p in r.extra[:20]:
                print(f"  {n}: extra {p}", file=sys.stderr)
        raise DataRefused("; ".join(lines) + " — no container was started")
    return reports


def _snapshot_excludes(cfg: LoadedConfig, plan: list[dict[str, Any]]) -> list[str]:
    # The datasets and their manifests are the data section's (a copy of each manifest is
    # kept in the run's data/): in the code snapshot too, a data update would read as a code change.
    ex = {".git", ".hermetic"}
    for p in [cfg.runs_path] + [d["path"] for d in plan] + [d["manifest"] for d in plan]:
        try:
            ex.add(Path(p).resolve().relative_to(cfg.root).as_posix())
        except ValueError:
            pass
    return sorted(ex)


def _passed_env(names: list[str]) -> dict[str, str]:
    out = {}
    for item in names:
        k, eq, v = item.partition("=")
        if not is_env_name(k):
            raise HermeticError(f"--env {item!r}: not NAME or NAME=VALUE", exit_code=2)
        if eq:
            out[k] = v
        elif k in os.environ:
            out[k] = os.environ[k]
        else:
            raise HermeticError(f"--env {k}: not set in this environment (pass NAME=VALUE to set it)", exit_code=2)
    return out


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the value of each secret-named ``--env NAME=VALUE`` replaced by ``<redacted>``.

    argv.txt and invocation.argv keep the command line as typed; a secret
    given as NAME=VALUE must not ride along (env.secrets keeps its name).
    """
    from hermetic.record.secrets_policy import REDACTED, is_secret_name

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


def _container_user(cfg: LoadedConfig) -> tuple[str, int, int]:
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        u, g = (int(x) for x in cfg.model.build.user.split(":"))
        return f"{u}:{g}", u, g
    return f"{uid}:{gid}", uid, gid


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if os.getuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.lchown(dirpath, uid, gid)
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), uid, gid)


def _image_section(store, info, base_ref: str) -> dict[str, Any]:
    from hermetic.gpu.cuda import cuda_info_from_labels
    from hermetic.registry import repo_digests

    labels = dict(info.labels)
    ci = cuda_info_from_labels(labels)
    return {
        "id": info.image_id, "manifest_digest": info.manifest_digest,
        "repo_digests": repo_digests(store, info.manifest_digest),
        "base": labels.get("org.hermetic.base") or base_ref,
        "lock_sha256": labels.get("org.hermetic.lock.sha256") or "",
        "packages": info.packages,
        "cuda": {"runtime": ci.runtime, "cudnn": ci.cudnn, "cublas": ci.cublas, "nccl": ci.nccl,
                 "torch_variant": ci.torch_variant},
        "labels": labels,
    }


def execute(cfg: LoadedConfig, paths: CachePaths, req: RunRequest) -> RunResult:
    from hermetic.builder.build import build
    from hermetic.builder.image_record import ImageInfo
    from hermetic.registry import ensure_image
    from hermetic.engine import engine_client, engine_has_image, load_image
    from hermetic.record import (begin_record, create_run_dir, env_section, finish_record, new_run_id,
                                 seed_section, write_record)
    from hermetic.run.container import ContainerSpec, Mount, check_gpu_runtime, run_streaming
    from hermetic.run.probe import run_probe
    from hermetic.run.snapshot import extract_snapshot, take_snapshot
    from hermetic.store.oci import OciStore

    log = _log(req.echo)
    m = cfg.model
    client = engine_client()
    if req.gpus:
        check_gpu_runtime(client)  # before anything is built, verified or created
    script = req.script if req.source_tar else resolve_script(cfg, req.script)
    passed = _passed_env(req.env)
    store = OciStore(paths.oci)

    # 1. the image
    if req.image_manifest:
        if not store.has_image(req.image_manifest):
            raise HermeticError(f"image {req.image_manifest} is not in the local store", exit_code=3)
        info = ImageInfo.from_store(store, req.image_manifest)
        if not engine_has_image(info.image_id):
            load_image(store, req.image_manifest)
    else:
        res = build(cfg, paths, log=log if req.echo else None, pull_base=ensure_image)
        if not res.noop:
            log(f"built image {res.image_id}")
        info = res.info

    # 2. the data (a failure stops before any run dir or container)
    plan = dataset_plan(cfg, req.data_paths, req.manifest_paths)
    reports = verify_data(plan, progress=req.echo and sys.stderr.isatty(), log=log)

    # 3. the run directory
    run_id = new_run_id(name=req.name)
    run_dir = create_run_dir(cfg.runs_path, run_id)
    seed = req.seed if req.seed is not None else m.determinism.seed
    argv = redact_argv(req.argv)
    rec = begin_record(run_id, argv=argv, script=script, args=req.args, config=cfg.resolved(),
                       config_sha256=cfg.sha256, name=req.name, replay_of=req.replay_of, group=req.group,
                       gpus=req.gpus, network=req.network,
                       resume_from=req.resume_from.name if req.resume_from is not None else None)
    rec["image"] = _image_section(store, info, m.base)
    rec["data"] = {}
    for d, rep in zip(plan, reports):
        manifest_copy = f"data/{d['name']}.sha256"
        shutil.copyfile(d["manifest"], run_dir / manifest_copy)
        rec["data"][d["name"]] = {"path": str(d["path"]), "mount": d["mount"], "manifest_file": manifest_copy,
                                  "manifest_sha256": rep.manifest_sha256, "bytes": rep.total_bytes,
                                  "count": rep.file_count, "verify_mode": rep.mode}
    image_env = info.env_map()
    run_env = {"HERMETIC_SEED": str(seed), "HERMETIC_RUN_ID": run_id, "HERMETIC_OUTPUTS": OUTPUTS_MOUNT,
               "HERMETIC_RUNTIME_REPORT": RUNTIME_REPORT}
    determinism = {k: v for k, v in {**image_env, **run_env, **passed}.items() if is_knob(k)}
    rec["seed"] = seed_section(seed, req.seed_policy)
    rec["env"] = env_section(determinism, {k: v for k, v in passed.items() if not is_knob(k)})

    # copies of what defines the run, beside the record
    lock_name = Path(m.lock).name
    try:
        shutil.copyfile(cfg.lock_path, run_dir / lock_name)
    except FileNotFoundError:
        pass
    from hermetic.record.rundir import redact_tree

    atomic_write_text(run_dir / "config.resolved.yaml", yaml.safe_dump(redact_tree(cfg.resolved()), sort_keys=True))
    atomic_write_text(run_dir / "argv.txt", "\n".join(argv) + "\n")

    # 4. the code
    workspace = Path(tempfile.mkdtemp(prefix=f"workspace-{run_id}.", dir=paths.tmpdir()))
    os.chmod(workspace, 0o755)  # the container's (non-root) user must reach /workspace
    try:
        if req.source_tar:
            (run_dir / "code").mkdir(exist_ok=True)
            shutil.copyfile(req.source_tar, run_dir / "code" / "source.tar")
            extract_snapshot(req.source_tar, workspace)
            snap = take_snapshot(workspace, run_dir, [], use_git=False)
            rec["code"] = {"git": req.replay_git, "snapshot": snap.section()["snapshot"]}
        else:
            snap = take_snapshot(cfg.root, run_dir, _snapshot_excludes(cfg, plan))
            for w in snap.warnings:
                log(f"warning: {w}")
            extract_snapshot(snap.tar_path, workspace)
            rec["code"] = snap.section()
        if not (workspace / script).is_file():
            raise HermeticError(f"{script}: not in the source snapshot (untracked and ignored by git?)", exit_code=2)

        # 5. the probe, same image, same devices
        user, uid, gid = _container_user(cfg)
        python = f"{m.build.prefix}/bin/python"
        probe, cached = run_probe(client, image_id=info.image_id, python=python, user=user, gpus=req.gpus,
                                  cache_dir=paths.root / "probes")
        rec["software"], rec["hardware"] = probe.get("software", {}), probe.get("hardware", {})
        write_record(run_dir, rec)  # early: a hard kill still leaves a record
        refusal = _gpu_refusal(probe, info.labels) if req.gpus else None
        if refusal:
            rec = finish_record(rec, run_dir, status="refused", exit_code=None)
            write_record(run_dir, rec)
            raise HermeticError(refusal, exit_code=3)

        # 6. the run
        outputs = run_dir / "outputs"
        meta = run_dir / ".runtime"
        meta.mkdir()
        if req.resume_from is not None:
            _seed_outputs(req.resume_from, outputs)
        _chown_tree(outputs, uid, gid)
        _chown_tree(meta, uid, gid)
        command = ([python, script] if script.endswith(".py") else [f"./{script}"]) + list(req.args)
        mounts = [Mount(workspace, m.build.workdir, True), Mount(outputs, OUTPUTS_MOUNT, False),
                  Mount(meta, RUNTIME_MOUNT, False)]
        mounts += [Mount(d["path"], d["mount"], True) for d in plan]
        spec = ContainerSpec(image_id=info.image_id, command=command, mounts=mounts,
                             env={**run_env, **passed}, user=user, workdir=m.build.workdir,
                             network=req.network, gpus=req.gpus, labels={"org.hermetic.run-id": run_id},
                             shm_size=m.run.shm_size, tmpfs_size=m.run.tmp_size)
        log(f"run {run_id}: {' '.join(command)}")
        outcome = run_streaming(client, spec, run_dir / "logs", echo=req.echo)
        _chown_tree(run_dir, os.getuid(), os.getgid())
        applied = _read_runtime_report(meta / "runtime.json")
        rec["seed"] = seed_section(seed, req.seed_policy, applied)
        if outcome.interrupted:
            # 128 + signal number, as a shell reports it: 130 for Ctrl-C, 143 for SIGTERM
            status, code = "interrupted", 128 + int(getattr(signal.Signals, outcome.signal_name or "SIGINT"))
        else:
            code = outcome.exit_code if outcome.exit_code is not None else 1
            status = "succeeded" if code == 0 else "failed"
        shutil.rmtree(meta, ignore_errors=True)
        rec = finish_record(rec, run_dir, status=status, exit_code=None if outcome.interrupted else code)
        sealed = write_record(run_dir, rec)
        log(f"run {run_id} {status} (exit {code}); record: {run_dir / 'run.json'}")
        return RunResult(run_id, run_dir, status, code, sealed)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _seed_outputs(previous_run: Path, outputs: Path) -> None:
    src = previous_run / "outputs"
    if not src.is_dir():
        raise HermeticError(f"--resume-from {previous_run}: no outputs/ there", exit_code=2)
    for p in src.rglob("*"):
        rel = p.relative_to(src)
        if p.is_dir():
            (outputs / rel).mkdir(parents=True, exist_ok=True)
        elif p.is_file():
            (outputs / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, outputs / rel)


def _read_runtime_report(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def _gpu_refusal(probe: dict[str, Any], labels: dict[str, str]) -> str | None:
    from hermetic.gpu.checks import failures, run_checks

    fails = failures(run_checks(probe, labels, strict=True))
    return fails[0].message if fails else None
