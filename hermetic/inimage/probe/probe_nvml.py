"""The probe's NVML backends: pynvml (nvidia-ml-py) when importable, else ctypes on libnvidia-ml.so.1.

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


class NvmlPy:
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


def _nvml_field(errors, path, fn, *args):
    """Like safe, but NVML's NOT_SUPPORTED becomes a plain null (a fact, not a failure)."""
    try:
        return fn(*args)
    except Exception as e:
        if not (isinstance(e, NvmlError) and e.code == NvmlError.NOT_SUPPORTED):
            errors.append("%s: %s" % (path, reason(e)))
        return None


def gpus_from_nvml(nvml, errors):
    driver = _nvml_field(errors, "hardware.gpus.driver_version", nvml.driver_version)
    cuda_driver = cuda_version_string(
        _nvml_field(errors, "hardware.gpus.cuda_driver_version", nvml.cuda_driver_version))
    gpus = []
    count = _nvml_field(errors, "hardware.gpus", nvml.count) or 0
    for i in range(count):
        p = "hardware.gpus[%d]." % i
        try:
            h = nvml.handle(i)
        except Exception as e:
            errors.append("%shandle: %s" % (p, reason(e)))
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
