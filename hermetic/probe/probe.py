#!/usr/bin/env python3
"""hermetic's in-image probe: the software and hardware a run actually had.

Copied into images and run inside the container as ``python3 probe.py``; it
prints ONE JSON document to stdout::

    {"probe_version": 1, "software": {...}, "hardware": {...}, "errors": [...]}

Rules this file keeps, because it runs in images we do not control:

- standard library only; torch, numpy, threadpoolctl and pynvml (nvidia-ml-py)
  are used when importable, never required;
- Python 3.8 or newer (no newer syntax, no newer stdlib calls);
- never crashes: a field that cannot be read is null and "<field path>: <why>"
  is appended to "errors"; a value that is absent by nature (a CPU build of
  torch has no NCCL) is null without an error;
- stdout carries only the JSON: while collecting, file descriptor 1 points at
  stderr, so chatter from native libraries (CUDA, NCCL) cannot corrupt it.

Where GPU facts come from (recorded in hardware.gpu_source and, per GPU,
sm_count_source):

1. NVML through pynvml when importable, else NVML through ctypes on
   libnvidia-ml.so.1 (nvidia-container-toolkit injects it with the ``utility``
   capability), else ``nvidia-smi --query-gpu ... --format=csv,noheader,nounits``
   (injected with the same capability; CUDA version parsed from its banner).
2. NVML has no SM count for a whole GPU. It comes from
   torch.cuda.get_device_properties(i).multi_processor_count when torch sees
   CUDA, else from the CUDA driver API (libcuda.so.1, injected with the
   ``compute`` capability: cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)); CUDA
   devices are matched to NVML devices by UUID, then PCI bus id. A MIG slice's
   SM count comes from NVML itself (nvmlDeviceGetAttributes).
3. With no NVML and no nvidia-smi, GPUs that torch or libcuda see are listed
   from there.

A MIG-enabled GPU is listed once per MIG device (what CUDA computes on), with
"mig_mode": "enabled" and its parent GPU under "mig_parent".

Importable too: ``collect()`` returns the document, ``collect_gpus(errors)``
the GPU part alone (``hermetic doctor`` uses it on the host).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

PROBE_VERSION = 1
NO_GPU_NOTE = "no GPU visible"

# Environment variables that change numerics, threading or device selection.
ENV_EXACT = (
    "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "MKL_DYNAMIC", "OMP_DYNAMIC",
    "NVIDIA_TF32_OVERRIDE", "XLA_FLAGS", "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC",
    "TZ", "LC_ALL", "LANG", "MKL_CBWR", "KMP_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES",
    "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDNN_V8_API_DISABLED", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
ENV_PREFIXES = ("HERMETIC_", "NCCL_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_")
ENV_SUFFIXES = ("_NUM_THREADS",)

CPU_FLAGS_OF_INTEREST = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "sha_ni", "aes",
    "vaes", "vpclmulqdq", "avx_vnni", "avx_vnni_int8", "avx_ifma", "avx_ne_convert",
)
CPU_FLAG_PREFIXES = ("avx512", "amx")

SMI_FIELDS = (
    "index", "name", "uuid", "memory.total", "compute_cap", "driver_version",
    "ecc.mode.current", "mig.mode.current", "clocks.max.sm", "clocks.max.memory",
    "power.limit", "pci.bus_id",
)


# -- error bookkeeping -------------------------------------------------------

def _reason(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return " ".join(text.split())  # one line


def _safe(errors, path, fn, *args):
    """fn(*args), or None with "path: reason" appended to errors."""
    try:
        return fn(*args)
    except Exception as e:  # a probe never raises
        errors.append("%s: %s" % (path, _reason(e)))
        return None


def _read_text(path):
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
    out = {}
    for key, value in os.environ.items():
        if key in ENV_EXACT or key.startswith(ENV_PREFIXES) or key.endswith(ENV_SUFFIXES):
            out[key] = value
    return dict(sorted(out.items()))


def _import(errors, path, name):
    try:
        return __import__(name, fromlist=["_"])
    except (Exception, SystemExit) as e:  # ImportError, or a broken install raising anything
        errors.append("%s: not importable (%s)" % (path, _reason(e)))
        return None


def _torch_info(errors):
    torch = _import(errors, "software.torch", "torch")
    if torch is None:
        return None
    p = "software.torch."
    cuda = _safe(errors, p + "cuda", lambda: torch.version.cuda)
    info = {
        "version": _safe(errors, p + "version", lambda: str(torch.__version__)),
        "git_version": _safe(errors, p + "git_version", lambda: getattr(torch.version, "git_version", None)),
        "cuda": cuda,
        "hip": _safe(errors, p + "hip", lambda: getattr(torch.version, "hip", None)),
        "cudnn": _safe(errors, p + "cudnn", lambda: torch.backends.cudnn.version()),
        "nccl": _safe(errors, p + "nccl", _nccl_version, torch) if cuda else None,
        "arch_list": _safe(errors, p + "arch_list", _arch_list, torch),
        "cuda_available": _safe(errors, p + "cuda_available", lambda: bool(torch.cuda.is_available())),
        "device_count": _safe(errors, p + "device_count", lambda: int(torch.cuda.device_count())),
        "deterministic_algorithms": _safe(
            errors, p + "deterministic_algorithms", lambda: bool(torch.are_deterministic_algorithms_enabled())),
        "deterministic_warn_only": _safe(
            errors, p + "deterministic_warn_only",
            lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled())),
        "cudnn_benchmark": _safe(errors, p + "cudnn_benchmark", lambda: bool(torch.backends.cudnn.benchmark)),
        "cudnn_deterministic": _safe(
            errors, p + "cudnn_deterministic", lambda: bool(torch.backends.cudnn.deterministic)),
        "tf32_matmul": _safe(errors, p + "tf32_matmul", lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "tf32_cudnn": _safe(errors, p + "tf32_cudnn", lambda: bool(torch.backends.cudnn.allow_tf32)),
        "float32_matmul_precision": _safe(
            errors, p + "float32_matmul_precision", lambda: str(torch.get_float32_matmul_precision())),
        "num_threads": _safe(errors, p + "num_threads", lambda: int(torch.get_num_threads())),
        "num_interop_threads": _safe(errors, p + "num_interop_threads", lambda: int(torch.get_num_interop_threads())),
    }
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
    flags = None
    getter = getattr(torch._C, "_cuda_getArchFlags", None)
    if getter is not None:
        flags = getter()
    if flags:
        return sorted(set(str(flags).split()), key=_arch_sort_key)
    return sorted(set(torch.cuda.get_arch_list()), key=_arch_sort_key)


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
        "version": _safe(errors, "software.numpy.version", lambda: str(np.__version__)),
        "config": _safe(errors, "software.numpy.config", _numpy_config, np),
    }


def _numpy_config(np):
    """BLAS/LAPACK and SIMD summary (numpy >= 1.25 dicts; older: *_opt_info)."""
    try:
        cfg = np.show_config(mode="dicts")
    except TypeError:
        cfg = None
    if isinstance(cfg, dict):
        deps = cfg.get("Build Dependencies", {})
        simd = cfg.get("SIMD Extensions", {})
        out = {}
        for lib in ("blas", "lapack"):
            d = deps.get(lib) or {}
            out[lib] = {k: d.get(k) for k in ("name", "version", "openblas configuration") if k in d}
        out["simd_baseline"] = simd.get("baseline")
        out["simd_found"] = simd.get("found")
        return out
    conf = np.__config__
    out = {}
    for lib in ("blas", "lapack"):
        d = getattr(conf, lib + "_opt_info", None) or {}
        out[lib] = {"libraries": d.get("libraries"), "define_macros": [list(m) for m in d.get("define_macros", [])]}
    return out


def _blas_info(errors):
    tpc = _import(errors, "software.blas", "threadpoolctl")
    if tpc is None:
        return None
    pools = _safe(errors, "software.blas", tpc.threadpool_info)
    if pools is None:
        return None
    return [{k: pool[k] for k in sorted(pool)} for pool in pools]


# -- hardware ---------------------------------------------------------------

def collect_hardware(errors, use_torch=True):
    uname = os.uname()
    hw = {
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "os": _safe(errors, "hardware.os", _os_pretty_name),
        "glibc": _safe(errors, "hardware.glibc", _glibc_version),
        "cpu": _cpu_info(errors),
        "memory_bytes": _safe(errors, "hardware.memory_bytes", _mem_total),
        "memory_limit_bytes": _safe(errors, "hardware.memory_limit_bytes", _cgroup_memory_limit),
    }
    gpus, source, tried = collect_gpus(errors, use_torch=use_torch)
    hw["gpus"] = gpus
    hw["gpu_source"] = source
    if not gpus:
        hw["gpu_note"] = NO_GPU_NOTE
        hw["gpu_sources_tried"] = tried
    return hw


def _os_pretty_name():
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            text = _read_text(path)
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
    cpuinfo = _safe(errors, "hardware.cpu", _read_text, "/proc/cpuinfo") or ""
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
        "logical_cores": os.cpu_count(),
        "affinity": _safe(errors, "hardware.cpu.affinity", lambda: len(os.sched_getaffinity(0))),
        "cgroup_cpus": _safe(errors, "hardware.cpu.cgroup_cpus", _cgroup_cpus),
    }


def _mem_total():
    for line in _read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    raise LookupError("no MemTotal in /proc/meminfo")


def _cgroup_memory_limit():
    """The container's memory limit in bytes, or None when unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = _read_text(path).strip()
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
        quota, period = _read_text("/sys/fs/cgroup/cpu.max").split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except OSError:
        pass
    try:
        quota = int(_read_text("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").strip())
        period = int(_read_text("/sys/fs/cgroup/cpu/cpu.cfs_period_us").strip())
    except OSError:
        return None
    return None if quota <= 0 else quota / period


