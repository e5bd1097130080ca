"""Framework switches for repeatable numerics, by mode.

strict       torch.use_deterministic_algorithms(True) (an op with no
             deterministic implementation raises at once), cuDNN benchmark
             off and deterministic on, TF32 off for matmul and cuDNN,
             uninitialized memory filled (torch >= 2.1); warns on stderr
             when an env knob the image should carry is missing.
statistical  seeds only: deterministic algorithms off, so the fast,
             nondeterministic kernels are allowed and reruns agree in
             distribution, not in bits.
off          nothing is touched; the run record says so.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import _optional
from ._onimport import after_import
from ._env import STRICT_ENV_EXPECTED, resolve_mode
from ._io import warn
from .report import record

# torch's documented value (docs: "Reproducibility"); needed by CUDA >= 10.2
# cuBLAS for deterministic results, harmless without a GPU.
CUBLAS_WORKSPACE_DEFAULT = ":4096:8"

# torch's flags as the last enable_determinism() left them, to tell at exit what the script changed after.
_flags_at_enable: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class DeterminismResult:
    mode: str
    source: str  # "argument", "env:HERMETIC_DETERMINISM" or "default"
    torch: Dict[str, Any] = field(default_factory=dict)  # flags as read back after setting
    env_missing: Tuple[str, ...] = ()
    env_set_in_process: Dict[str, str] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()


def enable_determinism(mode: Optional[str] = None) -> DeterminismResult:
    """Apply ``mode`` (strict | statistical | off; default $HERMETIC_DETERMINISM,
    else strict) and record the flags in the runtime report.

    Call it before building models and before any CUDA work: cuBLAS reads
    CUBLAS_WORKSPACE_CONFIG when it creates its handle.
    """
    value, source = resolve_mode(mode)
    warnings: List[str] = []
    env_missing: List[str] = []
    env_set: Dict[str, str] = {}
    torch = _optional.torch()

    if value == "strict":
        for name in STRICT_ENV_EXPECTED:
            if name not in os.environ:
                env_missing.append(name)
        if "CUBLAS_WORKSPACE_CONFIG" in env_missing:
            too_late = torch is not None and _cuda_initialized(torch)
            if too_late:
                msg = ("CUBLAS_WORKSPACE_CONFIG is not set and CUDA is already initialized: "
                       "cuBLAS results may vary; set it in the image or before any CUDA work")
            else:
                os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_DEFAULT
                env_set["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_DEFAULT
                msg = (f"CUBLAS_WORKSPACE_CONFIG is not set (the image should carry it); "
                       f"set it in-process to {CUBLAS_WORKSPACE_DEFAULT}")
            warnings.append(msg)
        if "PYTHONHASHSEED" in env_missing:
            warnings.append("PYTHONHASHSEED is not set: str/bytes hashes (set iteration order) differ "
                            "between processes; it only works when set before Python starts")
        if "OMP_NUM_THREADS" in env_missing:
            warnings.append("OMP_NUM_THREADS is not set: CPU reductions split work by thread count, "
                            "so results can differ between machines with different core counts")
        for msg in warnings:
            warn(msg)

    flags: Dict[str, Any] = {}
    if torch is not None:
        if value == "strict":
            _torch_strict(torch)
        elif value == "statistical":
            # Fast kernels allowed, even if an earlier call turned strict on.
            use_deterministic_algorithms(torch, False)
            torch.backends.cudnn.deterministic = False
        flags = torch_flags(torch)

    global _flags_at_enable
    _flags_at_enable = dict(flags) if torch is not None else None
    result = DeterminismResult(
        mode=value, source=source, torch=flags, env_missing=tuple(env_missing),
        env_set_in_process=env_set, warnings=tuple(warnings),
    )
    record(determinism={
        "mode": value, "source": source, "torch": flags, "env_missing": list(env_missing),
        "env_set_in_process": env_set, "warnings": list(warnings),
    })
    return result


def _cuda_initialized(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a CPU build without the call
        return False


def _new_precision_api(torch: Any) -> bool:
    # torch >= 2.9: fp32_precision replaces allow_tf32; mixing the two APIs
    # makes the legacy getters raise, so use one or the other.
    return hasattr(torch.backends, "fp32_precision") and hasattr(torch.backends.cuda.matmul, "fp32_precision")


# What torch.use_deterministic_algorithms does in recent torch (2.13 here; its code's names, exactly):
# TorchInductor's `deterministic` flag, for which it imports torch._inductor.config (and torch._dynamo with
# it), then the C flag. The import is ~1.1 s of CPU at every start (torch 2.13 on the CPU: as much as
# `import torch`) for scripts that never compile.
_TORCH_UDA_NAMES = ("torch._inductor.config", "_inductor", "config", "deterministic", "_C",
                    "_set_deterministic_algorithms")
INDUCTOR_CONFIG = "torch._inductor.config"


def use_deterministic_algorithms(torch: Any, mode: bool) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=False)``, with TorchInductor's flag set when its
    config is first imported (by torch.compile, say) rather than now.

    Only where torch's function is the one known (its code names exactly the two flags): the C flag is set
    now, and the inductor flag to ``mode`` when its module is executed: what torch's function would have
    left there (a later call of it imports the module first, so its own value wins; the C flag alone, as
    torch.set_deterministic_debug_mode sets it, never touched inductor's). Any other torch (older: no
    inductor flag; a newer one that does more) gets torch's own function."""
    fn = torch.use_deterministic_algorithms
    code = getattr(fn, "__code__", None)
    if code is None or tuple(code.co_names) != _TORCH_UDA_NAMES or INDUCTOR_CONFIG in sys.modules:
        fn(mode, warn_only=False)
        return
    torch._C._set_deterministic_algorithms(mode, warn_only=False)
    after_import(INDUCTOR_CONFIG, lambda config, mode=bool(mode): setattr(config, "deterministic", mode))


