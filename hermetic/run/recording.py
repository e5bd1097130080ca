"""The record step: run.json's sections from the plan and the earlier steps' results, and the files beside it."""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic.builder.image_record import ImageInfo
from hermetic.config.load import LoadedConfig
from hermetic.config.determinism import is_knob
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.engines.base import RunOutcome
from hermetic.run.data import VerifiedDataset
from hermetic.config.containerpaths import OUTPUTS_MOUNT
from hermetic.run.plan import RUNTIME_REPORT


def image_section(info: ImageInfo, repo_digests: list[str], base_ref: str) -> dict[str, Any]:
    from hermetic.gpu.cuda import cuda_info_from_labels

    labels = dict(info.labels)
    ci = cuda_info_from_labels(labels)
    return {
        "id": info.image_id, "manifest_digest": info.manifest_digest,
        "repo_digests": repo_digests,
        "base": labels.get("org.hermetic.base") or base_ref,
        "lock_sha256": labels.get("org.hermetic.lock.sha256") or "",
        "packages": info.packages,
        "cuda": {"runtime": ci.runtime, "cudnn": ci.cudnn, "cublas": ci.cublas, "nccl": ci.nccl,
                 "torch_variant": ci.torch_variant},
        "labels": labels,
    }


def data_section(run_dir: Path, verified: list[VerifiedDataset]) -> dict[str, Any]:
    """The data section; keeps each manifest, as verified, in ``run_dir/data/<name>.sha256``."""
    out = {}
    for v in verified:
        (run_dir / v.manifest_file).write_bytes(v.manifest_bytes)
        rep = v.report
        out[v.plan.name] = {"path": str(v.plan.host_path), "mount": v.plan.mount,
                            "mounts": list(v.plan.container_paths), "manifest_file": v.manifest_file,
                            "manifest_sha256": rep.manifest_sha256, "bytes": rep.total_bytes,
                            "count": rep.file_count, "verify_mode": rep.mode}
    return out


@dataclass(frozen=True)
class RunEnvironment:
    """The variables a run's container gets, and how the record tells them apart."""

    container: dict[str, str]  # what the container gets on top of the image's Env
    determinism: dict[str, str]  # every knob in effect, whoever set it (record: env.determinism)
    passed: dict[str, str]  # the other variables the user passed (record: env.passed)
    given: dict[str, str]  # everything the user passed with --env, knobs included


def run_environment(info: ImageInfo, run_id: str, seed: int, passed: dict[str, str]) -> RunEnvironment:
    run_env = {"HERMETIC_SEED": str(seed), "HERMETIC_RUN_ID": run_id, "HERMETIC_OUTPUTS": OUTPUTS_MOUNT,
               "HERMETIC_RUNTIME_REPORT": RUNTIME_REPORT}
    determinism = {k: v for k, v in {**info.env_map(), **run_env, **passed}.items() if is_knob(k)}
    return RunEnvironment({**run_env, **passed}, determinism, {k: v for k, v in passed.items() if not is_knob(k)},
                          dict(passed))


def write_run_files(run_dir: Path, cfg: LoadedConfig, argv: list[str]) -> None:
    """Copies of what defines the run, beside the record: the lock, the resolved config, argv."""
    from hermetic.record.rundir import redact_tree

    try:
        shutil.copyfile(cfg.lock_path, run_dir / Path(cfg.model.lock).name)
    except FileNotFoundError:
        pass
    import yaml  # here: written beside the container's start, not before it

    atomic_write_text(run_dir / "config.resolved.yaml", yaml.safe_dump(redact_tree(cfg.resolved()), sort_keys=True))
    atomic_write_text(run_dir / "argv.txt", "\n".join(argv) + "\n")


def outcome_status(outcome: RunOutcome) -> tuple[str, int]:
    """(record status, exit code): 128 + signal number when interrupted, as a shell reports it."""
    if outcome.interrupted:
        return "interrupted", 128 + int(getattr(signal.Signals, outcome.signal_name or "SIGINT"))
    code = outcome.exit_code if outcome.exit_code is not None else 1
    return ("succeeded" if code == 0 else "failed"), code