# -- GPUs -------------------------------------------------------------------

class NvmlError(Exception):
    NOT_SUPPORTED = 3
    NOT_FOUND = 6

    def __init__(self, code, message):
        Exception.__init__(self, "NVML error %s: %s" % (code, message))
        self.code = code


class _NvmlCtypes:
    """The handful of NVML calls the probe needs, straight from libnvidia-ml.so.1."""

    source = "nvml"

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class _Pci(ctypes.Structure):  # nvmlPciInfo_t (v3)
        _fields_ = [
            ("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
            ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
            ("busId", ctypes.c_char * 32),
        ]

    class _Attributes(ctypes.Structure):  # nvmlDeviceAttributes_t
        _fields_ = [
            ("multiprocessorCount", ctypes.c_uint), ("sharedCopyEngineCount", ctypes.c_uint),
            ("sharedDecoderCount", ctypes.c_uint), ("sharedEncoderCount", ctypes.c_uint),
            ("sharedJpegCount", ctypes.c_uint), ("sharedOfaCount", ctypes.c_uint),
            ("gpuInstanceSliceCount", ctypes.c_uint), ("computeInstanceSliceCount", ctypes.c_uint),
            ("memorySizeMB", ctypes.c_ulonglong),
        ]

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._call("nvmlInit_v2")

    def _call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise NvmlError(rc, (self.lib.nvmlErrorString(rc) or b"?").decode("utf-8", "replace"))

    def _string(self, name, *args, size=96):
        buf = ctypes.create_string_buffer(size)
        self._call(name, *(args + (buf, ctypes.c_uint(size))))
        return buf.value.decode("utf-8", "replace")

    def _uint(self, name, *args):
        v = ctypes.c_uint()
        self._call(name, *(args + (ctypes.byref(v),)))
        return v.value

    def count(self):
        return self._uint("nvmlDeviceGetCount_v2")

    def handle(self, index):
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def name(self, h):
        return self._string("nvmlDeviceGetName", h)

    def uuid(self, h):
        return self._string("nvmlDeviceGetUUID", h)

    def memory_total(self, h):
        m = self._Memory()
        self._call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(m))
        return int(m.total)

    def compute_capability(self, h):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvmlDeviceGetCudaComputeCapability", h, ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def driver_version(self):
        return self._string("nvmlSystemGetDriverVersion", size=80)

    def cuda_driver_version(self):
        v = ctypes.c_int()
        self._call("nvmlSystemGetCudaDriverVersion", ctypes.byref(v))
        return v.value

    def ecc_enabled(self, h):
        cur, pend = ctypes.c_int(), ctypes.c_int()
        self._call("nvmlDeviceGetEccMode", h, ctypes.byref(cur), ctypes.byref(pend))
        return bool(cur.value)

    def mig_enabled(self, h):
        cur, pend = ctypes.c_uint(), ctypes.c_uint()
        self._call("nvmlDeviceGetMigMode", h, ctypes.byref(cur), ctypes.byref(pend))
        return cur.value == 1

    def max_clock(self, h, clock_type):  # 1 = SM, 2 = memory
        v = ctypes.c_uint()
        self._call("nvmlDeviceGetMaxClockInfo", h, ctypes.c_int(clock_type), ctypes.byref(v))
        return v.value

    def power_limit_mw(self, h):
        return self._uint("nvmlDeviceGetPowerManagementLimit", h)

    def pci_bus_id(self, h):
        pci = self._Pci()
        self._call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci))
        return pci.busId.decode("ascii", "replace")

    def mig_handles(self, h):
        out = []
        for i in range(self._uint("nvmlDeviceGetMaxMigDeviceCount", h)):
            mh = ctypes.c_void_p()
            rc = self.lib.nvmlDeviceGetMigDeviceHandleByIndex(h, ctypes.c_uint(i), ctypes.byref(mh))
            if rc == 0:
                out.append(mh)
        return out

    def sm_count(self, mig_handle):
        a = self._Attributes()
        self._call("nvmlDeviceGetAttributes_v2", mig_handle, ctypes.byref(a))
        return int(a.multiprocessorCount)

    def shutdown(self):
        self.lib.nvmlShutdown()