def _torch_strict(torch: Any) -> None:
    use_deterministic_algorithms(torch, True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    deterministic_mod = getattr(getattr(torch, "utils", None), "deterministic", None)
    if deterministic_mod is not None and hasattr(deterministic_mod, "fill_uninitialized_memory"):
        # torch >= 2.1: torch.empty() and friends fill memory with a known value (NaN / max int), so a
        # kernel that reads memory it never wrote reads the same bits every run (its default; set, not assumed).
        deterministic_mod.fill_uninitialized_memory = True
    if _new_precision_api(torch):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"  # conv and rnn
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def changed_since_enable(flags_now: Dict[str, Any]) -> Optional[Dict[str, List[Any]]]:
    """{flag: [as enable_determinism() set it, as it is now]} for the flags that changed since;
    None when enable_determinism() was never called with torch present."""
    if _flags_at_enable is None:
        return None
    return {k: [_flags_at_enable.get(k), v] for k, v in sorted(flags_now.items()) if _flags_at_enable.get(k) != v}


def torch_flags(torch: Any) -> Dict[str, Any]:
    """The determinism-relevant torch settings, read back (not assumed)."""
    flags: Dict[str, Any] = {
        "use_deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn.deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "num_threads": int(torch.get_num_threads()),
        "num_interop_threads": int(torch.get_num_interop_threads()),
    }
    if _new_precision_api(torch):
        # Only the new getters: the legacy allow_tf32 getters raise once the
        # new API has set conv and rnn precision separately.
        flags["cuda.matmul.fp32_precision"] = str(torch.backends.cuda.matmul.fp32_precision)
        flags["cudnn.conv.fp32_precision"] = str(torch.backends.cudnn.conv.fp32_precision)
        flags["cudnn.rnn.fp32_precision"] = str(torch.backends.cudnn.rnn.fp32_precision)
    else:
        flags["cuda.matmul.allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        flags["cudnn.allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    deterministic_mod = getattr(getattr(torch, "utils", None), "deterministic", None)
    if deterministic_mod is not None and hasattr(deterministic_mod, "fill_uninitialized_memory"):
        flags["fill_uninitialized_memory"] = bool(deterministic_mod.fill_uninitialized_memory)
    return flags
