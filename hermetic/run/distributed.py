"""Multi-process runs: torchrun inside the container, and the record's ``distributed`` section.

One node: c10d rendezvous on the container's loopback. Slurm nodes: torchrun's static rendezvous at the first
node, node rank SLURM_NODEID, so rank r always lands on the same node. All pure but ``collect_rank_files_at``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from hermetic.config.containerpaths import RUNTIME_MOUNT
from hermetic.core.errors import UsageError
from hermetic.config.gpus import gpu_count

# torchrun's per-rank logs and the other ranks' outputs: inside the runtime directory,
# which the container already has writable at RUNTIME_MOUNT (no extra mount to collide with).
TORCHRUN_LOG_DIR = "torchrun"
RANK_OUTPUTS_DIR = "ranks"
RDZV_PORT = 29400  # c10d's default in torchrun's docs; the container's own loopback, so no clash
# Variables the record keeps whole: they configure the collectives.
DIST_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")
MAX_NPROC = 1024


class DistributedConfigError(UsageError):
    """--nproc-per-node / --nodes that cannot work (exit 64)."""


@dataclass(frozen=True)
class DistributedPlan:
    """A distributed run's shape: processes per node, backend, nodes, this node's rank and rendezvous."""

    nproc_per_node: int
    backend: str  # "gloo" or "nccl"
    nnodes: int = 1
    node_rank: int = 0  # this container's node (SLURM_NODEID under Slurm)
    master_addr: str = "127.0.0.1"
    master_port: int = RDZV_PORT
    rdzv_id: str | None = None  # the same on every node (the run's ID); None: this run's ID

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def rendezvous(self) -> str:
        return "c10d" if self.nnodes == 1 else "static"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "DistributedPlan":
        return cls(int(doc["nproc_per_node"]), str(doc["backend"]), int(doc["nnodes"]), int(doc["node_rank"]),
                   str(doc["master_addr"]), int(doc["master_port"]), doc.get("rdzv_id"))


def plan_distributed(nproc_per_node: int, *, gpus: str | None, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int = RDZV_PORT) -> DistributedPlan:
    """The plan, or DistributedConfigError naming the option that cannot work."""
    if not 1 <= nproc_per_node <= MAX_NPROC:
        raise DistributedConfigError(f"--nproc-per-node {nproc_per_node}: must be between 1 and {MAX_NPROC}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise DistributedConfigError(f"--nodes {nnodes}: node rank {node_rank} is not one of its nodes")
    have = gpu_count(gpus)
    if have is not None and 0 < have < nproc_per_node:
        raise DistributedConfigError(f"--nproc-per-node {nproc_per_node} with --gpus {gpus}: each rank needs "
                                     f"its own GPU (give {nproc_per_node} GPUs, or fewer processes)")
    return DistributedPlan(nproc_per_node, "nccl" if gpus else "gloo", nnodes, node_rank, master_addr, master_port)


def launch_command(plan: DistributedPlan, python: str, script: str, args: list[str], run_id: str) -> list[str]:
    """``python -m torch.distributed.run ... SCRIPT ARGS``: every rank's output teed into per-rank logs.

    The rendezvous ID prefixes the keys of the rendezvous store: every node must give the same one."""
    rdzv_id = plan.rdzv_id or run_id
    cmd = [python, "-m", "torch.distributed.run", "--nnodes", str(plan.nnodes),
           "--nproc-per-node", str(plan.nproc_per_node), "--max-restarts", "0",
           "--log-dir", posixpath.join(RUNTIME_MOUNT, TORCHRUN_LOG_DIR), "--tee", "3"]
    if plan.nnodes == 1:
        # --local-addr: the rendezvous' store would bind the container's host name, which does not
        # resolve in a container without a network
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{plan.master_port}", "--rdzv-id", rdzv_id,
                "--local-addr", "127.0.0.1"]
    else:
        cmd += ["--rdzv-backend", "static", "--node-rank", str(plan.node_rank), "--master-addr", plan.master_addr,
                "--master-port", str(plan.master_port), "--rdzv-id", rdzv_id]
    if not script.endswith(".py"):
        cmd += ["--no-python", f"./{script}"]
    else:
        cmd.append(script)
    return cmd + list(args)


def container_env(plan: DistributedPlan) -> dict[str, str]:
    """What the container gets under the run's env (the user's --env wins): the backend, the other
    ranks' outputs dir and, on one node, gloo on the loopback (a container without a network has no
    other interface, and gloo would first try the host name, which does not resolve there)."""
    # the image's runtime package (hermetic_runtime), imported where it is used: its package imports all of it
    from hermetic.inimage.runtime.distributed import BACKEND_ENV, RANK_OUTPUTS_ENV

    env = {BACKEND_ENV: plan.backend, RANK_OUTPUTS_ENV: posixpath.join(RUNTIME_MOUNT, RANK_OUTPUTS_DIR)}
    if plan.nnodes == 1 and plan.backend == "gloo":
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def dist_env(env: Mapping[str, str]) -> dict[str, str]:
    """Every NCCL_*/GLOO_* (and TORCH_NCCL_*, TORCH_DISTRIBUTED_*) variable in ``env``, sorted."""
    return {k: str(v) for k, v in sorted(env.items()) if k.startswith(DIST_ENV_PREFIXES)}


def _gpu_of(hardware: Mapping[str, Any], index: int) -> dict[str, Any] | None:
    gpus = hardware.get("gpus") or []
    if index < len(gpus) and isinstance(gpus[index], dict):
        g = gpus[index]
        return {"name": g.get("name"), "uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id")}
    return None


def backend_version(backend: str, software: Mapping[str, Any]) -> str | None:
    """NCCL's version as torch reports it; gloo has none of its own (it is built into torch)."""
    torch = software.get("torch") if isinstance(software.get("torch"), dict) else {}
    if backend == "nccl":
        return str(torch["nccl"]) if torch.get("nccl") is not None else None
    return f"built into torch {torch['version']}" if torch.get("version") else None


