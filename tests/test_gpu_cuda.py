"""CUDA pins read from real locks (uv pip compile output against PyPI, tests/fixtures/locks/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermetic.gpu.cuda import (
    CudaInfo,
    cuda_info,
    cuda_info_from_labels,
    cuda_wheel,
    image_labels,
    torch_variant,
    variant_cuda_version,
)
from hermetic.lock.model import LockedWheel, ResolvedWheel, Target
from hermetic.lock.read import read_lock

LOCKS = Path(__file__).parent / "fixtures" / "locks"


def lock_wheels(name: str) -> tuple[LockedWheel, ...]:
    return read_lock(LOCKS / f"{name}.txt", Target()).wheels


def chosen_files(name: str) -> dict[str, dict]:
    return json.loads((LOCKS / f"{name}.wheels.json").read_text())


def test_small_cu12_lock():
    info = cuda_info(lock_wheels("cu12-small"))
    assert info.scheme == "cu12-suffixed"
    assert info.runtime == "12.8.90"
    assert info.cuda_version == "12.8"
    assert (info.cudnn, info.cublas, info.nccl, info.torch, info.torch_variant) == (None,) * 5
    assert [w.name for w in info.wheels] == ["nvidia-cuda-runtime-cu12", "nvidia-nvtx-cu12"]
    assert image_labels(info) == {
        "org.hermetic.cuda.scheme": "cu12-suffixed",
        "org.hermetic.cuda.version": "12.8",
        "org.hermetic.cuda.runtime": "12.8.90",
    }


def test_torch_291_suffixed_scheme():
    info = cuda_info(lock_wheels("torch-2.9.1-cu12"))
    assert info == CudaInfo(
        scheme="cu12-suffixed", runtime="12.8.90", cudnn="9.10.2.21", cublas="12.8.4.1", nccl="2.27.5",
        nvrtc="12.8.93", toolkit=None, torch="2.9.1", torch_variant=None,
    )
    assert info.cuda_version == "12.8"
    assert len(info.wheels) == 15  # every nvidia-*-cu12 that torch 2.9.1 requires on Linux x86_64
    assert {w.suffix_major for w in info.wheels} == {12}


def test_torch_2110_cuda_toolkit_scheme():
    info = cuda_info(lock_wheels("torch-2.11.0-cuda-toolkit"))
    assert info.scheme == "cuda-toolkit-unsuffixed"
    assert info.toolkit == "13.0.2"
    assert info.runtime == "13.0.96"
    assert info.cublas == "13.1.0.3"
    assert info.nvrtc == "13.0.88"
    assert info.cudnn == "9.19.0.56"  # nvidia-cudnn-cu13: still suffixed
    assert info.nccl == "2.28.9"  # nvidia-nccl-cu13
    assert info.cuda_version == "13.0"
    assert info.torch == "2.11.0" and info.torch_variant is None
    suffixed = sorted(w.name for w in info.wheels if w.suffix_major is not None)
    assert suffixed == ["nvidia-cudnn-cu13", "nvidia-cusparselt-cu13", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13"]


def test_filenames_and_resolved_wheels_give_the_same_answer_as_the_lock():
    files = chosen_files("torch-2.9.1-cu12")
    from_lock = cuda_info(lock_wheels("torch-2.9.1-cu12"))
    from_names = cuda_info(f["filename"] for f in files.values())
    by_name = {w.name: w for w in lock_wheels("torch-2.9.1-cu12")}
    resolved = [ResolvedWheel(by_name[n], f["filename"], f["sha256"]) for n, f in files.items()]
    assert cuda_info(resolved) == from_lock == from_names


def test_no_cuda_wheels():
    info = cuda_info([("numpy", "2.1.3"), ("torch", "2.13.0+cpu")])
    assert info.scheme == "none" and info.cuda_version is None
    assert info.torch_variant == "cpu"
    assert image_labels(info) == {"org.hermetic.cuda.scheme": "none", "org.hermetic.torch.version": "2.13.0+cpu",
                                  "org.hermetic.torch.variant": "cpu"}


def test_mixed_runtimes_are_flagged():
    info = cuda_info([("nvidia-cuda-runtime-cu12", "12.8.90"), ("nvidia-cuda-runtime", "13.0.96")])
    assert info.scheme == "mixed"


@pytest.mark.parametrize("version,variant,cuda", [
    ("2.9.1+cu128", "cu128", (12, 8)), ("2.9.1+cu126", "cu126", (12, 6)), ("2.0.1+cu118", "cu118", (11, 8)),
    ("2.9.0+cu130", "cu130", (13, 0)), ("2.9.1+cpu", "cpu", None), ("2.5.1+rocm6.2", "rocm6.2", None),
    ("2.9.1", None, None),
])
def test_torch_variants(version, variant, cuda):
    assert torch_variant(version) == variant
    assert variant_cuda_version(variant) == cuda


def test_cuda_wheel_names():
    assert cuda_wheel("nvidia_cudnn_cu12", "9.10.2.21").component == "cudnn"
    assert cuda_wheel("nvidia-cuda-runtime", "13.0.96").suffix_major is None
    assert cuda_wheel("nvidia-nccl-cu13", "2.28.9").suffix_major == 13
    assert cuda_wheel("nvidia-ml-py", "12.570.86") is None  # NVML bindings, not a CUDA library
    assert cuda_wheel("nvidia-dali-cuda120", "1.40.0") is None


def test_labels_round_trip():
    info = cuda_info(lock_wheels("torch-2.11.0-cuda-toolkit"))
    back = cuda_info_from_labels(image_labels(info))
    assert (back.runtime, back.cudnn, back.cublas, back.nccl, back.nvrtc, back.toolkit, back.torch, back.scheme) == \
        (info.runtime, info.cudnn, info.cublas, info.nccl, info.nvrtc, info.toolkit, info.torch, info.scheme)
    assert back.cuda_version == "13.0"
    assert cuda_info_from_labels({}).cuda_version is None
