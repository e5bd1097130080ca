"""The record steps around a pyxis container (``--container pyxis``): the job script starts it with ``srun
--container-image=REGISTRY#REPO@sha256:…``; ``begin`` verifies the data, opens the prepared run, extracts the
snapshot and writes the record early (``interrupted``); ``end`` collects, hashes and seals it with the exit code.
Not run here (no enroot/pyxis): the tests check the script (docs/scale-out.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from hermetic.run.plan import passed_env, plan_datasets
from hermetic.slurm.state import write_state
from hermetic.slurm.submission import Submission, load_submission
from hermetic.slurm.task import member_of, slurm_section

Log = Callable[[str], None]
WORKSPACE = ".workspace"  # the job script mounts $RUN_DIR/.workspace as the working directory
PROBE_FILE = ".probe.json"  # what the script's probe step printed


def _context(submission_path: Path) -> tuple[Submission, dict[str, Any], Path]:
    sub = load_submission(submission_path)
    slurm = slurm_section(os.environ, sub)
    member = member_of(sub, os.environ)
    return sub, slurm, sub.run_dir(member)


def _probe(run_dir: Path) -> dict[str, Any]:
    try:
        lines = (run_dir / PROBE_FILE).read_text().strip().splitlines()
        doc = json.loads(lines[-1])
    except (OSError, ValueError, IndexError):
        return {}
    return doc if isinstance(doc, dict) else {}


def begin(submission_path: Path, *, log: Log) -> Path:
    from hermetic.record import write_record
    from hermetic.run.data import verify_datasets
    from hermetic.run.recording import run_environment
    from hermetic.run.runner import open_record, open_run, run_seed, snapshot_code
    from hermetic.run.seal import RUNTIME_DIR
    from hermetic.store.oci import OciStore
    from hermetic.core.paths import cache_paths

    sub, slurm, run_dir = _context(submission_path)
    member = member_of(sub, os.environ)
    write_state(run_dir, state="running", node=slurm["node"], job_id=slurm["array_job_id"] or slurm["job_id"])
    cfg = sub.loaded_config()
    req = sub.run_request(member, slurm=slurm, distributed=None)
    datasets = verify_datasets(plan_datasets(cfg, req.data_paths, req.manifest_paths), progress=False, log=log)
    info = sub.image_info()
    run_id, run_dir = open_run(cfg, req)
    seed = run_seed(cfg, req)
    env = run_environment(info, run_id, seed, passed_env(req.env))
    rec = open_record(cfg, OciStore(cache_paths().oci), req, info, datasets, req.script, run_id, run_dir, env, seed)
    rec["image"]["repo_digests"] = list(sub.repo_digests)
    workspace = run_dir / WORKSPACE
    workspace.mkdir()
    rec["code"] = snapshot_code(cfg, req, run_dir, workspace, datasets, req.script, log)
    probe = _probe(run_dir)
    rec["software"], rec["hardware"] = probe.get("software", {}), probe.get("hardware", {})
    (run_dir / RUNTIME_DIR).mkdir(exist_ok=True)
    write_record(run_dir, rec)
    return run_dir


def end(submission_path: Path, exit_code: int, *, log: Log) -> int:
    from hermetic.record.rundir import load_record
    from hermetic.engines.base import RunOutcome
    from hermetic.run.plan import ContainerUser
    from hermetic.run.seal import collect_outputs, seal_run

    sub, _slurm, run_dir = _context(submission_path)
    member = member_of(sub, os.environ)
    req = sub.run_request(member, slurm=None, distributed=None)
    rec = load_record(run_dir)
    rec["record"]["record_sha256"] = ""
    workspace = run_dir / WORKSPACE
    # enroot runs the container as the job's own user (no --container-remap-root): what the script wrote
    # is that user's, so it is that user who collects it (still through safetree: no link followed).
    job_user = ContainerUser(f"{os.getuid()}:{os.getgid()}", os.getuid(), os.getgid())
    collected = collect_outputs(rec, workspace, run_dir, job_user)
    shutil.rmtree(workspace, ignore_errors=True)
    (run_dir / PROBE_FILE).unlink(missing_ok=True)
    result = seal_run(req, run_dir.name, run_dir, rec, RunOutcome(exit_code, False), collected, log)
    write_state(run_dir, state="finished", status=result.status, exit_code=result.exit_code, reason=result.reason)
    return result.exit_code
