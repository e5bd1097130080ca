"""One seed for every random number generator the process may use.

``derive_seed`` is the one way the runtime makes a seed from a seed: the first
8 bytes (big-endian) of sha256 over the parts joined by ':'. Adding numbers
(seed + worker_id) makes seed 1/worker 1 and seed 2/worker 0 the same stream;
a hash keeps every (seed, rank, worker) distinct, on any Python and platform.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _optional
from ._env import resolve_rank, resolve_seed, world_size
from ._seeds import derive_seed, rank_seed  # noqa: F401 (derive_seed is this module's API too)
from .report import record


@dataclass(frozen=True)
class SeedResult:
    """What ``seed_everything`` did.

    ``numpy_generator`` is a fresh ``numpy.random.Generator`` (PCG64) seeded
    with the seed, or None without numpy; ``jax_key`` is
    ``jax.random.PRNGKey(seed)``, or None without JAX. ``seeded`` names every
    generator seeded, e.g. ``("python", "numpy", "torch")``.
    """

    seed: int
    source: str  # "argument", "env:HERMETIC_SEED" or "default"
    seeded: Tuple[str, ...]
    numpy_generator: Any = field(default=None, repr=False, compare=False)
    jax_key: Any = field(default=None, repr=False, compare=False)


# The seed the last seed_everything() applied in this process: the default for
# the DataLoader helpers, so a seed passed in code is not silently replaced by
# $HERMETIC_SEED there.
_current_seed: Optional[int] = None


def current_seed(seed: Optional[int] = None) -> int:
    """``seed`` if given, else the one seed_everything() applied, else
    $HERMETIC_SEED, else 0."""
    if seed is None and _current_seed is not None:
        return _current_seed
    return resolve_seed(seed)[0]


def seed_everything(seed: Optional[int] = None, *, per_rank: bool = True) -> SeedResult:
    """Seed Python's ``random``, numpy (legacy global state and a returned
    Generator), torch (CPU and every CUDA device) and make a JAX key.

    With no argument the seed is $HERMETIC_SEED (which `hermetic run` sets
    from hermetic.yaml), else 0. In a multi-process run (WORLD_SIZE > 1) each
    rank gets its own seed derived from (seed, rank) unless ``per_rank=False``
    (hermetic_runtime.distributed.rank_seed). Records what it did in the
    runtime report.
    """
    global _current_seed
    value, source = resolve_seed(seed)
    shared = value
    if per_rank:
        if world_size() > 1:
            value = rank_seed(value, resolve_rank(None))
    _current_seed = value
    seeded: List[str] = []

    random.seed(value)
    seeded.append("python")

    np_gen = None
    np = _optional.numpy()
    if np is not None:
        np.random.seed(value)
        np_gen = np.random.default_rng(value)
        seeded += ["numpy", "numpy.Generator"]

    torch = _optional.torch()
    if torch is not None:
        torch.manual_seed(value)  # CPU, and every CUDA device (lazily)
        seeded.append("torch")
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(value)
            seeded.append("torch.cuda")

    jax_key = None
    jax = _optional.jax()
    if jax is not None:
        jax_key = jax.random.PRNGKey(value)
        seeded.append("jax")

    result = SeedResult(seed=value, source=source, seeded=tuple(seeded), numpy_generator=np_gen, jax_key=jax_key)
    seed_doc: dict = {"value": value, "source": source, "seeded": list(seeded)}
    if value != shared:
        seed_doc["shared"] = shared  # the run's seed this rank's was derived from
    record(seed=seed_doc)
    return result


def state_digest(state: Any) -> str:
    """sha256 of an RNG state written as compact JSON (``[version, [625 ints], gauss_next]`` for
    ``random.getstate()``; ``["MT19937", [624 ints], pos, has_gauss, cached_gaussian]`` for numpy's
    legacy ``get_state()``): equal states, equal digests, on any platform."""
    return hashlib.sha256(json.dumps(state, separators=(",", ":"), allow_nan=False).encode("utf-8")).hexdigest()


def final_seeds(modules: Mapping[str, Any], last_seed: Mapping[str, Any]) -> Dict[str, Any]:
    """What each generator the process imported ended with, for the report's ``final.seeds``.

    ``modules`` holds ``random``, ``numpy.random`` and ``torch`` when imported;
    ``last_seed`` what ``random.seed`` / ``numpy.random.seed`` were last given
    (the start-up hook notes it). ``random`` and ``numpy``: ``seed`` and
    ``state_sha256`` (state_digest); ``torch``: ``seed``, ``torch.initial_seed()``,
    the seed its CPU generator was last given. A generator whose state cannot
    be read is reported with ``error``.
    """
    out: Dict[str, Any] = {}
    rnd = modules.get("random")
    if rnd is not None:
        try:
            version, internal, gauss_next = rnd.getstate()
            out["random"] = {"seed": last_seed.get("random"),
                             "state_sha256": state_digest([version, list(internal), gauss_next])}
        except Exception as e:  # noqa: BLE001 - at exit: report, never raise
            out["random"] = {"error": f"{type(e).__name__}: {e}"}
    npr = modules.get("numpy.random")
    if npr is not None:
        try:
            name, key, pos, has_gauss, cached = npr.get_state(legacy=True)
            out["numpy"] = {"seed": last_seed.get("numpy"),
                            "state_sha256": state_digest([str(name), [int(k) for k in key.tolist()], int(pos),
                                                          int(has_gauss), float(cached)])}
        except Exception as e:  # noqa: BLE001
            out["numpy"] = {"error": f"{type(e).__name__}: {e}"}
    torch = modules.get("torch")
    if torch is not None:
        try:
            out["torch"] = {"seed": int(torch.initial_seed())}
        except Exception as e:  # noqa: BLE001
            out["torch"] = {"error": f"{type(e).__name__}: {e}"}
    return out
