"""One Slurm task on its node: the member its array task ID selects, run as `hermetic run` runs it.

It reads ``slurm/submit.json`` (never the checkout), takes the image by digest from the shared store or the
registry (verified either way), and hands hermetic.run.runner.execute the RunRequest a replay would build. Across
nodes, node 0's record is the run's; node k > 0 records its own container under ``<run>/nodes/``; torchrun meets
at the first node's address.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from hermetic.core.errors import HermeticError, UsageError
from hermetic.run.distributed import RDZV_PORT, DistributedPlan
from hermetic.slurm.state import write_state
from hermetic.slurm.submission import Member, Submission, load_submission

Log = Callable[[str], None]
PORT_SPAN = 1000  # the rendezvous port is RDZV_PORT + job ID mod this: jobs sharing a node do not collide


def _int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name, "").strip()
    return int(v) if v.isdigit() else None


def slurm_section(env: Mapping[str, str], sub: Submission) -> dict[str, Any]:
    """The record's ``slurm`` section, from the task's environment."""
    job = _int(env, "SLURM_JOB_ID")
    if job is None:
        raise UsageError("hermetic slurm-task runs inside a Slurm job (SLURM_JOB_ID is not set); "
                            "use hermetic submit")
    return {
        "job_id": job, "array_job_id": _int(env, "SLURM_ARRAY_JOB_ID"), "array_task_id": _int(env, "SLURM_ARRAY_TASK_ID"),
        "node": env.get("SLURMD_NODENAME", ""), "partition": env.get("SLURM_JOB_PARTITION", sub.partition),
        "nodelist": env.get("SLURM_JOB_NODELIST", env.get("SLURMD_NODENAME", "")),
        "nnodes": _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES") or 1,
        "node_rank": _int(env, "SLURM_NODEID") or 0, "cluster": env.get("SLURM_CLUSTER_NAME") or None,
        "container": sub.container, "submitted_from": sub.submission_id, "image_pulled_from": None,
    }


def member_of(sub: Submission, env: Mapping[str, str]) -> Member:
    return sub.member(_int(env, "SLURM_ARRAY_TASK_ID") or 0 if sub.kind == "group" else 0)


def node_distributed(sub: Submission, member: Member, slurm: dict[str, Any]) -> DistributedPlan | None:
    """This node's share of the run: its node rank, the first node's address, the job's port and the
    run's ID as the rendezvous ID on every node."""
    from hermetic.slurm import ctl

    doc = sub.request.get("distributed")
    if not doc:
        return None
    plan = DistributedPlan.from_json(doc)
    if plan.nnodes == 1:
        return plan
    first = ctl.hostnames(slurm["nodelist"])[0]
    return dataclasses.replace(plan, node_rank=slurm["node_rank"], master_addr=ctl.node_addr(first),
                               master_port=RDZV_PORT + slurm["job_id"] % PORT_SPAN, rdzv_id=member.run_id)


def node_gpus(requested: str | None, env: Mapping[str, str]) -> str | None:
    """The GPUs Slurm allocated to this job, for the container (Docker does not see Slurm's cgroups)."""
    if not requested:
        return None
    allocated = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    return f"device={allocated}" if allocated else requested


def node_cache_dir(template: str | None, node: str) -> str | None:
    return None if template is None else template.replace("{node}", node)


def run_task(submission_path: Path, *, log: Log, env: Mapping[str, str] | None = None) -> int:
    """Run this task's member; the run's exit code (as `hermetic run` exits)."""
    from hermetic.core.paths import cache_paths
    from hermetic.run.replay import ensure_recorded_image
    from hermetic.run.runner import execute
    from hermetic.store.oci import OciStore

    env = os.environ if env is None else env
    sub = load_submission(submission_path)
    slurm = slurm_section(env, sub)
    member = member_of(sub, env)
    primary = slurm["node_rank"] == 0
    run_dir = sub.run_dir(member)
    if primary:
        write_state(run_dir, state="running", node=slurm["node"], job_id=slurm["array_job_id"] or slurm["job_id"],
                    task_job_id=slurm["job_id"])
    try:
        cache = node_cache_dir(sub.node_cache, slurm["node"])
        if cache is not None:
            os.environ["HERMETIC_CACHE"] = cache
        elif sub.shared_store:  # the image, and everything else the run caches, in the store every node mounts
            os.environ["HERMETIC_CACHE"] = sub.shared_store
        paths = cache_paths()
        store = OciStore(paths.oci)
        pulled = None
        if sub.shared_store:
            from hermetic.slurm.shared import copy_image

            if Path(os.path.realpath(paths.root)) != Path(os.path.realpath(sub.shared_store)):
                copied = copy_image(OciStore(Path(sub.shared_store) / "oci"), store, sub.image["manifest_digest"])
                if copied:
                    log(f"image {sub.image['manifest_digest']}: {copied} blob(s) copied from the shared store "
                        f"{sub.shared_store} into this node's cache, each verified")
            slurm["image_store"] = sub.shared_store
            if sub.squashfs:  # the engine mounts this file once its sha256 is the submitted one (engines.squashfs)
                from hermetic.engines import squashfs as sqfs

                os.environ[sqfs.FILE_VARIABLE] = sub.squashfs["path"]
                os.environ[sqfs.EXPECT_VARIABLE] = sub.squashfs["sha256"]
        else:
            pulled = ensure_recorded_image(store, sub.image["manifest_digest"], sub.repo_digests,
                                           image_id=sub.image["image_id"])
            if pulled:
                log(f"image {sub.image['manifest_digest']} was not in this node's store: pulled by digest from "
                    f"{pulled}")
        slurm["image_pulled_from"] = pulled
        cfg = sub.loaded_config()
        req = sub.run_request(member, slurm=slurm, distributed=node_distributed(sub, member, slurm))
        req = dataclasses.replace(req, gpus=node_gpus(req.gpus, env))
        if not primary:
            req = dataclasses.replace(req, run_dir=_node_run_dir(run_dir, slurm["node_rank"]))
        result = execute(cfg, paths, req, log=log)
    except HermeticError as e:
        if primary:
            write_state(run_dir, state="failed", reason=e.message, exit_code=e.exit_code)
        raise
    if primary:
        write_state(run_dir, state="finished", status=result.status, exit_code=result.exit_code,
                    reason=result.reason)
    return result.exit_code


def _node_run_dir(run_dir: Path, node_rank: int) -> Path:
    from hermetic.record import create_run_dir
    from hermetic.run.seal import NODES_DIR

    return create_run_dir(run_dir / NODES_DIR, f"{run_dir.name}-node{node_rank}")
