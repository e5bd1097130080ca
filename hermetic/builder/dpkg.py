"""dpkg's status database (``var/lib/dpkg/status``, deb822), parsed: which packages a root filesystem has."""

from __future__ import annotations

from hermetic.provenance.sbom import installed_deb_packages


def installed_packages(text: str) -> dict[str, str]:
    """{package: version} of the installed packages, sorted by name (provenance.sbom's reading)."""
    return {p.name: p.version for p in installed_deb_packages(text)}
