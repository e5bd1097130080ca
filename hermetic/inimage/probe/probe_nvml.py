"""The probe's NVML backends: pynvml (nvidia-ml-py) when importable, else ctypes on libnvidia-ml.so.1.

Both answer ``call(name, *args)`` by pynvml's function names, with pynvml's results.
Standard library only (pynvml is optional), Python 3.8+; see probe.py.
"""

from __future__ import annotations

import ctypes

if __package__:  # imported from hermetic (doctor, tests)
    from hermetic.inimage.probe.probe_util import cuda_version_string, reason
else:  # run as a script inside the container: this directory is sys.path[0]
    from probe_util import cuda_version_string, reason


class NvmlError(Exception):
    NOT_SUPPORTED = 3

    def __init__(self, code, message):
        Exception.__init__(self, "NVML error %s: %s" % (code, message))
        self.code = code


class NvmlCtypes:
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
        if not (isinstance(e, NvmlError) and e.code == NvmlError.NOT_SUPPORTED):
            errors.append("%s: %s" % (path, reason(e)))
        return None


def gpus_from_nvml(nvml, errors):
    def field(path, convert, name, *args):
        return _nvml_field(errors, path, lambda: convert(nvml.call(name, *args)))

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
        power = field(p + "power_limit_w", int, "nvmlDeviceGetPowerManagementLimit", h)
        ecc = field(p + "ecc_enabled", lambda v: bool(v[0]), "nvmlDeviceGetEccMode", h)
        gpu = {
            "index": i,
            "name": field(p + "name", _text, "nvmlDeviceGetName", h),
            "uuid": field(p + "uuid", _text, "nvmlDeviceGetUUID", h),
            "memory_bytes": field(p + "memory_bytes", lambda v: int(v.total), "nvmlDeviceGetMemoryInfo", h),
            "compute_capability": cc,
            "sm_count": None,
            "sm_count_source": None,
            "driver_version": driver,
            "cuda_driver_version": cuda_driver,
            "ecc_enabled": bool(ecc) if ecc is not None else False,  # NOT_SUPPORTED: ECC cannot be on
            "mig_mode": "not supported" if mig is None else ("enabled" if mig else "disabled"),
            "clocks": {"sm_max_mhz": sm_mhz, "mem_max_mhz": mem_mhz},
            "power_limit_w": round(power / 1000.0, 3) if power is not None else None,
            "pci_bus_id": field(p + "pci_bus_id", lambda v: _text(v.busId), "nvmlDeviceGetPciInfo", h),
        }
        handles = (_nvml_field(errors, p + "mig_devices", _mig_handles, nvml, h) or []) if mig else []
        if not handles:
            gpus.append(gpu)  # MIG off, or on with no slice visible to us: list the parent
            continue
        parent = {"index": i, "name": gpu["name"], "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"]}
        for j, mh in enumerate(handles):
            q = "hardware.gpus[%d].mig[%d]." % (i, j)
            sm = field(q + "sm_count", lambda v: int(v.multiprocessorCount), "nvmlDeviceGetAttributes_v2", mh)
            slice_gpu = dict(gpu)
            slice_gpu.update({
                "index": len(gpus),
                "name": field(q + "name", _text, "nvmlDeviceGetName", mh),
                "uuid": field(q + "uuid", _text, "nvmlDeviceGetUUID", mh),
                "memory_bytes": field(q + "memory_bytes", lambda v: int(v.total), "nvmlDeviceGetMemoryInfo", mh),
                "sm_count": sm,
                "sm_count_source": "nvml-mig-attributes" if sm is not None else None,
                "mig_parent": parent,
            })
            gpus.append(slice_gpu)
    for n, g in enumerate(gpus):
        g["index"] = n
    return gpus
