"""Which build of torch a lock holds: the CPU wheel, or the CUDA build with its ``nvidia-*`` wheels (gigabytes
a machine without a GPU never uses); ``hermetic lock`` says which (README, "CPU torch"), and a torchvision or
torchaudio built for the other torch is warned about. Pure: names and versions in, one sentence out."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from hermetic.lock.model import Lock

# CUDA 12 wheels are suffixed (nvidia-cublas-cu12); CUDA 13's are not (nvidia-cublas 13.x).
_CUDA_SUFFIX = re.compile(r"-cu(\d+)$")
_RUNTIMES = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")


@dataclass(frozen=True)
class TorchBuild:
    version: str  # as locked: 2.13.0, 2.13.0+cpu, 2.6.0+cu124
    kind: str  # "cpu" | "cuda" | "rocm" | "unknown"
    cuda_major: int | None  # CUDA major version of the wheels, when kind == "cuda" and known
    nvidia_wheels: int  # how many nvidia-* packages the lock holds

    def sentence(self) -> str:
        """One line for ``hermetic lock`` to print."""
        if self.kind == "cpu":
            return f"torch {self.version}: the CPU build (no CUDA wheels)"
        if self.kind == "cuda":
            cuda = f"CUDA {self.cuda_major}" if self.cuda_major else "CUDA"
            plural = "s" if self.nvidia_wheels != 1 else ""
            return (f"torch {self.version}: the {cuda} build, with {self.nvidia_wheels} nvidia-* wheel{plural} (an image of "
                    f"several GB that needs a GPU to use them); without a GPU, pin the CPU build "
                    f"(torch=={_public(self.version)}+cpu) and lock again")
        if self.kind == "rocm":
            return f"torch {self.version}: the ROCm build"
        return f"torch {self.version}"

    def to_json(self) -> dict[str, object]:
        return {"version": self.version, "kind": self.kind, "cuda_major": self.cuda_major,
                "nvidia_wheels": self.nvidia_wheels}


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+")[0]


COMPANIONS = ("torchvision", "torchaudio")  # built against one torch build each, with native extensions


def mismatched_companions(lock: Lock, torch: TorchBuild | None) -> list[str]:
    """Warnings for torchvision/torchaudio built for another torch than the one locked: PyPI's Linux
    torchvision is a CUDA build (its _C.so needs libtorch_cuda), so beside torch+cpu it does not import
    (``operator torchvision::nms does not exist``); a ``+cpu`` one beside the CUDA torch lacks its ops."""
    if torch is None or torch.kind not in ("cpu", "cuda"):
        return []
    out = []
    for name in COMPANIONS:
        w = lock.by_name().get(name)
        if w is None:
            continue
        local = w.version.partition("+")[2].lower()
        cpu = local == "cpu" or local.startswith("cpu.")
        if torch.kind == "cpu" and not cpu:
            out.append(f"{name} {w.version} is a CUDA build (PyPI's Linux wheels are), but torch {torch.version} is the "
                       f"CPU build: it will not import; pin {name}=={_public(w.version)}+cpu from the index torch's "
                       "+cpu wheel comes from (--extra-index-url https://download.pytorch.org/whl/cpu)")
        elif torch.kind == "cuda" and cpu:
            out.append(f"{name} {w.version} is a CPU build, but torch {torch.version} is the CUDA build: pin the "
                       f"matching {name} without +cpu")
    return out


def companion_warnings(lock: Lock) -> list[str]:
    """mismatched_companions for the torch build ``lock`` holds: what ``hermetic lock``, ``build`` and ``run``
    each warn about (a run goes on: a script that never imports torchvision works)."""
    return mismatched_companions(lock, torch_build(lock))


def torch_build(lock: Lock) -> TorchBuild | None:
    """The torch build the lock holds, or None when it holds no torch."""
    wheels = lock.by_name()
    torch = wheels.get("torch")
    if torch is None:
        return None
    nvidia = [w for name, w in wheels.items() if name.startswith("nvidia-")]
    local = torch.version.partition("+")[2].lower()
    cuda_major: int | None = None
    if local.startswith("cu") and local[2:].isdigit():  # +cu124: 12; +cu130: 13
        kind, cuda_major = "cuda", int(local[2:-1] or 0) or None
    elif local == "cpu" or local.startswith("cpu."):
        kind = "cpu"
    elif local.startswith("rocm"):
        kind = "rocm"
    elif nvidia:  # PyPI's Linux torch: no local version, its CUDA in the nvidia-* wheels it requires
        kind = "cuda"
    elif not local:
        kind = "cpu"  # no nvidia-* wheel beside a plain torch: it cannot use CUDA (e.g. macOS-style wheels)
    else:
        kind = "unknown"
    if kind == "cuda" and cuda_major is None:
        for name in _RUNTIMES:
            w = wheels.get(name)
            if w is not None:
                m = _CUDA_SUFFIX.search(name)
                try:
                    cuda_major = int(m.group(1)) if m else Version(w.version).major
                except InvalidVersion:
                    pass
                break
    return TorchBuild(torch.version, kind, cuda_major, len(nvidia))
