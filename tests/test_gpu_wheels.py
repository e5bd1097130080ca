"""Build-time checks on real lock fixtures and real wheel file names (hermetic.gpu.wheels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermetic.core.errors import HermeticError
from hermetic.gpu.cuda import cuda_info
from hermetic.gpu.findings import failures, raise_for_failures, warnings
from hermetic.gpu.wheels import build_checks, check_glibc, check_python_abi, check_torch_cuda
from hermetic.lock.model import Target
from hermetic.lock.read import read_lock

LOCKS = Path(__file__).parent / "fixtures" / "locks"


def lock_info(name: str):
    return cuda_info(read_lock(LOCKS / f"{name}.txt", Target()).wheels)


def filenames(name: str) -> dict[str, str]:
    return {k: v["filename"] for k, v in json.loads((LOCKS / f"{name}.wheels.json").read_text()).items()}


# -- torch variant vs nvidia wheels ------------------------------------------------

@pytest.mark.parametrize("lock", ["torch-2.9.1-cu12", "torch-2.11.0-cuda-toolkit", "cu12-small"])
def test_real_locks_are_consistent(lock):
    assert check_torch_cuda(lock_info(lock)) == []


SMALL = [("nvidia-cuda-runtime-cu12", "12.8.90"), ("nvidia-nvtx-cu12", "12.8.90")]


def test_matching_local_variant_is_fine():
    assert check_torch_cuda(cuda_info(SMALL + [("torch", "2.9.1+cu128")])) == []


def test_variant_disagreeing_with_runtime_is_refused():
    (f,) = check_torch_cuda(cuda_info(SMALL + [("torch", "2.9.1+cu126")]))
    assert f.severity == "fail"
    assert f.message == ("torch 2.9.1+cu126 is built for CUDA 12.6, but the lock pins nvidia-cuda-runtime-cu12 "
                         "12.8.90 (CUDA 12.8)")


def test_cu13_variant_with_toolkit_runtime_is_fine():
    pins = [("cuda-toolkit", "13.0.2"), ("nvidia-cuda-runtime", "13.0.96"), ("torch", "2.9.0+cu130")]
    assert check_torch_cuda(cuda_info(pins)) == []


def test_cpu_torch_with_nvidia_wheels_warns():
    (f,) = check_torch_cuda(cuda_info(SMALL + [("torch", "2.9.1+cpu")]))
    assert f.severity == "warn"
    assert "torch 2.9.1+cpu is a CPU-only build, yet the lock pins 2 nvidia CUDA wheel(s)" in f.message


def test_cpu_torch_alone_is_fine():
    assert check_torch_cuda(cuda_info([("torch", "2.13.0+cpu"), ("numpy", "2.1.3")])) == []


def test_pypi_torch_without_nvidia_wheels_is_refused():
    (f,) = check_torch_cuda(cuda_info([("torch", "2.9.1"), ("numpy", "2.1.3")]))
    assert f.severity == "fail" and f.message.startswith("torch 2.9.1 (PyPI, a CUDA build on Linux) needs")


def test_variant_without_runtime_is_refused():
    (f,) = check_torch_cuda(cuda_info([("torch", "2.9.1+cu128")]))
    assert f.severity == "fail" and "pins no CUDA runtime wheel (nvidia-cuda-runtime-cu12)" in f.message


def test_cuda12_library_in_a_cuda13_lock_is_refused():
    pins = [("nvidia-cuda-runtime", "13.0.96"), ("nvidia-cudnn-cu12", "9.10.2.21"), ("torch", "2.11.0")]
    (f,) = check_torch_cuda(cuda_info(pins))
    assert f.check == "cuda-family" and f.severity == "fail"
    assert f.message == ("nvidia-cudnn-cu12 9.10.2.21 is built for CUDA 12, but the lock's runtime is "
                         "nvidia-cuda-runtime 13.0.96 (CUDA 13)")


def test_two_runtime_families_are_refused():
    info = cuda_info([("nvidia-cuda-runtime-cu12", "12.8.90"), ("nvidia-cuda-runtime", "13.0.96")])
    assert any(f.check == "cuda-family" and "two families" in f.message for f in failures(check_torch_cuda(info)))


def test_rocm_torch_with_nvidia_wheels_warns():
    (f,) = check_torch_cuda(cuda_info(SMALL + [("torch", "2.5.1+rocm6.2")]))
    assert f.severity == "warn" and "ROCm" in f.message


# -- glibc / manylinux --------------------------------------------------------------

def test_torch_291_wheels_fit_bookworm_and_python_311():
    names = filenames("torch-2.9.1-cu12")
    assert build_checks(lock_info("torch-2.9.1-cu12"), names.values(), glibc=(2, 36), python_version="3.11") == []


def test_torch_2110_wheels_fit_ubuntu_2404():
    names = filenames("torch-2.11.0-cuda-toolkit")
    assert build_checks(lock_info("torch-2.11.0-cuda-toolkit"), names.values(), glibc=(2, 39),
                        python_version="3.11") == []


def test_old_glibc_refuses_exactly_the_wheels_above_it():
    names = filenames("torch-2.9.1-cu12")
    found = check_glibc(names.values(), (2, 17))
    assert all(f.severity == "fail" for f in found)
    refused = sorted(f.message.split()[0] for f in found)
    # the lowest tag of each wheel is its floor: manylinux2014 (2.17) wheels pass, 2_27/2_28 ones do not
    assert refused == ["nvidia-cublas-cu12", "nvidia-cudnn-cu12", "nvidia-curand-cu12", "nvidia-cusolver-cu12",
                       "torch", "triton"]
    torch = next(f for f in found if f.message.startswith("torch "))
    assert torch.message == ("torch 2.9.1 (torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl) needs glibc >= 2.28, "
                             "the base has glibc 2.17")


@pytest.mark.parametrize("filename,glibc,ok", [
    ("nvidia_nvtx_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (2, 17), True),
    ("nvidia_nvtx-13.0.85-py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl", (2, 5), True),
    ("nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl", (2, 11), False),
    ("pynacl-1.6.2-cp38-abi3-manylinux_2_34_x86_64.whl", (2, 36), True),
    ("pynacl-1.6.2-cp38-abi3-manylinux_2_34_x86_64.whl", (2, 28), False),
    ("numpy-2.4.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", (2, 27), True),
    ("filelock-4.3.1-py3-none-any.whl", (2, 5), True),
])
def test_manylinux_levels(filename, glibc, ok):
    assert (check_glibc([filename], glibc) == []) is ok


def test_musl_base_refuses_manylinux_but_not_pure_python():
    found = check_glibc(["torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl", "filelock-4.3.1-py3-none-any.whl"],
                        None, libc="musl")
    (f,) = found
    assert f.message == ("torch 2.9.1 (torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl) needs glibc (manylinux), "
                         "but the base has musl libc")


def test_musllinux_wheel_on_glibc_base_is_refused():
    (f,) = check_glibc(["numpy-2.1.3-cp311-cp311-musllinux_1_2_x86_64.whl"], (2, 36))
    assert f.severity == "fail" and "is a musllinux wheel, the base has glibc" in f.message


def test_wrong_architecture_is_refused():
    (f,) = check_glibc(["numpy-2.1.3-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"], (2, 36))
    assert f.message.endswith("is built for aarch64, the image is x86_64")


def test_plain_linux_tag_warns_and_unknown_glibc_warns():
    (f,) = check_glibc(["thing-1.0-cp311-cp311-linux_x86_64.whl"], (2, 36))
    assert f.severity == "warn"
    (g,) = check_glibc(["torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl"], None, libc="unknown")
    assert g.severity == "warn" and "glibc version is unknown" in g.message


# -- Python ABI -------------------------------------------------------------------

def test_cp311_wheels_refused_on_python_312():
    names = filenames("torch-2.9.1-cu12")
    found = check_python_abi(names.values(), "3.12")
    assert sorted(f.message.split()[0] for f in found) == ["markupsafe", "torch", "triton"]
    torch = next(f for f in found if f.message.startswith("torch "))
    assert torch.message == ("torch 2.9.1 (torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl) is for cp311-cp311; "
                             "the image's Python is CPython 3.12 (cp312)")


@pytest.mark.parametrize("filename,python,ok", [
    ("opencv_python-4.14.0.94-cp37-abi3-manylinux_2_28_x86_64.whl", "3.11", True),
    ("pyogrio-0.13.0-cp311-abi3-manylinux_2_28_x86_64.whl", "3.10", False),  # abi3 from 3.11 up
    ("multiprocess-0.70.19-py311-none-any.whl", "3.11", True),
    ("multiprocess-0.70.19-py311-none-any.whl", "3.12", True),  # pip accepts older py3X tags too
    ("multiprocess-0.70.19-py312-none-any.whl", "3.11", False),
    ("cuda_toolkit-13.0.2-py2.py3-none-any.whl", "3.11", True),
    ("numpy-2.1.3-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", False),
    ("thing-1.0-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl", "3.10", False),
])
def test_python_abi_tags(filename, python, ok):
    assert (check_python_abi([filename], python) == []) is ok


def test_raise_for_failures_names_the_first_and_counts_the_rest():
    found = check_python_abi(filenames("torch-2.9.1-cu12").values(), "3.12")
    with pytest.raises(HermeticError) as e:
        raise_for_failures(found)
    assert str(e.value).startswith("markupsafe 3.0.4 (")
    assert e.value.hint.startswith("2 more check(s) failed: ")
    raise_for_failures(warnings(found))  # warnings never raise
