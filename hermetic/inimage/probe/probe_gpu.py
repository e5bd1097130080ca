"""The probe's GPU facts (see probe.py): NVML through pynvml (nvidia-ml-py) or ctypes on libnvidia-ml.so.1,
else ``nvidia-smi --query-gpu``, else CUDA (torch or libcuda.so.1's driver API), which also gives the SM counts
NVML has not for a whole GPU (matched to its devices by UUID, then PCI bus id). Standard library only, Python 3.8+.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import shutil
import subprocess


def reason(exc):
    return " ".join(("%s: %s" % (type(exc).__name__, exc)).split())  # one line


def cuda_version_string(code):
    """12040 -> "12.4" (CUDA encodes major*1000 + minor*10); None stays None."""
    return None if code is None else "%d.%d" % (int(code) // 1000, (int(code) % 1000) // 10)


# -- NVML -------------------------------------------------------------------

class NvmlError(Exception):
    def __init__(self, code, message):
        Exception.__init__(self, "NVML error %s: %s" % (code, message))
        self.code = code


class NvmlCtypes:
    """The handful of NVML calls the probe needs, straight from libnvidia-ml.so.1."""

    source = "nvml"

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class _Pci(ctypes.Structure):  # nvmlPciInfo_t (v3): domain, bus, device, pciDeviceId, pciSubSystemId
        _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("ids", ctypes.c_uint * 5), ("busId", ctypes.c_char * 32)]

    class _Attributes(ctypes.Structure):  # nvmlDeviceAttributes_t: 7 more counts (shared engines, slices)
        _fields_ = [("multiprocessorCount", ctypes.c_uint), ("counts", ctypes.c_uint * 7),
                    ("memorySizeMB", ctypes.c_ulonglong)]

    # pynvml's name -> what the C function writes after its arguments: values by reference, or a string buffer
    # of this size (and its size)
    OUT = {
        "nvmlDeviceGetCount": (ctypes.c_uint,),
        "nvmlDeviceGetHandleByIndex": (ctypes.c_void_p,),
        "nvmlDeviceGetName": 96,
        "nvmlDeviceGetUUID": 96,
        "nvmlDeviceGetMemoryInfo": (_Memory,),
        "nvmlDeviceGetCudaComputeCapability": (ctypes.c_int, ctypes.c_int),
        "nvmlSystemGetDriverVersion": 80,
        "nvmlSystemGetCudaDriverVersion": (ctypes.c_int,),
        "nvmlDeviceGetEccMode": (ctypes.c_int, ctypes.c_int),
        "nvmlDeviceGetMigMode": (ctypes.c_uint, ctypes.c_uint),
        "nvmlDeviceGetMaxClockInfo": (ctypes.c_uint,),
        "nvmlDeviceGetPowerManagementLimit": (ctypes.c_uint,),
        "nvmlDeviceGetPciInfo": (_Pci,),
        "nvmlDeviceGetMaxMigDeviceCount": (ctypes.c_uint,),
        "nvmlDeviceGetMigDeviceHandleByIndex": (ctypes.c_void_p,),
        "nvmlDeviceGetAttributes_v2": (_Attributes,),
    }
    C_NAME = {  # the versioned C function pynvml calls under the plain name
        "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    }

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self.lib.nvmlInit_v2())

    def _check(self, rc):
        if rc != 0:
            raise NvmlError(rc, (self.lib.nvmlErrorString(rc) or b"?").decode("utf-8", "replace"))

    def call(self, name, *args):
        fn, out = getattr(self.lib, self.C_NAME.get(name, name)), self.OUT[name]
        if isinstance(out, int):
            buf = ctypes.create_string_buffer(out)
            self._check(fn(*(args + (buf, ctypes.c_uint(out)))))
            return buf.value
        values = [kind() for kind in out]
        self._check(fn(*(args + tuple(ctypes.byref(v) for v in values))))
        # a handle or a struct as it is (a handle's .value would be passed back as a C int), a number as its value
        values = [v if isinstance(v, (ctypes.c_void_p, ctypes.Structure)) else v.value for v in values]
        return values[0] if len(values) == 1 else tuple(values)

    def shutdown(self):
        self.lib.nvmlShutdown()


class NvmlPy:
    """The same calls through pynvml (nvidia-ml-py)."""

    source = "pynvml"

    def __init__(self, pynvml):
        self.m = pynvml
        self.m.nvmlInit()

    def call(self, name, *args):
        fn = getattr(self.m, name, None) or getattr(self.m, name.replace("_v2", ""))  # an older pynvml: no _v2
        try:
            return fn(*args)
        except self.m.NVMLError as e:
            raise NvmlError(getattr(e, "value", "?"), str(e))

    def shutdown(self):
        try:
            self.m.nvmlShutdown()
        except Exception:
            pass


def open_nvml(tried, only=None):
    if only in (None, "pynvml"):
        try:
            import pynvml  # nvidia-ml-py
        except Exception as e:
            tried.append("pynvml: not importable (%s)" % reason(e))
        else:
            try:
                return NvmlPy(pynvml)
            except Exception as e:
                tried.append("pynvml: %s" % reason(e))
        if only == "pynvml":
            return None
    try:
        return NvmlCtypes()
    except Exception as e:  # OSError: no such library
        tried.append("libnvidia-ml.so.1: %s" % reason(e))
    return None


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _mig_handles(nvml, h):
    out = []
    for i in range(int(nvml.call("nvmlDeviceGetMaxMigDeviceCount", h))):
        try:
            out.append(nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", h, i))
        except NvmlError:  # no slice at this index
            continue
    return out


def _nvml_field(errors, path, fn, *args):
    """Like safe, but NVML's NOT_SUPPORTED becomes a plain null (a fact, not a failure)."""
    try:
        return fn(*args)
    except Exception as e:
        if not (isinstance(e, NvmlError) and e.code == 3):  # NVML_ERROR_NOT_SUPPORTED
            errors.append("%s: %s" % (path, reason(e)))
        return None


