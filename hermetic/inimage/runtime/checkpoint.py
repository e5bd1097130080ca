"""Checkpoints that resume a run exactly.

A checkpoint holds the model, optimizer and scheduler state, every RNG state
(``rng_state``) and the position in the data (epoch, batch index: the number
of batches of that epoch already consumed). Resuming restores all of it; the
training loop then reseeds the loader for that epoch (``seed_epoch``) and
skips ``batch`` batches by iterating over them, so DataLoader workers advance
their RNG streams exactly as in an uninterrupted run.

With torch importable the file is ``torch.save`` output written through a file
object (the zip's inner folder is then always "archive", not the temp file's
random name, so equal checkpoints are equal bytes) and is read back with
``weights_only=True``. Without torch it is a pickle. Either way it is written
to a temp file and renamed into place: a crash leaves the old checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from . import _optional
from ._io import atomic_write_bytes
from .report import record
from .rng import rng_state, set_rng_state

FORMAT = "hermetic-checkpoint/1"


@dataclass(frozen=True)
class Checkpoint:
    epoch: int
    batch: int
    extra: Dict[str, Any]
    sha256: str
    data: Dict[str, Any] = field(repr=False)


def _check_position(epoch: int, batch: int) -> None:
    for name, v in (("epoch", epoch), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: must be a non-negative integer, got {v!r}")


def save_checkpoint(
    path: "str | os.PathLike[str]",
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    generators: Optional[Mapping[str, Any]] = None,
    epoch: int = 0,
    batch: int = 0,
    extra: Optional[Mapping[str, Any]] = None,
) -> str:
    """Write a checkpoint atomically; returns the sha256 of its bytes.

    ``generators``: named RNGs outside the global ones, e.g.
    ``{"loader": loader_generator, "numpy": seed_result.numpy_generator}``.
    ``extra``: plain values to carry (running sums, a JAX key as a list...).
    """
    _check_position(epoch, batch)
    doc: Dict[str, Any] = {
        "format": FORMAT,
        "position": {"epoch": epoch, "batch": batch},
        "rng": rng_state(generators),
        "extra": dict(extra or {}),
    }
    for key, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is not None:
            doc[key] = obj.state_dict()

    torch = _optional.torch()
    if torch is not None:
        buf = io.BytesIO()
        torch.save(doc, buf)
        data = buf.getvalue()
    else:
        data = pickle.dumps(doc, protocol=4)
    path = os.fspath(path)
    atomic_write_bytes(path, data)
    digest = hashlib.sha256(data).hexdigest()
    record(checkpoint={"last_saved": {"path": path, "sha256": digest, "epoch": epoch, "batch": batch}})
    return digest


def load_checkpoint(
    path: "str | os.PathLike[str]",
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    generators: Optional[Mapping[str, Any]] = None,
    restore_rng: bool = True,
    map_location: Any = "cpu",
) -> Checkpoint:
    """Load a checkpoint into the objects given and restore every RNG state
    (unless ``restore_rng=False``); returns the position and ``extra``."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if data[:2] == b"PK":  # a zip: torch.save's format
        torch = _optional.torch()
        if torch is None:
            raise RuntimeError(f"{path}: written by torch.save, but torch is not importable")
        doc = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    else:
        doc = pickle.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} checkpoint")
    for key, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is None:
            continue
        if key not in doc:
            raise KeyError(f"{path}: the checkpoint holds no {key} state")
        obj.load_state_dict(doc[key])
    if restore_rng:
        # Last, so nothing above can draw from a restored generator.
        set_rng_state(doc["rng"], generators)
    pos = doc["position"]
    record(checkpoint={"resumed_from": {"path": path, "sha256": digest,
                                        "epoch": int(pos["epoch"]), "batch": int(pos["batch"])}})
    return Checkpoint(epoch=int(pos["epoch"]), batch=int(pos["batch"]), extra=dict(doc.get("extra", {})),
                      sha256=digest, data=doc)
