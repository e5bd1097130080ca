"""The one thing pyproject.toml cannot say: hermetic's C extension.

hermetic.data._filehash is the per-file loop of dataset hashing (open, fstat,
read, sha256). It is optional: where it cannot be built (no C compiler, no
OpenSSL headers) the build goes on without it and hermetic.data.hashing runs
the same loop in Python (docs/data.md). Where Intel's multi-buffer crypto
library is installed (Debian: libipsec-mb-dev; x86-64 only) the loop also
hashes many small files at once with it; OpenSSL's libcrypto, the library
behind hashlib, does the rest.
"""

import ctypes.util
import os
import sysconfig

from setuptools import Extension, setup


def _has_ipsec_mb() -> bool:
    if os.environ.get("HERMETIC_NO_IPSEC_MB"):
        return False
    include_dirs = ["/usr/include", "/usr/local/include", sysconfig.get_config_var("INCLUDEDIR") or ""]
    header = any(os.path.exists(os.path.join(d, "intel-ipsec-mb.h")) for d in include_dirs if d)
    return header and ctypes.util.find_library("IPSec_MB") is not None


libraries, macros = ["crypto"], []
if _has_ipsec_mb():
    libraries.append("IPSec_MB")
    macros.append(("HERMETIC_WITH_IPSEC_MB", "1"))

setup(
    ext_modules=[
        Extension(
            "hermetic.data._filehash",
            sources=["hermetic/data/_filehash.c"],
            libraries=libraries,
            define_macros=macros,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