def gpus_from_nvml(nvml, errors):
    def field(path, convert, name, *args):
        return _nvml_field(errors, path, lambda: convert(nvml.call(name, *args)))

    def described(p, h):  # what a GPU and a MIG slice of it each have
        return {"name": field(p + "name", _text, "nvmlDeviceGetName", h),
                "uuid": field(p + "uuid", _text, "nvmlDeviceGetUUID", h),
                "memory_bytes": field(p + "memory_bytes", lambda v: int(v.total), "nvmlDeviceGetMemoryInfo", h)}

    driver = field("hardware.gpus.driver_version", _text, "nvmlSystemGetDriverVersion")
    cuda_driver = cuda_version_string(
        field("hardware.gpus.cuda_driver_version", int, "nvmlSystemGetCudaDriverVersion"))
    gpus = []
    for i in range(field("hardware.gpus", int, "nvmlDeviceGetCount") or 0):
        p = "hardware.gpus[%d]." % i
        try:
            h = nvml.call("nvmlDeviceGetHandleByIndex", i)
        except Exception as e:
            errors.append("%shandle: %s" % (p, reason(e)))
            continue
        cc = field(p + "compute_capability", lambda v: "%d.%d" % tuple(v), "nvmlDeviceGetCudaComputeCapability", h)
        mig = field(p + "mig_mode", lambda v: int(v[0]) == 1, "nvmlDeviceGetMigMode", h)
        sm_mhz = field(p + "clocks.sm_max_mhz", int, "nvmlDeviceGetMaxClockInfo", h, 1)  # 1 = SM, 2 = memory
        mem_mhz = field(p + "clocks.mem_max_mhz", int, "nvmlDeviceGetMaxClockInfo", h, 2)
        power = field(p + "power_limit_w", lambda v: round(int(v) / 1000.0, 3), "nvmlDeviceGetPowerManagementLimit", h)
        ecc = field(p + "ecc_enabled", lambda v: bool(v[0]), "nvmlDeviceGetEccMode", h)
        gpu = described(p, h)
        gpu.update({
            "index": i, "compute_capability": cc, "sm_count": None, "sm_count_source": None,
            "driver_version": driver, "cuda_driver_version": cuda_driver,
            "ecc_enabled": bool(ecc),  # NOT_SUPPORTED (None): ECC cannot be on
            "mig_mode": "not supported" if mig is None else ("enabled" if mig else "disabled"),
            "clocks": {"sm_max_mhz": sm_mhz, "mem_max_mhz": mem_mhz}, "power_limit_w": power,
            "pci_bus_id": field(p + "pci_bus_id", lambda v: _text(v.busId), "nvmlDeviceGetPciInfo", h),
        })
        handles = (_nvml_field(errors, p + "mig_devices", _mig_handles, nvml, h) or []) if mig else []
        if not handles:
            gpus.append(gpu)  # MIG off, or on with no slice visible to us: list the parent
            continue
        parent = {"index": i, "name": gpu["name"], "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"]}
        for j, mh in enumerate(handles):
            q = "hardware.gpus[%d].mig[%d]." % (i, j)
            sm = field(q + "sm_count", lambda v: int(v.multiprocessorCount), "nvmlDeviceGetAttributes_v2", mh)
            gpus.append(dict(gpu, sm_count=sm, sm_count_source="nvml-mig-attributes" if sm is not None else None,
                             mig_parent=parent, **described(q, mh)))
    for n, g in enumerate(gpus):  # MIG slices listed in their parent's place
        g["index"] = n
    return gpus


