"""What the commands on recorded runs share: ``--runs-dir``, where a command looks for runs, damaged records.

Below cli/runs_cmd.py, cli/logs_cmd.py, cli/runs_tools_cmd.py and cli/diff_cmd.py, so that none imports another
for these. Only click and the standard library are imported here (``hermetic runs`` lists on them alone).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import click

from hermetic.cli.common import config_option, json_option

F = TypeVar("F", bound=Callable[..., Any])


def runs_options(with_json: bool = True) -> Callable[[F], F]:
    """--runs-dir, -C and (``with_json``) --json, shown in that order."""
    def apply(f: F) -> F:
        f = json_option(f) if with_json else f
        f = config_option(f)
        return click.option("--runs-dir", "runs_dir", metavar="DIR", default=None,
                            help="The runs directory (default: runs_dir from hermetic.yaml, else ./runs).")(f)

    return apply


def runs_location(ctx: click.Context, runs_dir: str | None, config_path: str | None) -> tuple[str | None, str | None]:
    """A subcommand's --runs-dir and -C, else the ``runs`` group's (``hermetic runs -C x show ID``)."""
    parent = ctx.parent.params if ctx.parent else {}
    return runs_dir or parent.get("runs_dir"), config_path or parent.get("config_path")


@contextlib.contextmanager
def reading(*run_dirs: Path) -> Iterator[None]:
    """A record that passed its loader but holds what no hermetic wrote (a wrong type where a formatter or a
    comparison looks, nesting too deep for Python) is damaged data: one line naming its run.json, exit 65."""
    try:
        yield
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError) as e:
        from hermetic.core.errors import DataError
        from hermetic.core.escape import shown

        files = " or ".join(str(d / "run.json") if d.name != "run.json" else str(d) for d in run_dirs)
        why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
        raise DataError(f"{files}: not a record hermetic can read ({shown(why, limit=200)})") from None
