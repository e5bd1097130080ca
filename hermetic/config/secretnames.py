"""Which environment variables are secrets: names recorded, never values. Imports nothing of hermetic's: the
one rule config refuses them by under ``env:`` and the record redacts them by."""

from __future__ import annotations

SECRET_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")
# Well-known settings that only look like secrets: recorded (and allowed under env:) by value.
NOT_SECRETS = frozenset({"TOKENIZERS_PARALLELISM"})
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """Whether ``name`` contains a SECRET_MARKERS word (any case), but for NOT_SECRETS. Deliberately broad:
    ``MONKEY=1`` recorded by name costs nothing, ``WANDB_API_KEY``'s value would leak into every copy."""
    upper = name.upper()
    return upper not in NOT_SECRETS and any(marker in upper for marker in SECRET_MARKERS)
