"""``--mlflow [URI]``: the option that ``hermetic run`` and ``hermetic runs export`` share.

Alone it means $MLFLOW_TRACKING_URI; it takes the next word only when that is a URI (``hermetic run --mlflow
train.py`` runs train.py; ``--mlflow=./mlruns`` for a bare path). Only click is imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from hermetic.cli.common import ScriptCommand

F = TypeVar("F", bound=Callable[..., Any])
OPTION = "--mlflow"
URI_PREFIXES = ("file:", "databricks", "uc:", "sqlite:", "postgresql", "mysql", "mssql")


def mlflow_option(f: F) -> F:
    return click.option(
        OPTION, "mlflow_uri", metavar="[URI]", default=None,
        help="Export to this MLflow tracking server (alone: $MLFLOW_TRACKING_URI). Needs hermetic[mlflow].",
    )(f)


def looks_like_uri(word: str) -> bool:
    return "://" in word or word.startswith(URI_PREFIXES)


def bare_mlflow_flags(args: list[str], command: click.Command, interspersed: bool) -> list[str]:
    """``--mlflow`` not followed by a URI becomes ``--mlflow=`` (use the environment); the walk stops at ``--``
    and, unless ``interspersed``, at the first argument (the script, whose arguments are never touched)."""
    takes_value = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag
                   and p.name != "mlflow_uri" for o in p.opts}
    out = list(args)
    i = 0
    while i < len(out):
        word = out[i]
        if word == "--":
            break
        if word == OPTION:
            if i + 1 >= len(out) or not looks_like_uri(out[i + 1]):
                out[i] = OPTION + "="
            else:
                i += 1
        elif word in takes_value:
            i += 1
        elif not word.startswith("-") and not interspersed:
            break
        i += 1
    return out


class MlflowCommand(ScriptCommand):
    """A command whose ``--mlflow`` takes a URI only when one follows (see the module doc)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, bare_mlflow_flags(args, self, ctx.allow_interspersed_args))


def mlflow_target(value: str | None) -> str | None:
    """Where ``hermetic run --mlflow`` exports, checked before the run starts (a URI, the installed extra)."""
    if value is None:
        return None
    from hermetic.integrations.mlflow import require, tracking_uri

    uri = tracking_uri(value or None)
    require()
    return uri


def export_after_run(uri: str | None, dirs: list[Path], exit_code: int) -> int:
    """Export the finished run(s) or group; the run's exit code, or 1 when the run succeeded but the
    export failed (the record is on disk either way: the message says how to export it again)."""
    if uri is None:
        return exit_code
    from hermetic.core.errors import HermeticError
    from hermetic.integrations.mlflow import export_paths

    try:
        results = export_paths(dirs, uri)
    except HermeticError as e:
        ids = " ".join(d.name for d in dirs)
        click.echo(f"hermetic: error: MLflow export failed: {e.message}", err=True)
        click.echo(f"hermetic: hint: the run is recorded; export it later with "
                   f"`hermetic runs export --mlflow {uri} {ids}`", err=True)
        return exit_code or 1
    for r in results:
        click.echo(f"exported {r.id} to MLflow run {r.mlflow_run_id}" + (f": {r.url}" if r.url else ""), err=True)
    return exit_code
