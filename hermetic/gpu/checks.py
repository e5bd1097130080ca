"""Compatibility checks between a lock, a base image, a host and a GPU (pure).

Build time (lock + base):
  check_torch_cuda   torch's CUDA variant agrees with the nvidia-* wheels
  check_glibc        the base's glibc satisfies every wheel's manylinux tag
  check_python_abi   the image's Python accepts every wheel's interpreter/ABI tag
Run time (probe JSON from inside the container + the image's labels):
  check_driver       the host driver's CUDA version covers the image's CUDA runtime
  check_arch         torch has kernels (SASS, or PTX to JIT) for each GPU
  compare_hardware   what differs between two runs' hardware that changes bits

Every check returns a list of Findings (empty = fine). A Finding's message is
one line naming the package or GPU and both sides, ready for HermeticError.

Decisions (docs/gpu.md has the reasons at length):
- torch ``+cpu`` with nvidia-* wheels in the lock: warn, not refuse. Other
  packages (jax-cuda12-plugin, cupy-cuda12x) legitimately pull them; torch
  itself will not use them.
- driver older than the runtime within the same CUDA major: warn (NVIDIA's
  minor-version compatibility runs precompiled kernels; PTX JIT of newer PTX
  fails); ``strict=True`` refuses. A lower major: refuse.
- GPU compute capability X.Y: ``sm_XY`` in torch's arch list is a match; an
  ``sm_XZ`` with Z < Y is binary compatible (same major) and fine; an
  arch-specific ``sm_XYa`` only matches X.Y exactly; a ``compute_XY`` (PTX)
  entry <= the GPU's capability is accepted with a warning: the driver JITs it
  at first use, so the machine code depends on the driver version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from hermetic.errors import HermeticError
from hermetic.gpu.cuda import CudaInfo, cuda_info_from_labels, major_minor

Severity = Literal["warn", "fail"]


@dataclass(frozen=True)
class Finding:
    check: str  # "torch-cuda" | "cuda-family" | "glibc" | "python-abi" | "driver" | "arch" | "hardware"
    severity: Severity
    message: str  # one line, names the culprit and both sides

    def __str__(self) -> str:
        return self.message


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "fail"]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "warn"]


def raise_for_failures(findings: Iterable[Finding], error: type[HermeticError] = HermeticError) -> None:
    """Raise the first failure as a one-line HermeticError (the count of others in the hint)."""
    fails = failures(findings)
    if not fails:
        return
    more = len(fails) - 1
    hint = f"{more} more check(s) failed: " + "; ".join(f.message for f in fails[1:]) if more else None
    raise error(fails[0].message, hint=hint)


# -- build: torch variant vs nvidia wheels ------------------------------------

def check_torch_cuda(info: CudaInfo) -> list[Finding]:
    out: list[Finding] = []
    torch = f"torch {info.torch}" if info.torch else None
    runtime_mm = major_minor(info.runtime)
    runtime_name = _runtime_wheel_name(info)

    # The nvidia wheels must agree among themselves on the CUDA major.
    if info.scheme == "mixed":
        names = ", ".join(f"{w.name} {w.version}" for w in info.wheels if w.component == "cuda-runtime")
        out.append(Finding("cuda-family", "fail", f"the lock pins CUDA runtimes of two families: {names}"))
    family = runtime_mm[0] if runtime_mm else None
    if family is not None:
        for w in info.wheels:
            if w.suffix_major is not None and w.suffix_major != family:
                out.append(Finding(
                    "cuda-family", "fail",
                    f"{w.name} {w.version} is built for CUDA {w.suffix_major}, "
                    f"but the lock's runtime is {runtime_name} {info.runtime} (CUDA {family})"))

    if torch is None:
        return out
    variant = info.torch_variant
    if variant is None:
        # PyPI torch on Linux is a CUDA build; its CUDA is its nvidia deps.
        if not info.has_cuda_wheels:
            out.append(Finding(
                "torch-cuda", "fail",
                f"{torch} (PyPI, a CUDA build on Linux) needs its nvidia-* CUDA wheels, but the lock has none "
                f"(was it resolved for another platform, or with --no-deps?)"))
        elif runtime_mm is None:
            out.append(Finding(
                "torch-cuda", "fail",
                f"{torch} needs a CUDA runtime wheel (nvidia-cuda-runtime), but the lock pins none"))
        return out
    if variant == "cpu":
        if info.has_cuda_wheels:
            names = ", ".join(w.name for w in info.wheels[:3]) + (" ..." if len(info.wheels) > 3 else "")
            out.append(Finding(
                "torch-cuda", "warn",
                f"{torch} is a CPU-only build, yet the lock pins {len(info.wheels)} nvidia CUDA wheel(s) ({names}); "
                f"torch will not use them"))
        return out
    if variant.startswith("rocm"):
        if info.has_cuda_wheels:
            out.append(Finding(
                "torch-cuda", "warn",
                f"{torch} is a ROCm build, yet the lock pins nvidia CUDA wheels; torch will not use them"))
        return out
    claimed = info.variant_cuda
    if claimed is None:
        out.append(Finding("torch-cuda", "warn", f"{torch}: unknown local variant '+{variant}'; CUDA not checked"))
        return out
    if runtime_mm is None:
        out.append(Finding(
            "torch-cuda", "fail",
            f"{torch} is built for CUDA {claimed[0]}.{claimed[1]}, but the lock pins no CUDA runtime wheel "
            f"(nvidia-cuda-runtime-cu{claimed[0]})"))
    elif runtime_mm != claimed:
        out.append(Finding(
            "torch-cuda", "fail",
            f"{torch} is built for CUDA {claimed[0]}.{claimed[1]}, but the lock pins {runtime_name} "
            f"{info.runtime} (CUDA {runtime_mm[0]}.{runtime_mm[1]})"))
    return out


def _runtime_wheel_name(info: CudaInfo) -> str:
    for w in info.wheels:
        if w.component == "cuda-runtime":
            return w.name
    return "nvidia-cuda-runtime"


# -- build: glibc / manylinux --------------------------------------------------

_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_PLATFORM = re.compile(r"^(?P<kind>manylinux|musllinux)_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>.+)$")


def platform_requirement(platform: str) -> tuple[str, tuple[int, int] | None, str | None]:
    """A wheel platform tag -> (libc kind, minimum version, arch).

    kind: "any" | "glibc" | "musl" | "linux" (unportable linux_*) | "other" (macOS, Windows...).
    """
    if platform == "any":
        return "any", None, None
    m = _PLATFORM.match(platform)
    if m:
        kind = "glibc" if m.group("kind") == "manylinux" else "musl"
        return kind, (int(m.group("major")), int(m.group("minor"))), m.group("arch")
    for legacy, level in _LEGACY_MANYLINUX.items():
        if platform.startswith(legacy + "_"):
            return "glibc", level, platform[len(legacy) + 1:]
    if platform.startswith("linux_"):
        return "linux", None, platform[len("linux_"):]
    return "other", None, None


def check_glibc(
    wheel_filenames: Iterable[str],
    glibc: tuple[int, int] | None,
    *,
    libc: Literal["glibc", "musl", "unknown"] = "glibc",
    machine: str = "x86_64",
) -> list[Finding]:
    """Every wheel must have at least one platform tag the base can run.

    ``glibc`` is the base image's glibc (see glibc_from_rootfs); ``libc`` says
    what kind of C library the base has when glibc is None.
    """
    out: list[Finding] = []
    for filename in wheel_filenames:
        try:
            name, version, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            out.append(Finding("glibc", "fail", f"{filename}: not a valid wheel filename"))
            continue
        reqs = [platform_requirement(t.platform) for t in tags]
        if any(kind == "any" for kind, _, _ in reqs):
            continue
        what = f"{name} {version} ({filename})"
        for_arch = [r for r in reqs if r[2] in (machine, None)]
        if not for_arch:
            arches = sorted({r[2] or "?" for r in reqs})
            out.append(Finding("glibc", "fail", f"{what} is built for {', '.join(arches)}, the image is {machine}"))
            continue
        glibc_levels = sorted(r[1] for r in for_arch if r[0] == "glibc" and r[1])
        musl_levels = sorted(r[1] for r in for_arch if r[0] == "musl" and r[1])
        if libc == "musl":
            if musl_levels:
                continue  # glibc is None here: a musl base cannot be ordered against a musl tag we do not know
            out.append(Finding("glibc", "fail", f"{what} needs glibc (manylinux), but the base has musl libc"))
            continue
        if glibc_levels:
            need = glibc_levels[0]  # the lowest tag is the wheel's real floor
            if glibc is None:
                out.append(Finding(
                    "glibc", "warn",
                    f"{what} needs glibc >= {need[0]}.{need[1]}; the base's glibc version is unknown"))
            elif need > glibc:
                out.append(Finding(
                    "glibc", "fail",
                    f"{what} needs glibc >= {need[0]}.{need[1]}, the base has glibc {glibc[0]}.{glibc[1]}"))
            continue
        if musl_levels:
            out.append(Finding("glibc", "fail", f"{what} is a musllinux wheel, the base has glibc"))
            continue
        if any(r[0] == "linux" for r in for_arch):
            out.append(Finding(
                "glibc", "warn",
                f"{what} has a plain linux_{machine} tag (built on one machine, no manylinux promise)"))
            continue
        out.append(Finding("glibc", "fail", f"{what} is not a Linux wheel"))
    return out


# -- build: Python version / ABI ------------------------------------------------

def _accepted_interpreter_abis(python_version: str, implementation: str) -> set[tuple[str, str]]:
    major, minor = (int(x) for x in python_version.split(".")[:2])
    if implementation != "cp":
        raise ValueError(f"only CPython images are supported, not {implementation!r}")
    plats = ["any"]
    tags: list[Tag] = list(cpython_tags(python_version=(major, minor), platforms=plats))
    tags += list(compatible_tags(python_version=(major, minor), interpreter=f"cp{major}{minor}", platforms=plats))
    return {(t.interpreter, t.abi) for t in tags}


def check_python_abi(
    wheel_filenames: Iterable[str], python_version: str, *, implementation: str = "cp",
) -> list[Finding]:
    """Every wheel must accept the image's interpreter: cp311-cp311, cp39-abi3, py3-none..."""
    accepted = _accepted_interpreter_abis(python_version, implementation)
    nodot = python_version.replace(".", "")[:3]
    out: list[Finding] = []
    for filename in wheel_filenames:
        try:
            name, version, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            out.append(Finding("python-abi", "fail", f"{filename}: not a valid wheel filename"))
            continue
        if any((t.interpreter, t.abi) in accepted for t in tags):
            continue
        pairs = ", ".join(sorted({f"{t.interpreter}-{t.abi}" for t in tags}))
        out.append(Finding(
            "python-abi", "fail",
            f"{name} {version} ({filename}) is for {pairs}; the image's Python is CPython {python_version} "
            f"(cp{nodot})"))
    return out


