"""Metrics from what frameworks write (issue 25): the readers, the names, the wall-clock rule, the series file
hermetic writes and checks, and the collection that reads them as the container's user.

The files here are the frameworks' formats made by hand (Lightning's metrics.csv, the Trainer's
trainer_state.json and *_results.json) or by TensorBoard's own writer (event files, on the host: the
tensorboard the test extra installs); tests/test_frameworks.py runs the frameworks themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.core.errors import IntegrityError
from hermetic.record import metrics as mx
from synthetic_records import synthetic_record

RID = "20261201-101500-aaaaaa"
LIGHTNING_CSV = ("epoch,step,train_loss,val_loss\n"
                 "0,0,1.5,\n0,1,1.25,\n0,1,,1.0\n1,2,0.75,\n1,3,0.5,\n1,3,,0.625\n")
TRAINER_STATE = {
    "global_step": 12, "epoch": 1.0, "best_metric": None,
    "log_history": [
        {"loss": 5.5, "grad_norm": 2.0, "learning_rate": 0.004, "epoch": 0.25, "step": 2},
        {"loss": 4.75, "grad_norm": 1.5, "learning_rate": 0.002, "epoch": 0.5, "step": 6},
        {"eval_loss": 4.5, "eval_runtime": 0.51, "eval_samples_per_second": 31.2, "eval_steps_per_second": 3.9,
         "epoch": 0.5, "step": 6},
        {"train_runtime": 3.21, "train_samples_per_second": 14.9, "train_steps_per_second": 3.7,
         "total_flos": 123.0, "train_loss": 4.9, "epoch": 1.0, "step": 12},
    ],
}


def event_file(logdir: Path, scalars: dict[str, list[tuple[int, float]]], *, tensor_style: bool = False) -> Path:
    """An event file as torch.utils.tensorboard writes one (``simple_value``), or as Keras does (scalar tensors
    with the scalars plugin's metadata on each tag's first value), by TensorBoard's own writer."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(logdir))
    seen = set()
    steps = sorted({s for pts in scalars.values() for s, _ in pts})
    for step in steps:
        values = []
        for tag, pts in scalars.items():
            for s, v in pts:
                if s != step:
                    continue
                if tensor_style:
                    meta = (SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
                            if tag not in seen else None)
                    seen.add(tag)
                    values.append(Summary.Value(tag=tag, tensor=TensorProto(dtype=1, float_val=[v]), metadata=meta))
                else:
                    values.append(Summary.Value(tag=tag, simple_value=v))
        writer.add_event(Event(step=step, wall_time=time.time(), summary=Summary(value=values)))
    writer.close()
    [path] = [p for p in logdir.iterdir() if "tfevents" in p.name and p.stat().st_mtime_ns]
    return path


