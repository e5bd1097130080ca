"""Run and group identifiers: ``20261129-214500-1a2b3c[-name]`` (UTC time, 24 random bits).

Sorted as strings they sort by start time; the random part keeps same-second runs apart.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone

from hermetic.core.paths import name_pattern
from hermetic.core.paths import slug as paths_slug

RUN_NAME_MAX = 63
RUN_ID_RE = re.compile(rf"^\d{{8}}-\d{{6}}-[0-9a-f]{{6}}(?:-{name_pattern(RUN_NAME_MAX)})?$")


def utc(now: datetime | None = None) -> datetime:
    """``now`` as an aware UTC datetime (naive values are taken to be UTC)."""
    now = now or datetime.now(timezone.utc)
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)


def iso_utc(now: datetime | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``: ``2026-11-29T21:45:00.123Z``."""
    t = utc(now)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def slug(name: str) -> str:
    """A run name as it may appear in an ID: lowercase, ``[a-z0-9._-]``, at most 63 chars (paths.slug)."""
    return paths_slug(name, RUN_NAME_MAX)


def new_run_id(now: datetime | None = None, name: str | None = None) -> str:
    """A fresh run ID; ``name`` (slugged) is appended when it is not empty."""
    t = utc(now)
    rid = t.strftime("%Y%m%d-%H%M%S-") + os.urandom(3).hex()  # secrets.token_hex's own source, without its imports
    s = slug(name) if name else ""
    return f"{rid}-{s}" if s else rid


def new_group_id(now: datetime | None = None, name: str | None = None) -> str:
    """A multi-seed group's ID: the same shape as a run ID (groups and runs sort together)."""
    return new_run_id(now, name)


def is_run_id(text: str) -> bool:
    return bool(RUN_ID_RE.match(text))
