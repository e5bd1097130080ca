"""``hermetic doctor``: is this machine ready to build and run? One line per check.

Checks, in order: the engines (the Docker Engine, Podman, Charliecloud: which
can run here; an engine that cannot is a failure only when none can), the
Docker Engine's GPU runtime, the host's NVIDIA driver, free disk under the cache root, which loop hashes datasets (C or
Python), the OCI blob store (every blob rehashes to its name; every ref's
image is complete) and the wheel store (every wheel rehashes to its
directory name). Each is ok / warn / fail with what to do about it; the exit
status is 0 when nothing fails. The engine's GPU runtime and the stores are
judged by the same code as `hermetic run --gpus` and `hermetic cache verify`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from hermetic.cli.common import emit_json, json_option
from hermetic.cli.progress import with_byte_bar
from hermetic.errors import EXIT_UNAVAILABLE

GiB = 1 << 30
DISK_WARN_BYTES = 10 * GiB
DISK_FAIL_BYTES = 1 * GiB


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    hint: str = ""


# -- Docker Engine -------------------------------------------------------------

def check_engine() -> tuple[Check, Any]:
    """(check, client or None)."""
    from hermetic.engine import engine_client
    from hermetic.errors import EngineError

    try:
        client = engine_client()
        v = client.version()
    except EngineError as e:
        return Check("docker engine", "fail", e.message, e.hint or "run scripts/ensure-docker"), None
    except Exception as e:  # the daemon answered ping but not version: still unusable
        return Check("docker engine", "fail", f"Docker Engine error: {' '.join(str(e).split())}",
                     "run scripts/ensure-docker"), None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return Check("docker engine", "ok",
                 f"Docker Engine {v.get('Version', '?')} (API {v.get('ApiVersion', '?')}) at {host}"), client


def check_podman() -> Check:
    """Whether ``--engine podman`` can run here, and how it holds the limits (hermetic.engines.podman)."""
    from hermetic.errors import HermeticError

    name = "podman"
    hint = "apt-get install podman catatonit uidmap skopeo (docs/scale-out.md, \"Engines\")"
    if shutil.which("podman") is None:
        return Check(name, "warn", "not installed", hint)
    from hermetic.engines import get_engine

    engine: Any = get_engine("podman")
    try:
        version = engine.version()
    except HermeticError as e:
        return Check(name, "warn", e.message, hint)
    missing = [t for t in ("skopeo",) if shutil.which(t) is None]
    if not any(shutil.which(i) or Path("/usr/libexec/podman", i).exists() for i in ("catatonit", "tini")):
        missing.append("catatonit")
    if engine.rootless:
        missing += [t for t in ("newuidmap", "newgidmap") if shutil.which(t) is None]
        if not _has_subid_range():
            return Check(name, "warn", f"Podman {version}, rootless, but /etc/subuid gives this user no range",
                         "add one: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER")
    if missing:
        return Check(name, "warn", f"Podman {version}, but {', '.join(missing)} missing", hint)
    how = ("rootless" if engine.rootless else "rootful") + (
        ", pids limit as RLIMIT_NPROC, no memory limit (cgroup v1)" if not engine.cgroup_limits else ", cgroup limits")
    return Check(name, "ok", f"Podman {version} ({how})")


def _has_subid_range() -> bool:
    import pwd

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
        lines = Path("/etc/subuid").read_text().splitlines()
    except (OSError, KeyError):
        return False
    return any(ln.split(":")[0] in (user, str(os.geteuid())) for ln in lines if ln.count(":") == 2)


def check_charliecloud() -> Check:
    """Whether ``--engine charliecloud`` can run here: ch-run, an init, unprivileged namespaces and overlay."""
    import subprocess

    from hermetic.errors import HermeticError

    name = "charliecloud"
    hint = "apt-get install charliecloud-runtime catatonit (docs/scale-out.md, \"Engines\")"
    if shutil.which("ch-run") is None:
        return Check(name, "warn", "not installed", hint)
    from hermetic.engines import get_engine

    engine: Any = get_engine("charliecloud")
    try:
        engine.connect()
        version = engine.version()
    except HermeticError as e:
        return Check(name, "warn", e.message, hint)
    trial = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--", "sh", "-c",
                            "mkdir -p /tmp && mount -t tmpfs tmpfs /tmp"], capture_output=True, text=True)
    if trial.returncode != 0:
        why = (trial.stderr.strip().splitlines() or ["?"])[-1]
        return Check(name, "warn", f"Charliecloud {version}, but an unprivileged user namespace cannot mount ({why})",
                     "allow unprivileged user namespaces (sysctl user.max_user_namespaces, "
                     "kernel.unprivileged_userns_clone=1)")
    return Check(name, "ok", f"Charliecloud {version} (ch-run {shutil.which('ch-run')}; pids limit as RLIMIT_NPROC, "
                             "no memory limit)")


def engines_verdict(checks: list[Check]) -> list[Check]:
    """An engine that cannot run here is a failure only when no engine can: then nothing can run."""
    engines = {"docker engine", "podman", "charliecloud"}
    if any(c.name in engines and c.status == "ok" for c in checks):
        return [Check(c.name, "warn", c.detail, c.hint) if c.name in engines and c.status == "fail" else c
                for c in checks]
    return [Check(c.name, "fail", c.detail, c.hint) if c.name in engines else c for c in checks]


def host_has_gpu(gpus: list[dict[str, Any]]) -> bool:
    return bool(gpus) or Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


def check_gpu_runtime(client: Any, gpu_on_host: bool) -> Check:
    """What `hermetic run --gpus` checks (hermetic.engine.gpu_runtime), said with what to do."""
    from hermetic.engine import gpu_runtime
    from hermetic.errors import EngineError

    name = "gpu runtime"
    if client is None:
        return Check(name, "warn", "not checked (no Docker Engine)", "run scripts/ensure-docker")
    try:
        rt = gpu_runtime(client)
    except EngineError as e:
        return Check(name, "fail", e.message)
    listed = ", ".join(rt.runtimes) or "none"
    if rt.via == "nvidia runtime":
        return Check(name, "ok", f"nvidia runtime registered (runtimes: {listed}; default {rt.default_runtime})")
    if rt.available:
        return Check(name, "ok", f"--gpus supported through {rt.via} (runtimes: {listed})")
    hint = ("install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` "
            "and restart dockerd")
    if gpu_on_host:
        return Check(name, "fail", f"no NVIDIA runtime in Docker (runtimes: {listed}): "
                                   f"`hermetic run --gpus` will fail", hint)
    return Check(name, "warn", f"no NVIDIA runtime (runtimes: {listed}); no GPU on this host either: CPU runs only",
                 hint)


# -- host driver ---------------------------------------------------------------

def host_gpus() -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(gpus, errors, sources tried) as the in-image probe sees them, here on the host."""
    from hermetic.probe.probe import collect_gpus

    errors: list[str] = []
    gpus, _source, tried = collect_gpus(errors, use_torch=False)
    return gpus, errors, tried


