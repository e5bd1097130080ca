"""Every RNG state in the process, as plain data.

``rng_state()`` returns only ints, floats, strings, lists, dicts and torch
ByteTensors, so a checkpoint holding it loads with
``torch.load(weights_only=True)`` and, without torch, survives pickle or JSON.

Keys: ``python`` (random.getstate), ``numpy`` (legacy global MT19937),
``torch`` (CPU), ``torch_cuda`` (one state per visible device) and
``generators`` (named torch.Generator / numpy Generator objects you pass in,
such as the DataLoader's). A JAX key is a value you keep yourself: put it in
the checkpoint's ``extra``.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Mapping, Optional

from . import _optional
from ._io import warn


def _to_plain(value: Any, np: Any) -> Any:
    """numpy arrays (inside a bit generator's state) -> tagged lists."""
    if np is not None and isinstance(value, np.ndarray):
        return {"__ndarray__": value.dtype.str, "data": value.tolist()}
    if isinstance(value, dict):
        return {k: _to_plain(v, np) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v, np) for v in value]
    if np is not None and isinstance(value, np.generic):
        return value.item()
    return value


def _from_plain(value: Any, np: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value and set(value) == {"__ndarray__", "data"}:
            return np.array(value["data"], dtype=np.dtype(value["__ndarray__"]))
        return {k: _from_plain(v, np) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_plain(v, np) for v in value]
    return value


def _generator_kind(gen: Any, torch: Any, np: Any) -> str:
    if torch is not None and isinstance(gen, torch.Generator):
        return "torch"
    if np is not None and isinstance(gen, np.random.Generator):
        return "numpy"
    if np is not None and isinstance(gen, np.random.RandomState):
        return "numpy.RandomState"
    raise TypeError(f"not a torch.Generator or numpy Generator/RandomState: {type(gen).__name__}")


def rng_state(generators: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Snapshot of every RNG state (see module docstring)."""
    state: Dict[str, Any] = {}
    version, internal, gauss_next = random.getstate()
    state["python"] = [version, list(internal), gauss_next]

    np = _optional.numpy()
    if np is not None:
        name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {"bit_generator": str(name), "key": key.tolist(), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}

    torch = _optional.torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state["torch_cuda"] = list(torch.cuda.get_rng_state_all())

    gens: Dict[str, Any] = {}
    for name, gen in sorted((generators or {}).items()):
        kind = _generator_kind(gen, torch, np)
        if kind == "torch":
            gens[name] = {"kind": kind, "state": gen.get_state()}
        elif kind == "numpy":
            gens[name] = {"kind": kind, "state": _to_plain(gen.bit_generator.state, np)}
        else:
            gens[name] = {"kind": kind, "state": _to_plain(list(gen.get_state(legacy=True)), np)}
    if gens:
        state["generators"] = gens
    return state


def set_rng_state(state: Mapping[str, Any], generators: Optional[Mapping[str, Any]] = None) -> None:
    """Restore what ``rng_state()`` captured. Named ``generators`` are restored
    in place; a name missing from the state raises KeyError."""
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))

    np = _optional.numpy()
    if "numpy" in state:
        if np is None:
            warn("the saved state has a numpy RNG state but numpy is not importable; skipped")
        else:
            s = state["numpy"]
            np.random.set_state((s["bit_generator"], np.array(s["key"], dtype=np.uint32), int(s["pos"]),
                                 int(s["has_gauss"]), float(s["cached_gaussian"])))

    torch = _optional.torch()
    if "torch" in state:
        if torch is None:
            warn("the saved state has a torch RNG state but torch is not importable; skipped")
        else:
            torch.set_rng_state(state["torch"])
    if "torch_cuda" in state and torch is not None:
        saved = list(state["torch_cuda"])
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have != len(saved):
            warn(f"the saved state has CUDA RNG states for {len(saved)} device(s), this process sees "
                 f"{have}; restoring the first {min(have, len(saved))}: the run will not continue bit for bit")
        for i in range(min(have, len(saved))):
            torch.cuda.set_rng_state(saved[i], device=i)

    saved_gens = state.get("generators", {})
    for name, gen in sorted((generators or {}).items()):
        if name not in saved_gens:
            raise KeyError(f"no RNG state saved for generator {name!r} (saved: {sorted(saved_gens)})")
        entry = saved_gens[name]
        kind = _generator_kind(gen, torch, np)
        if kind != entry["kind"]:
            raise TypeError(f"generator {name!r}: saved as {entry['kind']}, given a {kind}")
        if kind == "torch":
            gen.set_state(entry["state"])
        elif kind == "numpy":
            gen.bit_generator.state = _from_plain(entry["state"], np)
        else:
            gen.set_state(tuple(_from_plain(entry["state"], np)))
