"""Unmodified framework scripts on the real engine (issue 25): their metrics come from what the frameworks write.

Lightning with its default logger (TensorBoard's event files, read in the run's own image), Lightning's
CSVLogger, and the Hugging Face Trainer (trainer_state.json's log_history and *_results.json) on a tiny
GPT-2 with a local tokenizer, offline. CPU builds, tiny models, few steps: one image for all of them
(tests/frameworks_support.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from run_support import hermetic_run, run_dir_of

pytestmark = pytest.mark.docker


def group_run(project: Path, *args: str) -> tuple[dict, list[dict]]:
    """`hermetic run --json --seeds 0,1 ARGS`: (group.json, the members' records)."""
    proc = run_cli("run", "--json", "--seeds", "0,1", *args, cwd=project, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    group = json.loads(proc.stdout)
    members = [json.loads((project / "runs" / m["run_id"] / "run.json").read_text()) for m in group["members"]]
    return group, members


def test_lightning_default_logger_metrics_show_plot_group_and_replay(frameworks, tmp_path):
    group, members = group_run(frameworks, "lightning_train.py")
    for rec in members:
        m = rec["metrics"]
        assert {"tensorboard/train_loss", "tensorboard/val_loss", "tensorboard/epoch"} <= set(m["final"]), m
        tb = m["sources"]["tensorboard"]
        assert tb["reader"] == "image"  # read by TensorBoard in the run's own image, not on the host
        [event] = tb["files"]
        assert event.startswith("lightning_logs/version_0/events.out.tfevents.") and event in rec["outputs"]["volatile"]
        assert m["steps"] == 7 and m["series"]["file"] == "metrics/series.jsonl"
        rid = rec["record"]["run_id"]  # the run's own figure: drawn on demand, by the command its README gives
        assert f"hermetic runs plot {rid} -o runs/{rid}/metrics.png" in (frameworks / "runs" / rid / "README.md").read_text()
    finals = [r["metrics"]["final"]["tensorboard/val_loss"] for r in members]
    assert finals[0] != finals[1]  # the seed reached the training (hermetic seeded torch at start-up)
    stats = group["metrics"]["tensorboard/val_loss"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(sum(finals) / 2) and stats["ci95"] is not None
    assert group["flags"] == []

    first = members[0]["record"]["run_id"]
    show = run_cli("runs", "show", first, cwd=frameworks)
    assert show.returncode == 0 and "tensorboard/train_loss=" in show.stdout, show.stdout + show.stderr
    plot = run_cli("runs", "plot", first, "-o", str(tmp_path / "lightning.png"), "--json", cwd=frameworks)
    assert plot.returncode == 0, plot.stderr
    drawn = json.loads(plot.stdout)
    assert drawn["metrics"] == ["tensorboard/train_loss", "tensorboard/val_loss"]  # the epoch counter left out
    assert (tmp_path / "lightning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot = run_cli("runs", "plot", group["group"]["group_id"], "-o", str(tmp_path / "group.svg"), cwd=frameworks)
    assert plot.returncode == 0, plot.stderr

    # The event file's bytes differ every run (wall times, a name with the time): its values are compared.
    replay = run_cli("replay", str(frameworks / "runs" / first), "--json", cwd=frameworks, timeout=900)
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    verdict = json.loads(replay.stdout)["diff"]["verdict"]
    assert verdict["kind"] == "identical" and "tensorboard/train_loss" in verdict["line"], verdict
    assert "kept but not compared" in verdict["line"]


def test_lightning_csv_logger(frameworks):
    _, rec = hermetic_run(frameworks, "lightning_train.py", "--logger", "csv")
    m = rec["metrics"]
    assert sorted(m["final"]) == ["lightning/epoch", "lightning/train_loss", "lightning/val_loss"]
    assert m["sources"]["lightning"]["files"] == ["lightning_logs/version_0/metrics.csv"]
    assert "tensorboard" not in m["sources"] and m["steps"] == 7
    series = [json.loads(line) for line in (run_dir_of(frameworks, rec) / "metrics" / "series.jsonl").read_text()
              .splitlines()]
    by_name = {e["name"]: e for e in series}
    assert len(by_name["lightning/train_loss"]["points"]) == 8 and len(by_name["lightning/val_loss"]["points"]) == 2


def test_trainer_metrics_from_log_history_and_results_and_a_seed_group(frameworks):
    group, members = group_run(frameworks, "trainer_gpt2.py", "--seed", "{seed}")
    for rec in members:
        m = rec["metrics"]
        assert {"trainer/loss", "trainer/eval_loss", "trainer/train_loss", "trainer/perplexity"} <= set(m["final"])
        # train_runtime, *_per_second: kept, marked, never a metric to compare
        assert "trainer/train_runtime" in m["wall_clock"] and "trainer/eval_samples_per_second" in m["wall_clock"]
        assert not any(k.endswith(("_runtime", "_per_second")) for k in m["final"])
        assert "out/trainer_state.json" in m["sources"]["trainer"]["files"]
        assert not any("checkpoint-" in f for f in m["sources"]["trainer"]["files"])
        results = json.loads((run_dir_of(frameworks, rec) / "outputs" / "out" / "eval_results.json").read_text())
        assert m["final"]["trainer/eval_loss"] == results["eval_loss"]
        assert m["steps"] == 12
    finals = [r["metrics"]["final"]["trainer/eval_loss"] for r in members]
    assert finals[0] != finals[1]
    stats = group["metrics"]["trainer/eval_loss"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(sum(finals) / 2)
    assert stats["ci95"] is not None and stats["ci95"][0] < stats["mean"] < stats["ci95"][1]
    assert "trainer/train_runtime" not in group["metrics"]


def test_a_trainer_rerun_is_identical_except_wall_clock_fields_weights_first(frameworks):
    """The issue's headline: two runs of the same Trainer script (same seed) differ only in the fields the
    Trainer fills with times; the verdict names the weights identical first and the timing fields, exit 0."""
    from run_support import diff_json

    _, a = hermetic_run(frameworks, "trainer_gpt2.py", "--seed", "7", "--max_steps", "6", timeout=900)
    _, b = hermetic_run(frameworks, "trainer_gpt2.py", "--seed", "7", "--max_steps", "6", timeout=900)
    proc = run_cli("diff", str(run_dir_of(frameworks, a)), str(run_dir_of(frameworks, b)), cwd=frameworks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.startswith("identical except wall-clock fields: "), line
    assert line.split("(", 1)[1].startswith("out/"), line  # the files bitwise identical, weights first
    assert "model.safetensors" in line.split(")")[0] and "train_runtime" in line, line
    assert "nondeterminism" not in proc.stdout
    code, d = diff_json(run_dir_of(frameworks, a), run_dir_of(frameworks, b))
    assert code == 0 and d["verdict"]["kind"] == "wall_clock", d["verdict"]