# -- nvidia-smi ------------------------------------------------------------

SMI_FIELDS = (
    "index", "name", "uuid", "memory.total", "compute_cap", "driver_version",
    "ecc.mode.current", "mig.mode.current", "clocks.max.sm", "clocks.max.memory",
    "power.limit", "pci.bus_id",
)


def _smi_value(raw):
    raw = raw.strip()
    return None if not raw or raw.startswith("[") or raw in ("N/A", "Not Supported") else raw


def gpus_from_nvidia_smi(smi, errors):
    fields = list(SMI_FIELDS)
    while True:
        proc = subprocess.run(
            [smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, universal_newlines=True,
        )
        if proc.returncode == 0 or "compute_cap" not in fields:
            break
        fields.remove("compute_cap")  # drivers before ~510 do not know this field
    if proc.returncode != 0:
        msg = " ".join((proc.stderr or proc.stdout).split())
        raise RuntimeError("nvidia-smi exited %s: %s" % (proc.returncode, msg))
    banner = ""
    try:
        banner = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
                                universal_newlines=True).stdout
    except Exception as e:
        errors.append("hardware.gpus.cuda_driver_version: %s" % reason(e))
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
            "ecc_enabled": (row.get("ecc.mode.current") or "").lower() == "enabled",
            "mig_mode": (row.get("mig.mode.current") or "not supported").lower(),
            "clocks": {"sm_max_mhz": num("clocks.max.sm", int), "mem_max_mhz": num("clocks.max.memory", int)},
            "power_limit_w": num("power.limit", float),
            "pci_bus_id": row.get("pci.bus_id"),
        })
    return gpus


# -- CUDA -------------------------------------------------------------------

# What the CUDA side (torch or libcuda) knows about one device.
CudaDevice = collections.namedtuple("CudaDevice", "name uuid pci_bus_id cc sm_count memory_bytes source")


def cuda_devices_from_torch(errors, tried):
    try:
        import torch
    except Exception as e:
        tried.append("torch: not importable (%s)" % reason(e))
        return None
    try:
        if not torch.cuda.is_available():
            tried.append("torch: torch.cuda.is_available() is False")
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            pr = torch.cuda.get_device_properties(i)
            uuid = getattr(pr, "uuid", None)
            bus = ("%04x:%02x:%02x.0" % (getattr(pr, "pci_domain_id", 0), pr.pci_bus_id, pr.pci_device_id)
                   if hasattr(pr, "pci_bus_id") else None)
            out.append(CudaDevice(pr.name, str(uuid) if uuid is not None else None, bus,
                                   "%d.%d" % (pr.major, pr.minor), int(pr.multi_processor_count),
                                   int(pr.total_memory), "torch"))
        return out
    except Exception as e:
        errors.append("hardware.gpus.sm_count: torch: %s" % reason(e))
        return None