def run_dir_with(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    run_dir = tmp_path / RID
    for rel, data in files.items():
        p = run_dir / "outputs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    (run_dir / "outputs").mkdir(parents=True, exist_ok=True)
    return run_dir


def collect(run_dir: Path, **plan) -> object:
    """hermetic.run.collect as a run's collection calls it: as uid 1000 (a forked child) when the test is root."""
    from hermetic.run.collect import CollectPlan, collect_run

    uid = 1000 if os.geteuid() == 0 else os.getuid()
    gid = 1000 if os.geteuid() == 0 else os.getgid()
    return collect_run(CollectPlan(run_dir=str(run_dir), runtime_dir=None, workspace=None, **plan), uid=uid, gid=gid)


# ---------------------------------------------------------------- names and rules


def test_wall_clock_figures_and_counters_are_told_by_name():
    clock = ["trainer/train_runtime", "trainer/eval_samples_per_second", "trainer/train_steps_per_second",
             "tensorboard/epoch_time", "lightning/time_per_step", "trainer/timestamp", "x/step_seconds",
             "tensorboard/it_per_sec", "tensorboard/train/duration"]
    measured = ["trainer/loss", "trainer/eval_loss", "trainer/total_flos", "tensorboard/timestep",
                "lightning/lifetime_reward", "trainer/learning_rate", "tensorboard/epoch", "trainer/grad_norm"]
    assert [n for n in clock if not mx.is_wall_clock(n)] == []
    assert [n for n in measured if mx.is_wall_clock(n)] == []
    assert mx.is_counter("tensorboard/epoch") and mx.is_counter("epoch") and not mx.is_counter("trainer/loss")
    assert mx.enabled_sources("auto") == mx.SOURCES and mx.enabled_sources(None) == mx.SOURCES
    assert mx.enabled_sources("none") == () and mx.enabled_sources(["trainer", "tensorboard"]) == ("tensorboard",
                                                                                                   "trainer")


def test_run_metrics_in_hermetic_yaml(tmp_path):
    from hermetic.config.load import load_config

    base = "name: p\nbase: hermetic/debian-bookworm-python3@sha256:" + "a" * 64 + "\n"
    for text, want in (("", "auto"), ("run:\n  metrics: none\n", "none"),
                       ("run:\n  metrics: [tensorboard, trainer]\n", ["tensorboard", "trainer"])):
        (tmp_path / "hermetic.yaml").write_text(base + text)
        cfg = load_config(tmp_path / "hermetic.yaml")
        assert cfg.model.run.metrics == want and cfg.resolved()["run"]["metrics"] == want
        assert cfg.model.run.outputs.stdout is False
    for bad, where in (("run:\n  metrics: [wandb]\n", "run.metrics"), ("run:\n  metrics: []\n", "run.metrics"),
                       ("run:\n  metrics: [trainer, trainer]\n", "run.metrics"),
                       ("run:\n  outputs:\n    stdout: sometimes\n", "run.outputs.stdout")):
        (tmp_path / "hermetic.yaml").write_text(base + bad)
        proc = run_cli("config", "show", "-C", str(tmp_path))
        assert_clean_error(proc, 78, where)


def test_each_source_is_read_and_named_by_it(tmp_path):
    """Lightning's CSV, the Trainer's state (the newest, not a checkpoint's copy) and results, metrics.jsonl
    with its names as ever; wall-clock figures kept aside, never among the compared finals."""
    state = json.dumps(TRAINER_STATE)
    old_state = json.dumps({**TRAINER_STATE, "log_history": TRAINER_STATE["log_history"][:2], "global_step": 6})
    run_dir = run_dir_with(tmp_path, {
        "metrics.jsonl": '{"step": 1, "loss": 2.0, "time": 17.5}\n{"step": 2, "loss": 1.0, "val": {"acc": 0.5}}\n',
        "lightning_logs/version_0/metrics.csv": LIGHTNING_CSV,
        "lightning_logs/version_0/hparams.yaml": "{}\n",
        "out/trainer_state.json": state,
        "out/checkpoint-6/trainer_state.json": old_state,
        "out/checkpoint-12/trainer_state.json": state,
        "out/all_results.json": json.dumps({"epoch": 1.0, "eval_loss": 4.25, "eval_runtime": 0.4, "train_loss": 4.9,
                                            "train_runtime": 3.21, "perplexity": 70.1}),
        "out/eval_results.json": json.dumps({"epoch": 1.0, "eval_loss": 4.25, "eval_runtime": 0.4,
                                             "eval_samples_per_second": 40.0}),
        "out/train_results.json": json.dumps({"train_loss": 4.9, "train_runtime": 3.21}),
        "notes.json": json.dumps({"loss": 99}),  # no source's file: never read
    })
    got = collect(run_dir)
    m = got.metrics
    assert m["final"] == {
        "loss": 1.0, "val.acc": 0.5,  # metrics.jsonl: bare names, as always
        "lightning/epoch": 1, "lightning/train_loss": 0.5, "lightning/val_loss": 0.625,
        "trainer/epoch": 1.0, "trainer/eval_loss": 4.25, "trainer/grad_norm": 1.5, "trainer/learning_rate": 0.002,
        "trainer/loss": 4.75, "trainer/perplexity": 70.1, "trainer/total_flos": 123.0, "trainer/train_loss": 4.9,
    }
    assert m["wall_clock"] == {"trainer/eval_runtime": 0.4, "trainer/eval_samples_per_second": 40.0,
                               "trainer/eval_steps_per_second": 3.9, "trainer/train_runtime": 3.21,
                               "trainer/train_samples_per_second": 14.9, "trainer/train_steps_per_second": 3.7}
    assert m["steps"] == 12 and m["file"] == "outputs/metrics.jsonl"
    assert m["sources"]["trainer"]["files"] == ["out/all_results.json", "out/eval_results.json",
                                                "out/train_results.json", "out/trainer_state.json"]
    assert m["sources"]["lightning"] == {"files": ["lightning_logs/version_0/metrics.csv"],
                                         "metrics": ["lightning/epoch", "lightning/train_loss", "lightning/val_loss"]}
    assert m["sources"]["metrics.jsonl"]["metrics"] == ["loss", "val.acc"]
    assert "trainer/train_runtime" in m["sources"]["trainer"]["wall_clock"]
    assert got.notes == []

    series = mx.load_series(run_dir, {"metrics": m})
    assert series.series["lightning/train_loss"] == [(0, 1.5), (1, 1.25), (2, 0.75), (3, 0.5)]
    assert series.series["lightning/val_loss"] == [(1, 1.0), (3, 0.625)]
    # the final evaluation (eval_results.json, after save_state) is a point at the run's last step
    assert series.series["trainer/eval_loss"] == [(6, 4.5), (12, 4.25)]
    assert series.series["loss"] == [(1, 2.0), (2, 1.0)]
    assert series.wall_clock >= {"trainer/train_runtime", "trainer/eval_runtime"}
    assert "trainer/train_runtime" not in series.compared()
    assert m["series"]["sha256"] == mx.hashlib.sha256((run_dir / mx.SERIES_FILE).read_bytes()).hexdigest()

    # run.metrics: a list reads only those; none reads none (metrics.jsonl included)
    only = collect(run_dir, metrics=["lightning"]).metrics
    assert sorted(only["final"]) == ["lightning/epoch", "lightning/train_loss", "lightning/val_loss"]
    assert collect(run_dir, metrics=[]).metrics == {"final": {}, "steps": None, "file": None}


def test_several_runs_of_one_source_are_named_by_their_directories(tmp_path):
    pytest.importorskip("tensorboard")
    run_dir = run_dir_with(tmp_path, {"lightning_logs/version_0/metrics.csv": LIGHTNING_CSV,
                                      "lightning_logs/version_1/metrics.csv": LIGHTNING_CSV})
    logs = run_dir / "outputs" / "logs"
    event_file(logs / "train", {"epoch_loss": [(0, 0.9), (1, 0.7)]}, tensor_style=True)
    event_file(logs / "validation", {"epoch_loss": [(0, 1.1), (1, 0.8)]}, tensor_style=True)
    m = collect(run_dir).metrics
    assert {k: v for k, v in m["final"].items() if k.startswith("tensorboard/")} == pytest.approx(
        {"tensorboard/train/epoch_loss": 0.7, "tensorboard/validation/epoch_loss": 0.8})
    assert "lightning/version_0/train_loss" in m["final"] and "lightning/version_1/val_loss" in m["final"]


def test_event_files_are_read_by_tensorboard_on_the_host_as_the_container_user(tmp_path):
    """No image to read them in (no record names one): the fallback, tensorboard's EventFileLoader in the
    collection child (uid 1000 when the test is root); NaN survives; the reader is recorded."""
    pytest.importorskip("tensorboard")
    run_dir = run_dir_with(tmp_path, {})
    event_file(run_dir / "outputs" / "lightning_logs" / "version_0",
               {"train_loss": [(0, 1.0), (1, 0.5), (2, float("nan"))], "epoch": [(0, 0.0), (2, 1.0)]})
    got = collect(run_dir)
    m = got.metrics
    assert m["final"] == {"tensorboard/epoch": 1.0, "tensorboard/train_loss": "NaN"}
    assert m["sources"]["tensorboard"]["reader"] == "host" and m["steps"] == 2 and got.notes == []
    series = mx.load_series(run_dir, {"metrics": m}).series["tensorboard/train_loss"]
    assert series[:2] == [(0, 1.0), (1, 0.5)] and series[2][0] == 2 and series[2][1] != series[2][1]


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal to parse as root needs root")
def test_event_files_are_never_parsed_on_the_host_as_root(tmp_path):
    pytest.importorskip("tensorboard")
    from hermetic.run.collect import CollectPlan, collect_run

    run_dir = run_dir_with(tmp_path, {"metrics.jsonl": '{"step": 1, "loss": 0.5}\n'})
    event_file(run_dir / "outputs" / "tb", {"loss": [(1, 0.5)]})
    got = collect_run(CollectPlan(str(run_dir), None, None), uid=0, gid=0)  # a container that ran as root
    assert got.metrics["final"] == {"loss": 0.5}  # metrics.jsonl still read
    [note] = [n for n in got.notes if "tfevents" in n]
    assert "does not parse them on the host as root" in note


def test_without_tensorboard_anywhere_a_note_names_the_extra(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from hermetic.inimage import tb_scalars

    run_dir = run_dir_with(tmp_path, {})
    event_file(run_dir / "outputs" / "runs" / "Dec01", {"loss": [(1, 0.5)]})
    monkeypatch.setattr(tb_scalars, "available", lambda: "No module named 'tensorboard'")  # the forked child too
    got = collect(run_dir)
    assert got.metrics["final"] == {} and "series" not in got.metrics
    [note] = [n for n in got.notes if "tfevents" in n]
    assert "pip install 'hermetic[tensorboard]'" in note and "the run's record names no image" in note


def test_what_the_script_left_is_bounded_and_never_followed(tmp_path, monkeypatch):
    """A link where a source's file would be, a file over the size allowed, a malformed file: each a note, the
    other sources still read, nothing outside the run read."""
    outside = tmp_path / "host-secret.csv"
    outside.write_text("step,stolen\n1,4711\n")
    run_dir = run_dir_with(tmp_path, {
        "out/trainer_state.json": json.dumps(TRAINER_STATE),
        "bad/all_results.json": "{not json",
        "big/trainer_state.json": json.dumps({"log_history": [{"step": 1, "loss": 1.0}], "pad": "x" * 4096}),
    })
    os.makedirs(run_dir / "outputs" / "lightning_logs" / "version_0")
    os.symlink(outside, run_dir / "outputs" / "lightning_logs" / "version_0" / "metrics.csv")
    monkeypatch.setattr(mx, "MAX_FILE_BYTES", 4000)
    got = collect(run_dir)
    assert got.metrics["final"]["trainer/loss"] == 4.75  # the one Trainer directory that could be read
    assert not any("4711" in json.dumps(v) for v in (got.metrics, got.notes))
    assert not any(k.startswith("lightning/") for k in got.metrics["final"])
    text = "\n".join(got.notes)
    assert "outputs/lightning_logs/version_0/metrics.csv: a link" in text
    assert "outputs/bad/all_results.json: not JSON" in text
    assert "outputs/big/trainer_state.json" in text and "more than the 4000 allowed" in text


def test_a_long_series_keeps_its_last_value(tmp_path, monkeypatch):
    lines = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 101))
    run_dir = run_dir_with(tmp_path, {"metrics.jsonl": lines})
    monkeypatch.setattr(mx, "MAX_POINTS", 10)
    got = collect(run_dir)
    assert got.metrics["final"] == {"loss": 0.01} and got.metrics["steps"] == 100
    pts = mx.load_series(run_dir, {"metrics": got.metrics}).series["loss"]
    assert len(pts) == 10 and pts[-1] == (100, 0.01)
    assert any("loss: 100 points" in n for n in got.notes)


