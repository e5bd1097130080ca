"""Options and output helpers shared by the commands: -C, --json, the runs commands' --runs-dir, ``--mlflow
[URI]`` (alone: $MLFLOW_TRACKING_URI; it takes the next word only when that is a URI, so ``hermetic run --mlflow
train.py`` runs train.py), the commands that run a SCRIPT, and the progress bars (rich, on stderr, only on a
terminal; the packages report through callbacks and never draw). Only click, the standard library and
hermetic.core (stdlib only) are imported here: ``hermetic runs`` lists on them alone.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import click

from hermetic.core.errors import DataError, HermeticError
from hermetic.core.escape import shown
from hermetic.core.paths import cache_paths

F = TypeVar("F", bound=Callable[..., Any])


config_option = click.option("-C", "--config", "config_path", metavar="PATH", default=None,
                             help="hermetic.yaml, or the directory holding it (default: ./hermetic.yaml).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts.")


def emit_json(value: Any) -> None:
    sys.stdout.write(shown(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False), "json") + "\n")


def emit(as_json: bool, doc: Any, text: str) -> None:
    """``doc`` as JSON (--json), else ``text``."""
    if as_json:
        emit_json(doc)
    else:
        click.echo(text)


def oci_store():  # -> hermetic.store.oci.OciStore, imported when asked
    from hermetic.store.oci import OciStore

    return OciStore(cache_paths().oci)


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MB' (SI units, as docker and skopeo print sizes)."""
    for i, unit in enumerate(("B", "kB", "MB", "GB")):
        if n < 1000 ** (i + 1) or unit == "GB":
            return f"{n} B" if i == 0 else f"{n / 1000 ** i:.1f} {unit}"


def stderr_console():  # -> rich.console.Console, imported lazily
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def progress_enabled() -> bool:
    return sys.stderr.isatty()


def own_options(args: list[str], command: click.Command) -> list[tuple[int, click.Option, str]]:
    """The command's own options in ``args`` as (index, option, value), up to its first argument (the script).

    Commands that run a script (``run``, ``submit``) take options only before it; everything from the
    script on, and after ``--``, belongs to the script and is never looked at here."""
    by_opt = {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
    found: list[tuple[int, click.Option, str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or not word.startswith("-") or word == "-":
            break
        name, eq, inline = word.partition("=")
        opt = by_opt.get(name)
        if opt is None:
            break  # an unknown option: parse_args says so
        if opt.is_flag or eq:
            found.append((i, opt, inline))
        else:
            found.append((i, opt, args[i + 1] if i + 1 < len(args) else ""))
            i += 1
        i += 1
    return found


class ScriptCommand(click.Command):
    """A command that runs SCRIPT [ARGS...]: unknown options reach the script only after it; a mistyped
    option before it (``--seeed 3``) is a usage error with "Did you mean", and one given twice is refused."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        seen: dict[str, str] = {}
        for _, opt, value in own_options(args, self):
            if opt.multiple or opt.count:
                continue
            if opt.name in seen:
                raise click.UsageError(f"{opt.opts[-1]} given twice ({seen[opt.name] or 'on'} and {value or 'on'}): "
                                       "give it once", ctx=ctx)
            seen[opt.name] = value
        rest = super().parse_args(ctx, args)
        script = ctx.params.get("script")
        if isinstance(script, str) and script.startswith("-") and script != "-":
            possible = [o for p in self.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts]
            raise click.NoSuchOption(script.partition("=")[0], possibilities=possible, ctx=ctx)
        return rest


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
        files = " or ".join(str(d / "run.json") if d.name != "run.json" else str(d) for d in run_dirs)
        why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
        raise DataError(f"{files}: not a record hermetic can read ({shown(why, limit=200)})") from None


OPTION = "--mlflow"
URI_PREFIXES = ("file:", "databricks", "uc:", "sqlite:", "postgresql", "mysql", "mssql")


mlflow_option = click.option(OPTION, "mlflow_uri", metavar="[URI]", default=None, help="Export to this MLflow "
                             "tracking server (alone: $MLFLOW_TRACKING_URI). Needs hermetic[mlflow].")


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


class TransferBars:
    """One bar per transfer (push, pull); safe to advance from worker threads.

    Implements hermetic.registry.progress.TransferProgress.
    """

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), console=stderr_console(), transient=True,
        )
        self._progress.start()
        self._lock = threading.Lock()

    def start(self, description: str, total: int) -> Callable[[int], None]:
        task = self._progress.add_task(description, total=total)

        def advance(n: int) -> None:
            with self._lock:
                self._progress.advance(task, n)

        return advance

    def close(self) -> None:
        self._progress.stop()


def transfer_progress() -> Any:
    """Bars on a terminal, else the registry's silent default."""
    if progress_enabled():
        return TransferBars()
    from hermetic.registry.progress import NoProgress

    return NoProgress()


def download_bars(enabled: bool) -> tuple[Callable[[str, int, int | None], None] | None, Callable[[], None]]:
    """(callback(filename, bytes delta, total), stop) for parallel wheel downloads; (None, no-op) when off."""
    if not enabled:
        return None, lambda: None
    bars = TransferBars()
    advances: dict[str, Callable[[int], None]] = {}

    def cb(filename: str, delta: int, total: int | None) -> None:
        with bars._lock:
            if filename not in advances:
                advances[filename] = bars.start(filename[:48], total)
        advances[filename](delta)

    return cb, bars.close


def with_byte_bar(label: str, total: int, fn: Callable[[Callable[[int], None] | None], Any]) -> Any:
    """Run ``fn(advance)`` under a byte bar of ``total`` (a spinner when the total is unknown)."""
    if not progress_enabled():
        return fn(None)
    if not total:
        with stderr_console().status(label + " ..."):
            return fn(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  console=stderr_console(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        return fn(lambda n: progress.advance(task, n))
