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
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


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