def build_checks(
    info: CudaInfo | None,
    wheel_filenames: Iterable[str],
    *,
    glibc: tuple[int, int] | None,
    python_version: str,
    libc: Literal["glibc", "musl", "unknown"] = "glibc",
    machine: str = "x86_64",
) -> list[Finding]:
    """All build-time checks at once."""
    names = list(wheel_filenames)
    out: list[Finding] = []
    if info is not None:
        out += check_torch_cuda(info)
    out += check_glibc(names, glibc, libc=libc, machine=machine)
    out += check_python_abi(names, python_version)
    return out


# -- base image: which glibc ----------------------------------------------------

@dataclass(frozen=True)
class LibcInfo:
    kind: Literal["glibc", "musl", "unknown"]
    version: tuple[int, int] | None
    source: str  # the file that told us
    reason: str = ""  # why version is None


ReadFile = Callable[[str], "bytes | None"]

_LIBC_SO = (
    "/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/lib64/libc.so.6", "/usr/lib64/libc.so.6",
    "/lib/aarch64-linux-gnu/libc.so.6", "/usr/lib/aarch64-linux-gnu/libc.so.6",
    "/lib/libc.so.6", "/usr/lib/libc.so.6",
)
_LD_SO = (
    "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "/usr/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
    "/usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
)
_MUSL_LOADERS = ("/lib/ld-musl-x86_64.so.1", "/lib/ld-musl-aarch64.so.1")
# "GNU C Library (Debian GLIBC 2.36-9+deb12u7) stable release version 2.36."
# "ld.so (Ubuntu GLIBC 2.39-0ubuntu8.3) stable release version 2.39."
_RELEASE = re.compile(rb"(?:GNU C Library|ld\.so) \([^)]*\) (?:stable |development )?release version (\d+)\.(\d+)")


