"""Runs in MLflow (issue 18): `hermetic runs export --mlflow` and `hermetic run --mlflow`, against a real
`mlflow server` (sqlite backend, local artifacts) on 127.0.0.1, read back with MlflowClient."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from metric_runs import loss_curve, make_group, make_run
from registry_support import free_port
from run_support import hermetic_run, run_dir_of

RID = "20261129-214500-1a2b3c"


def export(*args: str, cwd: Path | None = None, env: dict | None = None) -> dict:
    proc = run_cli("runs", "export", "--json", *args, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def find_runs(client, experiment: str, hermetic_id: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`hermetic.run_id` = '{hermetic_id}'")


def test_a_run_becomes_one_mlflow_run_with_everything_and_exporting_again_adds_nothing(mlflow_server, tmp_path):
    root = tmp_path / "runs"
    rec = make_run(root, RID, steps=30)
    out = export("--mlflow", mlflow_server.uri, "--runs-dir", str(root), RID, "--experiment", "exp-a")
    [first] = out["exported"]
    assert first["id"] == RID and first["created"] is True and first["metrics_logged"] == 4 * 30
    client = mlflow_server.client()
    run = client.get_run(first["mlflow_run_id"])

    # params: resolved config (dotted), script, arguments, seed
    p = run.data.params
    assert p["script"] == "train.py" and p["args"] == "--epochs 3" and p["seed"] == "0"
    assert p["config.determinism.mode"] == "strict" and p["config.datasets.0.mount"] == "/data/mnist"
    assert p["config.name"] == "mnist-demo"
    # tags: what makes it repeatable
    t = run.data.tags
    assert t["hermetic.run_id"] == RID and t["hermetic.kind"] == "run" and t["hermetic.status"] == "succeeded"
    assert t["hermetic.image.id"] == rec["image"]["id"]
    assert t["hermetic.image.manifest_digest"] == rec["image"]["manifest_digest"]
    assert t["hermetic.lock_sha256"] == rec["image"]["lock_sha256"]
    assert t["hermetic.git.commit"] == rec["code"]["git"]["commit"] == t["mlflow.source.git.commit"]
    assert t["hermetic.git.dirty"] == "false" and t["hermetic.version"] == rec["record"]["tool"]
    assert t["hermetic.record_sha256"] == rec["record"]["record_sha256"]
    # metrics with their steps, nested names dotted
    for key, f in (("loss", loss_curve), ("acc", lambda s: 1 - loss_curve(s)), ("val.loss", lambda s: 2 * loss_curve(s))):
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert hist == [(s * 10, f(s)) for s in range(1, 31)], key
    assert run.data.metrics["loss"] == rec["metrics"]["final"]["loss"]
    # the dataset: MLflow's digest is the manifest sha256 (cut to MLflow's 36 characters), the whole one tagged
    [ds_input] = run.inputs.dataset_inputs
    sha = rec["data"]["mnist"]["manifest_sha256"]
    assert ds_input.dataset.name == "mnist" and ds_input.dataset.digest == sha[:36]
    assert {t.key: t.value for t in ds_input.tags}["hermetic.manifest_sha256"] == sha
    assert json.loads(ds_input.dataset.profile) == {"files": 8, "bytes": 8 * 784, "manifest_sha256": sha}
    # artifacts, times, status
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["README.md", "metrics.png", "run.json"]
    local = Path(client.download_artifacts(run.info.run_id, "run.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text()) == rec
    figure = Path(client.download_artifacts(run.info.run_id, "metrics.png", str(tmp_path / "dl")))
    drawn = run_cli("runs", "--runs-dir", str(root), "plot", RID, "-o", str(tmp_path / "plot.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert figure.read_bytes() == (tmp_path / "plot.png").read_bytes()  # the figure `runs plot RUN` draws
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (root / RID / "metrics.png").exists()
    assert run.info.status == "FINISHED" and run.info.run_name == RID
    assert run.info.end_time - run.info.start_time == 3 * 60 * 1000

    # again: the same MLflow run, nothing logged twice
    again = export("--mlflow", mlflow_server.uri, "--runs-dir", str(root), RID, "--experiment", "exp-a")["exported"][0]
    assert again["mlflow_run_id"] == first["mlflow_run_id"] and again["created"] is False
    assert again["metrics_logged"] == 0
    assert len(find_runs(client, "exp-a", RID)) == 1
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 30


def test_a_seed_group_is_a_parent_with_the_summary_and_its_members_as_children(mlflow_server, tmp_path):
    root = tmp_path / "runs"
    gid = "20261129-230000-9a9a9a-seeds"
    curves = [lambda s, k=k: loss_curve(s) * (1 + 0.1 * k) for k in range(3)]
    gdir = make_group(root, gid, curves, prefix="20261129-2201")
    group = json.loads((gdir / "group.json").read_text())
    make_run(root, "20261130-080000-0c0c0c")  # not in the group: exported on its own
    env = {"MLFLOW_TRACKING_URI": mlflow_server.uri}
    out = export("--mlflow", "--runs-dir", str(root), "--experiment", "exp-g", env=env)  # no RUN: everything
    kinds = sorted((e["kind"], e["id"]) for e in out["exported"])
    assert kinds == [("group", gid), ("run", "20261130-080000-0c0c0c")]
    [g] = [e for e in out["exported"] if e["kind"] == "group"]
    assert sorted(c["id"] for c in g["children"]) == [m["run_id"] for m in group["members"]]

    client = mlflow_server.client()
    parent = client.get_run(g["mlflow_run_id"])
    s = group["metrics"]["loss"]
    assert parent.data.tags["hermetic.kind"] == "group" and parent.data.params["seeds"] == "0,1,2"
    assert "config.determinism.seed" not in parent.data.params
    assert parent.data.metrics["loss.mean"] == pytest.approx(s["mean"], rel=1e-12)
    assert parent.data.metrics["loss.sd"] == pytest.approx(s["sd"], rel=1e-12)
    assert [parent.data.metrics["loss.ci95_low"], parent.data.metrics["loss.ci95_high"]] == pytest.approx(s["ci95"])
    assert parent.data.metrics["loss.n"] == 3
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["group.json"]
    exp = client.get_experiment_by_name("exp-g")
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(c.data.tags["hermetic.run_id"] for c in children) == [m["run_id"] for m in group["members"]]
    assert sorted(c.data.params["seed"] for c in children) == ["0", "1", "2"]

    # everything again: 5 MLflow runs still (parent, 3 children, the lone run), no new points
    out = export("--mlflow", mlflow_server.uri, "--runs-dir", str(root), "--experiment", "exp-g")
    flat = [x for e in out["exported"] for x in [e, *e["children"]]]
    assert len(flat) == 5 and not any(x["created"] for x in flat) and sum(x["metrics_logged"] for x in flat) == 0
    assert len(client.search_runs([exp.experiment_id])) == 5
    # a member exported by itself still hangs under its parent
    member = group["members"][1]["run_id"]
    one = export("--mlflow", mlflow_server.uri, "--runs-dir", str(root), "--experiment", "exp-g", member)
    run = client.get_run(one["exported"][0]["mlflow_run_id"])
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and not one["exported"][0]["created"]


@pytest.mark.mlflow  # MLflow's client, against a port where nothing listens (its retries take seconds)
def test_clear_errors_without_a_server_or_the_extra(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    make_run(root, RID)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    proc = run_cli("runs", "export", "--runs-dir", str(root), RID)
    assert_clean_error(proc, 64, "--mlflow")
    proc = run_cli("runs", "export", "--mlflow", "--runs-dir", str(root), RID)
    assert_clean_error(proc, 64, "MLFLOW_TRACKING_URI")
    # nothing listens on this port: a one-line error naming the server, no traceback
    dead = f"http://127.0.0.1:{free_port()}"
    proc = run_cli("runs", "export", "--mlflow", dead, "--runs-dir", str(root), RID, timeout=300)
    assert_clean_error(proc, 69, f"MLflow at {dead}")
    # mlflow not installed (sys.modules[name] = None is how Python blocks an import): the extra to install
    blocked = ("import sys; sys.modules['mlflow'] = None; from hermetic.cli import main; "
               f"main(['runs', 'export', '--mlflow', 'http://127.0.0.1:1', '--runs-dir', {str(root)!r}, {RID!r}])")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert_clean_error(proc, 69, "pip install 'hermetic[mlflow]'")


def test_bare_mlflow_takes_no_script_or_run_id_as_its_uri():
    from hermetic.cli.common import bare_mlflow_flags
    from hermetic.cli.run_cmd import run

    def parsed(args):
        return bare_mlflow_flags(args, run, interspersed=False)

    assert parsed(["--mlflow", "train.py", "--epochs", "3"]) == ["--mlflow=", "train.py", "--epochs", "3"]
    assert parsed(["--mlflow", "http://h:5000", "train.py"]) == ["--mlflow", "http://h:5000", "train.py"]
    assert parsed(["--gpus", "--mlflow", "--mlflow", "t.py"]) == ["--gpus", "--mlflow", "--mlflow=", "t.py"]
    # the script's own arguments are never touched
    assert parsed(["train.py", "--mlflow", "x"]) == ["train.py", "--mlflow", "x"]
    assert parsed(["--mlflow"]) == ["--mlflow="]
    ctx = run.make_context("run", ["--mlflow", "train.py", "--lr", "1"])
    assert ctx.params["mlflow_uri"] == "" and ctx.params["script"] == "train.py" and ctx.params["args"] == ("--lr", "1")


def test_other_commands_import_neither_mlflow_nor_matplotlib(tmp_path):
    root = tmp_path / "runs"
    make_run(root, RID)
    make_run(root, "20261129-214600-4d4d4d", minutes=1)
    for args in (["runs", "--runs-dir", str(root)], ["runs", "show", "--runs-dir", str(root), RID],
                 ["diff", str(root / RID), str(root / "20261129-214600-4d4d4d")], ["run", "--help"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermetic", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert {m.split(".")[0] for m in modules} & {"mlflow", "matplotlib", "PIL"} == set(), args


@pytest.mark.docker
def test_a_real_run_and_its_replay_in_mlflow(project, mlflow_server, tmp_path):
    """examples/numpy-logreg run with `hermetic run --mlflow URI`, replayed, then everything exported."""
    proc, rec = hermetic_run(project, "--mlflow", mlflow_server.uri, "train.py", "--epochs", "4")
    rid = rec["record"]["run_id"]
    assert f"exported {rid} to MLflow run" in proc.stderr
    client = mlflow_server.client()
    [run] = find_runs(client, "numpy-logreg", rid)  # the experiment is the project's name
    assert run.data.tags["hermetic.image.id"] == rec["image"]["id"]
    assert run.data.tags["hermetic.git.commit"] == "" and run.data.tags["hermetic.git.dirty"] == ""  # no git here
    lines = [json.loads(x) for x in (run_dir_of(project, rec) / "outputs" / "metrics.jsonl").read_text().splitlines()]
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test_loss"))
    assert hist == [(x["step"], x["test_loss"]) for x in lines] and len(hist) == 4
    for name, value in rec["metrics"]["final"].items():
        assert math.isclose(run.data.metrics[name], value, rel_tol=0, abs_tol=0), name
    [ds] = run.inputs.dataset_inputs
    assert ds.dataset.digest == rec["data"]["logreg"]["manifest_sha256"][:36]
    assert json.loads(ds.dataset.source)["uri"] == str((project / "data").resolve())
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"README.md", "metrics.png", "run.json"}  # the figure drawn for the export
    assert not (run_dir_of(project, rec) / "metrics.png").exists()  # not by the run, nor into its directory
    assert f"hermetic runs plot {rid} -o runs/{rid}/metrics.png" in (run_dir_of(project, rec) / "README.md").read_text()
    assert run.info.status == "FINISHED"

    replay = run_cli("replay", str(run_dir_of(project, rec)), "--json", cwd=project)
    assert replay.returncode == 0, replay.stderr[-3000:]
    replay_id = json.loads(replay.stdout)["replay"]
    out = export("--mlflow", mlflow_server.uri, cwd=project)
    by_id = {e["id"]: e for e in out["exported"]}
    assert by_id[rid]["created"] is False and by_id[replay_id]["created"] is True
    [r] = find_runs(client, "numpy-logreg", replay_id)
    assert r.data.tags["hermetic.replay_of"] == rid
    assert r.data.tags["hermetic.verdict"].startswith("bitwise identical (")
    assert r.data.tags["hermetic.verdict.kind"] == "identical"
    assert len(find_runs(client, "numpy-logreg", rid)) == 1



@pytest.mark.docker
def test_run_mlflow_checks_the_target_before_the_run(project, monkeypatch):
    """No URI, or no mlflow: refused before anything runs (no run directory), not after a long training."""
    from run_support import run_dirs

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = run_dirs(project)
    proc = run_cli("run", "--mlflow", "train.py", cwd=project)
    assert_clean_error(proc, 64, "MLFLOW_TRACKING_URI")
    blocked = ("import sys; sys.modules['mlflow'] = None; from hermetic.cli import main; "
               "main(['run', '--mlflow', 'http://127.0.0.1:1', 'train.py'])")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120, cwd=project)
    assert_clean_error(proc, 69, "pip install 'hermetic[mlflow]'")
    assert run_dirs(project) == before


# ---------------------------------------------------------------- issue 25: the extra alone, no mount, never RUNNING


def _run_without_mount(root: Path, run_id: str, *, minutes: int = 0) -> dict:
    """A finished run whose dataset has no mount: (what `hermetic init` writes) and whose metrics come from
    the Trainer's trainer_state.json, not metrics.jsonl."""
    from datetime import timedelta

    from hermetic.record import finish_record, write_record
    from hermetic.record.rundir import create_run_dir
    from synthetic_records import DATA_MANIFEST, T0, synthetic_record

    rec = synthetic_record(run_id, minutes=minutes)
    rec["data"]["mnist"]["mount"] = None
    for ds in rec["invocation"]["config"]["datasets"]:
        ds.pop("mount", None)
    run_dir = create_run_dir(root, run_id)
    (run_dir / "data" / "mnist.sha256").write_text(DATA_MANIFEST)
    (run_dir / "outputs" / "out").mkdir()
    history = [{"loss": 1.0 / s, "learning_rate": 0.01, "epoch": s / 10, "step": s} for s in range(1, 21)]
    history.append({"train_runtime": 3.5, "train_samples_per_second": 11.0, "train_loss": 0.2, "step": 20})
    (run_dir / "outputs" / "out" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    (run_dir / "outputs" / "out" / "eval_results.json").write_text(json.dumps({"eval_loss": 0.5}))
    done = finish_record(rec, run_dir, status="succeeded", exit_code=0, finished_at=T0 + timedelta(minutes=minutes + 3))
    return write_record(run_dir, done)


@pytest.fixture(scope="module")
def skinny_venv(tmp_path_factory) -> Path:
    """A fresh venv with hermetic (editable, from this checkout) and only its own dependencies and the mlflow
    extra's (mlflow-skinny: no numpy, no pandas), pinned to the project's lock; uv installs them from PyPI."""
    from conftest import REPO

    uv = Path(sys.executable).with_name("uv")
    venv = tmp_path_factory.mktemp("skinny") / "venv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=300)
    pins = tmp_path_factory.mktemp("pins") / "constraints.txt"
    lines = (REPO / "requirements.lock").read_text().splitlines()
    pins.write_text("".join(ln.rstrip(" \\") + "\n" for ln in lines if ln[:1].isalnum() and "==" in ln))
    proc = subprocess.run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-c", str(pins),
                           "-e", f"{REPO}[mlflow]"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    no_numpy = subprocess.run([str(venv / "bin" / "python"), "-c", "import numpy"], capture_output=True, timeout=60)
    assert no_numpy.returncode != 0  # what the extra brings: the full mlflow (and numpy) is not there
    return venv


def test_the_extra_alone_exports_runs_whose_dataset_has_no_mount(skinny_venv, mlflow_server, tmp_path):
    root = tmp_path / "runs"
    ids = [f"20261201-0900{i:02d}-{0xa00000 + i:06x}" for i in range(3)]
    recs = [_run_without_mount(root, rid, minutes=i) for i, rid in enumerate(ids)]
    proc = subprocess.run([str(skinny_venv / "bin" / "hermetic"), "runs", "export", "--json", "--mlflow",
                           mlflow_server.uri, "--runs-dir", str(root), "--experiment", "skinny"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    exported = {e["id"]: e for e in json.loads(proc.stdout)["exported"]}
    assert sorted(exported) == ids
    client = mlflow_server.client()
    for rid, rec in zip(ids, recs):
        run = client.get_run(exported[rid]["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        [ds] = run.inputs.dataset_inputs
        assert ds.dataset.digest == rec["data"]["mnist"]["manifest_sha256"][:36]
        tags = {t.key: t.value for t in ds.tags}
        assert "hermetic.mount" not in tags and tags["hermetic.manifest_sha256"] == rec["data"]["mnist"]["manifest_sha256"]
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "trainer/loss"))
        assert hist == [(s, 1.0 / s) for s in range(1, 21)]
        assert run.data.metrics["trainer/eval_loss"] == 0.5
        assert run.data.metrics["trainer/train_runtime"] == 3.5  # wall-clock figures go to MLflow too
    # again, from the extra alone: nothing logged twice
    again = subprocess.run([str(skinny_venv / "bin" / "hermetic"), "runs", "export", "--json", "--mlflow",
                            mlflow_server.uri, "--runs-dir", str(root), "--experiment", "skinny"],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert all(not e["created"] and e["metrics_logged"] == 0 for e in json.loads(again.stdout)["exported"])


def test_an_export_that_fails_part_way_ends_its_mlflow_run_failed(mlflow_server, tmp_path):
    """The experiment's artifacts go where nothing can be written (a file stands where its directory would be):
    the export fails after the MLflow run exists; the run is FAILED, never left RUNNING."""
    root = tmp_path / "runs"
    _run_without_mount(root, RID)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    client = mlflow_server.client()
    client.create_experiment("broken-artifacts", artifact_location=str(blocker / "artifacts"))
    proc = run_cli("runs", "export", "--mlflow", mlflow_server.uri, "--runs-dir", str(root), RID,
                   "--experiment", "broken-artifacts")
    assert_clean_error(proc, 69, f"MLflow at {mlflow_server.uri}")
    [run] = find_runs(client, "broken-artifacts", RID)
    assert run.info.status == "FAILED" and run.info.end_time is not None
