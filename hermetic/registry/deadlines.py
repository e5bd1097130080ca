"""The limits of a registry transfer (docs/registry.md, "Deadlines"): the whole push or pull, one request, and the
slowest a blob may move; hermetic.core.transfer's watchdog keeps them, a missed one ends in RegistryTimeout (exit
75)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from hermetic.core.errors import TempFail
from hermetic.core.transfer import DEFAULT_MIN_RATE, DEFAULT_RATE_WINDOW_S, env_number, min_rate

TOTAL_TIMEOUT_ENV = "HERMETIC_REGISTRY_TIMEOUT"
REQUEST_TIMEOUT_ENV = "HERMETIC_REGISTRY_REQUEST_TIMEOUT"
MIN_RATE_ENV = "HERMETIC_REGISTRY_MIN_RATE"  # else HERMETIC_MIN_RATE, every transfer's
RATE_WINDOW_ENV = "HERMETIC_REGISTRY_RATE_WINDOW"  # else HERMETIC_RATE_WINDOW
DEFAULT_TOTAL_TIMEOUT_S = 3600.0  # one push or pull: a few GB over a slow link
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # one manifest/HEAD/token request; the longest pause of a blob transfer
CONNECT_TIMEOUT_S = 15.0


class RegistryTimeout(TempFail):
    """A deadline passed (exit 75): the registry is stalled or too slow; trying again later may work."""


@dataclass(frozen=True)
class Timeouts:
    """``total``: seconds for everything one client does (a push or a pull); ``request``: for one request
    other than a blob's bytes, and the longest a blob transfer may go without a byte moving; a blob that
    moves slower than ``min_rate`` bytes/s over ``rate_window`` seconds is ended."""

    total: float = DEFAULT_TOTAL_TIMEOUT_S
    request: float = DEFAULT_REQUEST_TIMEOUT_S
    min_rate: float = DEFAULT_MIN_RATE
    rate_window: float = DEFAULT_RATE_WINDOW_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, total: float | None = None) -> "Timeouts":
        env = os.environ if env is None else env
        rate, window = min_rate(env, (MIN_RATE_ENV, RATE_WINDOW_ENV))
        return cls(total=total if total is not None else env_number(env, TOTAL_TIMEOUT_ENV, DEFAULT_TOTAL_TIMEOUT_S),
                   request=env_number(env, REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT_S), min_rate=rate,
                   rate_window=window)
