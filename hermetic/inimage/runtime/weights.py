"""Model weights as bytes that depend on the numbers only.

``save_weights`` writes every tensor's raw little-endian bytes, in sorted name
order, into one ``.bin`` file, and a JSON index beside it (``.json``: name,
dtype, shape, offset, size and sha256 of each tensor). Two runs that computed
the same numbers write the same bytes, whatever torch's serialization does
(torch.save names its zip's inner folder after the file), and the index lets a
reader without torch say *which* tensors differ. ``read_weights`` uses only
the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from . import _optional
from ._io import atomic_write_bytes
from .metrics import outputs_dir

FORMAT = "hermetic-weights/1"
DEFAULT_NAME = "weights.bin"


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: Tuple[int, ...]
    data: bytes


def index_path(path: "str | os.PathLike[str]") -> Path:
    return Path(path).with_suffix(".json")


def _tensor_bytes(value: Any) -> Tuple[str, Tuple[int, ...], bytes]:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian targets
        raise RuntimeError("save_weights writes little-endian bytes and supports little-endian hosts only")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        dtype = str(t.dtype).replace("torch.", "")
        flat = t.reshape(-1).view(torch.uint8)  # any dtype, bfloat16 included
        if _optional.numpy() is not None:
            raw = flat.numpy().tobytes()
        else:
            raw = bytes(flat.tolist())
        return dtype, tuple(int(d) for d in t.shape), raw
    np = _optional.numpy()
    if np is not None:
        a = np.ascontiguousarray(value)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.hasobject:
            raise TypeError("save_weights: object arrays have no raw bytes")
        return a.dtype.name, tuple(int(d) for d in a.shape), a.tobytes()
    raise TypeError(f"save_weights: not a torch tensor or numpy array: {type(value).__name__}")


def save_weights(tensors: Mapping[str, Any], path: "Optional[str | os.PathLike[str]]" = None) -> Path:
    """Write ``tensors`` (e.g. ``model.state_dict()`` or a dict of numpy
    arrays) to ``path`` (default $HERMETIC_OUTPUTS/weights.bin) plus its index
    ``path`` with suffix ``.json``; both atomically. Returns the .bin path."""
    target = Path(path) if path is not None else outputs_dir() / DEFAULT_NAME
    entries = []
    chunks = []
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = _tensor_bytes(tensors[name])
        entries.append({"name": name, "dtype": dtype, "shape": list(shape), "offset": offset,
                        "nbytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
        chunks.append(raw)
        offset += len(raw)
    blob = b"".join(chunks)
    index = {"format": FORMAT, "byte_order": "little", "data": target.name,
             "data_sha256": hashlib.sha256(blob).hexdigest(), "tensors": entries}
    atomic_write_bytes(str(target), blob)
    atomic_write_bytes(str(index_path(target)),
                       (json.dumps(index, sort_keys=True, indent=2) + "\n").encode("utf-8"))
    return target


def read_weights(path: "str | os.PathLike[str]") -> Dict[str, Tensor]:
    """The tensors ``save_weights`` wrote, checked against the index's sha256s."""
    target = Path(path)
    index = json.loads(index_path(target).read_text(encoding="utf-8"))
    if index.get("format") != FORMAT:
        raise ValueError(f"{index_path(target)}: not a {FORMAT} index")
    blob = target.read_bytes()
    if hashlib.sha256(blob).hexdigest() != index["data_sha256"]:
        raise ValueError(f"{target}: sha256 does not match its index")
    out: Dict[str, Tensor] = {}
    for e in index["tensors"]:
        raw = blob[e["offset"]:e["offset"] + e["nbytes"]]
        out[e["name"]] = Tensor(dtype=e["dtype"], shape=tuple(e["shape"]), data=raw)
    return out
