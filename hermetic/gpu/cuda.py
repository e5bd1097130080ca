"""Which CUDA a lock pins: read from the locked nvidia-* wheels, never guessed.

Suffixed wheels (``nvidia-cuda-runtime-cu12==12.8.90``: CUDA 12 and older) or the cuda-toolkit
metapackage's unsuffixed ones (CUDA 13); the image's CUDA line is the runtime wheel's MAJOR.MINOR. torch's
local tag (``+cu128``) is checked against it in hermetic.gpu.wheels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Union

# packaging and the lock's model are imported only where a lock's wheels are read: a run reads its image's
# labels only (cuda_info_from_labels), beside its container's start
if TYPE_CHECKING:
    from hermetic.lock.model import LockedWheel, ResolvedWheel

SCHEME_SUFFIXED = "cu{major}-suffixed"  # "cu12-suffixed", "cu11-suffixed"
SCHEME_TOOLKIT = "cuda-toolkit-unsuffixed"
SCHEME_MIXED = "mixed"  # suffixed and unsuffixed runtimes in one lock: a broken resolution
SCHEME_NONE = "none"

# nvidia-<component>[-cuNN] distributions that carry CUDA libraries.
CUDA_COMPONENTS = frozenset({
    "cuda-runtime", "cuda-nvrtc", "cuda-cupti", "cuda-nvcc", "cuda-cccl", "cuda-crt", "cuda-culibos",
    "cuda-cuxxfilt", "cuda-opencl", "cuda-profiler-api", "cuda-sanitizer-api", "cublas", "cudnn", "cufft",
    "cufile", "curand", "cusolver", "cusparse", "cusparselt", "nccl", "nvtx", "nvjitlink", "nvshmem", "nvvm",
    "npp", "nvjpeg", "nvfatbin", "nvml-dev", "nvptxcompiler",
})
_NVIDIA_NAME = re.compile(r"^nvidia-(?P<component>[a-z0-9-]+?)(?:-cu(?P<cu>\d+))?$")

# CudaInfo field -> image label key
LABELS = {
    "scheme": "org.hermetic.cuda.scheme",
    "cuda_version": "org.hermetic.cuda.version",
    "runtime": "org.hermetic.cuda.runtime",
    "toolkit": "org.hermetic.cuda.toolkit",
    "cudnn": "org.hermetic.cudnn",
    "cublas": "org.hermetic.cublas",
    "nccl": "org.hermetic.nccl",
    "nvrtc": "org.hermetic.nvrtc",
    "torch": "org.hermetic.torch.version",
    "torch_variant": "org.hermetic.torch.variant",
}


@dataclass(frozen=True)
class CudaWheel:
    """One nvidia-* CUDA wheel: ``nvidia-cudnn-cu12`` -> component cudnn, suffix 12."""

    name: str
    version: str
    component: str
    suffix_major: int | None  # the NN of -cuNN; None when unsuffixed


@dataclass(frozen=True)
class CudaInfo:
    scheme: str
    runtime: str | None = None  # nvidia-cuda-runtime[-cuNN] version, e.g. "12.8.90"
    cudnn: str | None = None
    cublas: str | None = None
    nccl: str | None = None
    nvrtc: str | None = None
    toolkit: str | None = None  # cuda-toolkit metapackage version, e.g. "13.0.2"
    torch: str | None = None  # torch version as locked, e.g. "2.9.1+cu128"
    torch_variant: str | None = None  # "cu128" | "cpu" | "rocm6.2"; None for PyPI torch (no local tag)
    wheels: tuple[CudaWheel, ...] = field(default=(), compare=False)

    @property
    def cuda_version(self) -> str | None:
        """MAJOR.MINOR of the CUDA the wheels carry ("12.8"); None without CUDA wheels."""
        mm = major_minor(self.runtime) or major_minor(self.toolkit)
        return f"{mm[0]}.{mm[1]}" if mm else None

    @property
    def has_cuda_wheels(self) -> bool:
        return bool(self.wheels) or self.runtime is not None

    @property
    def variant_cuda(self) -> tuple[int, int] | None:
        """The CUDA version torch's local tag claims: "cu128" -> (12, 8)."""
        return variant_cuda_version(self.torch_variant)