def check_driver(gpus: list[dict[str, Any]], errors: list[str], tried: list[str]) -> Check:
    name = "nvidia driver"
    if gpus:
        first = gpus[0]
        models: dict[str, int] = {}
        for g in gpus:
            models[str(g.get("name"))] = models.get(str(g.get("name")), 0) + 1
        listing = ", ".join(f"{m} x{n}" if n > 1 else m for m, n in models.items())
        detail = (f"driver {first.get('driver_version') or '?'} (CUDA {first.get('cuda_driver_version') or '?'}); "
                  f"{len(gpus)} GPU(s): {listing}")
        if errors:
            return Check(name, "warn", detail + f"; {len(errors)} field(s) unreadable: {errors[0]}")
        return Check(name, "ok", detail)
    smi_failed = [t for t in tried if t.startswith("nvidia-smi:") and "not on PATH" not in t]
    nvml_failed = [t for t in tried if t.startswith("libnvidia-ml") and "cannot open" not in t]
    if smi_failed or nvml_failed:
        return Check(name, "fail", (smi_failed + nvml_failed)[0],
                     "the driver is installed but not working: reboot after a driver upgrade, "
                     "or reinstall the NVIDIA driver")
    if Path("/proc/driver/nvidia/version").exists():
        return Check(name, "fail", "the nvidia kernel module is loaded but neither NVML nor nvidia-smi answers",
                     "install the NVIDIA driver's user-space utilities (nvidia-smi, libnvidia-ml)")
    return Check(name, "warn", "no NVIDIA driver or GPU on this host: CPU runs only",
                 "for GPU runs, install the NVIDIA driver (it must support the image's CUDA; see docs/gpu.md)")


# -- disk ------------------------------------------------------------------------

def check_disk(root: Path) -> Check:
    name = "disk"
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    free = usage.free
    detail = f"{free / GiB:.1f} GiB free under {root}"
    if free < DISK_FAIL_BYTES:
        return Check(name, "fail", detail, "free space or set HERMETIC_CACHE to a larger disk")
    if free < DISK_WARN_BYTES:
        return Check(name, "warn", detail + " (a torch + CUDA image needs ~10 GiB)",
                     "free space or set HERMETIC_CACHE to a larger disk")
    return Check(name, "ok", detail)


