"""``hermetic doctor``: is this machine ready to build and run? One line per check.

The engines (a failure only when none can run), Docker's GPU runtime, the NVIDIA driver, free disk, the
dataset hashing loop, the OCI and wheel stores: judged by the code `hermetic run --gpus` and `hermetic cache
verify` use.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from hermetic.cli.common import emit_json, json_option, with_byte_bar
from hermetic.core.errors import EXIT_UNAVAILABLE
from hermetic.core.escape import shown
from hermetic.core.paths import cache_paths

GiB = 1 << 30
DISK_WARN_BYTES = 10 * GiB
DISK_FAIL_BYTES = 1 * GiB


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    hint: str = ""


# -- engines -------------------------------------------------------------------

def check_engines(gpu_on_host: bool) -> list[Check]:
    """Each engine's line, then the GPU lines of those that say how they reach a GPU, each engine asked by
    hermetic.engines (``readiness``, ``gpu_readiness``: what ``run`` itself checks). An engine that cannot
    run here is a failure only when no engine can: then nothing can run."""
    from hermetic.engines import ENGINES, get_engine

    engines = [get_engine(name) for name in ENGINES]
    ready = [e.readiness() for e in engines]
    worst = "warn" if any(r.status == "ok" for r in ready) else "fail"
    lines = [Check(e.label, worst if r.status != "ok" else "ok", r.detail, r.hint) for e, r in zip(engines, ready)]
    gpu = [Check("gpu runtime", r.status, r.detail, r.hint)
           for e in engines if (r := e.gpu_readiness(gpu_on_host)) is not None]
    return lines + gpu


def host_has_gpu(gpus: list[dict[str, Any]]) -> bool:
    return bool(gpus) or Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


# -- host driver ---------------------------------------------------------------

def host_gpus() -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(gpus, errors, sources tried) as the in-image probe sees them, here on the host."""
    from hermetic.inimage.probe.probe import collect_gpus

    errors: list[str] = []
    gpus, _source, tried = collect_gpus(errors, use_torch=False)
    return gpus, errors, tried


def check_driver(gpus: list[dict[str, Any]], errors: list[str], tried: list[str]) -> Check:
    name = "nvidia driver"
    if gpus:
        first = gpus[0]
        models = Counter(str(g.get("name")) for g in gpus)
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
    free = shutil.disk_usage(probe).free
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


def check_squashfs() -> Check:
    """Whether Charliecloud can run an image from its one SquashFS file here (squashfuse and FUSE)."""
    from hermetic.engines import squashfs as sqfs

    mount = sqfs.fuse_reason()
    if mount is None:
        return Check("squashfs", "ok", f"images as one file ({sqfs.FORMAT}); squashfuse can mount them here")
    return Check("squashfs", "warn", f"images as one file ({sqfs.FORMAT}); runs from directories here: {mount}")


# -- stores ----------------------------------------------------------------------

def check_stores(report: Any, paths: Any) -> list[Check]:
    """(oci store, wheel store) from `hermetic cache verify`'s report (hermetic.builder.gc.verify)."""
    root = paths.oci
    what = "rehashed" if report.rehashed else "listed (not rehashed: --quick)"
    if not (root / "blobs" / "sha256").is_dir():
        oci = Check("oci store", "ok", f"empty ({root})")
    elif report.bad_blobs:
        bad = [b.path for b in report.bad_blobs]
        oci = Check("oci store", "fail", f"{len(bad)} of {report.blobs} blobs corrupt: {', '.join(bad[:3])}"
                                         + (" ..." if len(bad) > 3 else ""),
                    "delete the listed files; `hermetic build` / `hermetic pull` brings them back")
    elif report.incomplete_refs:
        oci = Check("oci store", "warn", f"{report.blobs} blobs {what}; ref(s) with missing blobs: "
                    f"{', '.join(report.incomplete_refs[:3])}", "rebuild or pull those images again")
    else:
        oci = Check("oci store", "ok", f"{report.blobs} blobs {what}, {report.blob_bytes / GiB:.2f} GiB ({root})")
    problems = report.wheel_problems
    if problems:
        wheels = Check("wheel store", "fail", f"{len(problems)} problem(s): {problems[0]}"
                                              + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                       "delete the listed wheel directories; `hermetic fetch` downloads them again")
    else:
        wheels = Check("wheel store", "ok", f"{report.wheels} wheels {what} ({paths.wheels})")
    return [oci, wheels]


# -- all -------------------------------------------------------------------------

def run_doctor(*, rehash: bool = True) -> list[Check]:
    from hermetic.builder.gc import verify

    paths = cache_paths()
    gpus, gpu_errors, tried = host_gpus()
    checks = check_engines(host_has_gpu(gpus)) + [check_driver(gpus, gpu_errors, tried), check_disk(paths.root),
                                                   check_data_hashing(), check_squashfs()]
    blobs = paths.oci / "blobs" / "sha256"
    total = sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if rehash and blobs.is_dir() else 0
    report = with_byte_bar("rehashing the stores", total,
                           lambda advance: verify(paths, rehash=rehash, on_blob=advance))
    return checks + check_stores(report, paths)


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
            click.echo(f"{_MARK[c.status]}  {c.name:<{width}}  {shown(c.detail)}")
            if c.hint and c.status != "ok":
                click.echo(f"      {'':<{width}}  -> {shown(c.hint)}")
    return EXIT_UNAVAILABLE if failed else 0
