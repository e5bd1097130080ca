"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def config_option(f: F) -> F:
    return click.option(
        "-C", "--config", "config_path", metavar="PATH", default=None,
        help="hermetic.yaml, or the directory holding it (default: ./hermetic.yaml).",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts.")(f)


def emit_json(value: Any) -> None:
    from hermetic.core.escape import shown

    sys.stdout.write(shown(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False), "json") + "\n")


def emit(as_json: bool, doc: Any, text: str) -> None:
    """``doc`` as JSON (--json), else ``text``."""
    if as_json:
        emit_json(doc)
    else:
        click.echo(text)


def oci_store():  # -> hermetic.store.oci.OciStore, imported when asked
    from hermetic.core.paths import cache_paths
    from hermetic.store.oci import OciStore

    return OciStore(cache_paths().oci)


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MB' (SI units, as docker and skopeo print sizes)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


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
