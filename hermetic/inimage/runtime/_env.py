"""The environment variables the runtime reads, and their defaults.

One place, so the docs, the report and `hermetic run` agree on the names.
Nothing here imports outside the standard library: this package is copied
into every image as the top-level package ``hermetic_runtime``.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

SEED_ENV = "HERMETIC_SEED"
DETERMINISM_ENV = "HERMETIC_DETERMINISM"
OUTPUTS_ENV = "HERMETIC_OUTPUTS"
REPORT_ENV = "HERMETIC_RUNTIME_REPORT"
# torchrun / torch.distributed.launch set RANK for every process.
RANK_ENV = "RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"

DEFAULT_SEED = 0
DEFAULT_MODE = "strict"
DEFAULT_OUTPUTS = "/outputs"
MODES = ("strict", "statistical", "off")
SEED_MAX = 2**32 - 1  # numpy's legacy seed() takes 32 bits; hermetic.yaml has the same bound

# Set by the image for bitwise-repeatable runs; strict mode warns when one is
# missing. PYTHONHASHSEED only works when set before the interpreter starts,
# so it cannot be fixed from inside the process.
STRICT_ENV_EXPECTED = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "OMP_NUM_THREADS")

# The determinism knobs worth seeing in the run record as the process saw them.
DETERMINISM_VARS = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_DYNAMIC",
    "OMP_DYNAMIC",
    "NVIDIA_TF32_OVERRIDE",
    "NCCL_ALGO",
    "NCCL_NVLS_ENABLE",
    "XLA_FLAGS",
    "TF_DETERMINISTIC_OPS",
    "TZ",
    "LC_ALL",
)


def check_seed(value: object, where: str = "seed") -> int:
    """An int in [0, 2**32-1]; ValueError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: must be an integer, got {value!r}")
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"{where}: must be between 0 and {SEED_MAX}, got {value}")
    return value


def resolve_seed(seed: Optional[int]) -> Tuple[int, str]:
    """(seed, source): the argument, else $HERMETIC_SEED, else 0."""
    if seed is not None:
        return check_seed(seed), "argument"
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return DEFAULT_SEED, "default"
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r}: must be a decimal integer") from None
    return check_seed(value, SEED_ENV), "env:" + SEED_ENV


def resolve_mode(mode: Optional[str]) -> Tuple[str, str]:
    """(mode, source): the argument, else $HERMETIC_DETERMINISM, else strict."""
    if mode is not None:
        where, value = "mode", mode
        source = "argument"
    else:
        raw = os.environ.get(DETERMINISM_ENV, "").strip()
        if not raw:
            return DEFAULT_MODE, "default"
        where, value, source = DETERMINISM_ENV, raw, "env:" + DETERMINISM_ENV
    if value not in MODES:
        raise ValueError(f"{where}={value!r}: must be one of {', '.join(MODES)}")
    return value, source


def resolve_rank(rank: Optional[int]) -> int:
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank: must be a non-negative integer, got {rank!r}")
        return rank
    raw = os.environ.get(RANK_ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{RANK_ENV}={raw!r}: must be a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{RANK_ENV}={raw!r}: must be a non-negative integer")
    return value


def outputs_dir_path() -> str:
    return os.environ.get(OUTPUTS_ENV, "").strip() or DEFAULT_OUTPUTS


def determinism_env() -> dict:
    """The determinism knobs as this process sees them (unset ones omitted)."""
    return {k: os.environ[k] for k in DETERMINISM_VARS if k in os.environ}


def world_size() -> int:
    """$WORLD_SIZE (torchrun sets it), else 1."""
    raw = os.environ.get(WORLD_SIZE_ENV, "").strip()
    try:
        value = int(raw, 10) if raw else 1
    except ValueError:
        raise ValueError(f"{WORLD_SIZE_ENV}={raw!r}: must be a positive integer") from None
    if value < 1:
        raise ValueError(f"{WORLD_SIZE_ENV}={raw!r}: must be a positive integer")
    return value
