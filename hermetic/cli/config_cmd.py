"""``hermetic config show``: the resolved config and its canonical sha256."""

from __future__ import annotations

import click

from hermetic.cli.common import config_option, emit, json_option


@click.group()
def config() -> None:
    """Inspect hermetic.yaml as hermetic resolves it."""


@config.command("show")
@config_option
@json_option
def show(config_path: str | None, as_json: bool) -> None:
    """Print the resolved config (defaults filled in) and its sha256.

    The sha256 is over canonical JSON (sorted keys, compact separators), so the
    same settings written in another key order or YAML style hash the same.
    """
    import yaml

    from hermetic.config.load import load_config

    cfg = load_config(config_path)
    resolved = cfg.resolved()
    emit(as_json, {"path": str(cfg.path), "sha256": cfg.sha256, "config": resolved},
         f"# {cfg.path}\n# sha256: {cfg.sha256}\n"
         + yaml.safe_dump(resolved, sort_keys=True, default_flow_style=False).rstrip())
