"""What the commands on recorded runs share: the ``--runs-dir`` option and where a command looks for runs.

Below cli/runs_cmd.py (the ``runs`` group), cli/logs_cmd.py (``runs wait``),
cli/runs_tools_cmd.py (``runs export``, ``runs plot``) and cli/diff_cmd.py, so
that none of them imports another for these. Only click is imported here:
``hermetic runs`` lists 10,000 runs on click and the standard library alone.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def runs_dir_option(f: F) -> F:
    return click.option("--runs-dir", "runs_dir", metavar="DIR", default=None,
                        help="The runs directory (default: runs_dir from hermetic.yaml, else ./runs).")(f)


def remember_location(ctx: click.Context, runs_dir: str | None, config_path: str | None) -> None:
    """The ``runs`` group's own --runs-dir and -C, for its subcommands (``hermetic runs -C x show ID``)."""
    ctx.obj = {"runs_dir": runs_dir, "config_path": config_path}


def runs_location(ctx: click.Context, runs_dir: str | None, config_path: str | None) -> tuple[str | None, str | None]:
    """A subcommand's --runs-dir and -C, else the ``runs`` group's (remember_location)."""
    parent = ctx.obj or {}
    return runs_dir or parent.get("runs_dir"), config_path or parent.get("config_path")
