"""How the runtime derives seeds: one 64-bit seed from parts, and each rank's seed from the run's.

Pure and stdlib only (this package is copied into every image as
``hermetic_runtime``); below both seeding.py and distributed.py, which use
each other's rule.
"""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 64-bit seed from ``parts``: ``int.from_bytes(sha256(":".join(map(str, parts))).digest()[:8], "big")``.

    ``derive_seed(1234, 0, 1)`` is the seed of worker 1 on rank 0 for seed 1234.
    Parts are written with ``str()``, so pass ints and plain strings only.
    """
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, (int, str)):
            raise ValueError(f"derive_seed: parts must be int or str, got {p!r}")
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank`` in a run seeded with ``seed`` (see the module docstring)."""
    if rank == 0:
        return seed
    return derive_seed(seed, "rank", rank) % 2**32
