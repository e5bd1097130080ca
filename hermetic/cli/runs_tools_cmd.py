"""``hermetic runs export`` (to MLflow) and ``hermetic runs plot``, and ``hermetic diff --plot``'s figure.

Added to the ``runs`` group by cli/runs_cmd.py; mlflow and matplotlib are imported when an export or a figure
starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hermetic.cli.common import MlflowCommand, emit_json, mlflow_option, reading, runs_location, runs_options
from hermetic.record.locate import resolve_ref, runs_root
from hermetic.core.errors import HermeticError, UsageError
from hermetic.core.escape import shown


def all_exportable(root: Path) -> list[Path]:
    """Every group and every run that is not a member of one (members go with their group), oldest first."""
    from hermetic.record.index import list_entries

    entries = [e for e in list_entries(root) if not e.get("placeholder")]
    groups = {e["id"] for e in entries if e["kind"] == "group"}
    keep = [e for e in entries if e["kind"] == "group" or e.get("group") not in groups]
    return [root / e["id"] for e in reversed(keep)]


@click.command("export", cls=MlflowCommand)
@click.argument("refs", nargs=-1, metavar="[RUN|GROUP]...")
@mlflow_option
@click.option("--experiment", metavar="NAME",
              help="MLflow experiment (default: the project's name from hermetic.yaml, else 'hermetic').")
@runs_options()
@click.pass_context
def export_cmd(ctx: click.Context, refs: tuple[str, ...], mlflow_uri: str | None, experiment: str | None,
               runs_dir: str | None, config_path: str | None, as_json: bool) -> None:
    """Export runs and seed groups to an MLflow tracking server.

    Each run becomes one MLflow run: params (resolved config, script
    arguments, seed), metrics with their steps (the run's metric series:
    metrics.jsonl, TensorBoard, Lightning's CSV, the Trainer's files), tags
    (image ID, manifest and repo digests, lock sha256, git commit and dirty
    flag, hermetic version, status, a replay's verdict), each dataset as an
    MLflow dataset whose digest is its manifest's sha256, and run.json and
    README.md as artifacts. A seed group becomes a parent run with the
    summary (mean, sd, 95% interval) and its members as children. With no
    RUN, every run and group in the runs directory.

    Exporting again updates the same MLflow run (found by the tag
    hermetic.run_id), never a second one. Needs hermetic[mlflow].

    \b
    Examples:
      hermetic runs export --mlflow http://127.0.0.1:5000 20261129-2145
      MLFLOW_TRACKING_URI=http://mlflow:5000 hermetic runs export --mlflow
      hermetic runs export --mlflow=./mlruns --experiment mnist --json
    """
    from hermetic.integrations.mlflow import MlflowExporter, tracking_uri

    if mlflow_uri is None:
        raise UsageError("say where to export: --mlflow [URI] (alone: $MLFLOW_TRACKING_URI)")
    uri = tracking_uri(mlflow_uri or None)
    runs_dir, config_path = runs_location(ctx, runs_dir, config_path)
    paths = ([resolve_ref(r, runs_dir, config_path) for r in refs] if refs
             else all_exportable(runs_root(runs_dir, config_path)))
    exporter = MlflowExporter(uri, experiment=experiment)
    results = []
    for path in paths:
        with reading(path):
            r = exporter.export(path)
        results.append(r)
        if not as_json:
            for x in [r, *r.children]:
                click.echo(shown(f"{x.id}  {'created' if x.created else 'updated'}  mlflow run {x.mlflow_run_id}  "
                                 f"{x.metrics_logged} metric points" + (f"  {x.url}" if x.url else "")))
    if as_json:
        emit_json({"tracking_uri": uri, "exported": [r.to_json() for r in results]})
    elif not results:
        click.echo("no runs to export", err=True)


@click.command("plot")
@click.argument("refs", nargs=-1, required=True, metavar="RUN|GROUP...")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="Where to write it: .png or .svg.")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="Only this metric (repeatable; default: every metric except counters like epoch).")
@runs_options()
@click.pass_context
def plot_cmd(ctx: click.Context, refs: tuple[str, ...], output: str, metrics: tuple[str, ...],
             runs_dir: str | None, config_path: str | None, as_json: bool) -> None:
    """Draw runs' metrics over steps into a PNG or SVG.

    One panel per metric, one curve per run (from the run's metric series:
    metrics.jsonl, TensorBoard event files, Lightning's metrics.csv, the
    Trainer's trainer_state.json; wall-clock figures only when named with
    --metric); a seed group is drawn as the mean over its seeds with the 95%
    interval of the mean as a band. Runs with the same curve are drawn once and labelled
    together, so two bitwise-identical runs show one line; the first step
    where a run's curve parts from the first run's is marked. A run's own
    figure is drawn this way, on demand: its README.md gives the command.
    Needs hermetic[plots].

    \b
    Examples:
      hermetic runs plot 20261129-2145 20261130-09 -o loss.png
      hermetic runs plot GROUP_A GROUP_B --metric val_loss -o seeds.svg
    """
    runs_dir, config_path = runs_location(ctx, runs_dir, config_path)
    paths = [resolve_ref(r, runs_dir, config_path) for r in refs]
    result = write_plot(paths, output, metrics=list(metrics) or None)
    if as_json:
        emit_json(result.to_json())


def plot_or_note(paths: list[Path], output: str) -> dict[str, Any]:
    """``diff --plot``: the figure, or a note on stderr when there is nothing to draw (no metrics in either
    run, a series that cannot be read): the diff's verdict and exit code stand either way. The JSON that
    ``diff --json`` shows under ``plot``: PlotResult's, or ``{"path": None, "note": ...}``."""
    try:
        return write_plot(paths, output).to_json()
    except HermeticError as e:
        click.echo(f"hermetic: note: no plot written: {shown(e.message)}", err=True)
        return {"path": None, "note": e.message}


def write_plot(paths: list[Path], output: str, *, metrics: list[str] | None = None):  # -> PlotResult
    from hermetic.figures.runs import plot

    result = plot(paths, output, metrics=metrics)
    curves = ", ".join(f"{m}: {n}" for m, n in result.to_json()["curves"].items())
    click.echo(shown(f"wrote {result.path} ({curves} curves)"), err=True)
    return result
