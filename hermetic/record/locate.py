"""Finding runs: a project's runs directory, and a run or group by path, ID or unique ID prefix.

This is the fast path of ``hermetic runs``/``diff``/``replay``: it reads the
one key it needs (``runs_dir``) from hermetic.yaml without validating the
whole config (validation imports pydantic and builds the schema, ~0.35 s,
more than listing 10,000 runs takes). Anything unusual (no file, bad YAML,
a runs_dir that is not a string) goes to hermetic.config.load_config, whose
error messages are the reference.
"""

from __future__ import annotations

from pathlib import Path

from hermetic.paths import CONFIG_FILENAME, CONFIG_MAX_BYTES, find_upward, norm_relpath
from hermetic.record.rundir import resolve_run



def config_runs_dir(config_path: str | None) -> Path:
    """hermetic.yaml's runs_dir (``config_path``: the file, its directory, or None for ./hermetic.yaml)."""
    import yaml

    if config_path:
        p = Path(config_path)
        if p.is_dir():
            p = p / CONFIG_FILENAME
    else:
        p = find_upward(Path.cwd(), CONFIG_FILENAME) or Path.cwd() / CONFIG_FILENAME
    rel = None
    try:
        with open(p, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) <= CONFIG_MAX_BYTES:  # a larger one is load_config's to refuse, unparsed
            data = yaml.load(raw.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            rel = data.get("runs_dir", "runs") if isinstance(data, dict) else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        rel = None
    if not isinstance(rel, str) or not rel:
        from hermetic.config import load_config

        return load_config(config_path).runs_path
    rel = norm_relpath(rel)
    return Path(rel) if rel.startswith("/") else (p.parent / rel).resolve()


def runs_root(runs_dir: str | None, config_path: str | None) -> Path:
    """--runs-dir, else the config's runs_dir (-C, or the nearest hermetic.yaml upwards), else ./runs."""
    if runs_dir:
        return Path(runs_dir)
    if config_path or find_upward(Path.cwd(), CONFIG_FILENAME) is not None:
        return config_runs_dir(config_path)
    return Path("runs")


def resolve_ref(ref: str, runs_dir: str | None, config_path: str | None) -> Path:
    """A run/group directory from a path, an ID or a unique ID prefix (the config read only if needed)."""
    if "/" in ref or ref in (".", ".."):
        return resolve_run(ref, None)
    return resolve_run(ref, runs_root(runs_dir, config_path))
