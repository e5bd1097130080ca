"""``--gpus``: the one grammar of what a run asks for, as ``docker run --gpus`` spells it: ``all``, a count, or
``device=ID[,ID...]`` (indexes, GPU-/MIG-<uuid>, shell quotes allowed); anything else is a usage error before
any engine is asked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hermetic.core.errors import UsageError

# A device ID: an index, or a GPU/MIG UUID (old MIG IDs are MIG-GPU-<uuid>/<gi>/<ci>).
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
MAX_COUNT = 1024  # more GPUs than any one machine holds: a typo, not a request
EXPECTED = "expected all, a count such as 2, or device=ID[,ID...]"


@dataclass(frozen=True)
class GpuRequest:
    """What ``--gpus`` asks for: every GPU (``count`` and ``device_ids`` both empty), N of them, or these."""

    count: int | None = None
    device_ids: tuple[str, ...] = ()

    @property
    def all(self) -> bool:
        return self.count is None and not self.device_ids

    @property
    def how_many(self) -> int | None:
        """How many GPUs the container gets, when the request says (None for ``all``)."""
        return len(self.device_ids) if self.device_ids else self.count


def parse_gpus(value: str | None) -> GpuRequest | None:
    """The request ``value`` makes (None for no value: no GPUs); UsageError naming the value otherwise."""
    if value is None or value == "":
        return None

    def bad(why: str = EXPECTED) -> UsageError:
        return UsageError(f"--gpus {value!r}: {why}")

    g = value.strip()
    if len(g) >= 2 and g[0] == g[-1] and g[0] in "\"'":
        g = g[1:-1].strip()
    if g == "all":
        return GpuRequest()
    if g.isascii() and g.isdigit():
        if len(g) > 4 or int(g) > MAX_COUNT:
            raise bad(f"more than {MAX_COUNT} GPUs")
        if int(g) == 0:
            raise bad("0 GPUs: leave --gpus out to run without GPUs")
        return GpuRequest(count=int(g))
    if g.startswith("device="):
        ids = [x.strip() for x in g[len("device="):].split(",")]
        if not ids or not all(ids):
            raise bad("device= needs IDs separated by commas, e.g. device=0,1")
        wrong = next((x for x in ids if not _DEVICE_ID.fullmatch(x)), None)
        if wrong is not None:
            raise bad(f"{wrong!r} is not a GPU index or UUID")
        if len(set(ids)) != len(ids):
            raise bad("a device is named twice")
        return GpuRequest(device_ids=tuple(ids))
    raise bad()


def gpu_count(value: str | None) -> int | None:
    """How many GPUs ``--gpus value`` gives, when it says: 0 for none, None for ``all``."""
    request = parse_gpus(value)
    return 0 if request is None else request.how_many
