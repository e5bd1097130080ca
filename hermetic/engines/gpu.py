"""GPUs for the engines that are not Docker: what each needs from the host, and the refusal when it lacks it.

Podman takes GPUs through CDI (``--device nvidia.com/gpu=all``; the spec is
the NVIDIA Container Toolkit's ``nvidia-ctk cdi generate``; checked in
hermetic.engines.podman). Charliecloud takes them as ``ch-fromhost --nvidia``
does: the driver's libraries and binaries that ``nvidia-container-cli list``
names are copied into the image, and ldconfig is run in it. hermetic does
that once per image and driver into a layer of its own (the upper directory
of a writable overlay over the image's layers, in which ch-fromhost ran),
stacked on the image for a GPU run, and binds the GPUs' device nodes
(/dev/nvidia0..., nvidiactl, nvidia-uvm) into the container's /dev.

No GPU machine was available where this was written: the refusals are
tested (no nvidia-container-cli, no driver libraries, no device nodes), the
injection itself is not (docs/gpu.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hermetic.errors import Unavailable

CLI = "nvidia-container-cli"
NO_CLI = (f"Charliecloud takes GPUs with ch-fromhost --nvidia, which needs `{CLI}` (the NVIDIA Container Toolkit's "
          "libnvidia-container-tools); it is not installed")
COMMON_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def charliecloud_gpu_files() -> list[str]:
    """The driver files ch-fromhost --nvidia would inject (``nvidia-container-cli list``); Unavailable if none."""
    cli = shutil.which(CLI)
    if cli is None:
        raise Unavailable(NO_CLI)
    if not shutil.which("ch-fromhost"):
        raise Unavailable("ch-fromhost is not installed (Debian: apt-get install charliecloud-builders)")
    proc = subprocess.run([cli, "list", "--binaries", "--libraries"], capture_output=True, text=True)
    files = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not any("libcuda.so" in f for f in files):
        why = (proc.stderr.strip().splitlines() or ["it names no libcuda.so"])[-1]
        raise Unavailable(f"no NVIDIA driver libraries on this host for ch-fromhost --nvidia ({CLI} list: {why}); "
                          "install the NVIDIA driver")
    if not Path("/dev/nvidiactl").exists():
        raise Unavailable("no /dev/nvidiactl: the NVIDIA kernel module is not loaded")
    return files


def _minor_by_uuid() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        entries = list(GPUS_DIR.iterdir())
    except OSError:
        return out
    for d in entries:
        try:
            info = dict(ln.split(":", 1) for ln in (d / "information").read_text().splitlines() if ":" in ln)
        except OSError:
            continue
        uuid, minor = info.get("GPU UUID", "").strip(), info.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            out[uuid] = int(minor)
    return out


def nvidia_device_nodes(gpus: str) -> list[str]:
    """The /dev names (relative) a container needs for ``--gpus``: the GPUs asked for and the common nodes."""
    from hermetic.gpus import parse_gpus

    request = parse_gpus(gpus)
    if request is None:
        return []
    present = sorted(int(p.name[6:]) for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    if request.all:
        minors = present
    elif request.device_ids:
        by_uuid = _minor_by_uuid()
        minors = [int(d) if d.isdigit() else by_uuid.get(d, -1) for d in request.device_ids]
        if -1 in minors:
            raise Unavailable(f"--gpus {gpus}: no GPU of this host has that UUID")
    else:
        minors = present[:request.count]
        if len(minors) < request.count:
            raise Unavailable(f"--gpus {gpus}: this host has {len(present)} GPU(s)")
    missing = [m for m in minors if not Path(f"/dev/nvidia{m}").exists()]
    if missing or not minors:
        raise Unavailable(f"--gpus {gpus}: no /dev/nvidia{missing[0] if missing else 'N'} on this host")
    return [f"nvidia{m}" for m in minors] + [n for n in COMMON_NODES if Path("/dev", n).exists()]


def driver_version() -> str:
    try:
        return Path("/proc/driver/nvidia/version").read_text().split("Kernel Module", 1)[-1].split()[0]
    except (OSError, IndexError):
        return "unknown"


def make_gpu_layer(layers: list[Path], dest: Path, ch_run_env: dict[str, str]) -> Path:
    """The driver's files injected by ``ch-fromhost --nvidia`` into a writable overlay over ``layers``; its
    upper directory, renamed to ``dest``, is the GPU layer (a lower layer of every GPU run of the image)."""
    work = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    for d in ("upper", "work", "merged"):
        (work / d).mkdir(parents=True)
    lowers = ":".join(str(p) for p in reversed(layers))
    script = (f"set -eu; mount -t overlay overlay -o userxattr,lowerdir={lowers},upperdir={work}/upper,"
              f"workdir={work}/work {work}/merged; ch-fromhost --nvidia {work}/merged")
    unshare = ["unshare"] + (["--user", "--map-root-user"] if os.geteuid() != 0 else []) + ["--mount", "--", "sh", "-c"]
    proc = subprocess.run([*unshare, script], capture_output=True, text=True, env=ch_run_env)
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise Unavailable(f"ch-fromhost --nvidia failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    os.rename(work / "upper", dest)
    shutil.rmtree(work, ignore_errors=True)
    return dest
