"""The run record: runs/<id>/run.json, its schema, seal, index, README and seed groups.

Public API (what ``hermetic run`` / ``replay`` call):

- ids: ``new_run_id``, ``new_group_id``, ``iso_utc``, ``is_run_id``
- run dir: ``create_run_dir``, ``adopt_run_dir``, ``write_record``, ``load_record``, ``resolve_run``
- building: ``begin_record``, ``env_section``, ``seed_section``, ``finish_record``,
  ``hash_outputs``, ``metrics_summary``
- integrity: ``seal``, ``verify_seal``, ``validate_record`` (hermetic.record.schema, imports pydantic)
- secrets: ``is_secret_name``
- README: ``render_readme``
- groups: ``write_group``, ``load_group``
- listing: ``list_entries`` (hermetic.record.index)

Each is imported from its module on first use (nothing but this file is
imported with the package); pydantic is imported when a record is validated.
"""

from __future__ import annotations

from typing import Any

# imported now, not on first use: the function has its module's name, and a submodule once imported is the
# package's attribute of that name (`from hermetic.record import seal` must stay the function)
from hermetic.record.seal import seal, verify_seal

# name -> the module that defines it; imported on first use (PEP 562): `hermetic run` needs the run dir
# before its container starts, and the rest of the package (the record's building, README, groups, index, the
# schema: pydantic) only beside the container's start.
_EXPORTS = {
    "begin_record": "build", "env_section": "build", "finish_record": "build", "seed_section": "build",
    "load_group": "group", "write_group": "group",
    "is_run_id": "ids", "iso_utc": "ids", "new_group_id": "ids", "new_run_id": "ids",
    "list_entries": "index", "hash_outputs": "outputs", "metrics_summary": "outputs", "render_readme": "readme",
    "adopt_run_dir": "rundir", "create_run_dir": "rundir", "load_record": "rundir", "resolve_run": "rundir",
    "write_record": "rundir", "is_secret_name": "secrets_policy",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module == "build":
        from hermetic.record import build as m
    elif module == "group":
        from hermetic.record import group as m
    elif module == "ids":
        from hermetic.record import ids as m
    elif module == "index":
        from hermetic.record import index as m
    elif module == "outputs":
        from hermetic.record import outputs as m
    elif module == "readme":
        from hermetic.record import readme as m
    elif module == "rundir":
        from hermetic.record import rundir as m
    elif module == "secrets_policy":
        from hermetic.record import secrets_policy as m
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(m, name)


def validate_record(record, *, source="run.json", sealed=True):  # noqa: ANN001 - thin lazy wrapper
    """See hermetic.record.schema.validate_record (imported on first use: it needs pydantic)."""
    from hermetic.record.schema import validate_record as _validate

    return _validate(record, source=source, sealed=sealed)


__all__ = [
    "adopt_run_dir", "begin_record", "create_run_dir", "env_section", "finish_record", "hash_outputs", "is_run_id",
    "is_secret_name", "iso_utc", "list_entries", "load_group", "load_record", "metrics_summary",
    "new_group_id", "new_run_id", "render_readme", "resolve_run", "seal", "seed_section",
    "validate_record", "verify_seal", "write_group", "write_record",
]