def cuda_devices_from_libcuda(errors, tried):
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        tried.append("libcuda.so.1: %s" % reason(e))
        return None
    try:
        def call(name, *args):
            rc = getattr(cu, name)(*args)
            if rc != 0:
                raise RuntimeError("%s returned CUDA error %d" % (name, rc))

        def out(kind, name, *args):  # what the function writes to its first argument
            v = kind()
            call(name, ctypes.byref(v), *args)
            return v

        def text(name, size, dev, encoding):
            buf = ctypes.create_string_buffer(size)
            call(name, buf, size, dev)
            return buf.value.decode(encoding, "replace")

        call("cuInit", 0)
        devs = []
        for i in range(out(ctypes.c_int, "cuDeviceGetCount").value):
            dev = out(ctypes.c_int, "cuDeviceGet", i)
            name = text("cuDeviceGetName", 256, dev, "utf-8")
            # _v2 gives a MIG slice its own UUID (what NVML lists); older drivers lack it
            uuid_fn = "cuDeviceGetUuid_v2" if hasattr(cu, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
            h = bytes(out(ctypes.c_ubyte * 16, uuid_fn, dev)).hex()
            bus = text("cuDeviceGetPCIBusId", 32, dev, "ascii")
            mem = int(out(ctypes.c_size_t, "cuDeviceTotalMem_v2", dev).value)
            # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR = 75/76, MULTIPROCESSOR_COUNT = 16
            major, minor, sms = (out(ctypes.c_int, "cuDeviceGetAttribute", a, dev).value for a in (75, 76, 16))
            devs.append(CudaDevice(name, "%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]), bus,
                                   "%d.%d" % (major, minor), sms, mem, "libcuda"))
        return devs
    except Exception as e:
        errors.append("hardware.gpus.sm_count: libcuda: %s" % reason(e))
        return None


def _norm_uuid(u):
    """'GPU-1111...', 'MIG-...' and torch's '1111...' -> the hex digits (a prefix's letters are not hex)."""
    return re.sub(r"[^0-9a-f]", "", (u or "").lower()) or None


def _norm_bus(b):
    """'00000000:3B:00.0' and '0000:3b:00.0' -> (0, 0x3b, 0, 0)."""
    m = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$", (b or "").strip())
    return tuple(int(x, 16) for x in m.groups()) if m else None


def attach_sm_counts(gpus, cuda_devs, errors):
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


# -- which source says what ------------------------------------------------

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
        nvml = open_nvml(tried, only)
    elif only not in ("nvidia-smi", "cuda"):
        errors.append("hardware.gpus: HERMETIC_PROBE_GPU_SOURCE=%r is not one of pynvml, nvml, nvidia-smi, cuda" % only)
    if nvml is not None:
        try:
            gpus = gpus_from_nvml(nvml, errors)
            source = nvml.source
        finally:
            nvml.shutdown()
    elif only in (None, "nvidia-smi"):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            tried.append("nvidia-smi: not on PATH")
        else:
            try:
                gpus = gpus_from_nvidia_smi(smi, errors)
                source = "nvidia-smi"
            except Exception as e:
                tried.append("nvidia-smi: %s" % reason(e))
                errors.append("hardware.gpus: nvidia-smi: %s" % reason(e))
    # SM counts (and, with no NVML/nvidia-smi, the GPU list itself) from CUDA.
    # With no GPU listed, CUDA failing to find one is the normal CPU case:
    # its reasons go to sources_tried, not to errors.
    need_cuda = not gpus or any(g.get("sm_count") is None for g in gpus)
    cuda_devs = None
    if need_cuda and (gpus or (nvml is None and only in (None, "cuda"))):
        cuda_errors = errors if gpus else []
        if use_torch:
            cuda_devs = cuda_devices_from_torch(cuda_errors, tried)
        if cuda_devs is None:
            cuda_devs = cuda_devices_from_libcuda(cuda_errors, tried)
        if not gpus:
            tried.extend(cuda_errors)
    if gpus and cuda_devs is not None:
        attach_sm_counts(gpus, cuda_devs, errors)
    elif gpus:
        for g in gpus:
            if g.get("sm_count") is None:
                errors.append("hardware.gpus[%s].sm_count: no CUDA view (torch without CUDA, libcuda.so.1 missing)"
                              % g.get("index"))
    elif cuda_devs:
        cuda_driver, v = None, ctypes.c_int()
        try:
            if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
                cuda_driver = cuda_version_string(v.value)  # "12.4"
        except Exception:  # no libcuda.so.1 (torch listed the GPUs)
            pass
        gpus = [{
            "index": i, "name": d.name, "uuid": d.uuid, "memory_bytes": d.memory_bytes,
            "compute_capability": d.cc, "sm_count": d.sm_count, "sm_count_source": d.source,
            "driver_version": None, "cuda_driver_version": cuda_driver, "ecc_enabled": None,
            "mig_mode": None, "clocks": {"sm_max_mhz": None, "mem_max_mhz": None},
            "power_limit_w": None, "pci_bus_id": d.pci_bus_id,
        } for i, d in enumerate(cuda_devs)]
        source = cuda_devs[0].source
        errors.append("hardware.gpus: listed from %s (no NVML, no nvidia-smi): driver version, ECC, MIG, "
                      "clocks and power limit unknown" % source)
    return gpus, source, tried
