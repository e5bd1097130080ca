"""The run record: runs/<id>/run.json, its schema, seal, index, README and seed groups.

The public names below are imported from their modules on first use (PEP 562), so ``hermetic run`` loads only
the run dir's code before its container starts; pydantic is imported when a record is validated.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermetic.config.secretnames import is_secret_name
# imported now, not on first use: the function has its module's name, and a submodule once imported is the
# package's attribute of that name (`from hermetic.record import seal` must stay the function)
from hermetic.record.seal import seal, verify_seal

# name -> the module that defines it, imported on first use
_EXPORTS = {
    "begin_record": "build", "env_section": "build", "finish_record": "build", "seed_section": "build",
    "load_group": "group", "write_group": "group",
    "is_run_id": "ids", "iso_utc": "ids", "new_group_id": "ids", "new_run_id": "ids",
    "list_entries": "index", "hash_outputs": "outputs", "metrics_summary": "outputs", "render_readme": "readme",
    "adopt_run_dir": "rundir", "create_run_dir": "rundir", "load_record": "rundir", "load_run": "rundir",
    "resolve_run": "rundir", "write_record": "rundir", "validate_record": "schema",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = [
    "adopt_run_dir", "begin_record", "create_run_dir", "env_section", "finish_record", "hash_outputs", "is_run_id",
    "is_secret_name", "iso_utc", "list_entries", "load_group", "load_record", "load_run", "metrics_summary",
    "new_group_id", "new_run_id", "render_readme", "resolve_run", "seal", "seed_section",
    "validate_record", "verify_seal", "write_group", "write_record",
]
