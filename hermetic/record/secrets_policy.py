"""Which environment variables are secrets: their names are recorded, never their values."""

from __future__ import annotations

SECRET_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """True when ``name`` contains TOKEN, SECRET, KEY, PASSWORD or CREDENTIAL (any case).

    Deliberately broad: recording ``MONKEY=1`` by name only costs nothing,
    recording ``WANDB_API_KEY``'s value leaks it into every copy of the run.
    """
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)