def distributed_section(plan: DistributedPlan, *, seed: int, env: Mapping[str, str], software: Mapping[str, Any],
                        hardware: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``distributed`` section as planned: world, backend, each rank's seed and device."""
    from hermetic.inimage.runtime.distributed import RANK_SEED_RULE, rank_seed

    ranks = []
    for node in range(plan.nnodes):
        for local in range(plan.nproc_per_node):
            rank = node * plan.nproc_per_node + local
            device = f"cuda:{local}" if plan.backend == "nccl" else "cpu"
            gpu = _gpu_of(hardware, local) if plan.backend == "nccl" and node == plan.node_rank else None
            ranks.append({"rank": rank, "local_rank": local, "node_rank": node, "seed": rank_seed(seed, rank),
                          "device": device, "gpu": gpu, "reported": None})
    return {
        "launcher": "torchrun", "world_size": plan.world_size, "nnodes": plan.nnodes,
        "nproc_per_node": plan.nproc_per_node, "node_rank": plan.node_rank, "backend": plan.backend,
        "backend_version": backend_version(plan.backend, software),
        "rendezvous": {"backend": plan.rendezvous, "endpoint": f"{plan.master_addr}:{plan.master_port}"},
        "seed_rule": RANK_SEED_RULE, "ranks": ranks, "env": dist_env(env), "outputs_from": 0, "logs": {},
    }


def with_reports(section: dict[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """Each rank's ``reported``: what the runtime said that rank applied (seed, device, backend), if it did."""
    out = {**section, "ranks": [dict(r) for r in section["ranks"]]}
    per_rank = report.get("ranks") if isinstance(report.get("ranks"), dict) else {}
    for r in out["ranks"]:
        doc = report if r["rank"] == 0 else per_rank.get(str(r["rank"]))
        if not isinstance(doc, dict):
            continue
        seed = doc.get("seed") if isinstance(doc.get("seed"), dict) else {}
        dist = doc.get("distributed") if isinstance(doc.get("distributed"), dict) else {}
        reported = {k: v for k, v in {"seed": seed.get("value"), "device": dist.get("device"),
                                      "backend": dist.get("backend"), "world_size": dist.get("world_size")}.items()
                    if v is not None}
        r["reported"] = reported or None
    return out


def collect_rank_files_at(rtfd: int, runfd: int, plan: DistributedPlan) -> dict[str, dict[str, str]]:
    """torchrun's per-rank logs -> ``logs/rank<R>/``, the other ranks' outputs -> ``ranks/<R>/outputs/`` (from the
    runtime's directory ``rtfd`` to the run's ``runfd``, through safetree); returns ``{rank: {"stdout", "stderr"}}``.
    """
    from hermetic.hostfs import safetree

    logs: dict[str, dict[str, str]] = {}
    # <log-dir>/<rdzv id>_<random>/attempt_<n>/<local rank>/{stdout,stderr}.log; restarts are off: attempt_0.
    found = []
    with _subdir(rtfd, TORCHRUN_LOG_DIR) as tfd:
        for e in safetree.walk(tfd, prune=lambda rel: rel.count("/") >= 3) if tfd is not None else ():
            parts = e.rel.split("/")
            if (e.kind == "file" and len(parts) == 4 and parts[1].startswith("attempt_")
                    and parts[2].isdigit() and parts[3] in ("stdout.log", "stderr.log", "error.json")):
                found.append((plan.node_rank * plan.nproc_per_node + int(parts[2]), e.rel, parts[3]))
        for rank, rel, name in sorted(found):
            try:
                safetree.move(tfd, rel, runfd, f"logs/rank{rank}/{name}")
            except (safetree.UnsafePath, FileExistsError):
                continue
            logs.setdefault(str(rank), {})[name.split(".")[0]] = f"logs/rank{rank}/{name}"
    with _subdir(rtfd, RANK_OUTPUTS_DIR) as ofd:
        for name in sorted(os.listdir(ofd)) if ofd is not None else ():
            st = os.stat(name, dir_fd=ofd, follow_symlinks=False)
            if not (name.isdigit() and safetree.kind_of(st.st_mode) == "dir"):
                continue
            dest = safetree.open_dir(runfd, f"ranks/{name}", create=True)
            try:
                os.rename(name, "outputs", src_dir_fd=ofd, dst_dir_fd=dest)  # the directory itself
            finally:
                os.close(dest)
    return dict(sorted(logs.items(), key=lambda kv: int(kv[0])))


@contextlib.contextmanager
def _subdir(dirfd: int, rel: str) -> Iterator[int | None]:
    """``rel`` under ``dirfd`` opened as a directory (closed after), or None where there is none or a link."""
    from hermetic.hostfs import safetree

    try:
        fd = safetree.open_dir(dirfd, rel)
    except (FileNotFoundError, safetree.UnsafePath):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def plan_section(plan: DistributedPlan, rec: Mapping[str, Any], env: Any) -> dict[str, Any]:
    """The runner's hook after the probe: the section from the record so far and the run's environment
    (``env``: hermetic.run.recording.RunEnvironment; the image's variables are in env.determinism/passed)."""
    seen = {**container_env(plan), **rec["env"]["determinism"], **rec["env"]["passed"], **env.container}
    return distributed_section(plan, seed=int(rec["seed"]["value"]), env=seen, software=rec["software"],
                               hardware=rec["hardware"])


def finish_section(section: dict[str, Any], report: Mapping[str, Any],
                   logs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The runner's hook after the container: each rank's report and its logs (collect_rank_files) added."""
    return {**with_reports(section, report), "logs": logs}
