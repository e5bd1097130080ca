"""Pictures of runs (issue 18): `hermetic diff --plot`, `hermetic runs plot`, and the figure in a run's
README. Every figure is read back: its size, that it is not blank, which colours it holds."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_clean_error, run_cli
from metric_runs import loss_curve, make_group, make_run
from run_support import hermetic_run, run_dir_of

from hermetic.plotting import PALETTE

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
    from hermetic.stats import summarize
    from hermetic.integrations.plots import group_curve, load_entry

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


def test_the_runs_own_figure_draws_at_the_plots_resolution_with_nice_ticks():
    """hermetic.rasterplot (the README's figure, Pillow) keeps plotting's DPI, and its ticks are matplotlib's
    kind: 1, 2, 2.5 or 5 times a power of ten, labelled with as few decimals as tell them apart."""
    from hermetic import plotting, rasterplot

    assert rasterplot.PT == plotting.DPI / 72
    assert rasterplot.nice_ticks(2, 838, 9) == [100, 200, 300, 400, 500, 600, 700, 800]
    assert rasterplot.tick_labels(rasterplot.nice_ticks(0.8197, 0.8323, 8)) == [
        "0.820", "0.822", "0.824", "0.826", "0.828", "0.830", "0.832"]
    assert rasterplot.tick_labels([0.0, 0.25, 0.5]) == ["0.00", "0.25", "0.50"]
    assert rasterplot.tick_labels([-0.0, 1.0]) == ["0", "1"] and rasterplot.nice_ticks(3.0, 3.0) == [3.0]
    assert rasterplot.tick_labels([0.0, 2e6, 4e6]) == ["0", "2e+06", "4e+06"]


def test_the_runs_own_figure_is_a_png_whose_pixels_are_the_drawn_ones():
    """rasterplot writes its PNG itself (rows unfiltered, one IDAT; Pillow's encoder tries five filters per
    row): a decoder reads back exactly the drawn pixels, and the same image gives the same bytes."""
    import zlib

    from hermetic import rasterplot

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8), "RGB")  # odd sizes, any bytes
    data = rasterplot._png(img)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data == rasterplot._png(img)
    back = Image.open(io.BytesIO(data))
    back.load()  # a chunk's CRC or the deflate stream wrong: Pillow refuses here
    assert back.format == "PNG" and back.mode == "RGB" and back.size == (53, 37)
    assert back.tobytes() == img.tobytes()
    with pytest.raises(ValueError, match="RGBA"):
        rasterplot._png(img.convert("RGBA"))  # not written wrong: refused (the figure's drawing then has none)
    # IHDR: 8-bit truecolour, no interlace; every row's filter byte is 0
    assert data[12:16] == b"IHDR" and data[24:29] == bytes([8, 2, 0, 0, 0])
    idat = data.index(b"IDAT")
    rows = zlib.decompress(data[idat + 4: idat + 4 + int.from_bytes(data[idat - 4:idat], "big")])
    assert len(rows) == 37 * (1 + 53 * 3) and all(rows[r * (1 + 53 * 3)] == 0 for r in range(37))


def test_the_workers_rehearsal_draws_a_figure_the_size_of_a_runs_usual_one(runs):
    """The record worker rehearses the drawing while the script runs, so that the final figure finds its
    memory touched already: that only helps when the rehearsal is the size of a real run's figure (four
    metrics: 2x2 panels, as make_run's)."""
    from hermetic import rasterplot

    rehearsed = Image.open(io.BytesIO(rasterplot.rehearse()))
    drawn = Image.open(runs / A / "metrics.png")
    assert rehearsed.size == drawn.size == (1120, 690) and non_white(rehearsed) > 0.02


def test_a_finished_runs_readme_shows_its_metrics_figure(runs, tmp_path):
    from hermetic.record import begin_record, write_record
    from hermetic.record.rundir import create_run_dir
    from hermetic.record.synthetic import synthetic_record

    readme = (runs / A / "README.md").read_text()
    assert "![The run's metrics over steps](metrics.png)" in readme.splitlines()[4]  # under the status line
    img = Image.open(runs / A / "metrics.png")
    assert img.size == (1120, 690) and non_white(img) > 0.02 and pixels_near(img, BLUE) > 500

    # an early record (the run is still going) and a run without metrics: no figure, no link
    rid = "20261129-235900-0f0f0f"
    full = synthetic_record(rid)
    rec = begin_record(rid, argv=["hermetic", "run", "train.py"], script="train.py", args=[],
                       config=full["invocation"]["config"], config_sha256=full["invocation"]["config_sha256"])
    for key in ("image", "code", "data", "seed", "env", "software", "hardware"):
        rec[key] = full[key]
    run_dir = create_run_dir(tmp_path / "more", rid)
    (run_dir / "outputs" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    write_record(run_dir, rec)
    assert not (run_dir / "metrics.png").exists() and "metrics.png" not in (run_dir / "README.md").read_text()
    plain = synthetic_record("20261129-235800-0e0e0e")
    plain["metrics"] = {"final": {}, "steps": None, "file": None}
    plain_dir = create_run_dir(tmp_path / "more", "20261129-235800-0e0e0e")
    write_record(plain_dir, plain)
    assert not (plain_dir / "metrics.png").exists()

    # without Pillow (hermetic[plots]) the record and README are written all the same, without the figure
    script = ("import sys, json; sys.modules['PIL'] = None\n"
              "from pathlib import Path\nfrom hermetic.record import write_record, load_record\n"
              f"d = Path({str(runs / C)!r}); (d / 'metrics.png').unlink()\n"
              "write_record(d, load_record(d))\n")
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    assert not (runs / C / "metrics.png").exists() and "metrics.png" not in (runs / C / "README.md").read_text()


def test_the_figure_is_drawn_from_the_collected_series_without_reading_it_back(tmp_path):
    """metrics.jsonl is parsed once, by the collection; the final record's figure takes the series the
    collection wrote (Collected.series, write_record's ``series``): the same picture as from the file."""
    import os
    from datetime import timedelta

    from hermetic.record import finish_record, write_record
    from hermetic.record.metrics import SERIES_FILE
    from hermetic.record.rundir import create_run_dir
    from hermetic.record.synthetic import T0, synthetic_record
    from hermetic.run.collect import CollectPlan, collect_run

    rid = "20261129-235700-0d0d0d"
    run_dir = create_run_dir(tmp_path / "runs", rid)
    with open(run_dir / "outputs" / "metrics.jsonl", "w") as f:
        for s in range(1, 31):
            f.write(json.dumps({"step": s, "loss": loss_curve(s), "epoch": s // 10}) + "\n")
    collected = collect_run(CollectPlan(str(run_dir), None, None), uid=os.getuid(), gid=os.getgid())
    assert [e["name"] for e in collected.series] == ["epoch", "loss"]
    done = finish_record(synthetic_record(rid), run_dir, status="succeeded", exit_code=0,
                         finished_at=T0 + timedelta(minutes=3), outputs=collected.outputs,
                         metrics=collected.metrics, notes=collected.notes)
    write_record(run_dir, done)  # from the file, read back and checked against the record
    from_file = (run_dir / "metrics.png").read_bytes()
    (run_dir / "metrics.png").unlink()
    (run_dir / SERIES_FILE).unlink()  # not read when the series is passed along
    write_record(run_dir, done, series=collected.series)
    assert (run_dir / "metrics.png").read_bytes() == from_file


def reaped(pid: int) -> None:
    """Worker ``pid`` said it had drawn, then exits: it is reaped once it has (not waited for; a seed group's
    next run's warm_up looks again), so it ends and is left no zombie."""
    from hermetic.record import worker as workers

    for _ in range(500):
        workers.warm_up()  # what a seed group's next run does first (it may fork that run's worker)
        if pid not in workers._exiting:
            break
        time.sleep(0.01)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # it ended, and was reaped


def test_the_record_worker_draws_the_same_picture_and_a_dead_one_is_replaced(tmp_path):
    """`hermetic run` forks the record worker at its start (record.worker.warm_up): it imports Pillow (and the
    record schema) while the run goes on, checks the run's records and draws when sent the final one. Its
    picture is the inline one's; a worker that died meanwhile is replaced by one forked then, and the
    figure still exists when the record does; a waiting worker draws the final record written."""
    import os
    import signal
    from datetime import timedelta

    from hermetic.record import figure, finish_record, worker as workers, write_record
    from hermetic.record.errors import RecordError
    from hermetic.record.rundir import create_run_dir
    from hermetic.record.synthetic import T0, synthetic_record
    from hermetic.run.collect import CollectPlan, collect_run

    rid = "20261129-235600-0c0c0c"
    run_dir = create_run_dir(tmp_path / "runs", rid)
    with open(run_dir / "outputs" / "metrics.jsonl", "w") as f:
        for s in range(1, 31):
            f.write(json.dumps({"step": s, "loss": loss_curve(s)}) + "\n")
    collected = collect_run(CollectPlan(str(run_dir), None, None), uid=os.getuid(), gid=os.getgid())
    done = finish_record(synthetic_record(rid), run_dir, status="succeeded", exit_code=0,
                         finished_at=T0 + timedelta(minutes=3), outputs=collected.outputs,
                         metrics=collected.metrics, notes=collected.notes)
    write_record(run_dir, done, series=collected.series)  # drawn in this process
    inline = (run_dir / "metrics.png").read_bytes()
    for kill in (False, True):
        (run_dir / "metrics.png").unlink()
        workers.warm_up()
        worker = workers.current()
        assert worker is not None and worker.parent == os.getpid()
        if kill:
            os.kill(worker.pid, signal.SIGKILL)
            os.waitpid(worker.pid, 0)
        drawing = figure.start_metrics_figure(run_dir, done, series=collected.series)
        assert drawing is not None and (drawing.pid != worker.pid) == kill
        assert workers.current() is None  # taken: the next run gets a worker of its own
        write_record(run_dir, done, series=collected.series, figure=drawing)
        assert (run_dir / "metrics.png").read_bytes() == inline, kill
    (run_dir / "metrics.png").unlink()
    workers.warm_up()
    pid = workers.current().pid
    write_record(run_dir, done, series=collected.series)  # checked, then drawn, by the waiting worker
    assert workers.current() is None and (run_dir / "metrics.png").read_bytes() == inline
    reaped(pid)
    # asked to check and draw in one exchange, a worker that finds the final record invalid draws nothing
    # and keeps waiting; the record is not written
    (run_dir / "metrics.png").unlink()
    bad = json.loads(json.dumps(done))
    bad["seed"]["value"] = "forty-two"
    workers.warm_up()
    pid = workers.current().pid
    try:
        with pytest.raises(RecordError, match="seed"):
            write_record(run_dir, bad, series=collected.series)
        waiting = workers.current()
        assert not (run_dir / "metrics.png").exists() and waiting is not None and waiting.pid == pid
        write_record(run_dir, done, series=collected.series)
        assert workers.current() is None and (run_dir / "metrics.png").read_bytes() == inline
        reaped(pid)  # the worker drew it
        # a worker that died before the final record: checked and drawn here, the dead one reaped
        (run_dir / "metrics.png").unlink()
        workers.warm_up()
        dead = workers.current().pid
        os.kill(dead, signal.SIGKILL)
        write_record(run_dir, done, series=collected.series)
        assert workers.current() is None and (run_dir / "metrics.png").read_bytes() == inline
        with pytest.raises(ChildProcessError):
            os.waitpid(dead, os.WNOHANG)
    finally:
        gone = workers.take()
        if gone is not None:
            gone.close()
            os.waitpid(gone.pid, 0)


def test_a_wait_for_the_workers_verdict_interrupted_leaves_no_answer_for_the_next_record(tmp_path, monkeypatch):
    """Ctrl-C while the run waits for the worker's verdict on a record: the worker is let go, so that its
    late answer ("valid", for that record) is never read as the verdict on the next one (the sealing of the
    interrupted run's record, say), which is then checked by a worker of its own or inline."""
    import os

    from hermetic.record import worker as workers
    from hermetic.record.errors import RecordError
    from hermetic.record.synthetic import synthetic_record

    rid = "20261129-235800-0e0e0e"
    good = synthetic_record(rid)
    bad = json.loads(json.dumps(good))
    bad["seed"]["value"] = "forty-two"
    workers.warm_up()
    worker = workers.current()
    real_read = workers._read_message
    monkeypatch.setattr(workers, "_read_message", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        workers.validate_record(good, source="run.json", sealed=False)
    monkeypatch.setattr(workers, "_read_message", real_read)
    with pytest.raises(RecordError, match="seed"):  # not the stale "valid" of the interrupted request
        workers.validate_record(bad, source="run.json", sealed=False)
    assert workers.current() is None or workers.current().pid != worker.pid
    try:
        os.waitpid(worker.pid, 0)  # it ended at the end of its request pipe, and is reaped here or was
    except ChildProcessError:
        pass


def test_the_record_worker_gives_the_schemas_verdicts_and_its_absence_changes_nothing(tmp_path):
    """What the worker says of a record is what hermetic.record.schema says in this process: valid, or the same
    RecordError message; killed, the caller validates itself."""
    import os
    import signal

    from hermetic.record import worker as workers
    from hermetic.record.schema import RecordError, validate_record
    from hermetic.record.synthetic import synthetic_record

    good = synthetic_record("20261129-235500-0b0b0b")
    bad = json.loads(json.dumps(good))
    bad["seed"]["value"] = "forty-two"
    with pytest.raises(RecordError) as here:
        validate_record(bad, source="x/run.json", sealed=False)
    workers.warm_up()
    try:
        w = workers.current()
        assert w.validate(good, source="x/run.json", sealed=False) is None
        assert w.validate(bad, source="x/run.json", sealed=False) == here.value.message
        with pytest.raises(RecordError, match=re.escape(here.value.message)):
            workers.validate_record(bad, source="x/run.json", sealed=False)
        os.kill(w.pid, signal.SIGKILL)
        os.waitpid(w.pid, 0)
        with pytest.raises(RecordError, match=re.escape(here.value.message)):
            workers.validate_record(bad, source="x/run.json", sealed=False)  # validated here instead
        assert workers.current() is None  # the dead one let go
        workers.validate_record(good, source="x/run.json", sealed=False)
    finally:
        gone = workers.take()
        if gone is not None:
            gone.close()
            os.waitpid(gone.pid, 0)


def test_a_runs_process_imports_no_pydantic_nor_pillow_before_its_container():
    """What the record worker and the kept config are for (docs/benchmarks.md, "Run overhead")."""
    code = ("import sys, hermetic.cli, hermetic.cli.run_cmd, hermetic.run.runner, hermetic.engines.docker, "
            "hermetic.configview, hermetic.record.worker, hermetic.record.figure; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'PIL', 'yaml', 'docker', 'requests'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.docker
def test_two_real_runs_of_the_example_draw_one_curve_each(project, tmp_path):
    _, a = hermetic_run(project, "train.py", "--epochs", "3")
    _, b = hermetic_run(project, "train.py", "--epochs", "3")
    da, db = run_dir_of(project, a), run_dir_of(project, b)
    for rd in (da, db):
        assert "![The run's metrics over steps](metrics.png)" in (rd / "README.md").read_text()
        assert Image.open(rd / "metrics.png").size[0] > 0
    code, out = diff_plot(project / "runs", da.name, db.name, tmp_path / "real.png")
    assert code == 0 and out["verdict"]["kind"] == "identical"
    assert set(out["plot"]["curves"].values()) == {1}
    assert set(out["plot"]["metrics"]) == {"test_acc", "test_loss", "train_acc", "train_loss"}
    img = Image.open(tmp_path / "real.png")
    assert non_white(img) > 0.02 and pixels_near(img, BLUE) > 200 and pixels_near(img, RED) == 0


def test_what_only_a_runs_end_needs_is_not_imported_before_its_container():
    """hermetic.record's building, a resumed run's, the snapshot's tar writer, the lock's CUDA reading, the
    collection: imported beside the container's start or as the script runs (docs/benchmarks.md)."""
    code = ("import sys, hermetic.cli, hermetic.cli.run_cmd, hermetic.run.runner, hermetic.engines.docker, "
            "hermetic.configview, hermetic.record.worker, hermetic.run.snapshot, hermetic.builder.quick; "
            "print(sorted(set(sys.modules) & {'hermetic.record.build', 'hermetic.record.group', "
            "'hermetic.run.resume', 'hermetic.builder.tarlayer', 'hermetic.gpu.cuda', 'packaging', "
            "'hermetic.run.collect', 'hermetic.safetree', 'secrets'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
