"""How two runs were spread over processes: world size, backend and its version, the rank map (pure).

No ``distributed`` section is one process. Material: world size and its split, backend and version, the rank
map (rank-to-GPU order changes results), NCCL_*/GLOO_* variables; not: the rendezvous, log places, GPU
identities and per-rank seeds (they follow from the seed).
"""

from __future__ import annotations

from typing import Any

from hermetic.diff.model import SectionDiff
from hermetic.record.schema import Distributed, RankPlacement, Record

TITLE = "processes and ranks"
# Not a record's section (unchecked, launcher None): what a record without one compares as.
ONE_PROCESS = Distributed.model_construct(
    launcher=None, world_size=1, nnodes=1, nproc_per_node=1, node_rank=0, backend=None, backend_version=None,
    rendezvous=None, seed_rule="", env={}, outputs_from=0, logs={},
    ranks=[RankPlacement.model_construct(rank=0, local_rank=0, node_rank=0, seed=0, device=None, gpu=None,
                                         reported=None)])


def _describe(d: Distributed) -> str:
    if d.launcher is None:
        return "one process"
    shape = f"{d.nnodes} nodes x {d.nproc_per_node}" if d.nnodes > 1 else f"{d.nproc_per_node} processes"
    return f"world size {d.world_size} ({shape}, {d.backend})"


def rank_map(d: Distributed) -> dict[int, tuple[Any, Any, Any]]:
    return {int(r.rank): (r.node_rank, r.local_rank, r.device) for r in d.ranks}


def compare_distributed(a_rec: Record, b_rec: Record) -> SectionDiff:
    a, b = a_rec.distributed or ONE_PROCESS, b_rec.distributed or ONE_PROCESS
    s = SectionDiff("distributed", TITLE, "input", same_as=_describe(a))
    if a.world_size != b.world_size:
        s.add("world_size", "changed", a.world_size, b.world_size, f"world size {a.world_size} -> {b.world_size}")
    for key, label, x, y in (("nnodes", "nodes", a.nnodes, b.nnodes),
                             ("nproc_per_node", "processes per node", a.nproc_per_node, b.nproc_per_node)):
        if x != y:
            s.add(key, "changed", x, y, f"{label} {x} -> {y}", headline=a.world_size == b.world_size)
    for key, label, x, y in (("backend", "backend", a.backend, b.backend),
                             ("backend_version", "backend version", a.backend_version, b.backend_version)):
        if x != y:
            s.add(key, "changed", x, y, f"{label} {x or 'none'} -> {y or 'none'}")
    if a.world_size == b.world_size:
        ma, mb = rank_map(a), rank_map(b)
        moved = [r for r in sorted(ma) if ma[r] != mb.get(r)]
        if moved:
            def place(p: tuple[Any, Any, Any]) -> str:
                return f"node {p[0]} local {p[1]} {p[2] or 'default device'}"

            s.add("ranks", "changed", [ma[r] for r in moved], [mb[r] for r in moved],
                  "rank map: " + "; ".join(f"rank {r} {place(ma[r])} -> {place(mb[r])}" for r in moved[:3])
                  + (f"; +{len(moved) - 3} more" if len(moved) > 3 else ""))
    ea, eb = a.env or {}, b.env or {}
    for k in sorted(ea.keys() | eb.keys()):
        if ea.get(k) != eb.get(k):
            # The env section judges these variables too; named here so the cause reads as the collectives'.
            s.add(f"env.{k}", "changed", ea.get(k), eb.get(k),
                  f"{k} {ea.get(k) or 'unset'} -> {eb.get(k) or 'unset'}", material=False)
    ra, rb = a.rendezvous, b.rendezvous
    if ra != rb and ra is not None and rb is not None:
        s.add("rendezvous", "changed", ra, rb, f"rendezvous {ra.backend} {ra.endpoint} -> {rb.backend} {rb.endpoint}",
              material=False)
    return s
