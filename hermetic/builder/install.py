"""Wheels -> files at their final in-image paths, without pip and without a container.

pypa/installer unpacks each wheel into a staging directory laid out exactly
as the image's virtual environment (``destdir`` + in-image path), so RECORD,
console-script shebangs (the image's interpreter) and INSTALLER come out the
same whatever the staging path is. No direct_url.json is written (it would
name a host path). The venv itself is a few files we write by hand.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from hermetic.errors import HermeticError

INSTALLER_NAME = b"hermetic\n"


@dataclass(frozen=True)
class VenvLayout:
    prefix: str  # e.g. /opt/venv
    python_version: str  # MAJOR.MINOR
    base_python: str  # the base image's interpreter, e.g. /usr/bin/python3

    @property
    def site_packages(self) -> str:
        return f"{self.prefix}/lib/python{self.python_version}/site-packages"

    @property
    def bin(self) -> str:
        return f"{self.prefix}/bin"

    @property
    def interpreter(self) -> str:
        return f"{self.prefix}/bin/python"

    def scheme(self, dist_name: str) -> dict[str, str]:
        return {
            "purelib": self.site_packages,
            "platlib": self.site_packages,
            "headers": f"{self.prefix}/include/site/python{self.python_version}/{dist_name}",
            "scripts": self.bin,
            "data": self.prefix,
        }


def install_wheel(wheel_path: Path, staging: Path, layout: VenvLayout) -> None:
    """Unpack one wheel under ``staging`` + in-image paths."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    try:
        with WheelFile.open(wheel_path) as source:
            dest = SchemeDictionaryDestination(
                layout.scheme(source.distribution),
                interpreter=layout.interpreter,
                script_kind="posix",
                bytecode_optimization_levels=(),
                destdir=str(staging),
            )
            install(source, dest, additional_metadata={"INSTALLER": INSTALLER_NAME})
    except HermeticError:
        raise
    except Exception as e:  # installer raises plain exceptions on bad wheels
        raise HermeticError(f"{wheel_path.name}: cannot install wheel: {e}") from None


def venv_files(layout: VenvLayout) -> dict[str, tuple[str, bytes | str]]:
    """The venv skeleton: in-image path -> ("file", bytes) | ("symlink", target)."""
    home = posixpath.dirname(layout.base_python)
    cfg = (
        f"home = {home}\n"
        "include-system-site-packages = false\n"
        f"version = {layout.python_version}\n"
        f"executable = {layout.base_python}\n"
    ).encode()
    major = layout.python_version.split(".")[0]
    return {
        f"{layout.prefix}/pyvenv.cfg": ("file", cfg),
        f"{layout.bin}/python": ("symlink", layout.base_python),
        f"{layout.bin}/python{major}": ("symlink", "python"),
        f"{layout.bin}/python{layout.python_version}": ("symlink", "python"),
        f"{layout.prefix}/lib64": ("symlink", "lib"),
    }