def _dpkg_libc6(text: str) -> tuple[int, int] | None:
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in para.splitlines():
            if line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields.get("Package") == "libc6" and "installed" in fields.get("Status", "install ok installed").split():
            m = re.match(r"^(?:\d+:)?(\d+)\.(\d+)", fields.get("Version", ""))
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


def detect_libc(read_file: ReadFile) -> LibcInfo:
    """What C library a root filesystem has, from its files (read_file(abs path) -> bytes or None)."""
    for path in ("/var/lib/dpkg/status", "/var/lib/dpkg/status.d/libc6"):  # Debian/Ubuntu; distroless
        data = read_file(path)
        if data:
            v = _dpkg_libc6(data.decode("utf-8", "replace"))
            if v:
                return LibcInfo("glibc", v, f"{path} (libc6)")
    for path in _LIBC_SO + _LD_SO:
        data = read_file(path)
        if not data:
            continue
        m = _RELEASE.search(data)
        if m:
            return LibcInfo("glibc", (int(m.group(1)), int(m.group(2))), path)
    for path in _MUSL_LOADERS + ("/etc/alpine-release",):
        data = read_file(path)
        if data is not None:
            what = f"Alpine {data.decode('ascii', 'replace').strip()}" if path.endswith("alpine-release") else path
            return LibcInfo("musl", None, path, f"musl libc ({what}): manylinux wheels need glibc")
    return LibcInfo("unknown", None, "", "no libc6 in dpkg status, no libc.so.6 or ld-linux with a version string")


