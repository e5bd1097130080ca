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

Only standard-library modules are imported here; pydantic is imported when a
record is validated.
"""

from hermetic.record.build import begin_record, env_section, finish_record, seed_section
from hermetic.record.group import load_group, write_group
from hermetic.record.ids import is_run_id, iso_utc, new_group_id, new_run_id
from hermetic.record.index import list_entries
from hermetic.record.outputs import hash_outputs, metrics_summary
from hermetic.record.readme import render_readme
from hermetic.record.rundir import adopt_run_dir, create_run_dir, load_record, resolve_run, write_record
from hermetic.record.seal import seal, verify_seal
from hermetic.record.secrets_policy import is_secret_name


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