class _NvmlPy:
    """The same calls through pynvml (nvidia-ml-py)."""

    source = "pynvml"

    def __init__(self, pynvml):
        self.m = pynvml
        self.m.nvmlInit()

    def _wrap(self, fn, *args):
        try:
            return fn(*args)
        except self.m.NVMLError as e:
            raise NvmlError(getattr(e, "value", "?"), str(e))

    @staticmethod
    def _s(v):
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    def count(self):
        return int(self._wrap(self.m.nvmlDeviceGetCount))

    def handle(self, index):
        return self._wrap(self.m.nvmlDeviceGetHandleByIndex, index)

    def name(self, h):
        return self._s(self._wrap(self.m.nvmlDeviceGetName, h))

    def uuid(self, h):
        return self._s(self._wrap(self.m.nvmlDeviceGetUUID, h))

    def memory_total(self, h):
        return int(self._wrap(self.m.nvmlDeviceGetMemoryInfo, h).total)

    def compute_capability(self, h):
        major, minor = self._wrap(self.m.nvmlDeviceGetCudaComputeCapability, h)
        return int(major), int(minor)

    def driver_version(self):
        return self._s(self._wrap(self.m.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self):
        return int(self._wrap(self.m.nvmlSystemGetCudaDriverVersion))

    def ecc_enabled(self, h):
        cur, _pending = self._wrap(self.m.nvmlDeviceGetEccMode, h)
        return bool(cur)

    def mig_enabled(self, h):
        cur, _pending = self._wrap(self.m.nvmlDeviceGetMigMode, h)
        return int(cur) == 1

    def max_clock(self, h, clock_type):
        return int(self._wrap(self.m.nvmlDeviceGetMaxClockInfo, h, clock_type))

    def power_limit_mw(self, h):
        return int(self._wrap(self.m.nvmlDeviceGetPowerManagementLimit, h))

    def pci_bus_id(self, h):
        return self._s(self._wrap(self.m.nvmlDeviceGetPciInfo, h).busId)

    def mig_handles(self, h):
        out = []
        for i in range(int(self._wrap(self.m.nvmlDeviceGetMaxMigDeviceCount, h))):
            try:
                out.append(self.m.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
            except self.m.NVMLError:
                continue
        return out

    def sm_count(self, mig_handle):
        getter = getattr(self.m, "nvmlDeviceGetAttributes_v2", None) or self.m.nvmlDeviceGetAttributes
        return int(self._wrap(getter, mig_handle).multiprocessorCount)

    def shutdown(self):
        try:
            self.m.nvmlShutdown()
        except Exception:
            pass


def _open_nvml(tried, only=None):
    if only in (None, "pynvml"):
        try:
            import pynvml  # nvidia-ml-py
        except Exception as e:
            tried.append("pynvml: not importable (%s)" % _reason(e))
        else:
            try:
                return _NvmlPy(pynvml)
            except Exception as e:
                tried.append("pynvml: %s" % _reason(e))
        if only == "pynvml":
            return None
    try:
        return _NvmlCtypes()
    except OSError as e:
        tried.append("libnvidia-ml.so.1: %s" % _reason(e))
    except Exception as e:
        tried.append("libnvidia-ml.so.1: %s" % _reason(e))
    return None


def _cuda_version_string(code):
    """12040 -> "12.4" (CUDA encodes major*1000 + minor*10)."""
    if code is None:
        return None
    code = int(code)
    return "%d.%d" % (code // 1000, (code % 1000) // 10)


def _nvml_field(errors, path, fn, *args):
    """Like _safe, but NVML's NOT_SUPPORTED becomes a plain null (a fact, not a failure)."""
    try:
        return fn(*args)
    except NvmlError as e:
        if e.code == NvmlError.NOT_SUPPORTED:
            return None
        errors.append("%s: %s" % (path, _reason(e)))
        return None
    except Exception as e:
        errors.append("%s: %s" % (path, _reason(e)))
        return None


def _gpus_from_nvml(nvml, errors):
    driver = _nvml_field(errors, "hardware.gpus.driver_version", nvml.driver_version)
    cuda_driver = _cuda_version_string(
        _nvml_field(errors, "hardware.gpus.cuda_driver_version", nvml.cuda_driver_version))
    gpus = []
    count = _nvml_field(errors, "hardware.gpus", nvml.count) or 0
    for i in range(count):
        p = "hardware.gpus[%d]." % i
        try:
            h = nvml.handle(i)
        except Exception as e:
            errors.append("%shandle: %s" % (p, _reason(e)))
            continue
        cc = _nvml_field(errors, p + "compute_capability", nvml.compute_capability, h)
        mig = _nvml_field(errors, p + "mig_mode", nvml.mig_enabled, h)
        sm_mhz = _nvml_field(errors, p + "clocks.sm_max_mhz", nvml.max_clock, h, 1)
        mem_mhz = _nvml_field(errors, p + "clocks.mem_max_mhz", nvml.max_clock, h, 2)
        power = _nvml_field(errors, p + "power_limit_w", nvml.power_limit_mw, h)
        ecc = _nvml_field(errors, p + "ecc_enabled", nvml.ecc_enabled, h)
        gpu = {
            "index": i,
            "name": _nvml_field(errors, p + "name", nvml.name, h),
            "uuid": _nvml_field(errors, p + "uuid", nvml.uuid, h),
            "memory_bytes": _nvml_field(errors, p + "memory_bytes", nvml.memory_total, h),
            "compute_capability": "%d.%d" % cc if cc else None,
            "sm_count": None,
            "sm_count_source": None,
            "driver_version": driver,
            "cuda_driver_version": cuda_driver,
            "ecc_enabled": bool(ecc) if ecc is not None else False,  # NOT_SUPPORTED: ECC cannot be on
            "mig_mode": "not supported" if mig is None else ("enabled" if mig else "disabled"),
            "clocks": {"sm_max_mhz": sm_mhz, "mem_max_mhz": mem_mhz},
            "power_limit_w": round(power / 1000.0, 3) if power is not None else None,
            "pci_bus_id": _nvml_field(errors, p + "pci_bus_id", nvml.pci_bus_id, h),
        }
        if not mig:
            gpus.append(gpu)
            continue
        handles = _nvml_field(errors, p + "mig_devices", nvml.mig_handles, h) or []
        if not handles:
            gpus.append(gpu)  # MIG on, but no slice visible to us: list the parent
            continue
        parent = {"index": i, "name": gpu["name"], "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"]}
        for j, mh in enumerate(handles):
            q = "hardware.gpus[%d].mig[%d]." % (i, j)
            sm = _nvml_field(errors, q + "sm_count", nvml.sm_count, mh)
            slice_gpu = dict(gpu)
            slice_gpu.update({
                "index": len(gpus),
                "name": _nvml_field(errors, q + "name", nvml.name, mh),
                "uuid": _nvml_field(errors, q + "uuid", nvml.uuid, mh),
                "memory_bytes": _nvml_field(errors, q + "memory_bytes", nvml.memory_total, mh),
                "sm_count": sm,
                "sm_count_source": "nvml-mig-attributes" if sm is not None else None,
                "mig_parent": parent,
            })
            gpus.append(slice_gpu)
    for n, g in enumerate(gpus):
        g["index"] = n
    return gpus


def _smi_value(raw):
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw in ("N/A", "Not Supported"):
        return None
    return raw


def _gpus_from_nvidia_smi(smi, errors):
    fields = list(SMI_FIELDS)
    proc = None
    for _attempt in range(2):
        proc = subprocess.run(
            [smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, universal_newlines=True,
        )
        if proc.returncode == 0 or "compute_cap" not in fields:
            break
        fields.remove("compute_cap")  # drivers before ~510 do not know this field
    if proc is None or proc.returncode != 0:
        msg = " ".join(((proc.stderr or proc.stdout) if proc else "").split())
        raise RuntimeError("nvidia-smi exited %s: %s" % (proc.returncode if proc else "?", msg))
    banner = ""
    try:
        banner = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
                                universal_newlines=True).stdout
    except Exception as e:
        errors.append("hardware.gpus.cuda_driver_version: %s" % _reason(e))
    return parse_nvidia_smi(proc.stdout, fields, banner, errors)


def parse_nvidia_smi(csv_text, fields, banner, errors):
    """GPU entries from ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``
    output; the CUDA version from the plain ``nvidia-smi`` banner."""
    m = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", banner or "")
    cuda_driver = m.group(1) if m else None
    if cuda_driver is None:
        errors.append("hardware.gpus.cuda_driver_version: no 'CUDA Version' in nvidia-smi output")
    gpus = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        row = dict(zip(fields, [_smi_value(c) for c in line.split(",")]))

        def num(key, cast):
            v = row.get(key)
            try:
                return cast(v) if v is not None else None
            except ValueError:
                errors.append("hardware.gpus[%d].%s: unreadable %r" % (len(gpus), key, v))
                return None

        mib = num("memory.total", float)
        ecc = row.get("ecc.mode.current")
        mig = row.get("mig.mode.current")
        gpus.append({
            "index": num("index", int),
            "name": row.get("name"),
            "uuid": row.get("uuid"),
            "memory_bytes": int(mib * 1024 * 1024) if mib is not None else None,
            "compute_capability": row.get("compute_cap"),
            "sm_count": None,
            "sm_count_source": None,
            "driver_version": row.get("driver_version"),
            "cuda_driver_version": cuda_driver,
            "ecc_enabled": (ecc or "").lower() == "enabled",
            "mig_mode": (mig or "not supported").lower(),
            "clocks": {"sm_max_mhz": num("clocks.max.sm", int), "mem_max_mhz": num("clocks.max.memory", int)},
            "power_limit_w": num("power.limit", float),
            "pci_bus_id": row.get("pci.bus_id"),
        })
    return gpus


class _CudaDevice:
    """What the CUDA side (torch or libcuda) knows about one device."""

    def __init__(self, name, uuid, pci_bus_id, cc, sm_count, memory_bytes, source):
        self.name, self.uuid, self.pci_bus_id = name, uuid, pci_bus_id
        self.cc, self.sm_count, self.memory_bytes, self.source = cc, sm_count, memory_bytes, source


def _cuda_devices_from_torch(errors, tried):
    try:
        import torch
    except Exception as e:
        tried.append("torch: not importable (%s)" % _reason(e))
        return None
    try:
        if not torch.cuda.is_available():
            tried.append("torch: torch.cuda.is_available() is False")
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            pr = torch.cuda.get_device_properties(i)
            uuid = getattr(pr, "uuid", None)
            bus = None
            if hasattr(pr, "pci_bus_id"):
                bus = "%04x:%02x:%02x.0" % (getattr(pr, "pci_domain_id", 0), pr.pci_bus_id, pr.pci_device_id)
            out.append(_CudaDevice(pr.name, str(uuid) if uuid is not None else None, bus,
                                   "%d.%d" % (pr.major, pr.minor), int(pr.multi_processor_count),
                                   int(pr.total_memory), "torch"))
        return out
    except Exception as e:
        errors.append("hardware.gpus.sm_count: torch: %s" % _reason(e))
        return None


def _cuda_devices_from_libcuda(errors, tried):
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        tried.append("libcuda.so.1: %s" % _reason(e))
        return None
    try:
        def call(name, *args):
            rc = getattr(cu, name)(*args)
            if rc != 0:
                raise RuntimeError("%s returned CUDA error %d" % (name, rc))

        call("cuInit", ctypes.c_uint(0))
        n = ctypes.c_int()
        call("cuDeviceGetCount", ctypes.byref(n))
        out = []
        for i in range(n.value):
            dev = ctypes.c_int()
            call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(i))

            def attr(code):
                v = ctypes.c_int()
                call("cuDeviceGetAttribute", ctypes.byref(v), ctypes.c_int(code), dev)
                return v.value

            name = ctypes.create_string_buffer(256)
            call("cuDeviceGetName", name, ctypes.c_int(256), dev)
            raw = (ctypes.c_ubyte * 16)()
            # _v2 gives a MIG slice its own UUID (what NVML lists); older drivers lack it
            uuid_fn = "cuDeviceGetUuid_v2" if hasattr(cu, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
            call(uuid_fn, ctypes.byref(raw), dev)
            h = bytes(bytearray(raw)).hex()
            bus = ctypes.create_string_buffer(32)
            call("cuDeviceGetPCIBusId", bus, ctypes.c_int(32), dev)
            mem = ctypes.c_size_t()
            call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev)
            # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16, COMPUTE_CAPABILITY_MAJOR/MINOR = 75/76
            out.append(_CudaDevice(
                name.value.decode("utf-8", "replace"),
                "%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]),
                bus.value.decode("ascii", "replace"), "%d.%d" % (attr(75), attr(76)), attr(16),
                int(mem.value), "libcuda"))
        return out
    except Exception as e:
        errors.append("hardware.gpus.sm_count: libcuda: %s" % _reason(e))
        return None


def _norm_uuid(u):
    if not u:
        return None
    u = u.lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix):]
    return re.sub(r"[^0-9a-f]", "", u) or None


