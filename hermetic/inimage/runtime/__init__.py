"""hermetic's in-image runtime: seeds, determinism switches, resumable
checkpoints and metrics for training code.

Shipped into every image as the top-level package ``hermetic_runtime``
(``import hermetic_runtime``); on the host it is ``hermetic.runtime``. It uses
only the standard library and imports numpy, torch and JAX lazily, when they
are installed. Everything it applies is merged into the JSON file named by
$HERMETIC_RUNTIME_REPORT, which `hermetic run` folds into run.json.

    import hermetic_runtime as hr
    hr.enable_determinism()            # mode from $HERMETIC_DETERMINISM
    seeds = hr.seed_everything()       # seed from $HERMETIC_SEED
    loader = DataLoader(ds, shuffle=True, num_workers=2, **hr.dataloader_kwargs())
    hr.log_metrics(step, loss=loss.item())

docs/runtime.md has the full API and the checklist it implements.
"""

from __future__ import annotations

from ._env import (
    DETERMINISM_ENV,
    OUTPUTS_ENV,
    RANK_ENV,
    REPORT_ENV,
    SEED_ENV,
)
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .data import (
    WorkerSeeder,
    dataloader_generator,
    dataloader_kwargs,
    loader_seed,
    make_worker_init_fn,
    seed_epoch,
    worker_seed,
)
from .determinism import DeterminismResult, enable_determinism
from .distributed import DistributedInfo, init_distributed, rank_outputs_dir, rank_seed, shared_seed
from .metrics import log_metrics, metrics_path, outputs_dir, trim_metrics
from .report import RUNTIME_VERSION, record
from .rng import rng_state, set_rng_state
from .seeding import SeedResult, derive_seed, seed_everything
from .weights import read_weights, save_weights

__version__ = RUNTIME_VERSION

__all__ = [
    "DETERMINISM_ENV",
    "OUTPUTS_ENV",
    "RANK_ENV",
    "REPORT_ENV",
    "SEED_ENV",
    "Checkpoint",
    "DeterminismResult",
    "DistributedInfo",
    "SeedResult",
    "WorkerSeeder",
    "dataloader_generator",
    "dataloader_kwargs",
    "derive_seed",
    "enable_determinism",
    "init_distributed",
    "load_checkpoint",
    "loader_seed",
    "log_metrics",
    "make_worker_init_fn",
    "metrics_path",
    "outputs_dir",
    "rank_outputs_dir",
    "rank_seed",
    "read_weights",
    "record",
    "rng_state",
    "save_checkpoint",
    "save_weights",
    "seed_epoch",
    "seed_everything",
    "set_rng_state",
    "shared_seed",
    "trim_metrics",
    "worker_seed",
]
