"""The ``hermetic`` command line.

Each command's module is imported only when used. Every HermeticError becomes one line on stderr (escaped:
hermetic.core.escape) and its exit code; there is no traceback for user errors.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from hermetic import __version__
from hermetic.core.display import escape_controls

# name -> "module:attribute"; order is the order of `hermetic --help`.
COMMANDS: dict[str, str] = {
    "config": "hermetic.cli.config_cmd:config",
    "lock": "hermetic.cli.lock_cmd:lock",
    "fetch": "hermetic.cli.fetch_cmd:fetch",
    "base": "hermetic.cli.base_cmd:base",
    "build": "hermetic.cli.build_cmd:build",
    "inspect": "hermetic.cli.build_cmd:inspect_image",
    "export": "hermetic.cli.export_cmd:export",
    "cache": "hermetic.cli.cache_cmd:cache",
    "data": "hermetic.cli.data_cmd:data",
    "run": "hermetic.cli.run_cmd:run",
    "runs": "hermetic.cli.runs_cmd:runs",
    "diff": "hermetic.cli.diff_cmd:diff",
    "replay": "hermetic.cli.run_cmd:replay",
    "logs": "hermetic.cli.logs_cmd:logs",
    "stop": "hermetic.cli.logs_cmd:stop",
    "submit": "hermetic.cli.submit_cmd:submit",
    "slurm-task": "hermetic.cli.submit_cmd:slurm_task",  # hidden: what submit's job scripts run on the nodes
    "slurm-summary": "hermetic.cli.submit_cmd:slurm_summary",  # hidden
    "push": "hermetic.cli.registry_cmd:push",
    "pull": "hermetic.cli.registry_cmd:pull",
    "verify": "hermetic.cli.verify_cmd:verify",
    "init": "hermetic.cli.init_cmd:init",
    "doctor": "hermetic.cli.doctor_cmd:doctor",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, _, attr = COMMANDS[cmd_name].partition(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hermetic")
def cli() -> None:
    """Repeatable ML training runs.

    \b
    hermetic init        an existing project -> hermetic.yaml, pinned base, lock, manifests (start here)
    hermetic lock        requirements.in -> lock with sha256 hashes for the image platform
    hermetic fetch       locked wheels -> verified, content-addressed wheel store
    hermetic build       lock + hermetic.yaml -> byte-reproducible image, by digest
    hermetic run         train inside that image with verified data; write runs/<id>/
    hermetic diff        why two runs differ (or "bitwise identical")
    hermetic replay      re-execute a recorded run exactly, then diff
    hermetic submit      the same run on Slurm (--seeds: a job array; --container pyxis)
    hermetic verify      rebuild a pushed image from its provenance: "reproduced" or why not

    Configuration is read from ./hermetic.yaml (or -C PATH). Caches live under
    $HERMETIC_CACHE (default ~/.cache/hermetic).

    Exit status: 0 success; 1 a verdict that two things differ (diff, replay,
    verify); 64-78 hermetic's own errors (64 usage, 65 bad or changed input,
    66 not found, 69 unavailable, 78 config; README "Exit codes"). `hermetic
    run` returns the training script's own code.
    """


def main(argv: list[str] | None = None) -> None:
    """The console entry point: every way out is one of hermetic.core.errors' exit codes (README: Exit codes)."""
    import os

    from hermetic.core import errors

    # hermetic's schemas take no pydantic plugin (logfire and the like are for a program's own models), and
    # looking for one reads every installed distribution's entry points, at every command.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    fast = argv is None
    try:
        rv: Any = cli.main(args=argv, prog_name="hermetic", standalone_mode=False)
    except errors.HermeticError as e:
        for line in e.details:
            click.echo(f"  {escape_controls(line)}", err=True)
        _print_error(e.message, e.hint)
        _exit(e.exit_code, fast)
    except click.exceptions.Abort:
        click.echo("hermetic: aborted", err=True)
        _exit(errors.EXIT_INTERRUPTED, fast)
    except KeyboardInterrupt:
        click.echo("hermetic: interrupted", err=True)
        _exit(errors.EXIT_INTERRUPTED, fast)
    except click.exceptions.Exit as e:
        _exit(e.exit_code, fast)
    except click.ClickException as e:
        # click's own usage errors exit 2, which a script also returns; ours say EX_USAGE.
        e.show()
        _exit(errors.EXIT_USAGE if isinstance(e, click.UsageError) or e.exit_code == 2 else e.exit_code, fast)
    except BrokenPipeError:
        _exit(errors.EXIT_BROKEN_PIPE, fast)
    except Exception as e:
        # A process or descriptor limit no code path named (``ulimit -n``, threading's "can't start new thread"), or
        # as the last resort, a full disk no writer named (its file, where the OSError knows it); else a bug.
        from hermetic.core.workers import limit_reached

        failure = limit_reached(e, "hermetic") or (errors.disk_full(e) if errors.is_disk_full(e) else None)
        if failure is None:
            _internal_error()
            _exit(errors.EXIT_SOFTWARE, fast)
        message = failure.message
        if isinstance(failure, errors.DiskFull) and not failure.filename:
            message += " (the write that failed named no file)"
        _print_error(message, failure.hint)
        _exit(failure.exit_code, fast)
    _exit(rv if isinstance(rv, int) else 0, fast)


def _internal_error() -> None:
    """A bug: keep the traceback for the report, but exit with a code that says so (not Python's 1)."""
    import traceback

    traceback.print_exc()
    click.echo(f"hermetic: internal error (a bug in hermetic {__version__}; please report it with the "
               "traceback above)", err=True)


def _exit(code: int, fast: bool) -> None:
    """Exit with ``code``; when ``fast`` (the console entry point, no non-daemon thread left), after the atexit
    handlers and a flush but without freeing every module, a sizeable part of a short command."""
    import threading

    if not fast or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                       if t is not threading.main_thread()):
        sys.exit(code)
    import atexit
    import os

    from hermetic.core import errors

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                if code == 0 and stream is sys.stdout:
                    code = errors.EXIT_BROKEN_PIPE  # a closed pipe, as BrokenPipeError above
        os._exit(code)


def _print_error(message: str, hint: str | None) -> None:
    # One line each, whatever the message embeds (a registry's error body, a file name): hermetic/core/display.py.
    click.echo(f"hermetic: error: {escape_controls(message)}", err=True)
    if hint:
        click.echo(f"hermetic: hint: {escape_controls(hint)}", err=True)
