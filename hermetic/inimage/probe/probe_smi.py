"""The probe's nvidia-smi backend: GPU facts from ``nvidia-smi --query-gpu ... --format=csv``.

Standard library only, Python 3.8+; see probe.py.
"""

from __future__ import annotations

import re
import subprocess

if __package__:  # imported from hermetic (doctor, tests)
    from hermetic.inimage.probe.probe_util import reason
else:  # run as a script inside the container: this directory is sys.path[0]
    from probe_util import reason

SMI_FIELDS = (
    "index", "name", "uuid", "memory.total", "compute_cap", "driver_version",
    "ecc.mode.current", "mig.mode.current", "clocks.max.sm", "clocks.max.memory",
    "power.limit", "pci.bus_id",
)


def _smi_value(raw):
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw in ("N/A", "Not Supported"):
        return None
    return raw


def gpus_from_nvidia_smi(smi, errors):
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
