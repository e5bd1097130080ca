"""Multi-process runs (torchrun): each rank's seed, its device, the process group, its outputs.

torchrun gives every worker the same environment plus RANK, LOCAL_RANK and
WORLD_SIZE, so everything per rank is derived here from (seed, rank):

- ``rank_seed(seed, rank)``: rank 0 keeps the run's seed (a 1-process run and
  rank 0 of a 2-process run start alike); rank r > 0 gets
  ``derive_seed(seed, "rank", r) % 2**32`` (32 bits: numpy's legacy seed).
  ``seed_everything()`` applies it by itself when WORLD_SIZE > 1.
- ``shared_seed()``: the seed every rank agrees on, for what must be the same
  on all of them (``DistributedSampler(seed=...)``: with per-rank seeds the
  shards would overlap).
- ``init_distributed()``: the process group with the backend `hermetic run`
  chose ($HERMETIC_DIST_BACKEND: gloo on CPU, nccl with GPUs), this rank's
  device (``cuda:LOCAL_RANK`` for nccl), recorded in the runtime report
  (ranks other than 0 under ``ranks.<rank>``).
- ``rank_outputs_dir()``: where this rank's outputs go. Rank 0 writes the run's
  outputs; `hermetic run` gives the other ranks their own directory
  ($HERMETIC_RANK_OUTPUTS/<rank>), kept beside the run, out of its outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from . import _optional
from ._env import RANK_ENV, WORLD_SIZE_ENV, resolve_rank, resolve_seed, world_size  # noqa: F401 (API)
from ._seeds import rank_seed  # noqa: F401 (this module's API: hermetic_runtime.distributed.rank_seed)
from .report import record

LOCAL_RANK_ENV = "LOCAL_RANK"
BACKEND_ENV = "HERMETIC_DIST_BACKEND"
RANK_OUTPUTS_ENV = "HERMETIC_RANK_OUTPUTS"
RANK_SEED_RULE = 'rank 0: seed; rank r > 0: derive_seed(seed, "rank", r) % 2**32'


def shared_seed(seed: Optional[int] = None) -> int:
    """The seed all ranks share: ``seed``, else $HERMETIC_SEED, else 0 (never per rank)."""
    return resolve_seed(seed)[0]


@dataclass(frozen=True)
class DistributedInfo:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: str  # "cpu" or "cuda:N"


def init_distributed(backend: Optional[str] = None) -> Optional[DistributedInfo]:
    """Join the process group torchrun set up; None when the script runs as one process.

    ``backend`` defaults to $HERMETIC_DIST_BACKEND, else nccl when CUDA is
    available, else gloo. With nccl the rank's device is ``cuda:LOCAL_RANK``
    (made current). Records rank, world size, backend (and NCCL's version) and
    device in the runtime report.
    """
    if WORLD_SIZE_ENV not in os.environ or RANK_ENV not in os.environ:
        return None
    torch = _optional.torch()
    if torch is None:
        raise RuntimeError("init_distributed needs torch, which is not importable")
    dist = _optional.optional_import("torch.distributed")

    rank, size = resolve_rank(None), world_size()
    local_rank = int(os.environ.get(LOCAL_RANK_ENV, "0") or 0)
    chosen = backend or os.environ.get(BACKEND_ENV, "").strip() or (
        "nccl" if torch.cuda.is_available() else "gloo")
    device = "cpu"
    if chosen == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen)
    info = DistributedInfo(rank, local_rank, size, chosen, device)
    details: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "world_size": size, "backend": chosen,
                               "device": device}
    if chosen == "nccl":
        try:
            details["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a torch without NCCL: record its absence
            details["nccl_version"] = None
    record(distributed=details)
    return info


def rank_outputs_dir() -> Optional[str]:
    """This rank's own outputs directory when it is not rank 0 and `hermetic run` gave one; else None."""
    base = os.environ.get(RANK_OUTPUTS_ENV, "").strip()
    if not base:
        return None
    try:
        rank = resolve_rank(None)
    except ValueError:
        return None
    return os.path.join(base, str(rank)) if rank > 0 else None
