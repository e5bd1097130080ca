"""The base image's C library from its files (hermetic.builder.libc), on this machine's own root filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermetic.builder.libc import _LIBC_SO, detect_libc, glibc_from_rootfs, installed_packages


# -- the base image's glibc ---------------------------------------------------------

def host_read_file(hide: tuple[str, ...] = ()):
    def read(path: str) -> bytes | None:
        if path in hide or any(path.startswith(h.rstrip("/") + "/") for h in hide):
            return None
        p = Path(path)
        return p.read_bytes() if p.is_file() else None
    return read


def host_glibc() -> tuple[int, int] | None:
    try:
        conf = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    if not conf.startswith("glibc "):
        return None
    major, minor = conf.split()[1].split(".")[:2]
    return int(major), int(minor)


needs_glibc_host = pytest.mark.skipif(host_glibc() is None, reason="this host is not a glibc system")


@needs_glibc_host
@pytest.mark.skipif(not Path("/var/lib/dpkg/status").is_file(), reason="not a dpkg system")
def test_glibc_of_this_machine_from_dpkg_status():
    info = detect_libc(host_read_file())
    assert info.kind == "glibc" and info.source == "/var/lib/dpkg/status (libc6)"
    assert info.version == host_glibc()


@needs_glibc_host
def test_glibc_of_this_machine_from_libc_so_when_dpkg_is_absent():
    info = detect_libc(host_read_file(hide=("/var/lib/dpkg",)))
    assert info.kind == "glibc" and info.source.endswith("libc.so.6")
    assert info.version == host_glibc()


@needs_glibc_host
def test_glibc_of_this_machine_from_ld_so_when_only_the_loader_is_readable():
    info = detect_libc(host_read_file(hide=("/var/lib/dpkg",) + _LIBC_SO))
    if info.kind == "unknown":
        pytest.skip("this host's loader is not at a path we look at")
    assert "ld-linux" in info.source and info.version == host_glibc()


def test_distroless_and_ubuntu_dpkg_status():
    status = (b"Package: tzdata\nStatus: install ok installed\nVersion: 2024a-0+deb12u1\n\n"
              b"Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.39-0ubuntu8.3\n"
              b"Description: GNU C Library: Shared libraries\n Contains the standard libraries.\n")
    assert glibc_from_rootfs({"/var/lib/dpkg/status": status}.get) == (2, 39)
    distroless = b"Package: libc6\nVersion: 2.36-9+deb12u7\nArchitecture: amd64\n"
    assert glibc_from_rootfs({"/var/lib/dpkg/status.d/libc6": distroless}.get) == (2, 36)


def test_alpine_is_musl_with_a_reason():
    files = {"/etc/alpine-release": b"3.20.3\n", "/etc/os-release": b'PRETTY_NAME="Alpine Linux v3.20"\n'}
    info = detect_libc(files.get)
    assert glibc_from_rootfs(files.get) is None
    assert info.kind == "musl" and "Alpine 3.20.3" in info.reason and "need glibc" in info.reason


def test_empty_rootfs_is_unknown():
    info = detect_libc(lambda _p: None)
    assert info.kind == "unknown" and info.version is None and info.reason


def test_dpkg_status_parser_reads_installed_packages_only():
    status = ("Package: a\nStatus: install ok installed\nVersion: 1.0\nDescription: x\n more: text\n\n"
              "Package: b\nStatus: deinstall ok config-files\nVersion: 2.0\n\n"
              "Package: c\nStatus: purge ok not-installed\n\n"
              "Package: d\nVersion: 3.0\n")  # no Status: distroless status.d
    assert installed_packages(status) == {"a": "1.0", "d": "3.0"}
