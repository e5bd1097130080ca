"""Wheel tags the image accepts (manylinux_2_28 down to manylinux1, abi3, py3-none-any), in pip's order of
preference: the most specific match wins, as an installer inside the image would choose."""

from __future__ import annotations

from functools import lru_cache

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from hermetic.lock.model import Target

_LEGACY_ALIASES = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}


def manylinux_platforms(glibc: tuple[int, int], machine: str) -> list[str]:
    major, top = glibc
    plats: list[str] = []
    for minor in range(top, 4, -1):
        plats.append(f"manylinux_{major}_{minor}_{machine}")
        legacy = _LEGACY_ALIASES.get((major, minor))
        if legacy:
            plats.append(f"{legacy}_{machine}")
    return plats


@lru_cache(maxsize=16)
def target_tags(target: Target) -> dict[Tag, int]:
    """Tag -> priority (lower is better)."""
    major, minor = (int(x) for x in target.python_version.split("."))
    plats = manylinux_platforms(target.glibc, target.machine)
    interp = f"cp{major}{minor}"
    tags = list(cpython_tags(python_version=(major, minor), abis=[interp], platforms=plats))
    tags += list(compatible_tags(python_version=(major, minor), interpreter=interp, platforms=plats))
    order: dict[Tag, int] = {}
    for i, t in enumerate(tags):
        order.setdefault(t, i)
    return order


def wheel_priority(filename: str, target: Target) -> int | None:
    """Best (lowest) priority among the wheel's tags, or None when none fits the target."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    order = target_tags(target)
    prios = [order[t] for t in tags if t in order]
    return min(prios) if prios else None
