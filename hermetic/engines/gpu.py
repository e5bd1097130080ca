"""How each engine reaches the host's GPUs (``--gpus``), and the refusal when it cannot.

Docker: the NVIDIA runtime or the container toolkit's hook, asked through ``HostConfig.DeviceRequests``.
Podman: CDI (``--device nvidia.com/gpu=all``). Charliecloud: the driver's files that ``nvidia-container-cli
list`` names, in a layer of hermetic's made once per image and driver (as ``ch-fromhost --nvidia`` does),
and the GPUs' device nodes bound into /dev. Podman's and Charliecloud's injection is untested on a GPU
(docs/gpu.md); their refusals are tested.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hermetic.engines.base import Readiness, last_line
from hermetic.core.errors import EngineError, Unavailable

# -- Docker ------------------------------------------------------------------------------------------------

NO_GPU_RUNTIME = "this Docker Engine has no NVIDIA runtime: install nvidia-container-toolkit"
# Binaries through which `docker run --gpus` reaches the NVIDIA container toolkit without a
# registered runtime (Docker >= 19.03 execs the prestart hook found beside a local daemon).
GPU_HOOKS = ("nvidia-container-runtime-hook", "nvidia-ctk", "nvidia-container-toolkit")


def gpu_runtime(client: Any) -> tuple[str, str]:
    """What ``--gpus`` goes through on this Docker Engine (docker-py's client): "nvidia runtime", a hook's path, or
    "" (nothing); and its runtimes, in words."""
    try:
        info = client.info()
    except Exception as e:  # noqa: BLE001 - docker-py's APIError or a transport error
        raise EngineError(f"cannot query the Docker Engine: {' '.join(str(e).split())}") from None
    runtimes = info.get("Runtimes") or {}
    listed = f"runtimes: {', '.join(sorted(runtimes)) or 'none'}"
    if "nvidia" in runtimes:
        return "nvidia runtime", f"{listed}; default {info.get('DefaultRuntime', '?')}"
    local = (os.environ.get("DOCKER_HOST") or "unix://").startswith("unix://")
    hook = next((found for name in GPU_HOOKS if (found := shutil.which(name))), None) if local else None
    return hook or "", listed


def check_gpu_runtime(client: Any) -> None:
    """Refuse before any container exists when --gpus cannot work on this Docker Engine."""
    if not gpu_runtime(client)[0]:
        raise EngineError(NO_GPU_RUNTIME)


def docker_gpu_readiness(client: Any, gpu_on_host: bool) -> Readiness:
    """``hermetic doctor``'s GPU line: what ``run --gpus`` checks, said with what to do."""
    try:
        via, listed = gpu_runtime(client)
    except EngineError as e:
        return Readiness("fail", e.message)
    if via == "nvidia runtime":
        return Readiness("ok", f"nvidia runtime registered ({listed})")
    if via:
        return Readiness("ok", f"--gpus supported through {via} ({listed})")
    hint = ("install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` "
            "and restart dockerd")
    if gpu_on_host:
        return Readiness("fail", f"no NVIDIA runtime in Docker ({listed}): `hermetic run --gpus` will fail", hint)
    return Readiness("warn", f"no NVIDIA runtime ({listed}); no GPU on this host either: CPU runs only", hint)


def device_requests(gpus: str | None) -> list[dict[str, Any]]:
    """docker-like --gpus: all | N | device=0,1 | "device=GPU-uuid" (the grammar: hermetic.config.gpus), as the
    Engine API's HostConfig.DeviceRequests."""
    from hermetic.config.gpus import parse_gpus

    request = parse_gpus(gpus)
    if request is None:
        return []
    if request.device_ids:
        return [{"Driver": "", "Count": 0, "DeviceIDs": list(request.device_ids), "Capabilities": [["gpu"]],
                 "Options": {}}]
    return [{"Driver": "", "Count": -1 if request.all else request.count, "DeviceIDs": None,
             "Capabilities": [["gpu"]], "Options": {}}]


# -- Podman: CDI ----------------------------------------------------------------------------------------------

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_KIND = "nvidia.com/gpu"
NO_CDI_SPEC = (f"Podman has no CDI spec for {CDI_KIND} (looked in {', '.join(map(str, CDI_DIRS))}): generate one "
               "with the NVIDIA Container Toolkit: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


def cdi_devices(gpus: str | None) -> list[str]:
    """``--gpus`` as CDI device names (NVIDIA's spec names each GPU by index and UUID, and ``all``)."""
    from hermetic.config.gpus import parse_gpus

    request = parse_gpus(gpus)
    if request is None:
        return []
    if request.all:
        return [f"{CDI_KIND}=all"]
    if request.device_ids:
        return [f"{CDI_KIND}={d}" for d in request.device_ids]
    return [f"{CDI_KIND}={i}" for i in range(request.count)]


def cdi_device_names() -> set[str]:
    """The device names the CDI specs on this host give ``nvidia.com/gpu`` (an empty set: no spec)."""
    import yaml

    names: set[str] = set()
    for p in sorted(p for d in CDI_DIRS if os.access(d, os.R_OK | os.X_OK) for p in d.iterdir()
                    if p.suffix in (".yaml", ".yml", ".json")):
        try:
            doc = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == CDI_KIND:
            names.update(str(dev.get("name")) for dev in doc.get("devices") or [] if isinstance(dev, dict))
    return names | {"all"} if names else names


def check_cdi(gpus: str) -> None:
    """Refuse, before any container exists, a ``--gpus`` that Podman's CDI specs on this host cannot give."""
    devices = cdi_devices(gpus)
    known = cdi_device_names()
    if not known:
        raise Unavailable(NO_CDI_SPEC)
    missing = [d for d in devices if d.split("=", 1)[1] not in known]
    if missing:
        raise Unavailable(f"Podman's CDI spec for {CDI_KIND} has no device {missing[0]} (it lists: "
                          f"{', '.join(sorted(known)) or 'none'}); regenerate it with nvidia-ctk cdi generate")


# -- Charliecloud: ch-fromhost --nvidia -----------------------------------------------------------------------

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
        why = last_line(proc.stderr, "it names no libcuda.so")
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
    from hermetic.config.gpus import parse_gpus

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


def make_gpu_layer(layers: list[Path], dest: Path, ch_run_env: dict[str, str], squashfs: Path | None = None) -> Path:
    """The driver's files injected by ``ch-fromhost --nvidia`` into a writable overlay over ``layers`` (or the
    image's ``squashfs`` file, mounted by squashfuse); its upper directory, renamed to ``dest``, is the GPU layer
    (a lower layer of every GPU run of the image)."""
    work = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    for d in ("upper", "work", "merged", "sq"):
        (work / d).mkdir(parents=True)
    lowers = ":".join(str(p) for p in reversed(layers))
    mount_file = ""
    if squashfs is not None:
        lowers, mount_file = f"{work}/sq", f"squashfuse_ll -o ro {shlex.quote(str(squashfs))} {work}/sq; "
    script = (f"set -eu; {mount_file}mount -t overlay overlay -o userxattr,lowerdir={lowers},upperdir={work}/upper,"
              f"workdir={work}/work {work}/merged; ch-fromhost --nvidia {work}/merged")
    unshare = ["unshare"] + (["--user", "--map-root-user"] if os.geteuid() != 0 else []) + ["--mount", "--", "sh", "-c"]
    proc = subprocess.run([*unshare, script], capture_output=True, text=True, env=ch_run_env)
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise Unavailable(f"ch-fromhost --nvidia failed: {last_line(proc.stderr, '?')}")
    os.rename(work / "upper", dest)
    shutil.rmtree(work, ignore_errors=True)
    return dest
