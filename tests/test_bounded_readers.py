"""What a run wrote is read within fixed caps (issue 40, item 2): metrics.jsonl, Lightning's metrics.csv, the
Trainer's JSON, TensorBoard's reader answer and the runtime's report, each crafted to cost hermetic memory; what
the caps left out is counted in the record (``metrics.left_out``). The last test runs such a script through
`hermetic run` and measures hermetic's peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermetic.record import metrics as mx
from hermetic.record.schema import validate_record

RID = "20261201-101500-bbbbbb"


def collect(tmp_path: Path, files: dict[str, str | bytes]):
    """hermetic.run.collect on a run directory holding ``files`` under outputs/ (as uid 1000 when root)."""
    from hermetic.run.collect import CollectPlan, collect_run

    run_dir = tmp_path / RID
    (run_dir / "outputs").mkdir(parents=True)
    for rel, data in files.items():
        p = run_dir / "outputs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    os.chmod(run_dir, 0o755)
    uid = 1000 if os.geteuid() == 0 else os.getuid()
    return collect_run(CollectPlan(run_dir=str(run_dir), runtime_dir=None, workspace=None), uid=uid, gid=uid)


def names(got) -> list[str]:
    return list(got.metrics["final"]) + list(got.metrics.get("wall_clock") or {})


def test_metrics_jsonl_of_many_names_keeps_the_first_names_and_counts_the_rest(tmp_path):
    lines = "".join(json.dumps({"step": s, **{f"m{s}_{i}": 1.0 for i in range(2000)}}) + "\n" for s in range(5))
    got = collect(tmp_path, {"metrics.jsonl": lines})
    assert len(names(got)) == mx.MAX_METRICS
    assert got.metrics["left_out"]["other_names"] == 5 * 2000 - mx.MAX_METRICS


def test_a_long_name_a_deep_object_and_a_huge_number_in_metrics_jsonl(tmp_path):
    deep = "{\"a\":" * 5000 + "1" + "}" * 5000
    lines = (json.dumps({"step": 1, "x" * 1000: 1.0, "big": 10 ** 400, "ok": 2}) + "\n"
             + json.dumps({"step": 2, "nest": {"a": {"b": 3}}}) + "\n")
    got = collect(tmp_path / "1", {"metrics.jsonl": lines})
    assert "x" * 1000 not in got.metrics["final"] and got.metrics["left_out"]["other_names"] == 1
    assert got.metrics["final"] == {"big": "Infinity", "ok": 2, "nest.a.b": 3}
    got = collect(tmp_path / "2", {"metrics.jsonl": lines + deep + "\n"})
    # Python <= 3.12's json refuses the line (RecursionError): the file is a note, as any bad line makes it;
    # 3.13's reads it (its C recursion limit is not sys's) and nothing below MAX_NESTING is a metric. Never a crash.
    refused = any("metrics.jsonl:3: not a JSON object" in n for n in got.notes)
    assert got.metrics["final"] == ({} if refused else {"big": "Infinity", "ok": 2, "nest.a.b": 3}), got.notes
    assert refused or sys.version_info >= (3, 13), got.notes


def test_a_lightning_csv_of_many_columns_keeps_the_first_columns(tmp_path):
    cols = 100_000
    text = "step," + ",".join(f"c{i}" for i in range(cols)) + "\n"
    text += "".join(f"{r}," + ",".join(["1"] * cols) + "\n" for r in range(3))
    got = collect(tmp_path, {"lightning_logs/version_0/metrics.csv": text})
    assert len(names(got)) == mx.MAX_COLUMNS - 1  # the step column is no metric
    assert got.metrics["left_out"]["columns"] == cols + 1 - mx.MAX_COLUMNS


def test_a_lightning_csv_past_its_byte_cap_is_read_up_to_it(tmp_path, monkeypatch):
    monkeypatch.setattr(mx, "MAX_CSV_BYTES", 1000)
    text = "step,loss\n" + "".join(f"{s},{s}.5\n" for s in range(1000))
    got = collect(tmp_path, {"metrics.csv": text})
    points = mx.load_series(tmp_path / RID, {"metrics": got.metrics}).series["lightning/loss"]
    assert 0 < len(points) < 200
    assert got.metrics["left_out"]["bytes"] > 0
    assert any("metrics.csv: only its first" in n for n in got.notes), got.notes


def test_a_trainer_state_of_wrong_types_is_read_for_what_it_holds(tmp_path):
    state = {"global_step": "x", "log_history": [
        "text", [1, 2], {"step": True, "loss": 1.0}, {"step": 10 ** 30, "loss": 1.0},
        {"step": 1, "loss": "1.0", "acc": [0.5], "lr": {"a": 1}, "ok": 0.5, "big": 10 ** 400},
        *({"step": 2, f"k{i}": 1} for i in range(3000))]}
    got = collect(tmp_path, {"a/trainer_state.json": json.dumps(state),
                             "x/trainer_state.json": json.dumps({"log_history": {"step": 1}}),
                             "y/all_results.json": "[" * 100_000 + "]" * 100_000})
    final = got.metrics["final"]
    assert final["trainer/ok"] == 0.5 and final["trainer/big"] == "Infinity" and "trainer/loss" not in final
    assert len(names(got)) <= mx.MAX_METRICS and got.metrics["left_out"]["other_names"] > 0
    text = "\n".join(got.notes)
    assert "x/trainer_state.json: no log_history list" in text and "y/all_results.json: not JSON" in text


def test_tensorboards_answer_of_many_tags_is_kept_within_the_caps():
    kept = mx.Kept()
    doc = {"tags": {f"t{i}": [[s, 0.5] for s in range(3)] for i in range(20_000)} | {"x" * 5000: [[1, 1.0]]}}
    part = mx.event_part("events.out.tfevents.1", doc, kept)
    assert len(part["series"]) == mx.MAX_METRICS
    assert kept.left_out["other_names"] == (20_000 - mx.MAX_METRICS) * 3 + 1


def test_the_points_of_all_sources_together_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(mx, "MAX_TOTAL_POINTS", 50)
    lines = "".join(json.dumps({"step": s, "a": s, "b": -s}) + "\n" for s in range(1, 101))
    got = collect(tmp_path, {"metrics.jsonl": lines})
    assert got.metrics["final"] == {"a": 100, "b": -100}
    assert got.metrics["series"]["points"] <= 50 and got.metrics["left_out"]["points"] >= 150


def test_a_record_with_left_out_counts_validates():
    from synthetic_records import synthetic_record

    rec = synthetic_record(RID)
    rec["metrics"]["left_out"] = {"points": 3, "columns": 99_000}
    validate_record(rec, sealed=False)


def test_a_runtime_report_nested_deep_is_a_note(tmp_path):
    from hermetic.run.collect import read_runtime_report_at

    (tmp_path / "runtime.json").write_text("[" * 100_000 + "]" * 100_000)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    notes: list[str] = []
    try:
        assert read_runtime_report_at(fd, notes) == {}
    finally:
        os.close(fd)
    assert notes == ["the runtime's report is not JSON: not read"]


CRAFTED = textwrap.dedent("""
    import json, os
    os.makedirs("/outputs/lightning_logs/version_0", exist_ok=True)
    cols = 100_000
    with open("/outputs/lightning_logs/version_0/metrics.csv", "w") as f:
        f.write("step," + ",".join(f"c{i}" for i in range(cols)) + "\\n")
        for r in range(30):
            f.write(f"{r}," + ",".join(["1"] * cols) + "\\n")
    with open("/outputs/metrics.jsonl", "w") as f:
        for s in range(10):
            f.write(json.dumps({"step": s, **{f"m{i}": 0.5 for i in range(s * 10_000, (s + 1) * 10_000)}}) + "\\n")
    history = [{"step": i, f"k{i}": [1], "loss": 0.5, "x": "y", "h": i * 0.5} for i in range(200_000)]
    with open("/outputs/trainer_state.json", "w") as f:
        json.dump({"global_step": "z", "log_history": history}, f)
    with open("/outputs/events.out.tfevents.1.host", "wb") as f:
        f.write(os.urandom(1 << 20))
    print("crafted", flush=True)