def glibc_from_rootfs(read_file: ReadFile) -> tuple[int, int] | None:
    """The base's glibc (MAJOR, MINOR), or None (musl or unknown: detect_libc says why)."""
    return detect_libc(read_file).version


# -- run: driver, arch ---------------------------------------------------------

def _gpus(probe: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((probe or {}).get("hardware") or {}).get("gpus") or [])


def _gpu_label(g: dict[str, Any]) -> str:
    return f"GPU {g.get('index')} ({g.get('name') or 'unknown model'})"


def check_driver(probe: dict[str, Any], labels: dict[str, str] | CudaInfo | None, *,
                 strict: bool = False) -> list[Finding]:
    """The host driver must support the image's CUDA runtime."""
    info = labels if isinstance(labels, CudaInfo) else cuda_info_from_labels(labels)
    runtime = major_minor(info.runtime) or major_minor(info.toolkit)
    if runtime is None:
        return []
    rt = f"{runtime[0]}.{runtime[1]}"
    gpus = _gpus(probe)
    if not gpus:
        return [Finding("driver", "warn",
                        f"the image carries CUDA {rt} but no GPU is visible in the container (hardware.gpu_note)")]
    out: list[Finding] = []
    seen: set[str] = set()
    for g in gpus:
        drv_cuda = g.get("cuda_driver_version")
        key = f"{drv_cuda}/{g.get('driver_version')}"
        if key in seen:
            continue
        seen.add(key)
        drv = major_minor(drv_cuda)
        driver = f"driver {g.get('driver_version') or '?'}"
        if drv is None:
            out.append(Finding("driver", "warn", f"{driver}: CUDA version unknown; cannot check it covers CUDA {rt}"))
        elif drv[0] < runtime[0] or (strict and drv < runtime):
            out.append(Finding(
                "driver", "fail",
                f"host {driver} supports CUDA up to {drv_cuda}, the image's CUDA runtime is {rt}: "
                f"upgrade the host driver"))
        elif drv < runtime:
            out.append(Finding(
                "driver", "warn",
                f"host {driver} supports CUDA up to {drv_cuda}, older than the image's CUDA runtime {rt}: "
                f"runs by minor-version compatibility (no PTX JIT of newer PTX); upgrade the driver to be safe"))
    return out


_ARCH = re.compile(r"^(?P<kind>sm|compute)_(?P<num>\d+)(?P<suffix>[af]?)$")


def _split_cc(num: str) -> tuple[int, int]:
    return int(num[:-1]), int(num[-1])  # "90" -> (9, 0), "120" -> (12, 0)


