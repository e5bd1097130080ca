"""DataLoader seeding: the shuffle order and every worker's RNGs.

The loader's ``torch.Generator`` drives the sampler's permutation and the base
seed torch hands its workers at each epoch; without one both come from the
global torch RNG, so any extra random call in the training loop would change
the data order. Each worker then reseeds ``random``, numpy and torch with

    derive_seed(seed, rank, worker_id, torch_worker_seed)

(sha256 of "seed:rank:worker_id:torch_worker_seed", first 8 bytes,
big-endian). ``torch_worker_seed`` is what torch gives that worker for this
epoch (drawn from the loader's generator, so itself deterministic): it makes
the streams fresh each epoch, where (seed, rank, worker_id) alone would repeat
the same augmentations every epoch.

Do not use ``persistent_workers=True`` with a resume: persistent workers keep
the seeds of the first epoch the process ran, which differ after a resume.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Optional

from . import _optional
from ._env import resolve_rank
from .report import record
from .seeding import current_seed, derive_seed

WORKER_SEED_RULE = "derive_seed(seed, rank, worker_id, torch_worker_seed)"


def _require_torch() -> Any:
    torch = _optional.torch()
    if torch is None:
        raise RuntimeError("the DataLoader helpers need torch, which is not importable")
    return torch


def loader_seed(seed: Optional[int] = None, rank: Optional[int] = None, epoch: Optional[int] = None) -> int:
    """The loader generator's seed: derive_seed(seed, rank, "loader"[, epoch])."""
    s, r = current_seed(seed), resolve_rank(rank)
    if epoch is None:
        return derive_seed(s, r, "loader")
    return derive_seed(s, r, "loader", epoch)


def worker_seed(seed: int, rank: int, worker_id: int, torch_worker_seed: int) -> int:
    return derive_seed(seed, rank, worker_id, torch_worker_seed)


def dataloader_generator(seed: Optional[int] = None, rank: Optional[int] = None) -> Any:
    """A ``torch.Generator`` for ``DataLoader(generator=...)``, seeded from
    (seed, rank). ``seed`` defaults to the one seed_everything() applied,
    ``rank`` to $RANK, else 0."""
    torch = _require_torch()
    s, r = current_seed(seed), resolve_rank(rank)
    g = torch.Generator()
    g.manual_seed(loader_seed(s, r))
    record(dataloader={"seed": s, "rank": r, "generator_seed": loader_seed(s, r),
                       "worker_seed_rule": WORKER_SEED_RULE})
    return g


def seed_epoch(generator: Any, epoch: int, seed: Optional[int] = None, rank: Optional[int] = None) -> int:
    """Reseed the loader's generator for ``epoch`` (like
    DistributedSampler.set_epoch). Called at the start of every epoch, it
    makes the data order a function of (seed, rank, epoch) alone, so a run
    resumed at (epoch, batch) sees the same batches. Returns the seed."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch: must be a non-negative integer, got {epoch!r}")
    s = loader_seed(seed, rank, epoch)
    generator.manual_seed(s)
    return s


class WorkerSeeder:
    """A DataLoader ``worker_init_fn`` that seeds ``random``, numpy and torch in
    each worker from (seed, rank, worker id, torch's worker seed).

    A class, not a closure, so it pickles for the spawn/forkserver start
    methods."""

    def __init__(self, seed: Optional[int] = None, rank: Optional[int] = None):
        self.seed = current_seed(seed)
        self.rank = resolve_rank(rank)

    def __call__(self, worker_id: int) -> None:
        torch = _require_torch()
        info = torch.utils.data.get_worker_info()
        torch_seed = int(info.seed) if info is not None else int(torch.initial_seed())
        s = worker_seed(self.seed, self.rank, worker_id, torch_seed)
        random.seed(s)
        torch.manual_seed(s)
        np = _optional.numpy()
        if np is not None:
            # numpy's legacy seed takes 32-bit words: give it both halves.
            np.random.seed([s & 0xFFFFFFFF, s >> 32])

    def __repr__(self) -> str:
        return f"WorkerSeeder(seed={self.seed}, rank={self.rank})"


def make_worker_init_fn(seed: Optional[int] = None, rank: Optional[int] = None) -> WorkerSeeder:
    return WorkerSeeder(seed, rank)


def dataloader_kwargs(seed: Optional[int] = None, rank: Optional[int] = None) -> Dict[str, Any]:
    """``DataLoader(ds, shuffle=True, num_workers=2, **dataloader_kwargs())``:
    the seeded generator and the worker_init_fn together."""
    return {"generator": dataloader_generator(seed, rank), "worker_init_fn": make_worker_init_fn(seed, rank)}