""")


@pytest.mark.docker
def test_hermetic_run_on_crafted_outputs_stays_under_300_mb(project):
    """hermetic's peak memory (its own and every process it waited for) while it collects crafted files."""
    (project / "crafted.py").write_text(CRAFTED)
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr[-3000:], "
             "'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    proc = subprocess.run([sys.executable, "-c", "import json; " + probe, sys.executable, "-m", "hermetic", "run",
                           "--json", "crafted.py"], cwd=project, capture_output=True, text=True, timeout=900)
    got = json.loads(proc.stdout)
    assert got["rc"] == 0, got["err"]
    rec = json.loads(got["out"])
    print(f"peak RSS of hermetic run on crafted outputs: {got['maxrss_kb'] // 1024} MB")
    assert got["maxrss_kb"] < 300 * 1024, got["maxrss_kb"]
    left = rec["metrics"]["left_out"]
    assert left["columns"] == 100_001 - mx.MAX_COLUMNS and left["other_names"] > 0
    assert len(rec["metrics"]["final"]) + len(rec["metrics"].get("wall_clock") or {}) <= mx.MAX_METRICS


# ---------------------------------------------------------------- sealed modes (issue 40, item 5)


def test_collected_outputs_lose_world_write_setuid_setgid_and_sticky_bits(tmp_path):
    """A script's outputs as it left them: a setuid file, a setgid world-writable one, a sticky world-writable
    directory, outputs/ itself world-writable. Sealed, none of those bits is left; the record lists the modes."""
    import stat

    run_dir = tmp_path / RID
    out = run_dir / "outputs"
    (out / "shared").mkdir(parents=True)
    (out / "tool").write_text("#!/bin/sh\n")
    (out / "shared" / "w.txt").write_text("x")
    (out / "plain.txt").write_text("y")
    if os.geteuid() == 0:  # the script's user owns what it made (a chown clears setuid: first)
        for p in (out, out / "shared", out / "shared" / "w.txt", out / "tool", out / "plain.txt"):
            os.chown(p, 1000, 1000)
    os.chmod(out / "tool", 0o4755)
    os.chmod(out / "shared" / "w.txt", 0o2666)
    os.chmod(out / "shared", 0o1777)
    os.chmod(out, 0o777)
    os.chmod(run_dir, 0o755)
    from hermetic.run.collect import CollectPlan, collect_run

    uid = 1000 if os.geteuid() == 0 else os.getuid()
    got = collect_run(CollectPlan(run_dir=str(run_dir), runtime_dir=None, workspace=None), uid=uid, gid=uid)
    modes = {p: stat.S_IMODE(os.lstat(p).st_mode) for p in (out, out / "shared", out / "shared" / "w.txt",
                                                            out / "tool", out / "plain.txt")}
    assert modes == {out: 0o775, out / "shared": 0o775, out / "shared" / "w.txt": 0o664, out / "tool": 0o755,
                     out / "plain.txt": 0o644 & ~os.umask(os.umask(0))}, modes
    assert got.outputs["modes_cleared"] == {".": "0777", "shared": "1777", "shared/w.txt": "2666", "tool": "4755"}
    from synthetic_records import synthetic_record

    rec = synthetic_record(RID)
    rec["outputs"]["modes_cleared"] = got.outputs["modes_cleared"]
    validate_record(rec, sealed=False)
