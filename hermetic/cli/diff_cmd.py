"""``hermetic diff RUN_A RUN_B``: why two runs (or two seed groups) differ, or "bitwise identical"."""

from __future__ import annotations

import click

from hermetic.cli.common import emit_json, reading, runs_options
from hermetic.cli.runs_tools_cmd import plot_or_note
from hermetic.record.locate import resolve_ref


@click.command()
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-5, show_default=True,
              help="Relative tolerance for 'metric within tolerance' (as numpy.isclose).")
@click.option("--atol", type=click.FloatRange(min=0), default=1e-8, show_default=True,
              help="Absolute tolerance for 'metric within tolerance' (as numpy.isclose).")
@click.option("--plot", "plot_file", metavar="FILE", default=None,
              help="Also draw both runs' metrics over steps into FILE (.png or .svg; needs hermetic[plots]).")
@runs_options()
def diff(run_a: str, run_b: str, rtol: float, atol: float, plot_file: str | None, runs_dir: str | None,
         config_path: str | None, as_json: bool) -> int:
    """Explain why two runs differ, most likely cause first.

    RUN_A and RUN_B are run directories, run IDs or unique ID prefixes. The
    records are compared in causal order: image and packages, code, config
    and arguments, data (per file, from the manifest copies), seed,
    environment variables, then the machine (software, driver and GPU, CPU
    and BLAS), then the outputs: each file bitwise, each final metric equal,
    within tolerance (|a-b| <= atol + rtol*|b|) or different.

    \b
    The first line is the verdict:
      bitwise identical
      same inputs, outputs differ: nondeterminism (knobs not set: ...)
      same inputs on different hardware, outputs differ: ...
      inputs differ: <most likely cause>; then ...

    Two seed groups (directories with group.json, from `hermetic run
    --seeds`) are compared metric by metric with Welch's t-test: is the
    difference of means within seed noise?

    Exit status: 0 bitwise identical (groups: every metric within seed
    noise), 1 different (or, for groups, cannot judge), 66 nothing was
    compared or no such run, 65 a record was edited after it was written,
    64 a run compared with a group (README, "Exit codes"). --plot never
    changes it: with nothing to draw, a note says so.

    \b
    Examples:
      hermetic diff runs/20261129-214500-1a2b3c runs/20261130-090000-4d5e6f
      hermetic diff 20261129-2145 20261130-09 --json | jq .verdict
      hermetic diff GROUP_A GROUP_B
      hermetic diff RUN_A RUN_B --plot curves.png   # each metric over steps, where they part marked
    """
    from hermetic.diff import diff_paths
    from hermetic.diff.render import render

    if plot_file is not None:  # a bad suffix or a missing matplotlib, refused before any work
        from hermetic.figures import render

        render.figure_format(plot_file)
        render.require("--plot")
    dir_a = resolve_ref(run_a, runs_dir, config_path)
    dir_b = resolve_ref(run_b, runs_dir, config_path)
    with reading(dir_a, dir_b):
        result = diff_paths(dir_a, dir_b, rtol=rtol, atol=atol)
        text = None if as_json else render(result)
    if not as_json:
        click.echo(text)
    plot = plot_or_note([dir_a, dir_b], plot_file) if plot_file else None
    if as_json:
        emit_json({**result.to_json(), **({"plot": plot} if plot is not None else {})})
    return result.verdict.exit_code  # the verdict's, whatever the figure: it is an extra
