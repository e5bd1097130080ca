"""The ``hermetic`` command line.

Each command lives in its own module and is imported only when used, so that
fast paths (``hermetic runs``, a no-op ``hermetic build``) do not pay for
Docker or pydantic imports they never touch. Every HermeticError becomes one
line on stderr and its exit code; there is no traceback for user errors.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from hermetic import __version__

# name -> "module:attribute"; order is the order of `hermetic --help`.
COMMANDS: dict[str, str] = {
    "config": "hermetic.cli.config_cmd:config",
    "lock": "hermetic.cli.lock_cmd:lock",
    "fetch": "hermetic.cli.fetch_cmd:fetch",
    "base": "hermetic.cli.base_cmd:base",
    "build": "hermetic.cli.build_cmd:build",
    "inspect": "hermetic.cli.build_cmd:inspect_image",
    "cache": "hermetic.cli.cache_cmd:cache",
    "data": "hermetic.cli.data_cmd:data",
    "run": "hermetic.cli.run_cmd:run",
    "runs": "hermetic.cli.runs_cmd:runs",
    "diff": "hermetic.cli.diff_cmd:diff",
    "replay": "hermetic.cli.run_cmd:replay",
    "logs": "hermetic.cli.logs_cmd:logs",
    "stop": "hermetic.cli.logs_cmd:stop",
    "push": "hermetic.cli.registry_cmd:push",
    "pull": "hermetic.cli.registry_cmd:pull",
    "verify": "hermetic.cli.verify_cmd:verify",
    "init": "hermetic.cli.init_cmd:init",
    "doctor": "hermetic.cli.doctor_cmd:doctor",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _module_exists(COMMANDS[name])]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None or not _module_exists(target):
            return None
        module_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(module_name), attr)


def _module_exists(target: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(target.partition(":")[0]) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hermetic")
def cli() -> None:
    """Repeatable ML training runs.

    \b
    hermetic lock        requirements.in -> lock with sha256 hashes for the image platform
    hermetic fetch       locked wheels -> verified, content-addressed wheel store
    hermetic build       lock + hermetic.yaml -> byte-reproducible image, by digest
    hermetic run         train inside that image with verified data; write runs/<id>/
    hermetic diff        why two runs differ (or "bitwise identical")
    hermetic replay      re-execute a recorded run exactly, then diff
    hermetic verify      rebuild a pushed image from its provenance: "reproduced" or why not

    Configuration is read from ./hermetic.yaml (or -C PATH). Caches live under
    $HERMETIC_CACHE (default ~/.cache/hermetic).
    """


def main(argv: list[str] | None = None) -> None:
    from hermetic.errors import HermeticError

    try:
        rv: Any = cli.main(args=argv, prog_name="hermetic", standalone_mode=False)
    except HermeticError as e:
        for line in e.details:
            click.echo(f"  {line}", err=True)
        _print_error(e.message, e.hint)
        _exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("hermetic: aborted", err=True)
        _exit(130)
    except KeyboardInterrupt:
        click.echo("hermetic: interrupted", err=True)
        _exit(130)
    except click.exceptions.Exit as e:
        _exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        _exit(e.exit_code)
    except BrokenPipeError:
        _exit(141)
    _exit(rv if isinstance(rv, int) else 0)


def _exit(code: int) -> None:
    """Exit with ``code`` without tearing the interpreter down.

    Freeing every module and object of a run (pydantic's schemas, docker-py,
    matplotlib) takes 0.1-0.15 s on two cores, after all output is written:
    the atexit handlers run and stdout/stderr are flushed, then the process
    ends. With a non-daemon thread still alive, the normal exit joins it.
    """
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    import atexit
    import os

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                if code == 0:
                    code = 141 if stream is sys.stdout else code  # a closed pipe, as BrokenPipeError below
        os._exit(code)


def _print_error(message: str, hint: str | None) -> None:
    click.echo(f"hermetic: error: {message}", err=True)
    if hint:
        click.echo(f"hermetic: hint: {hint}", err=True)
