"""Finding runs: a project's runs directory, and a run or group by path, ID or unique ID prefix."""

from __future__ import annotations

from pathlib import Path

from hermetic.core.paths import CONFIG_FILENAME, find_upward
from hermetic.record.rundir import resolve_run


def runs_root(runs_dir: str | None, config_path: str | None) -> Path:
    """--runs-dir, else the config's runs_dir (-C, or the nearest hermetic.yaml upwards), else ./runs."""
    if runs_dir:
        return Path(runs_dir)
    if config_path or find_upward(Path.cwd(), CONFIG_FILENAME) is not None:
        from hermetic.config.load import load_config  # the schema: only when a config is read

        return load_config(config_path).runs_path
    return Path("runs")


def resolve_ref(ref: str, runs_dir: str | None, config_path: str | None) -> Path:
    """A run/group directory from a path, an ID or a unique ID prefix (the config read only if needed)."""
    if "/" in ref or ref in (".", ".."):
        return resolve_run(ref, None)
    return resolve_run(ref, runs_root(runs_dir, config_path))
