#!/usr/bin/env python3
"""hermetic's in-image probe: the software and hardware a run actually had, as ONE JSON document on stdout.

Mounted read-only at /run/hermetic-probe and run as ``python probe.py`` in the training image's container.
Its files keep to: the standard library only (torch, numpy, threadpoolctl, pynvml used when importable),
Python 3.8+, never a crash (an unreadable field is null plus "<field path>: <why>" in "errors"), stdout
only the JSON (fd 1 points at stderr while collecting). GPUs: NVML (pynvml, else ctypes), else nvidia-smi,
else torch/libcuda; SM counts from torch or libcuda's driver API; a MIG device is one entry.
Importable: ``collect()``, and ``collect_gpus(errors)`` (``hermetic doctor``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import re
import sys

if __package__:  # imported from hermetic (doctor, tests)
    from hermetic.inimage.probe.probe_gpu import collect_gpus, reason
else:  # run as a script inside the container: its sibling is imported from this directory
    _here = os.path.dirname(os.path.abspath(__file__))
    if _here not in sys.path:  # Python 3.11+ leave it out under PYTHONSAFEPATH (the image's or the run's env)
        sys.path.insert(0, _here)
    from probe_gpu import collect_gpus, reason

PROBE_VERSION = 1
NO_GPU_NOTE = "no GPU visible"

# Environment variables that change numerics, threading or device selection.
ENV_EXACT = (
    "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "MKL_DYNAMIC", "OMP_DYNAMIC",
    "NVIDIA_TF32_OVERRIDE", "XLA_FLAGS", "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC",
    "TZ", "LC_ALL", "LANG", "MKL_CBWR", "KMP_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES",
    "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDNN_V8_API_DISABLED", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "PYTHON_CPU_COUNT",  # Python 3.13+: os.cpu_count() and the default sizes of process and thread pools
)
ENV_PREFIXES = ("HERMETIC_", "NCCL_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_")
ENV_SUFFIXES = ("_NUM_THREADS",)

CPU_FLAGS_OF_INTEREST = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "sha_ni", "aes",
    "vaes", "vpclmulqdq", "avx_vnni", "avx_vnni_int8", "avx_ifma", "avx_ne_convert",
)
CPU_FLAG_PREFIXES = ("avx512", "amx")

def safe(errors, path, fn, *args):
    """fn(*args), or None with "path: reason" appended to errors."""
    try:
        return fn(*args)
    except Exception as e:  # a probe never raises
        errors.append("%s: %s" % (path, reason(e)))
        return None


def read_text(path):
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return f.read()


# -- software ---------------------------------------------------------------

def collect_software(errors):
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable or None,
        },
        "torch": _torch_info(errors),
        "numpy": _numpy_info(errors),
        "blas": _blas_info(errors),
        "env": _determinism_env(),
    }


def _determinism_env():
    return {k: v for k, v in sorted(os.environ.items())
            if k in ENV_EXACT or k.startswith(ENV_PREFIXES) or k.endswith(ENV_SUFFIXES)}


def _import(errors, path, name):
    try:
        return __import__(name, fromlist=["_"])
    except (Exception, SystemExit) as e:  # ImportError, or a broken install raising anything
        errors.append("%s: not importable (%s)" % (path, reason(e)))
        return None


# software.torch's fields, each read on its own (one that fails is null and one error)
TORCH_FIELDS = {
    "version": lambda t: str(t.__version__),
    "git_version": lambda t: getattr(t.version, "git_version", None),
    "cuda": lambda t: t.version.cuda,
    "hip": lambda t: getattr(t.version, "hip", None),
    "cudnn": lambda t: t.backends.cudnn.version(),
    "arch_list": lambda t: _arch_list(t),
    "cuda_available": lambda t: bool(t.cuda.is_available()),
    "device_count": lambda t: int(t.cuda.device_count()),
    "deterministic_algorithms": lambda t: bool(t.are_deterministic_algorithms_enabled()),
    "deterministic_warn_only": lambda t: bool(t.is_deterministic_algorithms_warn_only_enabled()),
    "cudnn_benchmark": lambda t: bool(t.backends.cudnn.benchmark),
    "cudnn_deterministic": lambda t: bool(t.backends.cudnn.deterministic),
    "tf32_matmul": lambda t: bool(t.backends.cuda.matmul.allow_tf32),
    "tf32_cudnn": lambda t: bool(t.backends.cudnn.allow_tf32),
    "float32_matmul_precision": lambda t: str(t.get_float32_matmul_precision()),
    "num_threads": lambda t: int(t.get_num_threads()),
    "num_interop_threads": lambda t: int(t.get_num_interop_threads()),
}


def _torch_info(errors):
    torch = _import(errors, "software.torch", "torch")
    if torch is None:
        return None
    info = {k: safe(errors, "software.torch." + k, read, torch) for k, read in TORCH_FIELDS.items()}
    info["nccl"] = safe(errors, "software.torch.nccl", _nccl_version, torch) if info["cuda"] else None
    return info


def _nccl_version(torch):
    nccl = getattr(torch.cuda, "nccl", None)
    if nccl is None:
        nccl = importlib.import_module("torch.cuda.nccl")
    v = nccl.version()
    if isinstance(v, (tuple, list)):
        return ".".join(str(int(x)) for x in v)
    v = int(v)  # older torch: NCCL_VERSION_CODE
    if v >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return "%d.%d.%d" % (v // 10000, (v // 100) % 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v // 100) % 10, v % 100)


def _arch_list(torch):
    # get_arch_list() answers [] when no GPU is visible; the compiled-in list
    # (what the build check compares against) does not need a GPU.
    getter = getattr(torch._C, "_cuda_getArchFlags", None)
    flags = getter() if getter is not None else None
    archs = str(flags).split() if flags else torch.cuda.get_arch_list()
    return sorted(set(archs), key=_arch_sort_key)


def _arch_sort_key(arch):
    m = re.match(r"^(sm|compute)_(\d+)([a-z]?)$", arch)
    if not m:
        return (2, 0, arch)
    return (0 if m.group(1) == "sm" else 1, int(m.group(2)), arch)


def _numpy_info(errors):
    np = _import(errors, "software.numpy", "numpy")
    if np is None:
        return None
    return {
        "version": safe(errors, "software.numpy.version", lambda: str(np.__version__)),
        "config": safe(errors, "software.numpy.config", _numpy_config, np),
    }


def _numpy_config(np):
    """BLAS/LAPACK and SIMD summary (numpy >= 1.25 dicts; older: *_opt_info)."""
    try:
        cfg = np.show_config(mode="dicts")
    except TypeError:
        cfg = None
    if isinstance(cfg, dict):
        deps, simd = cfg.get("Build Dependencies", {}), cfg.get("SIMD Extensions", {})
        keep = ("name", "version", "openblas configuration")
        out = {lib: {k: v for k, v in (deps.get(lib) or {}).items() if k in keep} for lib in ("blas", "lapack")}
        out.update(simd_baseline=simd.get("baseline"), simd_found=simd.get("found"))
        return out
    infos = {lib: getattr(np.__config__, lib + "_opt_info", None) or {} for lib in ("blas", "lapack")}
    return {lib: {"libraries": d.get("libraries"), "define_macros": [list(m) for m in d.get("define_macros", [])]}
            for lib, d in infos.items()}


def _blas_info(errors):
    tpc = _import(errors, "software.blas", "threadpoolctl")
    if tpc is None:
        return None
    pools = safe(errors, "software.blas", tpc.threadpool_info)
    return None if pools is None else [{k: pool[k] for k in sorted(pool)} for pool in pools]


# -- hardware ---------------------------------------------------------------

def collect_hardware(errors, use_torch=True):
    uname = os.uname()
    hw = {
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "os": safe(errors, "hardware.os", _os_pretty_name),
        "glibc": safe(errors, "hardware.glibc", _glibc_version),
        "cpu": _cpu_info(errors),
        "memory_bytes": safe(errors, "hardware.memory_bytes", _mem_total),
        "memory_limit_bytes": safe(errors, "hardware.memory_limit_bytes", _cgroup_memory_limit),
    }
    hw["gpus"], hw["gpu_source"], tried = collect_gpus(errors, use_torch=use_torch)
    if not hw["gpus"]:
        hw["gpu_note"] = NO_GPU_NOTE
        hw["gpu_sources_tried"] = tried
    return hw


def _os_pretty_name():
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            text = read_text(path)
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"').strip("'")
    raise LookupError("no PRETTY_NAME in /etc/os-release or /usr/lib/os-release")


def _glibc_version():
    try:
        conf = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        conf = None
    if conf and conf.startswith("glibc "):
        return conf.split()[1]
    lib, version = platform.libc_ver()
    if lib == "glibc" and version:
        return version
    raise LookupError("not a glibc system (musl or another libc)")


def _cpu_info(errors):
    cpuinfo = safe(errors, "hardware.cpu", read_text, "/proc/cpuinfo") or ""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fields.get("Model") or fields.get("cpu model")
    if model is None and cpuinfo:
        errors.append("hardware.cpu.model: no 'model name' in /proc/cpuinfo")
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    interesting = sorted(f for f in set(flags) if f in CPU_FLAGS_OF_INTEREST or f.startswith(CPU_FLAG_PREFIXES))
    return {
        "model": model,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
        "flags_of_interest": interesting if flags else None,
        "logical_cores": _logical_cores(),
        "affinity": safe(errors, "hardware.cpu.affinity", lambda: len(os.sched_getaffinity(0))),
        "cgroup_cpus": safe(errors, "hardware.cpu.cgroup_cpus", _cgroup_cpus),
    }


def _logical_cores():
    # What os.cpu_count() reads, but without Python 3.13's override (PYTHON_CPU_COUNT, -X cpu_count): the machine's.
    n = os.sysconf("SC_NPROCESSORS_ONLN")  # a name every Linux libc (glibc, musl) has
    return n if n >= 1 else None


def _mem_total():
    for line in read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    raise LookupError("no MemTotal in /proc/meminfo")


def _cgroup_memory_limit():
    """The container's memory limit in bytes, or None when unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = read_text(path).strip()
        except OSError:
            continue
        if raw == "max":
            return None
        value = int(raw)
        return None if value >= (1 << 60) else value  # cgroup v1 "unlimited" is ~2^63
    return None