# -- dataset hashing -------------------------------------------------------------

def check_data_hashing() -> Check:
    """Which per-file hashing loop `hermetic data` runs: the C one (and with which sha256), or Python."""
    from hermetic.data import hashing

    name = "dataset hashing"
    if hashing._native is not None:
        return Check(name, "ok", f"C loop: {hashing._native.backend()}")
    why = "HERMETIC_PURE_PYTHON is set" if os.environ.get("HERMETIC_PURE_PYTHON") else "the C extension is not built"
    return Check(name, "warn", f"Python loop ({why}): ~1.5x slower on datasets of many small files",
                 "install a C compiler and OpenSSL's headers (scripts/ensure-build-deps), then reinstall hermetic")


# -- stores ----------------------------------------------------------------------

def check_stores(report: Any, paths: Any) -> tuple[Check, Check]:
    """(oci store, wheel store) from `hermetic cache verify`'s report (hermetic.builder.gc.verify)."""
    root = paths.oci
    if not (root / "blobs" / "sha256").is_dir():
        oci = Check("oci store", "ok", f"empty ({root})")
    elif report.bad_blobs:
        bad = [b.path for b in report.bad_blobs]
        oci = Check("oci store", "fail", f"{len(bad)} of {report.blobs} blobs corrupt: {', '.join(bad[:3])}"
                                         + (" ..." if len(bad) > 3 else ""),
                    "delete the listed files; `hermetic build` / `hermetic pull` brings them back")
    else:
        what = "rehashed" if report.rehashed else "listed (not rehashed: --quick)"
        if report.incomplete_refs:
            oci = Check("oci store", "warn", f"{report.blobs} blobs {what}; ref(s) with missing blobs: "
                                             f"{', '.join(report.incomplete_refs[:3])}", "rebuild or pull those images again")
        else:
            oci = Check("oci store", "ok", f"{report.blobs} blobs {what}, {report.blob_bytes / GiB:.2f} GiB ({root})")
    problems = report.wheel_problems
    if problems:
        wheels = Check("wheel store", "fail", f"{len(problems)} problem(s): {problems[0]}"
                                              + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                       "delete the listed wheel directories; `hermetic fetch` downloads them again")
    elif report.rehashed:
        wheels = Check("wheel store", "ok", f"{report.wheels} wheels rehashed ({paths.wheels})")
    else:
        wheels = Check("wheel store", "ok", f"{report.wheels} wheels listed (not rehashed: --quick) ({paths.wheels})")
    return oci, wheels


# -- all -------------------------------------------------------------------------

def run_doctor(*, rehash: bool = True) -> list[Check]:
    from hermetic.builder.gc import verify
    from hermetic.paths import cache_paths

    paths = cache_paths()
    checks: list[Check] = []
    engine, client = check_engine()
    checks += engines_verdict([engine, check_podman(), check_charliecloud()])
    gpus, gpu_errors, tried = host_gpus()
    checks.append(check_gpu_runtime(client, host_has_gpu(gpus)))
    checks.append(check_driver(gpus, gpu_errors, tried))
    checks.append(check_disk(paths.root))
    checks.append(check_data_hashing())
    blobs = paths.oci / "blobs" / "sha256"
    total = sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if rehash and blobs.is_dir() else 0
    report = with_byte_bar("rehashing the stores", total,
                           lambda advance: verify(paths, rehash=rehash, on_blob=advance))
    checks += check_stores(report, paths)
    return checks


_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


@click.command()
@click.option("--quick", is_flag=True, help="List the stores without rehashing them (rehashing reads every byte).")
@json_option
def doctor(quick: bool, as_json: bool) -> int:
    """Check that this machine can build and run: one line per check.

    \b
    Checks: the engines (Docker, Podman, Charliecloud: which can run here;
    FAIL only when none can), Docker's NVIDIA GPU runtime, the host's NVIDIA
    driver, free disk under the cache root, the dataset hashing loop (C, or
    the slower Python fallback), the OCI blob store and the wheel store
    (every file rehashed to its name). Each line is ok, warn or FAIL,
    with what to do about it. Exit status 0 when nothing fails, 69 (unavailable) when a check fails.

    \b
    Examples:
      hermetic doctor
      hermetic doctor --quick --json | jq '.checks[] | select(.status != "ok")'
    """
    checks = run_doctor(rehash=not quick)
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        emit_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"{_MARK[c.status]}  {c.name:<{width}}  {c.detail}")
            if c.hint and c.status != "ok":
                click.echo(f"      {'':<{width}}  -> {c.hint}")
    return EXIT_UNAVAILABLE if failed else 0