def major_minor(version: str | None) -> tuple[int, int] | None:
    """ "12.8.90" -> (12, 8); None for None or an unparsable string."""
    if not version:
        return None
    m = re.match(r"^(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def variant_cuda_version(variant: str | None) -> tuple[int, int] | None:
    """ "cu128" -> (12, 8), "cu118" -> (11, 8), "cu130" -> (13, 0); None otherwise.

    PyTorch spells the CUDA version as major digits then ONE minor digit.
    """
    m = re.match(r"^cu(\d+)(\d)$", variant or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_variant(version: str) -> str | None:
    """ "2.9.1+cu128" -> "cu128"; "2.9.1+cpu" -> "cpu"; "2.9.1" -> None (PyPI)."""
    from packaging.version import InvalidVersion, Version

    try:
        local = Version(version).local
    except InvalidVersion:
        local = version.partition("+")[2] or None
    return str(local) if local else None


def cuda_wheel(name: str, version: str) -> CudaWheel | None:
    from packaging.utils import canonicalize_name

    m = _NVIDIA_NAME.match(canonicalize_name(name))
    if not m or m.group("component") not in CUDA_COMPONENTS:
        return None
    cu = m.group("cu")
    return CudaWheel(canonicalize_name(name), version, m.group("component"), int(cu) if cu else None)


Pin = Union["LockedWheel", "ResolvedWheel", str, tuple[str, str]]


def _name_version(pin: Pin) -> tuple[str, str] | None:
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    from hermetic.lock.model import LockedWheel, ResolvedWheel

    if isinstance(pin, LockedWheel):
        return pin.name, pin.version
    if isinstance(pin, ResolvedWheel):
        return pin.locked.name, pin.locked.version
    if isinstance(pin, tuple):
        return canonicalize_name(pin[0]), str(pin[1])
    try:  # a wheel filename
        name, version, _, _ = parse_wheel_filename(pin)
    except InvalidWheelFilename:
        return None
    return str(name), str(version)


def cuda_info(pins: Iterable[Pin]) -> CudaInfo:
    """The CUDA a lock pins, from its wheels (LockedWheel, ResolvedWheel,
    wheel filenames or (name, version) pairs; mixed freely)."""
    versions: dict[str, str] = {}
    for pin in pins:
        nv = _name_version(pin)
        if nv is not None:
            versions[nv[0]] = nv[1]
    wheels = tuple(sorted((w for w in (cuda_wheel(n, v) for n, v in versions.items()) if w), key=lambda w: w.name))

    def component(comp: str) -> CudaWheel | None:
        found = [w for w in wheels if w.component == comp]
        # Prefer the suffix that matches the runtime's family; then any.
        found.sort(key=lambda w: (w.suffix_major is None, -(w.suffix_major or 0)))
        return found[0] if found else None

    runtimes = [w for w in wheels if w.component == "cuda-runtime"]
    suffixes = {w.suffix_major for w in runtimes}
    if not runtimes:
        scheme = SCHEME_TOOLKIT if "cuda-toolkit" in versions else SCHEME_NONE
    elif len(suffixes) > 1:
        scheme = SCHEME_MIXED
    elif None in suffixes:
        scheme = SCHEME_TOOLKIT
    else:
        scheme = SCHEME_SUFFIXED.format(major=next(iter(suffixes)))
    if scheme == SCHEME_NONE and wheels:
        # CUDA libraries without a runtime wheel (e.g. only nvidia-nvtx): name the family they carry.
        fams = {w.suffix_major for w in wheels}
        single = len(fams) == 1 and None not in fams
        scheme = SCHEME_SUFFIXED.format(major=next(iter(fams))) if single else SCHEME_TOOLKIT

    def version_of(comp: str) -> str | None:
        w = component(comp)
        return w.version if w else None

    torch_version = versions.get("torch")
    return CudaInfo(
        scheme=scheme,
        runtime=version_of("cuda-runtime"),
        cudnn=version_of("cudnn"),
        cublas=version_of("cublas"),
        nccl=version_of("nccl"),
        nvrtc=version_of("cuda-nvrtc"),
        toolkit=versions.get("cuda-toolkit"),
        torch=torch_version,
        torch_variant=torch_variant(torch_version) if torch_version else None,
        wheels=wheels,
    )


def image_labels(info: CudaInfo) -> dict[str, str]:
    """OCI config labels recording the pinned CUDA stack (only values that are present)."""
    return {key: str(getattr(info, attr)) for attr, key in LABELS.items() if getattr(info, attr)}


def cuda_info_from_labels(labels: dict[str, str] | None) -> CudaInfo:
    """The inverse of image_labels, for checks at run time (image config -> CudaInfo)."""
    labels = labels or {}
    kw = {attr: labels.get(key) for attr, key in LABELS.items() if attr != "cuda_version"}
    kw["scheme"] = kw.get("scheme") or SCHEME_NONE
    info = CudaInfo(**kw)  # type: ignore[arg-type]
    if info.runtime is None and info.toolkit is None and labels.get(LABELS["cuda_version"]):
        # An image labelled with only the MAJOR.MINOR still carries its CUDA line.
        info = CudaInfo(**{**kw, "runtime": labels[LABELS["cuda_version"]]})  # type: ignore[arg-type]
    return info
