"""The engines that run hermetic's containers: Docker, Podman, Charliecloud (docs/architecture.md).

``get_engine(name)`` gives one. Outside this package only this module and ``base`` are imported
(tests/test_architecture.py): what differs is asked of the engine, never decided by its name.
"""

from __future__ import annotations

import importlib

from hermetic.engines.base import DEFAULT_ENGINE, ENGINES, HOLDS_LABEL, Engine, EngineInfo
from hermetic.core.errors import UsageError

_made: dict[str, Engine] = {}


def get_engine(name: str | None = None) -> Engine:
    """The engine called ``name`` (default: docker); one object per process and name."""
    name = name or DEFAULT_ENGINE
    if name not in ENGINES:
        raise UsageError(f"engine {name!r}: one of {', '.join(ENGINES)}")
    if name not in _made:  # imported on first use: a run on one engine loads no other's module
        module = importlib.import_module(f"hermetic.engines.{name}")
        _made[name] = getattr(module, f"{name.capitalize()}Engine")()
    return _made[name]


def orphan_engines() -> tuple[str, ...]:
    """The engines whose containers can outlive their driver (``Engine.outlives_driver``)."""
    return tuple(name for name in ENGINES if get_engine(name).outlives_driver)


def held_paths() -> set[str] | None:
    """The host paths that containers hold (HOLDS_LABEL), on every engine whose containers can outlive their
    driver; None when one that may hold some cannot be asked."""
    found = [get_engine(name).containers_labelled(HOLDS_LABEL) for name in orphan_engines()]
    if any(rows is None for rows in found):
        return None
    return {str((r.get("Labels") or {}).get(HOLDS_LABEL)) for rows in found for r in rows or []
            if (r.get("Labels") or {}).get(HOLDS_LABEL)}


__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "EngineInfo", "get_engine", "held_paths", "orphan_engines"]
