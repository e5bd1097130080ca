"""The record's own error, apart from its schema: whoever checks a record's shape without pydantic (the run's
process, whose records the record worker validates: hermetic.record.worker) raises the same one."""

from __future__ import annotations

from hermetic.errors import DataError


class RecordError(DataError):
    """run.json (or group.json) does not have the documented shape."""