# ---------------------------------------------------------------- the series file: hermetic's, and checked


def finished_run(root: Path, run_id: str = RID, files: dict[str, str] | None = None) -> dict:
    from hermetic.record import finish_record, write_record
    from hermetic.record.rundir import create_run_dir
    from synthetic_records import DATA_MANIFEST

    rec = synthetic_record(run_id)
    run_dir = create_run_dir(root, run_id)
    (run_dir / "data" / "mnist.sha256").write_text(DATA_MANIFEST)
    snap = rec["code"]["snapshot"]  # bytes that stand for the snapshot (tests/synthetic_records.py does so too)
    (run_dir / snap["file"]).write_bytes(b"snapshot\n")
    snap["sha256"] = mx.hashlib.sha256(b"snapshot\n").hexdigest()
    for rel, text in (files or {"trainer/trainer_state.json": json.dumps(TRAINER_STATE)}).items():
        (run_dir / "outputs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "outputs" / rel).write_text(text)
    return write_record(run_dir, finish_record(rec, run_dir, status="succeeded", exit_code=0))


def test_the_series_file_is_checked_against_the_record(tmp_path):
    root = tmp_path / "runs"
    rec = finished_run(root)
    run_dir = root / RID
    assert rec["metrics"]["series"]["file"] == "metrics/series.jsonl"
    assert mx.load_series(run_dir, rec).series["trainer/loss"] == [(2, 5.5), (6, 4.75)]
    proc = run_cli("runs", "verify", "--runs-dir", str(root), RID)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = run_dir / mx.SERIES_FILE
    path.write_bytes(path.read_bytes().replace(b"4.75", b"1.75"))
    with pytest.raises(IntegrityError, match="series.jsonl: changed since the record was sealed"):
        mx.load_series(run_dir, rec)
    proc = run_cli("runs", "verify", "--runs-dir", str(root), RID)
    assert proc.returncode != 0 and "metrics/series.jsonl (the metric series) changed" in proc.stdout + proc.stderr
    proc = run_cli("runs", "plot", "--runs-dir", str(root), RID, "-o", str(tmp_path / "x.png"))
    assert_clean_error(proc, 65, "series.jsonl")
    path.unlink()
    proc = run_cli("runs", "plot", "--runs-dir", str(root), RID, "-o", str(tmp_path / "x.png"))
    assert_clean_error(proc, 65, "series.jsonl: missing")


def test_runs_show_lists_the_metrics_of_every_source(tmp_path):
    root = tmp_path / "runs"
    finished_run(root)
    proc = run_cli("runs", "show", "--runs-dir", str(root), RID)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("metrics"))
    assert "trainer/loss=4.75" in line and "trainer/train_loss=4.9" in line and "train_runtime" not in line
    listing = run_cli("runs", "--runs-dir", str(root))
    assert "trainer/loss" in listing.stdout or "4.75" in listing.stdout, listing.stdout


