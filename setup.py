"""The one thing pyproject.toml cannot say: hermetic's C extension.

hermetic.data._filehash is the per-file loop of dataset hashing (open, fstat,
read, sha256 through OpenSSL's libcrypto). It is optional: where it cannot be
built (no C compiler, no OpenSSL headers) the build goes on without it and
hermetic.data.hashing uses the same loop in Python, about 1.5x slower on
datasets of small files and no slower on large ones.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hermetic.data._filehash",
            sources=["hermetic/data/_filehash.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
