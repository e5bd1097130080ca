"""The in-image probe, run for real: on this host's interpreters and with hostile imports."""

from __future__ import annotations

import ast
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hermetic.inimage.probe import PROBE_PATH, probe_files
from hermetic.inimage.probe import probe as probe_mod
from hermetic.inimage.probe import probe_gpu

OPTIONAL_IMPORTS = {"torch", "numpy", "threadpoolctl", "pynvml"}
TOP_KEYS = {"probe_version", "software", "hardware", "errors"}


def run_probe(python: str = sys.executable, env: dict[str, str] | None = None, cwd: Path | None = None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HERMETIC_PROBE")}
    full_env.update(env or {})
    proc = subprocess.run([python, str(PROBE_PATH)], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=120)
    return proc


def assert_shape(doc: dict) -> None:
    assert {k for k in doc if not k.startswith("_")} == TOP_KEYS
    assert doc["probe_version"] == 1
    sw, hw = doc["software"], doc["hardware"]
    assert set(sw) == {"python", "torch", "numpy", "blas", "env"}
    assert set(sw["python"]) == {"version", "implementation", "executable"}
    for key in ("kernel", "os", "glibc", "cpu", "memory_bytes", "memory_limit_bytes", "gpus", "gpu_source"):
        assert key in hw, key
    assert set(hw["cpu"]) >= {"model", "vendor", "flags_of_interest", "logical_cores", "affinity"}
    assert isinstance(hw["gpus"], list)
    if not hw["gpus"]:
        assert hw["gpu_note"] == "no GPU visible"
        assert hw["gpu_sources_tried"], "an empty GPU list must say what was tried"
    for g in hw["gpus"]:
        assert set(g) >= {"index", "name", "uuid", "memory_bytes", "compute_capability", "sm_count",
                          "sm_count_source", "driver_version", "cuda_driver_version", "ecc_enabled",
                          "mig_mode", "clocks", "power_limit_w", "pci_bus_id"}
    assert all(isinstance(e, str) and ": " in e for e in doc["errors"])


def test_probe_on_this_host_prints_exactly_one_json_document():
    proc = run_probe()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, "stdout must carry the JSON document and nothing else"
    doc = json.loads(lines[0])
    assert_shape(doc)
    assert doc["software"]["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["hardware"]["memory_bytes"] > 0
    assert doc["hardware"]["cpu"]["logical_cores"] == os.cpu_count()
    if Path("/etc/debian_version").exists():
        assert doc["hardware"]["glibc"] and doc["hardware"]["glibc"].startswith("2.")


def test_probe_records_determinism_env_and_nothing_else():
    proc = run_probe(env={"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "3",
                          "HERMETIC_RUN_ID": "r1", "AWS_SECRET_ACCESS_KEY": "do-not-record"})
    env = json.loads(proc.stdout)["software"]["env"]
    assert env["PYTHONHASHSEED"] == "0"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["HERMETIC_RUN_ID"] == "r1"
    assert "AWS_SECRET_ACCESS_KEY" not in env


def _old_python(minor: int) -> str | None:
    """A working python3.<minor> (pyenv installs first: their shims may refuse to run)."""
    candidates = sorted((Path.home() / ".pyenv" / "versions").glob(f"3.{minor}.*/bin/python3.{minor}"))
    candidates += [Path(p) for p in (shutil.which(f"python3.{minor}"),) if p]
    for exe in candidates:
        ok = subprocess.run([str(exe), "-c", "pass"], capture_output=True, timeout=30).returncode == 0
        if ok:
            return str(exe)
    return None


@pytest.mark.parametrize("minor", [8, 9])
def test_probe_runs_on_old_pythons(minor):
    python = _old_python(minor)
    if python is None:
        pytest.skip(f"no python3.{minor} on this machine")
    proc = run_probe(python)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert_shape(doc)
    assert doc["software"]["python"]["version"].startswith(f"3.{minor}.")


@pytest.mark.parametrize("path", probe_files(), ids=lambda p: p.name)
def test_probe_source_parses_as_python_38(path):
    ast.parse(path.read_bytes(), feature_version=(3, 8))


def test_probe_is_its_entry_point_and_siblings():
    assert [p.name for p in probe_files()] == ["probe.py", "probe_gpu.py"]


@pytest.mark.parametrize("path", probe_files(), ids=lambda p: p.name)
def test_probe_imports_only_the_standard_library_at_module_level(path):
    tree = ast.parse(path.read_bytes())
    siblings = {p.stem for p in probe_files()}
    module_level = list(tree.body)
    for node in tree.body:  # `if __package__: ... else: ...` blocks are module level too
        if isinstance(node, (ast.If, ast.Try)):
            module_level += node.body + node.orelse
    top: set[str] = set()
    for node in module_level:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    top -= {"__future__", "hermetic"} | siblings  # siblings: as a script, or as hermetic.inimage.probe.X when imported
    assert top <= set(sys.stdlib_module_names), top - set(sys.stdlib_module_names)
    # optional packages only inside functions, by the names we document
    inner = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} - top
    assert inner <= OPTIONAL_IMPORTS, inner


def _hostile_site(tmp_path: Path) -> Path:
    """Packages that misbehave on import: print to fd 1, exit, or raise."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "numpy.py").write_text("import os, sys\nos.write(1, b'native chatter on fd 1\\n')\n"
                                   "print('python chatter')\n__version__ = '0.0-hostile'\n"
                                   "def show_config(mode='stdout'):\n    raise RuntimeError('no config')\n")
    (site / "threadpoolctl.py").write_text("raise SystemExit(3)\n")
    (site / "torch.py").write_text("raise OSError('libcudart.so.12: cannot open shared object file')\n")
    return site


def test_probe_survives_hostile_imports_and_keeps_stdout_clean(tmp_path):
    site = _hostile_site(tmp_path)
    proc = run_probe(env={"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    doc = json.loads(lines[0])
    assert_shape(doc)
    assert "native chatter on fd 1" in proc.stderr and "python chatter" in proc.stderr
    sw = doc["software"]
    assert sw["torch"] is None and sw["blas"] is None
    assert sw["numpy"] == {"version": "0.0-hostile", "config": None}
    errs = "\n".join(doc["errors"])
    assert "software.torch: not importable (OSError: libcudart.so.12" in errs
    assert "software.blas: not importable (SystemExit: 3)" in errs
    assert "software.numpy.config: RuntimeError: no config" in errs


def test_forced_gpu_source_is_respected_and_bad_values_reported():
    proc = run_probe(env={"HERMETIC_PROBE_GPU_SOURCE": "nvidia-smi", "PATH": "/nonexistent"})
    doc = json.loads(proc.stdout)
    tried = doc["hardware"].get("gpu_sources_tried") or []
    if doc["hardware"]["gpus"]:
        pytest.skip("a GPU is visible here")
    assert tried[0] == "nvidia-smi: not on PATH"
    assert not any(t.startswith(("pynvml", "libnvidia-ml")) for t in tried)
    bad = json.loads(run_probe(env={"HERMETIC_PROBE_GPU_SOURCE": "bogus"}).stdout)
    assert any("HERMETIC_PROBE_GPU_SOURCE='bogus'" in e for e in bad["errors"])


# -- pure parts of the GPU path (no GPU on the development machines) ---------------

SMI_FIELDS = list(probe_gpu.SMI_FIELDS)
# Hand-written in nvidia-smi's documented csv,noheader,nounits form (two H100s;
# an A100 with MIG on), not recorded.
SMI_CSV = (
    "0, NVIDIA H100 80GB HBM3, GPU-11111111-2222-3333-4444-555555555555, 81559, 9.0, 550.54.15, Enabled, "
    "Disabled, 1980, 2619, 700.00, 00000000:18:00.0\n"
    "1, NVIDIA A100-SXM4-40GB, GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, 40960, 8.0, 550.54.15, Enabled, "
    "Enabled, 1410, 1215, [N/A], 00000000:07:00.0\n"
)
SMI_BANNER = ("| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |\n")


def test_parse_nvidia_smi_reads_every_field():
    errors: list[str] = []
    gpus = probe_gpu.parse_nvidia_smi(SMI_CSV, SMI_FIELDS, SMI_BANNER, errors)
    assert errors == []
    h100, a100 = gpus
    assert h100["name"] == "NVIDIA H100 80GB HBM3"
    assert h100["memory_bytes"] == 81559 * 1024 * 1024
    assert h100["compute_capability"] == "9.0"
    assert h100["driver_version"] == "550.54.15" and h100["cuda_driver_version"] == "12.4"
    assert h100["ecc_enabled"] is True and h100["mig_mode"] == "disabled"
    assert h100["clocks"] == {"sm_max_mhz": 1980, "mem_max_mhz": 2619}
    assert h100["power_limit_w"] == 700.0
    assert h100["pci_bus_id"] == "00000000:18:00.0"
    assert h100["sm_count"] is None  # nvidia-smi has no SM count; CUDA fills it
    assert a100["mig_mode"] == "enabled" and a100["power_limit_w"] is None


def test_parse_nvidia_smi_without_cuda_banner_reports_it():
    errors: list[str] = []
    gpus = probe_gpu.parse_nvidia_smi(SMI_CSV, SMI_FIELDS, "garbage", errors)
    assert gpus[0]["cuda_driver_version"] is None
    assert errors == ["hardware.gpus.cuda_driver_version: no 'CUDA Version' in nvidia-smi output"]


def test_sm_counts_attach_by_uuid_then_pci_bus():
    errors: list[str] = []
    gpus = probe_gpu.parse_nvidia_smi(SMI_CSV, SMI_FIELDS, SMI_BANNER, errors)
    cuda = [
        # torch prints UUIDs without the GPU- prefix; libcuda gives raw bytes
        probe_gpu.CudaDevice("NVIDIA H100 80GB HBM3", "11111111-2222-3333-4444-555555555555", None,
                             "9.0", 132, 0, "torch"),
        probe_gpu.CudaDevice("NVIDIA A100-SXM4-40GB", None, "0000:07:00.0", "8.0", 108, 0, "libcuda"),
    ]
    probe_gpu.attach_sm_counts(gpus, cuda, errors)
    assert [(g["sm_count"], g["sm_count_source"]) for g in gpus] == [(132, "torch"), (108, "libcuda")]
    assert errors == []


def test_sm_count_missing_from_cuda_view_is_an_error_not_a_guess():
    errors: list[str] = []
    gpus = probe_gpu.parse_nvidia_smi(SMI_CSV, SMI_FIELDS, SMI_BANNER, errors)
    probe_gpu.attach_sm_counts(gpus, [], errors)
    assert all(g["sm_count"] is None for g in gpus)
    assert errors == [f"hardware.gpus[{i}].sm_count: not visible to CUDA (CUDA_VISIBLE_DEVICES?)" for i in (0, 1)]


def test_versions_decode():
    assert probe_gpu.cuda_version_string(12040) == "12.4"
    assert probe_gpu.cuda_version_string(13000) == "13.0"

    def Nccl(v):  # noqa: N802 - stands for the torch module's shape
        return SimpleNamespace(cuda=SimpleNamespace(nccl=SimpleNamespace(version=lambda: v)))

    assert probe_mod._nccl_version(Nccl((2, 27, 5))) == "2.27.5"
    assert probe_mod._nccl_version(Nccl(21805)) == "2.18.5"
    assert probe_mod._nccl_version(Nccl(2708)) == "2.7.8"


def test_nvml_structs_match_the_c_layout():
    # nvml.h: nvmlMemory_t 3 x u64; nvmlPciInfo_t (v3) 16+5*4+32 bytes; nvmlDeviceAttributes_t 8 x u32 + u64
    assert ctypes.sizeof(probe_gpu.NvmlCtypes._Memory) == 24
    assert ctypes.sizeof(probe_gpu.NvmlCtypes._Pci) == 68
    assert ctypes.sizeof(probe_gpu.NvmlCtypes._Attributes) == 40


def test_arch_list_sorted_sm_before_ptx():
    archs = ["compute_90", "sm_100", "sm_90a", "sm_80", "sm_90"]
    assert sorted(archs, key=probe_mod._arch_sort_key) == ["sm_80", "sm_90", "sm_90a", "sm_100", "compute_90"]


def test_probe_cache_key_follows_the_loaded_nvidia_driver(tmp_path, monkeypatch):
    """A driver reloaded without a reboot (same boot_id) must not reuse the old probe."""
    from hermetic.run import probe as run_probe_mod

    class Engine:
        def info(self):
            return {"ID": "engine-1"}

    banner = tmp_path / "version"
    monkeypatch.setattr(run_probe_mod, "NVIDIA_VERSION_PATH", banner)
    none = run_probe_mod.probe_key(Engine(), "sha256:" + "1" * 64, "all")
    banner.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    old = run_probe_mod.probe_key(Engine(), "sha256:" + "1" * 64, "all")
    banner.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03\n")
    new = run_probe_mod.probe_key(Engine(), "sha256:" + "1" * 64, "all")
    assert len({none, old, new}) == 3
    assert new == run_probe_mod.probe_key(Engine(), "sha256:" + "1" * 64, "all")  # stable for one driver