def test_a_record_from_before_series_files_still_plots_from_its_metrics_jsonl(tmp_path):
    from hermetic.record.build import summarize_metrics  # noqa: F401 - the record as it was made then
    from hermetic.record.rundir import create_run_dir

    run_dir = create_run_dir(tmp_path / "runs", RID)
    (run_dir / "outputs" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    old = {"metrics": {"final": {"loss": 1.0}, "steps": 2, "file": "outputs/metrics.jsonl"}}
    got = mx.load_series(run_dir, old)
    assert got.series == {"loss": [(1, 2.0), (2, 1.0)]} and got.sources == {"loss": "metrics.jsonl"}


# ---------------------------------------------------------------- diff: values compared, wall clock never


def _with_event_metrics(rec: dict, loss: float, runtime: float) -> dict:
    rec["outputs"]["files"]["lightning_logs/version_0/events.out.tfevents.1.host.1.0"] = {
        "sha256": mx.hashlib.sha256(f"{runtime}".encode()).hexdigest(), "size": 100}
    rec["outputs"]["volatile"] = ["lightning_logs/version_0/events.out.tfevents.1.host.1.0"]
    rec["metrics"] = {"final": {"tensorboard/train_loss": loss}, "steps": 7, "file": None,
                      "wall_clock": {"trainer/train_runtime": runtime},
                      "sources": {"tensorboard": {"files": [rec["outputs"]["volatile"][0]],
                                                  "metrics": ["tensorboard/train_loss"], "reader": "image"}}}
    return rec


def test_diff_compares_an_event_files_values_and_never_a_wall_clock_figure():
    from hermetic.diff import diff_records

    a = _with_event_metrics(synthetic_record("20261201-101500-aaaaaa"), 0.25, 3.2)
    b = _with_event_metrics(synthetic_record("20261201-102000-bbbbbb", minutes=5), 0.25, 4.9)
    d = diff_records(a, b)
    assert d.verdict.kind == "identical" and d.verdict.exit_code == 0, d.verdict.line
    assert "tensorboard/train_loss" in d.verdict.line and "train_runtime" not in json.dumps(d.to_json()["outputs"])
    b["metrics"]["final"]["tensorboard/train_loss"] = 0.3
    d = diff_records(a, b)
    assert d.verdict.exit_code == 1 and "metrics differ: tensorboard/train_loss" in d.outputs.summary()


def test_stdout_is_an_output_when_run_outputs_stdout_says_so(tmp_path):
    from hermetic.diff import diff_records

    run_dir = run_dir_with(tmp_path, {})
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "stdout.log").write_text("accuracy 0.75\n")
    got = collect(run_dir, stdout=True)
    entry = got.outputs["stdout"]
    assert entry == {"file": "logs/stdout.log", "sha256": mx.hashlib.sha256(b"accuracy 0.75\n").hexdigest(),
                     "size": 14}
    assert "stdout" not in collect(run_dir).outputs  # off by default
    a, b = synthetic_record("20261201-101500-aaaaaa"), synthetic_record("20261201-102000-bbbbbb", minutes=5)
    for r in (a, b):
        r["outputs"] = {"files": {}, "stdout": dict(entry)}
        r["metrics"] = {"final": {}, "steps": None, "file": None}
    d = diff_records(a, b)
    assert d.verdict.kind == "identical" and "logs/stdout.log" in d.verdict.line
    b["outputs"]["stdout"]["sha256"] = "0" * 64
    d = diff_records(a, b)
    assert d.verdict.kind == "nondeterminism" and "logs/stdout.log" in d.outputs.summary()


