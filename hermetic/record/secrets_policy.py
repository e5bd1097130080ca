"""Which environment variables are secrets: their names are recorded, never their values.

The rule lives in the base module hermetic.config.secretnames (config applies it to hermetic.yaml's ``env:``
too); it is re-exported here for the record's writers and readers.
"""

from __future__ import annotations

from hermetic.config.secretnames import REDACTED, SECRET_MARKERS, is_secret_name

__all__ = ["REDACTED", "SECRET_MARKERS", "is_secret_name"]
