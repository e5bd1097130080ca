"""Which C library a base's root filesystem has (pure): dpkg's status, libc.so.6's or ld-linux's banner,
or musl's loader / /etc/alpine-release. The build checks manylinux tags against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from hermetic.provenance.sbom import installed_deb_packages


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


def installed_packages(text: str) -> dict[str, str]:
    """{package: version} of the installed packages of a dpkg status file, sorted by name."""
    return {p.name: p.version for p in installed_deb_packages(text)}


def detect_libc(read_file: ReadFile) -> LibcInfo:
    """What C library a root filesystem has, from its files (read_file(abs path) -> bytes or None)."""
    for path in ("/var/lib/dpkg/status", "/var/lib/dpkg/status.d/libc6"):  # Debian/Ubuntu; distroless
        data = read_file(path)
        if data:
            libc6 = installed_packages(data.decode("utf-8", "replace")).get("libc6", "")
            m = re.match(r"^(?:\d+:)?(\d+)\.(\d+)", libc6)
            if m:
                return LibcInfo("glibc", (int(m.group(1)), int(m.group(2))), f"{path} (libc6)")
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
