"""Run-time checks on probe fixtures (hermetic.gpu.runtime), and how diff judges two runs' GPUs and CPUs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hermetic.diff.compare import compare_cpu, compare_gpu
from hermetic.gpu.cuda import cuda_info, image_labels
from hermetic.gpu.runtime import arch_support, check_arch, check_driver, run_checks
from hermetic.lock.model import Target
from hermetic.lock.read import read_lock

from test_probe import assert_shape

FIXTURES = Path(__file__).parent / "fixtures"
LOCKS = FIXTURES / "locks"
PROBES = FIXTURES / "probes"


def lock_info(name: str):
    return cuda_info(read_lock(LOCKS / f"{name}.txt", Target()).wheels)


def probe(name: str) -> dict:
    return json.loads((PROBES / f"{name}.json").read_text())


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


# -- comparing two runs' hardware (hermetic.diff.compare judges it) ----------------------

def gpu_diff(a: dict, b: dict):
    return compare_gpu(a["hardware"], b["hardware"], "all", "all")  # both with --gpus all


def test_same_hardware_has_no_differences():
    d = gpu_diff(probe("h100-sxm5-80gb"), probe("h100-sxm5-80gb"))
    assert d.changes == [] and d.warnings == []


def test_mig_slice_differs_in_sm_count_model_and_mode():
    d = gpu_diff(probe("a100-sxm4-40gb"), probe("a100-sxm4-40gb-mig-1g.5gb"))
    (warning,) = d.warnings
    assert warning.startswith("GPU 0: name NVIDIA A100-SXM4-40GB vs NVIDIA A100-SXM4-40GB MIG 1g.5gb, "
                              "sm_count 108 vs 14, mig_mode disabled vs enabled: cuBLAS only promises")
    assert {c.key for c in d.material} >= {"gpus[0].name", "gpus[0].sm_count", "gpus[0].mig_mode"}


def test_different_machines_list_gpu_and_cpu_differences():
    a, b = probe("h100-sxm5-80gb"), probe("rtx4090")
    (warning,) = gpu_diff(a, b).warnings
    assert "compute_capability 9.0 vs 8.9" in warning and "sm_count 132 vs 128" in warning
    cpu = compare_cpu(a["hardware"], b["hardware"], a["software"], b["software"])
    notes = "\n".join(c.note for c in cpu.material)
    assert "cpu.model Intel(R) Xeon(R) Platinum 8480+ -> AMD Ryzen 9 7950X 16-Core Processor" in notes
    assert "-amx_bf16" in notes


def test_gpu_count_differs():
    a = probe("h100-sxm5-80gb")
    b = copy.deepcopy(a)
    b["hardware"]["gpus"].append(dict(b["hardware"]["gpus"][0], index=1))
    d = gpu_diff(a, b)
    assert [c.note for c in d.material] == ["1 GPU(s) -> 2 GPU(s)"]


def test_a_gpu_refusal_is_recorded_as_refused_with_the_reason_and_hermetics_code(tmp_path):
    """The probe ran (so the run directory exists): the refusal is sealed in run.json, and runs wait agrees."""
    from types import SimpleNamespace

    from hermetic.cli.logs_cmd import exit_code_of
    from hermetic.core.errors import EXIT_UNAVAILABLE, Unavailable
    from hermetic.record import load_record
    from hermetic.record.index import entry_from_dir
    from synthetic_records import synthetic_record, write_synthetic_run
    from hermetic.run.runner import refuse_unfit_gpu

    runs = tmp_path / "runs"
    rec = synthetic_record("20261201-090000-abcdef")
    write_synthetic_run(runs, rec)
    run_dir = runs / "20261201-090000-abcdef"
    image = SimpleNamespace(labels=labels("torch-2.11.0-cuda-toolkit"))
    with pytest.raises(Unavailable) as e:
        refuse_unfit_gpu(rec, run_dir, probe("a100-sxm4-40gb"), image)
    assert e.value.exit_code == EXIT_UNAVAILABLE and "upgrade the host driver" in e.value.message
    sealed = load_record(run_dir)  # seal verified
    assert sealed["record"]["status"] == "refused" and sealed["record"]["exit_code"] is None
    assert sealed["record"]["reason"] == e.value.message
    assert sealed["record"]["hermetic_exit_code"] == EXIT_UNAVAILABLE
    assert exit_code_of(run_dir, entry_from_dir(run_dir)) == EXIT_UNAVAILABLE