def _norm_bus(b):
    """'00000000:3B:00.0' and '0000:3b:00.0' -> (0, 0x3b, 0, 0)."""
    m = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$", (b or "").strip())
    return tuple(int(x, 16) for x in m.groups()) if m else None


def _attach_sm_counts(gpus, cuda_devs, errors):
    by_uuid = {_norm_uuid(d.uuid): d for d in cuda_devs if _norm_uuid(d.uuid)}
    by_bus = {}
    for d in cuda_devs:
        if _norm_bus(d.pci_bus_id):
            by_bus.setdefault(_norm_bus(d.pci_bus_id), []).append(d)
    for g in gpus:
        if g.get("sm_count") is not None:
            continue
        d = by_uuid.get(_norm_uuid(g.get("uuid")))
        if d is None and "mig_parent" not in g:
            same_bus = by_bus.get(_norm_bus(g.get("pci_bus_id"))) or []
            d = same_bus[0] if len(same_bus) == 1 else None
        if d is None:
            errors.append("hardware.gpus[%s].sm_count: not visible to CUDA (CUDA_VISIBLE_DEVICES?)" % g.get("index"))
            continue
        g["sm_count"] = d.sm_count
        g["sm_count_source"] = d.source
        if g.get("compute_capability") is None:
            g["compute_capability"] = d.cc