def test_the_in_image_reader_prints_what_the_host_reader_reads(tmp_path):
    """tb_scalars.py as the reader container runs it (a separate interpreter, `python -I`), on a name that is
    not UTF-8: the same scalars."""
    pytest.importorskip("tensorboard")
    from hermetic.inimage import tb_scalars
    from hermetic.hostfs.safetree import record_name

    written = event_file(tmp_path / "out" / "plain", {"loss": [(1, 2.0), (2, float("inf"))]})
    logdir = tmp_path / "out" / os.fsdecode(b"odd\xffdir")  # TensorBoard's writer cannot make it; a script can
    os.rename(written.parent, logdir)
    path = logdir / written.name
    rel = record_name(os.path.relpath(path, tmp_path / "out"))
    request = {"root": str(tmp_path / "out"), "files": [rel], "max_bytes": 1 << 20, "max_points": 100}
    proc = subprocess.run([sys.executable, "-I", tb_scalars.__file__, json.dumps(request)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["files"][rel]["tags"] == {"loss": [[1, 2.0], [2, "Infinity"]]} and doc["files"][rel]["error"] is None


# ---------------------------------------------------------------- on the real engine: an image without tensorboard

COPIES_EVENTS = """import shutil
shutil.copytree("tb", "/outputs/tb")  # event files a SummaryWriter wrote elsewhere; this image has no tensorboard
"""


@pytest.mark.docker
def test_event_files_from_an_image_without_tensorboard_are_read_on_the_host_or_noted(project):
    """examples/numpy-logreg's image has no tensorboard: the reader container says so, and the collection child
    (the container's user) reads the files with the host's tensorboard; without one there either, a note."""
    pytest.importorskip("tensorboard")
    from run_support import hermetic_run

    event_file(project / "tb" / "run1", {"loss": [(1, 0.5), (2, 0.25)]})
    (project / "copies.py").write_text(COPIES_EVENTS)
    _, rec = hermetic_run(project, "copies.py")
    m = rec["metrics"]
    assert m["final"] == {"tensorboard/loss": 0.25} and m["sources"]["tensorboard"]["reader"] == "host", rec["outputs"].get("notes")
    blocked = ("import sys; sys.modules['tensorboard'] = None; from hermetic.cli import main; "
               "main(['run', '--json', 'copies.py'])")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=900, cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(proc.stdout)
    assert rec["metrics"]["final"] == {}
    [note] = [n for n in rec["outputs"]["notes"] if "TensorBoard event file" in n]
    assert "the run's image has no tensorboard" in note and "pip install 'hermetic[tensorboard]'" in note
