"""The inputs of every image outside hermetic.yaml and the lock (layer format, runtime): in every build
key and layer key.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# Bump on any change to what a layer holds or how layers are planned: it is part
# of every layer key and of the build key, so old cached builds are not reused.
LAYER_FORMAT = 4  # 3: PEP 552 bytecode beside every module (builder/bytecode.py); 4: small groups by size
# Bump on any change to what is copied out of a base to compile with (builder/interpreter.py): the
# compiler's start-up state is part of the .pyc bytes. Part of the build key, and of the copies' cache.
COMPILER_FORMAT = 2
RUNTIME_DIR = Path(__file__).resolve().parent.parent / "inimage" / "runtime"  # shipped as hermetic_runtime
STARTUP_MODULE = "_startup.py"  # shipped as _hermetic_startup, run at interpreter start (hermetic-runtime.pth)


def runtime_files() -> dict[str, bytes]:
    """The runtime's files (relative path -> bytes): the package's modules and the start-up .pth."""
    if not RUNTIME_DIR.is_dir():
        return {}
    paths = sorted(p for p in RUNTIME_DIR.rglob("*") if p.suffix in (".py", ".pth") and p.is_file())
    return {p.relative_to(RUNTIME_DIR).as_posix(): p.read_bytes() for p in paths}


@functools.cache  # the runtime ships with this installation: one hash per process (no-op, key, note)
def runtime_sha256() -> str:
    h = hashlib.sha256()
    for rel, data in runtime_files().items():
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()