def _gpus_from_cuda(cuda_devs, cuda_driver):
    return [{
        "index": i, "name": d.name, "uuid": d.uuid, "memory_bytes": d.memory_bytes,
        "compute_capability": d.cc, "sm_count": d.sm_count, "sm_count_source": d.source,
        "driver_version": None, "cuda_driver_version": cuda_driver, "ecc_enabled": None,
        "mig_mode": None, "clocks": {"sm_max_mhz": None, "mem_max_mhz": None},
        "power_limit_w": None, "pci_bus_id": d.pci_bus_id,
    } for i, d in enumerate(cuda_devs)]


def collect_gpus(errors, use_torch=True):
    """(gpus, source, sources_tried). gpus is [] when none is visible.

    HERMETIC_PROBE_GPU_SOURCE=pynvml|nvml|nvidia-smi|cuda restricts the GPU list
    to one source (to compare sources on a GPU machine, or to work around one).
    """
    tried = []
    gpus = []
    source = None
    only = os.environ.get("HERMETIC_PROBE_GPU_SOURCE") or None
    nvml = None
    if only in (None, "pynvml", "nvml"):
        nvml = _open_nvml(tried, only)
    elif only not in ("nvidia-smi", "cuda"):
        errors.append("hardware.gpus: HERMETIC_PROBE_GPU_SOURCE=%r is not one of pynvml, nvml, nvidia-smi, cuda" % only)
    if nvml is not None:
        try:
            gpus = _gpus_from_nvml(nvml, errors)
            source = nvml.source
        finally:
            nvml.shutdown()
    elif only in (None, "nvidia-smi"):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            tried.append("nvidia-smi: not on PATH")
        else:
            try:
                gpus = _gpus_from_nvidia_smi(smi, errors)
                source = "nvidia-smi"
            except Exception as e:
                tried.append("nvidia-smi: %s" % _reason(e))
                errors.append("hardware.gpus: nvidia-smi: %s" % _reason(e))
    # SM counts (and, with no NVML/nvidia-smi, the GPU list itself) from CUDA.
    # With no GPU listed, CUDA failing to find one is the normal CPU case:
    # its reasons go to sources_tried, not to errors.
    need_cuda = not gpus or any(g.get("sm_count") is None for g in gpus)
    cuda_devs = None
    if need_cuda and (gpus or (nvml is None and only in (None, "cuda"))):
        cuda_errors = errors if gpus else []
        if use_torch:
            cuda_devs = _cuda_devices_from_torch(cuda_errors, tried)
        if cuda_devs is None:
            cuda_devs = _cuda_devices_from_libcuda(cuda_errors, tried)
        if not gpus:
            tried.extend(cuda_errors)
    if gpus and cuda_devs is not None:
        _attach_sm_counts(gpus, cuda_devs, errors)
    elif gpus:
        for g in gpus:
            if g.get("sm_count") is None:
                errors.append("hardware.gpus[%s].sm_count: no CUDA view (torch without CUDA, libcuda.so.1 missing)"
                              % g.get("index"))
    elif cuda_devs:
        gpus = _gpus_from_cuda(cuda_devs, _libcuda_driver_version())
        source = cuda_devs[0].source
        errors.append("hardware.gpus: listed from %s (no NVML, no nvidia-smi): driver version, ECC, MIG, "
                      "clocks and power limit unknown" % source)
    return gpus, source, tried


def _libcuda_driver_version():
    """ "12.4" from cuDriverGetVersion, or None."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if cu.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return _cuda_version_string(v.value)
    except Exception:
        return None


# -- entry points -----------------------------------------------------------

def collect(use_torch=True):
    """The whole probe document. use_torch=False skips importing torch for GPU facts."""
    errors = []
    doc = {"probe_version": PROBE_VERSION, "software": None, "hardware": None, "errors": errors}
    try:
        doc["software"] = collect_software(errors)
    except Exception as e:
        errors.append("software: %s" % _reason(e))
    try:
        doc["hardware"] = collect_hardware(errors, use_torch=use_torch)
    except Exception as e:
        errors.append("hardware: %s" % _reason(e))
    return doc


def main():
    # Point fd 1 at stderr while collecting: native libraries write to fd 1
    # directly, and only the JSON may reach the real stdout.
    saved = None
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
               "errors": ["probe: %s" % _reason(e)]}
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
