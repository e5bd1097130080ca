"""The base's interpreter as copied out of the image (where, how to start it, what it said): shared by
interpreter.py, which makes it, and bytecode.py, which runs it.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic.builder.inputs import COMPILER_FORMAT
from hermetic.core.errors import Unavailable

INTERPRETER_FORMAT = COMPILER_FORMAT
NO_BYTECODE_HINT = "set `build.bytecode: none` in hermetic.yaml to build the image without bytecode"
_LIBDIR = ".lib"  # inside the copy: every needed library under its soname
_ENV = {  # the whole environment of the compiler: nothing of the host's
    "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
    "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "1", "LC_ALL": "C", "PATH": "/nonexistent",
}


class BytecodeError(Unavailable):
    """The base's interpreter cannot be found, copied or run on this host (EX_UNAVAILABLE)."""


@dataclass(frozen=True)
class BaseInterpreter:
    """The base's python, copied out and runnable here; what it reported when it first ran."""

    root: Path
    loader: str | None  # relative to root
    executable: str  # relative to root
    home: str  # relative to root: the prefix (PYTHONHOME), e.g. "usr"
    identity: str
    magic: str
    cache_tag: str
    version: tuple[int, int, int]

    def argv(self, *args: str) -> list[str]:
        exe = str(self.root / self.executable)
        if self.loader is None:
            return [exe, *args]
        loader = str(self.root / self.loader)
        inhibit = ["--inhibit-cache"] if "ld-linux" in posixpath.basename(self.loader) else []
        return [loader, *inhibit, "--library-path", str(self.root / _LIBDIR), exe, *args]

    def env(self) -> dict[str, str]:
        return {**_ENV, "PYTHONHOME": str(self.root / self.home)}

    def to_json(self) -> dict[str, Any]:
        return {"format": INTERPRETER_FORMAT, "loader": self.loader, "executable": self.executable, "home": self.home,
                "identity": self.identity, "magic": self.magic, "cache_tag": self.cache_tag,
                "version": list(self.version)}

    @classmethod
    def from_json(cls, root: Path, d: dict[str, Any]) -> "BaseInterpreter":
        return cls(root, d["loader"], d["executable"], d["home"], d["identity"], d["magic"], d["cache_tag"],
                   tuple(d["version"]))  # type: ignore[arg-type]


def check_maps(maps: list[str], root: Path) -> None:
    """Every file mapped into the compiler comes from the copy of the base."""
    prefix = str(root.resolve()) + os.sep
    for path in maps:
        if path.startswith("/proc/"):
            continue
        if not os.path.realpath(path).startswith(prefix):
            raise BytecodeError(f"the base's interpreter loaded {path} from this host, not from the image; "
                                "refusing to compile with it", hint=NO_BYTECODE_HINT)

