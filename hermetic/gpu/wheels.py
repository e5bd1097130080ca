"""Build-time checks (pure): every locked wheel must run on the base image and its Python.

``check_torch_cuda`` (torch's CUDA variant and the nvidia-* wheels), ``check_glibc`` (manylinux tags),
``check_python_abi`` (interpreter and ABI tags): Findings, one line each naming the package and both sides.
torch ``+cpu`` beside nvidia-* wheels only warns (other packages pull them).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Literal

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from hermetic.gpu.cuda import CudaInfo, major_minor
from hermetic.gpu.findings import Finding

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
    return next((w.name for w in info.wheels if w.component == "cuda-runtime"), "nvidia-cuda-runtime")


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


def _parsed(wheel_filenames: Iterable[str], check: str,
            out: list[Finding]) -> Iterator[tuple[str, str, Version, frozenset[Tag]]]:
    """Each wheel's filename, name, version and tags; a filename that is not a wheel's is a failure of
    ``check``, added to ``out``."""
    for filename in wheel_filenames:
        try:
            name, version, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            out.append(Finding(check, "fail", f"{filename}: not a valid wheel filename"))
            continue
        yield filename, name, version, tags


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
    for filename, name, version, tags in _parsed(wheel_filenames, "glibc", out):
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
    for filename, name, version, tags in _parsed(wheel_filenames, "python-abi", out):
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
