"""Which environment variables are secrets: their names may be recorded, never their values.

A base module (imports nothing of hermetic's), so that config can refuse a
secret under hermetic.yaml's ``env:`` by the same rule the record applies to
``--env`` (hermetic.record.secrets_policy re-exports it).
"""

from __future__ import annotations

SECRET_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")
# Well-known settings that only look like secrets: recorded (and allowed under env:) by value.
NOT_SECRETS = frozenset({"TOKENIZERS_PARALLELISM"})
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """True when ``name`` contains TOKEN, SECRET, KEY, PASSWORD or CREDENTIAL (any case), but for the
    few well-known settings in NOT_SECRETS (Hugging Face's TOKENIZERS_PARALLELISM).

    Deliberately broad: recording ``MONKEY=1`` by name only costs nothing,
    recording ``WANDB_API_KEY``'s value leaks it into every copy of the run.
    """
    upper = name.upper()
    return upper not in NOT_SECRETS and any(marker in upper for marker in SECRET_MARKERS)
