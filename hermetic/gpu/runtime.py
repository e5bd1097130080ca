"""Run-time checks (pure), from the probe's JSON (taken inside the container) and the image's labels.

``check_driver``: the host driver's CUDA covers the image's runtime (an older minor warns, ``strict``
refuses; an older major refuses). ``check_arch``: torch has kernels for each GPU (``sm_XY`` or a lower
minor of the same major; PTX at or below the capability warns: JIT). docs/gpu.md has the reasons.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from hermetic.gpu.cuda import CudaInfo, cuda_info_from_labels, major_minor
from hermetic.gpu.findings import Finding


def _gpus(probe: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((probe or {}).get("hardware") or {}).get("gpus") or [])


def _gpu_label(g: dict[str, Any]) -> str:
    return f"GPU {g.get('index')} ({g.get('name') or 'unknown model'})"


def check_driver(probe: dict[str, Any], labels: dict[str, str] | CudaInfo | None, *,
                 strict: bool = False) -> list[Finding]:
    """The host driver must support the image's CUDA runtime."""
    info = labels if isinstance(labels, CudaInfo) else cuda_info_from_labels(labels)
    runtime = major_minor(info.runtime) or major_minor(info.toolkit)
    if runtime is None:
        return []
    rt = f"{runtime[0]}.{runtime[1]}"
    gpus = _gpus(probe)
    if not gpus:
        return [Finding("driver", "warn",
                        f"the image carries CUDA {rt} but no GPU is visible in the container (hardware.gpu_note)")]
    out: list[Finding] = []
    seen: set[str] = set()
    for g in gpus:
        drv_cuda = g.get("cuda_driver_version")
        key = f"{drv_cuda}/{g.get('driver_version')}"
        if key in seen:
            continue
        seen.add(key)
        drv = major_minor(drv_cuda)
        driver = f"driver {g.get('driver_version') or '?'}"
        if drv is None:
            out.append(Finding("driver", "warn", f"{driver}: CUDA version unknown; cannot check it covers CUDA {rt}"))
        elif drv[0] < runtime[0] or (strict and drv < runtime):
            out.append(Finding(
                "driver", "fail",
                f"host {driver} supports CUDA up to {drv_cuda}, the image's CUDA runtime is {rt}: "
                f"upgrade the host driver"))
        elif drv < runtime:
            out.append(Finding(
                "driver", "warn",
                f"host {driver} supports CUDA up to {drv_cuda}, older than the image's CUDA runtime {rt}: "
                f"runs by minor-version compatibility (no PTX JIT of newer PTX); upgrade the driver to be safe"))
    return out


_ARCH = re.compile(r"^(?P<kind>sm|compute)_(?P<num>\d+)(?P<suffix>[af]?)$")


def _split_cc(num: str) -> tuple[int, int]:
    return int(num[:-1]), int(num[-1])  # "90" -> (9, 0), "120" -> (12, 0)


def arch_support(cc: tuple[int, int], arch_list: Iterable[str]) -> tuple[str, str | None]:
    """("sass", arch) | ("ptx", arch) | ("none", None) for a GPU of capability cc."""
    best_ptx: tuple[int, int] | None = None
    ptx_name = None
    for arch in arch_list:
        m = _ARCH.match(arch)
        if not m:
            continue
        a = _split_cc(m.group("num"))
        suffix = m.group("suffix")
        if m.group("kind") == "sm":
            if suffix == "a" and a == cc:
                return "sass", arch
            if suffix != "a" and a[0] == cc[0] and a[1] <= cc[1]:
                return "sass", arch
        elif a <= cc and (best_ptx is None or a > best_ptx):
            best_ptx, ptx_name = a, arch
    if ptx_name:
        return "ptx", ptx_name
    return "none", None


def check_arch(probe: dict[str, Any]) -> list[Finding]:
    """torch must have kernels for every visible GPU."""
    torch = ((probe or {}).get("software") or {}).get("torch")
    gpus = _gpus(probe)
    if not torch or not gpus:
        return []
    version = torch.get("version") or "?"
    if not torch.get("cuda"):
        return [Finding("arch", "warn",
                        f"torch {version} is not a CUDA build; the {len(gpus)} GPU(s) will not be used")]
    arch_list = torch.get("arch_list") or []
    if not arch_list:
        return [Finding("arch", "warn", f"torch {version}: arch list unknown; GPU kernels not checked")]
    out: list[Finding] = []
    for g in gpus:
        cc = major_minor(g.get("compute_capability"))
        if cc is None:
            out.append(Finding("arch", "warn", f"{_gpu_label(g)}: compute capability unknown; kernels not checked"))
            continue
        kind, arch = arch_support(cc, arch_list)
        sm = f"sm_{cc[0]}{cc[1]}"
        if kind == "ptx":
            out.append(Finding(
                "arch", "warn",
                f"{_gpu_label(g)}, compute capability {cc[0]}.{cc[1]}: torch {version} has no {sm} kernels, "
                f"runs by JIT from {arch} PTX (machine code then depends on the driver version)"))
        elif kind == "none":
            out.append(Finding(
                "arch", "fail",
                f"{_gpu_label(g)}, compute capability {cc[0]}.{cc[1]}: torch {version} has no {sm} "
                f"(arch list: {' '.join(arch_list)})"))
    return out


def run_checks(probe: dict[str, Any], labels: dict[str, str] | None, *, strict: bool = False) -> list[Finding]:
    return check_driver(probe, labels, strict=strict) + check_arch(probe)