def _cgroup_cpus():
    """CPUs allowed by the cgroup's CFS quota (e.g. 2.0), or None when unlimited."""
    try:
        quota, period = read_text("/sys/fs/cgroup/cpu.max").split()[:2]  # v2: "max 100000", "200000 100000"
    except OSError:
        try:  # v1: -1 when unlimited
            quota, period = (read_text("/sys/fs/cgroup/cpu/cpu.cfs_%s_us" % k) for k in ("quota", "period"))
        except OSError:
            return None
    if quota == "max" or int(quota) <= 0:
        return None
    return int(quota) / int(period)


# -- entry points -----------------------------------------------------------

def collect(use_torch=True):
    """The whole probe document. use_torch=False skips importing torch for GPU facts."""
    errors = []
    doc = {"probe_version": PROBE_VERSION, "software": None, "hardware": None, "errors": errors}
    try:
        doc["software"] = collect_software(errors)
    except Exception as e:
        errors.append("software: %s" % reason(e))
    try:
        doc["hardware"] = collect_hardware(errors, use_torch=use_torch)
    except Exception as e:
        errors.append("hardware: %s" % reason(e))
    return doc


def main():
    # Point fd 1 at stderr while collecting: native libraries write to fd 1
    # directly, and only the JSON may reach the real stdout.
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            doc = collect()
    except BaseException as e:  # even SystemExit/KeyboardInterrupt from an import
        doc = {"probe_version": PROBE_VERSION, "software": None, "hardware": None,
               "errors": ["probe: %s" % reason(e)]}
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
