"""The probe's CUDA view: devices as torch or the CUDA driver API (libcuda.so.1) see them.

NVML has no SM count for a whole GPU; it comes from here, matched to NVML's
devices by UUID, then PCI bus id. Standard library only, Python 3.8+; see probe.py.
"""

from __future__ import annotations

import collections
import ctypes
import re

if __package__:  # imported from hermetic (doctor, tests)
    from hermetic.inimage.probe.probe_util import cuda_version_string, reason
else:  # run as a script inside the container: this directory is sys.path[0]
    from probe_util import cuda_version_string, reason


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
            bus = None
            if hasattr(pr, "pci_bus_id"):
                bus = "%04x:%02x:%02x.0" % (getattr(pr, "pci_domain_id", 0), pr.pci_bus_id, pr.pci_device_id)
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
            out.append(CudaDevice(
                name.value.decode("utf-8", "replace"),
                "%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]),
                bus.value.decode("ascii", "replace"), "%d.%d" % (attr(75), attr(76)), attr(16),
                int(mem.value), "libcuda"))
        return out
    except Exception as e:
        errors.append("hardware.gpus.sm_count: libcuda: %s" % reason(e))
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


def gpus_from_cuda(cuda_devs, cuda_driver):
    return [{
        "index": i, "name": d.name, "uuid": d.uuid, "memory_bytes": d.memory_bytes,
        "compute_capability": d.cc, "sm_count": d.sm_count, "sm_count_source": d.source,
        "driver_version": None, "cuda_driver_version": cuda_driver, "ecc_enabled": None,
        "mig_mode": None, "clocks": {"sm_max_mhz": None, "mem_max_mhz": None},
        "power_limit_w": None, "pci_bus_id": d.pci_bus_id,
    } for i, d in enumerate(cuda_devs)]


def libcuda_driver_version():
    """ "12.4" from cuDriverGetVersion, or None."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if cu.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return cuda_version_string(v.value)
    except Exception:
        return None
