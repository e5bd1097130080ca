"""The determinism knobs: which variables they are, their values by mode, what counts toward identity.

The one list for everything outside the image (image config, record, replay, group summaries, diff); the
in-image copies (hermetic/inimage/runtime/_env.py, hermetic/inimage/probe/probe.py) are checked against it by
tests/test_determinism.py.
"""

from __future__ import annotations

from typing import Any, Mapping

MODES = ("strict", "statistical", "off")
MODE_ENV = "HERMETIC_DETERMINISM"  # the mode itself, for the in-image runtime
HASHSEED = "PYTHONHASHSEED"  # only works when set before the interpreter starts: baked into the image
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"
# BLAS / OpenMP thread counts: a reduction split over another number of threads sums in another order.
THREAD_KNOBS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Strict mode's fixed values.
STRICT_FIXED: dict[str, str] = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # needed by older torch for deterministic cuBLAS; harmless on newer
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
    "NVIDIA_TF32_OVERRIDE": "0",
    "NCCL_ALGO": "Ring",  # a fixed reduction order
    "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP reductions are not deterministic (nccl#1497)
    "XLA_FLAGS": "--xla_gpu_deterministic_ops=true",
    "TF_DETERMINISTIC_OPS": "1",  # TF < 2.8; later TF uses enable_op_determinism()
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
}
# Every variable recorded as a determinism knob (run.json env.determinism), whatever set it.
KNOB_NAMES: tuple[str, ...] = (HASHSEED, *THREAD_KNOBS, *STRICT_FIXED, SOURCE_DATE_EPOCH, MODE_ENV)
# cuBLAS workspace settings that make its reductions repeatable.
CUBLAS_OK = (":4096:8", ":16:8")

# The seed is an input of a run, not of the environment it runs in: it is left
# out of the image (one image serves every seed) and out of the config
# comparisons that a seed group makes (a group varies the seed on purpose).
SEED_KEY = "determinism.seed"


def is_knob(name: str) -> bool:
    return name in KNOB_NAMES


def knob_env(mode: str, threads: int, source_date_epoch: int, overrides: Mapping[str, str]) -> dict[str, str]:
    """The knobs baked into the image for ``mode``; ``overrides`` (hermetic.yaml determinism.env) win."""
    if mode not in MODES:
        raise ValueError(f"unknown determinism mode {mode!r} (one of {', '.join(MODES)})")
    env: dict[str, str] = {MODE_ENV: mode}
    if mode in ("strict", "statistical"):
        env[HASHSEED] = "0"
        env.update({name: str(threads) for name in THREAD_KNOBS})
    if mode == "strict":
        env.update(STRICT_FIXED)
        env[SOURCE_DATE_EPOCH] = str(source_date_epoch)
    env.update(overrides)
    return env


def identity_part(mode: str, threads: int, overrides: Mapping[str, str]) -> dict[str, Any]:
    """What of hermetic.yaml's ``determinism:`` decides the image: everything but the seed."""
    return {"mode": mode, "threads": threads, "env": dict(overrides)}


def without_seed(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config (as recorded) minus ``determinism.seed``."""
    det = config.get("determinism")
    if isinstance(det, dict) and "seed" in det:
        return {**config, "determinism": {k: v for k, v in det.items() if k != "seed"}}
    return dict(config)


def env_knobs_not_set(env: Mapping[str, str]) -> list[str]:
    """The environment knobs a run lacked: a repeatable cuBLAS workspace, a numeric
    PYTHONHASHSEED (set before the interpreter starts), the thread counts, and a fixed
    SOURCE_DATE_EPOCH (matplotlib stamps a PDF's CreationDate with now otherwise)."""
    missing = []
    if env.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_OK:
        missing.append("CUBLAS_WORKSPACE_CONFIG")
    if not str(env.get(HASHSEED, "")).isdigit():
        missing.append(HASHSEED)
    missing += [v for v in THREAD_KNOBS if not env.get(v)]
    if not str(env.get(SOURCE_DATE_EPOCH, "")).isdigit():
        missing.append(SOURCE_DATE_EPOCH)
    return missing
