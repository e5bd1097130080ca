"""numpy, torch and JAX: used when importable, never required.

An installed package whose import fails raises (a broken torch must not turn
into a silently unseeded run); an absent one returns None.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Optional


def optional_import(name: str) -> Optional[ModuleType]:
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return importlib.import_module(name)


def numpy() -> Optional[ModuleType]:
    return optional_import("numpy")


def torch() -> Optional[ModuleType]:
    return optional_import("torch")


def jax() -> Optional[ModuleType]:
    return optional_import("jax")


def distribution_version(name: str) -> Optional[str]:
    """The installed version of a distribution, without importing it."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None