def arch_support(cc: tuple[int, int], arch_list: Iterable[str]) -> tuple[str, str | None]:
    """("sass", arch) | ("ptx", arch) | ("none", None) for a GPU of capability cc."""
    best_ptx: tuple[int, int] | None = None
    ptx_name = None
    for arch in arch_list:
        m = _ARCH.match(arch)
        if not m:
            continue
        a = _split_cc(m.group("num"))
        suffix = m.group("suffix")
        if m.group("kind") == "sm":
            if suffix == "a" and a == cc:
                return "sass", arch
            if suffix != "a" and a[0] == cc[0] and a[1] <= cc[1]:
                return "sass", arch
        elif a <= cc and (best_ptx is None or a > best_ptx):
            best_ptx, ptx_name = a, arch
    if ptx_name:
        return "ptx", ptx_name
    return "none", None


def check_arch(probe: dict[str, Any]) -> list[Finding]:
    """torch must have kernels for every visible GPU."""
    torch = ((probe or {}).get("software") or {}).get("torch")
    gpus = _gpus(probe)
    if not torch or not gpus:
        return []
    version = torch.get("version") or "?"
    if not torch.get("cuda"):
        return [Finding("arch", "warn",
                        f"torch {version} is not a CUDA build; the {len(gpus)} GPU(s) will not be used")]
    arch_list = torch.get("arch_list") or []
    if not arch_list:
        return [Finding("arch", "warn", f"torch {version}: arch list unknown; GPU kernels not checked")]
    out: list[Finding] = []
    for g in gpus:
        cc = major_minor(g.get("compute_capability"))
        if cc is None:
            out.append(Finding("arch", "warn", f"{_gpu_label(g)}: compute capability unknown; kernels not checked"))
            continue
        kind, arch = arch_support(cc, arch_list)
        sm = f"sm_{cc[0]}{cc[1]}"
        if kind == "ptx":
            out.append(Finding(
                "arch", "warn",
                f"{_gpu_label(g)}, compute capability {cc[0]}.{cc[1]}: torch {version} has no {sm} kernels, "
                f"runs by JIT from {arch} PTX (machine code then depends on the driver version)"))
        elif kind == "none":
            out.append(Finding(
                "arch", "fail",
                f"{_gpu_label(g)}, compute capability {cc[0]}.{cc[1]}: torch {version} has no {sm} "
                f"(arch list: {' '.join(arch_list)})"))
    return out


def run_checks(probe: dict[str, Any], labels: dict[str, str] | None, *, strict: bool = False) -> list[Finding]:
    return check_driver(probe, labels, strict=strict) + check_arch(probe)


# -- run: compare two runs' hardware ------------------------------------------

def compare_hardware(probe_a: dict[str, Any], probe_b: dict[str, Any]) -> list[Finding]:
    """What differs between two runs' hardware in ways that can change results.

    cuBLAS promises identical bits only on the same architecture and SM count
    (a MIG slice has fewer SMs); CPU kernels (MKL, OpenBLAS, oneDNN) pick code
    paths by instruction set, so the CPU's flags matter too.
    """
    out: list[Finding] = []
    ga, gb = _gpus(probe_a), _gpus(probe_b)
    if len(ga) != len(gb):
        out.append(Finding("hardware", "warn", f"GPU count differs: {len(ga)} vs {len(gb)}"))
    for a, b in zip(ga, gb):
        i = a.get("index")
        for key, what in (("name", "GPU model"), ("compute_capability", "compute capability"),
                          ("sm_count", "SM count"), ("mig_mode", "MIG mode")):
            va, vb = a.get(key), b.get(key)
            if va != vb:
                out.append(Finding("hardware", "warn", f"GPU {i} {what} differs: {va} vs {vb}"))
    ca = ((probe_a or {}).get("hardware") or {}).get("cpu") or {}
    cb = ((probe_b or {}).get("hardware") or {}).get("cpu") or {}
    if ca.get("model") != cb.get("model"):
        out.append(Finding("hardware", "warn", f"CPU model differs: {ca.get('model')} vs {cb.get('model')}"))
    fa, fb = set(ca.get("flags_of_interest") or []), set(cb.get("flags_of_interest") or [])
    if fa != fb:
        only_a, only_b = sorted(fa - fb), sorted(fb - fa)
        out.append(Finding(
            "hardware", "warn",
            f"CPU instruction sets differ: only in A: {' '.join(only_a) or '-'}; only in B: {' '.join(only_b) or '-'}"))
    return out
