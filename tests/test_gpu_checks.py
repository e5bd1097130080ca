"""Build and run compatibility checks, on real lock fixtures, real wheel file names,
this machine's own root filesystem, and probe fixtures (tests/fixtures/probes/)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from hermetic.errors import HermeticError
from hermetic.gpu.checks import (
    arch_support,
    build_checks,
    check_arch,
    check_driver,
    check_glibc,
    check_python_abi,
    check_torch_cuda,
    compare_hardware,
    detect_libc,
    failures,
    glibc_from_rootfs,
    raise_for_failures,
    run_checks,
    warnings,
)
from hermetic.gpu.cuda import cuda_info, image_labels
from hermetic.lock.model import Target
from hermetic.lock.read import read_lock

from test_probe import assert_shape

FIXTURES = Path(__file__).parent / "fixtures"
LOCKS = FIXTURES / "locks"
PROBES = FIXTURES / "probes"


def lock_info(name: str):
    return cuda_info(read_lock(LOCKS / f"{name}.txt", Target()).wheels)


def filenames(name: str) -> dict[str, str]:
    return {k: v["filename"] for k, v in json.loads((LOCKS / f"{name}.wheels.json").read_text()).items()}


def probe(name: str) -> dict:
    return json.loads((PROBES / f"{name}.json").read_text())


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


# -- the base image's glibc ---------------------------------------------------------

def host_read_file(hide: tuple[str, ...] = ()):
    def read(path: str) -> bytes | None:
        if path in hide or any(path.startswith(h.rstrip("/") + "/") for h in hide):
            return None
        p = Path(path)
        return p.read_bytes() if p.is_file() else None
    return read


def host_glibc() -> tuple[int, int] | None:
    try:
        conf = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    if not conf.startswith("glibc "):
        return None
    major, minor = conf.split()[1].split(".")[:2]
    return int(major), int(minor)


needs_glibc_host = pytest.mark.skipif(host_glibc() is None, reason="this host is not a glibc system")


@needs_glibc_host
@pytest.mark.skipif(not Path("/var/lib/dpkg/status").is_file(), reason="not a dpkg system")
def test_glibc_of_this_machine_from_dpkg_status():
    info = detect_libc(host_read_file())
    assert info.kind == "glibc" and info.source == "/var/lib/dpkg/status (libc6)"
    assert info.version == host_glibc()


@needs_glibc_host
def test_glibc_of_this_machine_from_libc_so_when_dpkg_is_absent():
    info = detect_libc(host_read_file(hide=("/var/lib/dpkg",)))
    assert info.kind == "glibc" and info.source.endswith("libc.so.6")
    assert info.version == host_glibc()


@needs_glibc_host
def test_glibc_of_this_machine_from_ld_so_when_only_the_loader_is_readable():
    from hermetic.gpu.checks import _LIBC_SO

    info = detect_libc(host_read_file(hide=("/var/lib/dpkg",) + _LIBC_SO))
    if info.kind == "unknown":
        pytest.skip("this host's loader is not at a path we look at")
    assert "ld-linux" in info.source and info.version == host_glibc()


def test_distroless_and_ubuntu_dpkg_status():
    status = (b"Package: tzdata\nStatus: install ok installed\nVersion: 2024a-0+deb12u1\n\n"
              b"Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.39-0ubuntu8.3\n"
              b"Description: GNU C Library: Shared libraries\n Contains the standard libraries.\n")
    assert glibc_from_rootfs({"/var/lib/dpkg/status": status}.get) == (2, 39)
    distroless = b"Package: libc6\nVersion: 2.36-9+deb12u7\nArchitecture: amd64\n"
    assert glibc_from_rootfs({"/var/lib/dpkg/status.d/libc6": distroless}.get) == (2, 36)


def test_alpine_is_musl_with_a_reason():
    files = {"/etc/alpine-release": b"3.20.3\n", "/etc/os-release": b'PRETTY_NAME="Alpine Linux v3.20"\n'}
    info = detect_libc(files.get)
    assert glibc_from_rootfs(files.get) is None
    assert info.kind == "musl" and "Alpine 3.20.3" in info.reason and "need glibc" in info.reason


def test_empty_rootfs_is_unknown():
    info = detect_libc(lambda _p: None)
    assert info.kind == "unknown" and info.version is None and info.reason


# -- run checks on probe fixtures -----------------------------------------------------

def labels(lock: str) -> dict[str, str]:
    return image_labels(lock_info(lock))


def test_probe_fixtures_have_the_probe_shape_and_say_where_they_came_from():
    names = sorted(p.stem for p in PROBES.glob("*.json"))
    assert "no-gpu-container" in names and len(names) >= 5
    for name in names:
        doc = probe(name)
        source = doc.pop("_source")
        if name == "no-gpu-container":
            assert source.startswith("recorded")
        else:
            assert "hand-written from public specifications" in source and "NOT recorded" in source
        assert_shape(doc)


def test_h100_with_cuda_128_driver_runs_torch_291():
    p = probe("h100-sxm5-80gb")
    assert run_checks(p, labels("torch-2.9.1-cu12")) == []


def test_driver_one_minor_behind_warns_and_strict_refuses():
    p = probe("rtx4090")  # driver 550.54.15 -> CUDA 12.4
    (f,) = check_driver(p, labels("torch-2.9.1-cu12"))
    assert f.severity == "warn"
    assert "driver 550.54.15 supports CUDA up to 12.4, older than the image's CUDA runtime 12.8" in f.message
    (g,) = check_driver(p, labels("torch-2.9.1-cu12"), strict=True)
    assert g.severity == "fail" and "12.4" in g.message and "12.8" in g.message


def test_driver_of_an_older_major_is_refused():
    p = probe("a100-sxm4-40gb")  # driver 535.104.05 -> CUDA 12.2
    (f,) = check_driver(p, labels("torch-2.11.0-cuda-toolkit"))
    assert f.severity == "fail"
    assert f.message == ("host driver 535.104.05 supports CUDA up to 12.2, the image's CUDA runtime is 13.0: "
                         "upgrade the host driver")


def test_no_gpu_visible_for_a_cuda_image_warns_and_cpu_image_is_silent():
    p = probe("no-gpu-container")
    (f,) = check_driver(p, labels("torch-2.9.1-cu12"))
    assert f.severity == "warn" and "no GPU is visible" in f.message
    assert check_driver(p, image_labels(cuda_info([("torch", "2.13.0+cpu")]))) == []
    assert run_checks(p, {}) == []


def test_gpu_arch_missing_from_torch_is_refused_naming_gpu_and_arch():
    p = probe("h100-sxm5-80gb")
    p["software"]["torch"]["arch_list"] = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"]
    (f,) = check_arch(p)
    assert f.severity == "fail"
    assert f.message == ("GPU 0 (NVIDIA H100 80GB HBM3), compute capability 9.0: torch 2.9.1+cu128 has no sm_90 "
                         "(arch list: sm_50 sm_60 sm_70 sm_75 sm_80 sm_86)")


def test_ptx_entry_is_accepted_with_a_jit_warning():
    p = probe("h100-sxm5-80gb")
    p["software"]["torch"]["arch_list"] = ["sm_80", "sm_86", "compute_86"]
    (f,) = check_arch(p)
    assert f.severity == "warn" and "runs by JIT from compute_86 PTX" in f.message


def test_same_major_lower_minor_sass_is_binary_compatible():
    p = probe("rtx4090")  # cc 8.9
    p["software"]["torch"]["arch_list"] = ["sm_75", "sm_80", "sm_86", "sm_90"]
    assert check_arch(p) == []


@pytest.mark.parametrize("cc,archs,kind", [
    ((9, 0), ["sm_90a"], "sass"),
    ((9, 0), ["sm_80"], "none"),
    ((10, 3), ["sm_100f"], "sass"),
    ((10, 0), ["sm_90a", "compute_90"], "ptx"),
    ((8, 6), ["sm_90", "compute_90"], "none"),  # PTX newer than the GPU cannot run
    ((12, 0), ["sm_120", "compute_120"], "sass"),
])
def test_arch_support(cc, archs, kind):
    assert arch_support(cc, archs)[0] == kind


def test_cpu_torch_with_gpus_warns():
    p = probe("h100-sxm5-80gb")
    p["software"]["torch"].update({"cuda": None, "arch_list": [], "version": "2.9.1+cpu"})
    (f,) = check_arch(p)
    assert f.severity == "warn" and "not a CUDA build" in f.message


# -- comparing two runs' hardware ------------------------------------------------------

def test_same_hardware_has_no_differences():
    assert compare_hardware(probe("h100-sxm5-80gb"), probe("h100-sxm5-80gb")) == []


def test_mig_slice_differs_in_sm_count_model_and_mode():
    msgs = [f.message for f in compare_hardware(probe("a100-sxm4-40gb"), probe("a100-sxm4-40gb-mig-1g.5gb"))]
    assert msgs == [
        "GPU 0 GPU model differs: NVIDIA A100-SXM4-40GB vs NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "GPU 0 SM count differs: 108 vs 14",
        "GPU 0 MIG mode differs: disabled vs enabled",
    ]


def test_different_machines_list_gpu_and_cpu_differences():
    found = compare_hardware(probe("h100-sxm5-80gb"), probe("rtx4090"))
    text = "\n".join(f.message for f in found)
    assert "compute capability differs: 9.0 vs 8.9" in text
    assert "SM count differs: 132 vs 128" in text
    assert "CPU model differs: Intel(R) Xeon(R) Platinum 8480+ vs AMD Ryzen 9 7950X 16-Core Processor" in text
    assert "only in A: amx_bf16" in text
    assert all(f.severity == "warn" for f in found)


def test_gpu_count_differs():
    a = probe("h100-sxm5-80gb")
    b = copy.deepcopy(a)
    b["hardware"]["gpus"].append(dict(b["hardware"]["gpus"][0], index=1))
    assert [f.message for f in compare_hardware(a, b)] == ["GPU count differs: 1 vs 2"]
