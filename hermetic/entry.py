"""The `hermetic` console script.

`hermetic run` has its record worker (hermetic.record.worker) forked here, before the CLI's own imports
(click and every command: ~30 ms): the worker's import of the record schema is then done sooner, less of it
beside the engine's start of the run's container. Every other command, and a run that only prints its help
or detaches, goes straight to hermetic.cli (a run forks its worker there when none waits).
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["run"] and not {"--help", "-h", "--detach"} & set(args):
        # what hermetic.cli.main sets, set before the fork: the worker imports pydantic
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
        from hermetic.record.worker import warm_up

        warm_up()
    from hermetic.cli import main as cli_main

    cli_main()
