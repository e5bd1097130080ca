"""hermetic runs: the index, its repair, listing order, show, and groups in the list."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

from hermetic.core.canonical import pretty_json
from hermetic.record import list_entries, load_record, resolve_run, seal, write_group
from hermetic.record.index import INDEX_NAME, read_index
from hermetic.record.rundir import RunNotFound
from hermetic.core.errors import UsageError
from synthetic_records import synthetic_record, write_synthetic_run

IDS = ["20261129-214500-aaaaaa", "20261129-220000-bbbbbb", "20261130-080000-cccccc-named"]


def hermetic(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for i, rid in enumerate(IDS):
        rec = synthetic_record(rid, minutes=[0, 15, 615][i], seed=i)
        rec["metrics"]["final"]["loss"] = 0.5 - i / 10
        write_synthetic_run(root, rec)
    return root


def test_list_newest_first_from_the_index(runs):
    entries = list_entries(runs)
    assert [e["id"] for e in entries] == IDS[::-1]
    assert entries[0]["final"]["loss"] == 0.3 and entries[0]["status"] == "succeeded"
    index, lines = read_index(runs)
    assert sorted(index) == sorted(IDS) and lines == 4  # 3 lines + the final newline


def test_index_is_rebuilt_when_missing_and_repaired_when_stale(runs):
    (runs / INDEX_NAME).unlink()
    assert [e["id"] for e in list_entries(runs)] == IDS[::-1]
    assert sorted(read_index(runs)[0]) == sorted(IDS)
    # a run copied in by hand (no write_record): read once, then indexed
    rid = "20261201-000000-dddddd"
    shutil.copytree(runs / IDS[0], runs / rid)
    doc = json.loads((runs / rid / "run.json").read_text())
    doc["record"].update(run_id=rid, started_at="2026-12-01T00:00:00.000Z")
    (runs / rid / "run.json").write_text(pretty_json(seal(doc)))
    assert list_entries(runs)[0]["id"] == rid
    assert rid in read_index(runs)[0]
    # a removed run disappears from the list
    shutil.rmtree(runs / IDS[1])
    assert [e["id"] for e in list_entries(runs)] == [rid, IDS[2], IDS[0]]


def test_incomplete_and_torn_entries(runs):
    (runs / "20261202-000000-eeeeee").mkdir()  # a run still running: no run.json yet
    with open(runs / INDEX_NAME, "ab") as f:
        f.write(b'{"v":1,"id":"torn')  # a writer killed mid-line
    entries = list_entries(runs)
    assert entries[0]["id"] == "20261202-000000-eeeeee" and entries[0]["status"] == "incomplete"
    assert "20261202-000000-eeeeee" not in read_index(runs)[0]  # placeholders are not stored
    # the next append starts on a fresh line, so both parse
    rec = synthetic_record("20261203-000000-ffffff", minutes=9000)
    write_synthetic_run(runs, rec)
    assert "20261203-000000-ffffff" in read_index(runs)[0]


def test_rewritten_record_latest_wins(runs):
    from hermetic.record import write_record

    rec = load_record(runs / IDS[0])
    rec["record"]["status"] = "failed"
    rec["record"]["exit_code"] = 1
    write_record(runs / IDS[0], rec)
    entry = next(e for e in list_entries(runs) if e["id"] == IDS[0])
    assert (entry["status"], entry["exit_code"]) == ("failed", 1)


def test_resolve_run_by_prefix(runs):
    assert resolve_run("20261130", runs) == runs / IDS[2]
    assert resolve_run(str(runs / IDS[0]), runs) == runs / IDS[0]
    with pytest.raises(UsageError, match="ambiguous run ID prefix: 2 runs match"):
        resolve_run("20261129", runs)
    with pytest.raises(RunNotFound, match="no run with this ID or prefix"):
        resolve_run("2030", runs)


def test_cli_list_and_show(runs):
    r = hermetic("runs", "--runs-dir", str(runs))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "STARTED", "(UTC)", "STATUS", "IMAGE", "DATA", "METRIC"]
    assert [ln.split()[0] for ln in lines[1:]] == IDS[::-1]
    assert "loss=0.3" in lines[1] and "mnist:" in lines[1]
    r = hermetic("runs", "--runs-dir", str(runs), "--json", "-n", "1")
    assert [e["id"] for e in json.loads(r.stdout)] == [IDS[2]]
    r = hermetic("runs", "--runs-dir", str(runs), "show", "20261130")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"run {IDS[2]}  succeeded")
    assert "(seal verified; 2 output files rehashed, as recorded: " in r.stdout
    r = hermetic("runs", "show", "--runs-dir", str(runs), "--json", IDS[0])
    assert json.loads(r.stdout) == load_record(runs / IDS[0])
    r = hermetic("runs", "show", "--runs-dir", str(runs), "20261129")
    assert r.returncode == 64 and "ambiguous" in r.stderr


def test_cli_show_reports_a_tampered_record(runs):
    path = runs / IDS[0] / "run.json"
    path.write_text(path.read_text().replace('"loss": 0.5', '"loss": 0.4'))
    r = hermetic("runs", "--runs-dir", str(runs), "show", IDS[0])
    assert r.returncode == 65
    assert "record_sha256 does not match" in r.stderr


def test_cli_uses_runs_dir_from_config(tmp_path, runs):
    (tmp_path / "hermetic.yaml").write_text("name: demo\nbase: debian@sha256:" + "0" * 64 + "\nruns_dir: runs\n")
    r = hermetic("runs", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 3
    r = hermetic("runs", "--json", "-C", str(tmp_path / "hermetic.yaml"))
    assert len(json.loads(r.stdout)) == 3


def test_groups_are_listed(tmp_path):
    root = tmp_path / "runs"
    gid = "20261129-214400-999999-sweep"
    members = []
    for seed in range(3):
        rid = f"20261129-2145{seed:02d}-00000{seed}"
        rec = synthetic_record(rid, seed=seed)
        rec["invocation"]["group"] = gid
        rec["seed"]["policy"] = "group"
        rec["metrics"]["final"]["loss"] = 0.30 + seed / 100
        write_synthetic_run(root, rec)
        members.append(rid)
    write_group(root, gid, members)
    entries = list_entries(root)
    group = next(e for e in entries if e["id"] == gid)
    assert group["kind"] == "group" and group["seeds"] == [0, 1, 2]
    assert group["final"]["loss"] == pytest.approx(0.31)
    r = hermetic("runs", "--runs-dir", str(root))
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(gid))
    assert "group×3 succeeded" in line and "loss=0.31±0.01" in line
    (root / INDEX_NAME).unlink()  # rebuilt from group.json too
    assert next(e for e in list_entries(root) if e["id"] == gid)["kind"] == "group"
    r = hermetic("runs", "--runs-dir", str(root), "show", gid)
    assert r.returncode == 0, r.stderr
    assert "loss: mean 0.31 ± 0.01 (sd), n=3, 95% CI [0.285159, 0.334841]" in r.stdout


@pytest.mark.parametrize("runs_dir, where", [(None, "runs"), ("./out/runs/", "out/runs"),
                                             ("/srv/hermetic-runs", "/srv/hermetic-runs"), ("exp/../runs2", "runs2")])
def test_the_runs_directory_is_the_configs_runs_dir(tmp_path, runs_dir, where, monkeypatch):
    from hermetic.record.locate import runs_root

    monkeypatch.setenv("HERMETIC_ALLOW_PATHS", "/srv")  # a runs_dir outside the project, as its user allows

    text = "name: demo\nbase: debian@sha256:" + "0" * 64 + "\n"
    if runs_dir:
        text += f"runs_dir: {runs_dir}\n"
    (tmp_path / "hermetic.yaml").write_text(text)
    assert runs_root(None, str(tmp_path)) == tmp_path.resolve() / where  # an absolute `where` stays itself
    assert runs_root("elsewhere", str(tmp_path)) == Path("elsewhere")  # --runs-dir wins


def test_the_runs_listing_reads_the_config_as_every_command_does(tmp_path):
    """One loader: a hermetic.yaml the schema refuses is refused by `hermetic runs` too, naming its line and key."""
    (tmp_path / "hermetic.yaml").write_text("name: demo\nbase: debian@sha256:" + "0" * 64 + "\nrun_dir: out\n")
    proc = hermetic("runs", "-C", str(tmp_path))
    assert proc.returncode == 78 and f"{tmp_path.resolve() / 'hermetic.yaml'}:3: run_dir: unknown key" in proc.stderr


def _write_many(args):
    root, worker = args
    for i in range(20):
        write_synthetic_run(root, synthetic_record(f"20261129-21{worker:02d}{i:02d}-{worker:02x}{i:04x}"))


def test_concurrent_writers_keep_every_index_line(tmp_path):
    from multiprocessing import get_context

    root = tmp_path / "runs"
    root.mkdir()
    with get_context("spawn").Pool(4) as pool:
        pool.map(_write_many, [(root, w) for w in range(4)])
    index, lines = read_index(root)
    assert len(index) == 80 and lines == 81  # every append whole, on its own line
    assert len(list_entries(root)) == 80


def test_runs_show_says_what_the_seed_reached_not_the_report_keys():
    from hermetic.cli.runs_cmd import _seeded_text

    applied = {"startup": {"seed": 5, "seeded": ["random", "torch"]}, "final": {}, "versions": {}, "env": {},
               "schema": 1, "runtime_version": "1"}
    assert _seeded_text(applied) == "seeded at start-up: random, torch"
    applied["seed"] = {"value": 5, "source": "env", "seeded": ["random", "numpy", "torch"]}
    assert _seeded_text(applied).endswith("; by seed_everything: random, numpy, torch")
    assert _seeded_text({"startup": {"seed": 5, "seeded": []}}).startswith("nothing was seeded from it")
    assert _seeded_text({}) == "nothing reported"


def test_the_listed_metric_is_a_result_never_a_counter():
    """The listing's key metric: a usual name first (bare, under a framework's prefix too), else the first
    that is not a counter (hermetic.record.metrics.COUNTERS, the one list the figure and plots use) nor
    the learning rate."""
    from hermetic.cli.runs_cmd import key_metric
    from hermetic.record.metrics import COUNTERS

    assert key_metric({"accuracy": 0.9, "loss": 0.1}) == "loss"
    assert key_metric({"tensorboard/epoch": 3, "tensorboard/val_loss": 0.2, "a": 1}) == "tensorboard/val_loss"
    for counter in sorted(COUNTERS):
        assert key_metric({counter: 7, f"trainer/{counter}": 7, "lr": 0.1, "top1": 0.5}) == "top1"
    assert key_metric({"epoch": 1, "lr": 0.1}) == "epoch"  # nothing else: the first by name
    assert key_metric({}) is None
