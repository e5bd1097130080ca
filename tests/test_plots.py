"""Pictures of runs (issues 18, 39): `hermetic diff --plot`, `hermetic runs plot`, and a run's own figure,
drawn on demand by the command its README gives. Every figure is read back: its size, that it is not blank,
which colours it holds."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_clean_error, run_cli
from metric_runs import loss_curve, make_group, make_run
from run_support import hermetic_run, run_dir_of

from hermetic.figures.render import PALETTE

A, B, C = "20261129-214500-aaaaaa", "20261129-214600-bbbbbb", "20261129-214700-cccccc"
BLUE, RED = PALETTE[0], PALETTE[1]  # the first run's colour, the second's


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), dtype=np.int16)


def pixels_near(img: Image.Image, colour: str, tol: int = 40) -> int:
    """How many pixels are within ``tol`` (per channel) of ``colour``."""
    return int((np.abs(pixels(img) - np.array(rgb(colour))) <= tol).all(axis=2).sum())


def non_white(img: Image.Image) -> float:
    """The share of pixels that are not white."""
    return float((pixels(img) != 255).any(axis=2).mean())


def parting(step: int) -> float:
    """loss_curve until step 20, then a little higher: logged at steps 10, 20, ..., parts at step 200."""
    return loss_curve(step) + (0.05 if step >= 20 else 0.0)


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    make_run(root, A)
    make_run(root, B, minutes=1)  # the same curves as A
    make_run(root, C, parting, minutes=2)
    return root


def diff_plot(root: Path, a: str, b: str, out: Path) -> tuple[int, dict]:
    proc = run_cli("diff", str(root / a), str(root / b), "--plot", str(out), "--json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_two_identical_runs_draw_one_curve_and_two_that_part_draw_two_with_the_step_marked(runs, tmp_path):
    _, same = diff_plot(runs, A, B, tmp_path / "same.png")
    assert same["plot"]["curves"] == {"acc": 1, "loss": 1, "val.loss": 1}  # epoch: a counter, left out
    assert same["plot"]["shared"]["loss"] == [[A, B]] and same["plot"]["first_difference"] == {}
    img = Image.open(tmp_path / "same.png")
    assert img.format == "PNG" and img.size == (1120, 690)  # 2 columns x 2 rows of panels at 100 dpi
    assert non_white(img) > 0.02
    assert pixels_near(img, BLUE) > 500 and pixels_near(img, RED) == 0  # B's colour drawn nowhere

    _, parted = diff_plot(runs, A, C, tmp_path / "differ.png")
    assert parted["plot"]["curves"] == {"acc": 2, "loss": 2, "val.loss": 2}
    assert parted["plot"]["first_difference"] == {"acc": {C: 200}, "loss": {C: 200}, "val.loss": {C: 200}}
    img = Image.open(tmp_path / "differ.png")
    assert img.size == (1120, 690) and pixels_near(img, BLUE) > 500 and pixels_near(img, RED) > 500


def test_runs_plot_svg_metric_choice_and_the_same_bytes_twice(runs, tmp_path):
    out = tmp_path / "loss.svg"
    proc = run_cli("runs", "--runs-dir", str(runs), "plot", A, C, "--metric", "loss", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["format"] == "svg" and res["metrics"] == ["loss"] and res["curves"] == {"loss": 2}
    root = ET.fromstring(out.read_bytes())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    styles = " ".join(el.get("style", "") for el in root.iter())
    assert f"stroke: {BLUE}" in styles and f"stroke: {RED}" in styles
    first = out.read_bytes()
    assert run_cli("runs", "--runs-dir", str(runs), "plot", A, C, "--metric", "loss", "-o", str(out)).returncode == 0
    assert out.read_bytes() == first  # no date, fixed ids
    pngs = [tmp_path / "loss1.png", tmp_path / "loss2.png"]
    for png in pngs:
        assert run_cli("runs", "--runs-dir", str(runs), "plot", A, C, "--metric", "loss", "-o", str(png)).returncode == 0
    assert pngs[0].read_bytes() == pngs[1].read_bytes()
    assert Image.open(pngs[0]).size == (560, 370)  # one panel


def test_a_seed_group_is_its_mean_with_the_95_percent_band(tmp_path):
    from hermetic.core.stats import summarize
    from hermetic.figures.runs import group_curve, load_entry

    root = tmp_path / "runs"
    gid = "20261129-230000-9a9a9a-seeds"
    gdir = make_group(root, gid, [lambda s, k=k: loss_curve(s) * (1 + 0.2 * k) for k in range(4)], prefix="20261129-2201")
    entry = load_entry(gdir)
    steps, mean, lo, hi = group_curve(entry.members, "loss")
    assert steps == [10 * s for s in range(1, 31)]
    at = summarize([loss_curve(3) * (1 + 0.2 * k) for k in range(4)])  # step 30, as group.json would
    assert mean[2] == pytest.approx(at["mean"]) and [lo[2], hi[2]] == pytest.approx(at["ci95"])
    # the last step's band is group.json's interval for the final value
    final = json.loads((gdir / "group.json").read_text())["metrics"]["loss"]
    assert [lo[-1], hi[-1]] == pytest.approx(final["ci95"])

    out = tmp_path / "group.png"
    proc = run_cli("runs", "plot", str(gdir), "-o", str(out), "--metric", "loss", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["curves"] == {"loss": 1}
    img = Image.open(out)
    band = "#d2e3f0"  # the blue at alpha 0.2 over white
    assert pixels_near(img, BLUE) > 200 and pixels_near(img, band, tol=12) > 500


def test_bad_output_unknown_metric_and_no_matplotlib(runs, tmp_path):
    proc = run_cli("runs", "--runs-dir", str(runs), "plot", A, "-o", str(tmp_path / "x.jpg"))
    assert_clean_error(proc, 64, "x.jpg", ".png or .svg")
    proc = run_cli("diff", str(runs / A), str(runs / B), "--plot", str(tmp_path / "x.pdf"))
    assert_clean_error(proc, 64, ".png or .svg")
    proc = run_cli("runs", "--runs-dir", str(runs), "plot", A, "--metric", "nope", "-o", str(tmp_path / "x.png"))
    assert_clean_error(proc, 64, "nope", "acc, epoch, loss, val.loss")
    assert not (tmp_path / "x.png").exists()
    blocked = ("import sys; sys.modules['matplotlib'] = None; from hermetic.cli import main; "
               f"main(['diff', {str(runs / A)!r}, {str(runs / B)!r}, '--plot', {str(tmp_path / 'y.png')!r}])")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert_clean_error(proc, 69, "pip install 'hermetic[plots]'")


def readme_command(run_dir: Path) -> list[str] | None:
    """The command a run's README gives for drawing its figure (the indented line under the status), or
    None when it gives none."""
    lines = (run_dir / "README.md").read_text().splitlines()
    found = [line for line in lines if line.strip().startswith("hermetic runs plot ")]
    if not found:
        return None
    assert lines.index(found[0]) <= 8  # right under the status line
    return shlex.split(found[0])


def test_a_finished_runs_readme_says_how_to_draw_its_figure_and_that_command_draws_it(runs, tmp_path):
    """No run draws a figure; its README gives the command that does, run from the project directory."""
    assert not (runs / A / "metrics.png").exists()
    command = readme_command(runs / A)
    assert command == ["hermetic", "runs", "plot", A, "-o", f"runs/{A}/metrics.png"]
    proc = run_cli(*command[1:], cwd=tmp_path)  # the project directory: runs/ is here
    assert proc.returncode == 0, proc.stderr
    img = Image.open(runs / A / "metrics.png")
    img.load()
    assert img.format == "PNG" and img.size == (1120, 690)  # loss, acc, val.loss: 2x2 panels (epoch left out)
    assert non_white(img) > 0.02 and pixels_near(img, BLUE) > 500 and pixels_near(img, RED) == 0


def test_an_early_record_and_a_run_without_metrics_give_no_figure_command(tmp_path):
    from hermetic.record import begin_record, write_record
    from hermetic.record.rundir import create_run_dir
    from synthetic_records import synthetic_record

    rid = "20261129-235900-0f0f0f"
    full = synthetic_record(rid)
    rec = begin_record(rid, argv=["hermetic", "run", "train.py"], script="train.py", args=[],
                       config=full["invocation"]["config"], config_sha256=full["invocation"]["config_sha256"])
    for key in ("image", "code", "data", "seed", "env", "software", "hardware"):
        rec[key] = full[key]
    run_dir = create_run_dir(tmp_path / "runs", rid)
    (run_dir / "outputs" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    write_record(run_dir, rec)  # the run is still going
    assert readme_command(run_dir) is None
    plain = synthetic_record("20261129-235800-0e0e0e")
    plain["metrics"] = {"final": {}, "steps": None, "file": None}
    plain_dir = create_run_dir(tmp_path / "runs", "20261129-235800-0e0e0e")
    write_record(plain_dir, plain)
    assert readme_command(plain_dir) is None
    assert sorted(p.name for p in (tmp_path / "runs").glob("*/metrics.png")) == []


def test_a_record_is_written_without_the_plots_extra(runs):
    """The record, its README and its figure's command never import matplotlib (nor Pillow): without
    hermetic[plots] a run's record is written all the same, and the README still says how to draw it."""
    script = ("import sys; sys.modules['matplotlib'] = sys.modules['PIL'] = None\n"
              "from pathlib import Path\nfrom hermetic.record import write_record, load_record\n"
              f"d = Path({str(runs / C)!r}); (d / 'README.md').unlink()\n"
              "write_record(d, load_record(d))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert readme_command(runs / C) == ["hermetic", "runs", "plot", C, "-o", f"runs/{C}/metrics.png"]
    assert not (runs / C / "metrics.png").exists()


def test_a_runs_process_imports_no_figure_and_no_other_client_before_its_container():
    """The run's own modules, its config's loader among them, leave every figure (matplotlib: on demand),
    docker-py and requests out (docs/benchmarks.md, "Run overhead")."""
    code = ("import sys, hermetic.cli, hermetic.cli.run_cmd, hermetic.run.runner, hermetic.engines.docker, "
            "hermetic.config.load; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'matplotlib', 'PIL', 'docker', 'requests'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.docker
def test_two_real_runs_of_the_example_draw_one_curve_each(project, tmp_path):
    _, a = hermetic_run(project, "train.py", "--epochs", "3")
    _, b = hermetic_run(project, "train.py", "--epochs", "3")
    da, db = run_dir_of(project, a), run_dir_of(project, b)
    for rd in (da, db):  # no figure drawn by the run; its README's command draws it
        assert not (rd / "metrics.png").exists()
        command = readme_command(rd)
        assert command == ["hermetic", "runs", "plot", rd.name, "-o", f"runs/{rd.name}/metrics.png"]
        proc = run_cli(*command[1:], cwd=project)
        assert proc.returncode == 0, proc.stderr
        drawn = Image.open(rd / "metrics.png")
        assert drawn.size == (1120, 690) and pixels_near(drawn, BLUE) > 200  # four metrics: 2x2 panels
    code, out = diff_plot(project / "runs", da.name, db.name, tmp_path / "real.png")
    assert code == 0 and out["verdict"]["kind"] == "identical"
    assert set(out["plot"]["curves"].values()) == {1}
    assert set(out["plot"]["metrics"]) == {"test_acc", "test_loss", "train_acc", "train_loss"}
    img = Image.open(tmp_path / "real.png")
    assert non_white(img) > 0.02 and pixels_near(img, BLUE) > 200 and pixels_near(img, RED) == 0


def test_what_only_a_runs_end_needs_is_not_imported_before_its_container():
    """hermetic.record's building, a resumed run's, the snapshot's tar writer, what only a real build uses,
    the lock's CUDA reading, the collection: imported beside the container's start or as the script runs
    (docs/benchmarks.md). (The config's schema and the lock's model are read before: the build's no-op
    check needs both.)"""
    code = ("import sys, hermetic.cli, hermetic.cli.run_cmd, hermetic.run.runner, hermetic.engines.docker, "
            "hermetic.config.load, hermetic.run.snapshot, hermetic.builder.build; "
            "print(sorted(set(sys.modules) & {'hermetic.record.build', 'hermetic.record.group', "
            "'hermetic.run.resume', 'hermetic.builder.tarlayer', 'hermetic.builder.layers', "
            "'hermetic.builder.install', 'hermetic.gpu.cuda', 'hermetic.run.collect', 'hermetic.hostfs.safetree'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
