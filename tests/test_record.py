"""The run record: schema, seal, secrets, run dir, README, metrics and output summaries."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone

import pytest

from hermetic.core.canonical import canonical_json
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.record import (
    begin_record, create_run_dir, env_section, finish_record, hash_outputs, is_secret_name, load_record,
    metrics_summary, new_run_id, render_readme, seal, validate_record, verify_seal, write_record,
)
from hermetic.record.schema import RecordError
from synthetic_records import synthetic_record
from hermetic.core.resources import template_path

RID = "20261129-214500-1a2b3c"


def test_round_trip_write_then_load(tmp_path):
    run_dir = create_run_dir(tmp_path / "runs", RID)
    written = write_record(run_dir, synthetic_record(RID))
    loaded = load_record(run_dir)
    assert loaded == written
    assert verify_seal(loaded)
    assert load_record(run_dir / "run.json") == written
    text = (run_dir / "run.json").read_text()
    assert text.startswith("{\n  ")  # pretty for people...
    assert json.loads(text)["record"]["record_sha256"] == written["record"]["record_sha256"]
    # ...while the seal is over the canonical form: reformatting keeps it valid
    (run_dir / "run.json").write_bytes(canonical_json(loaded))
    assert load_record(run_dir) == written


def test_create_run_dir_makes_subdirs_and_refuses_reuse(tmp_path):
    run_dir = create_run_dir(tmp_path / "runs", RID)
    assert sorted(p.name for p in run_dir.iterdir()) == ["code", "data", "logs", "outputs"]
    with pytest.raises(HermeticError, match="already exists"):
        create_run_dir(tmp_path / "runs", RID)
    with pytest.raises(HermeticError, match="not a run ID"):
        create_run_dir(tmp_path / "runs", "../escape")


def test_tampered_record_is_reported(tmp_path):
    run_dir = create_run_dir(tmp_path, RID)
    write_record(run_dir, synthetic_record(RID))
    doc = json.loads((run_dir / "run.json").read_text())
    doc["metrics"]["final"]["accuracy"] = 0.99  # a nicer number, after the fact
    (run_dir / "run.json").write_text(json.dumps(doc, indent=2))
    with pytest.raises(IntegrityError, match="record_sha256 does not match") as e:
        load_record(run_dir)
    assert e.value.exit_code == 65


def test_seal_and_verify():
    rec = synthetic_record(RID)
    sealed = seal(rec)
    assert rec["record"]["record_sha256"] == ""  # seal copies
    assert verify_seal(sealed)
    sealed["seed"]["value"] = 7
    assert not verify_seal(sealed)


def _mutate(path: str, value):
    def apply(rec):
        node = rec
        *parents, last = path.split(".")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
        return rec
    return apply


_DELETE = object()


@pytest.mark.parametrize("path,value,expected", [
    ("image.packages.1.sha256", "xyz", r"image\.packages\[1\]\.sha256: must be 64 lowercase hex"),
    ("image.id", "abc", r"image\.id: must be 'sha256:'"),
    ("record.status", "ok", r"record\.status: .*'succeeded'"),
    ("record.started_at", "yesterday", r"record\.started_at: must be an ISO 8601 UTC time"),
    ("seed.value", "0", r"seed\.value: .*integer.* \(got a string\)"),
    ("seed.value", True, r"seed\.value: .*integer"),
    ("data.mnist.count", -1, r"data\.mnist\.count: .*greater than or equal to 0"),
    ("metrics.final.loss", True, r"metrics\.final\.loss: "),
    ("metrics.final.loss", float("nan"), r"metrics\.final\.loss: "),
    ("invocation.network", "bridge", r"invocation\.network: "),
    ("outputs.files", {"../x": {"sha256": "0" * 64, "size": 1}}, r'outputs\.files\["\.\./x"\]: must be a relative'),
    ("code.snapshot.file", "src.tar", r"code\.snapshot\.file: "),
    ("data.mnist.manifest_file", "data/other.sha256", r"data\.mnist\.manifest_file: must be 'data/mnist\.sha256'"),
    ("invocation.gpus", _DELETE, r"invocation\.gpus: required key is missing"),
    ("image.surprise", 1, r"image\.surprise: unknown key"),
    ("env.passed", {"HF_TOKEN": "hf_abc"}, r"env\.passed\.HF_TOKEN: looks like a secret"),
])
def test_malformed_records_name_the_key(path, value, expected):
    rec = _mutate(path, value)(synthetic_record(RID))
    with pytest.raises(RecordError, match=expected) as e:
        validate_record(rec, sealed=False)
    assert e.value.exit_code == 65
    assert "\n" not in str(e.value)


def test_unsealed_record_is_refused_on_load_shape():
    with pytest.raises(RecordError, match=r"record\.record_sha256: is empty"):
        validate_record(synthetic_record(RID), sealed=True)


def test_write_record_refuses_malformed_and_writes_nothing(tmp_path):
    run_dir = create_run_dir(tmp_path, RID)
    rec = synthetic_record(RID)
    del rec["seed"]["policy"]
    with pytest.raises(RecordError, match=r"seed\.policy: required key is missing"):
        write_record(run_dir, rec)
    assert not (run_dir / "run.json").exists()
    with pytest.raises(RecordError, match="does not match the directory name"):
        write_record(run_dir, synthetic_record("20261129-214500-ffffff"))


def test_write_record_refuses_nan_outside_metrics(tmp_path):
    run_dir = create_run_dir(tmp_path, RID)
    rec = synthetic_record(RID)
    rec["hardware"]["memory_bytes"] = float("inf")
    with pytest.raises(RecordError, match="NaN|Infinity|JSON"):
        write_record(run_dir, rec)


@pytest.mark.parametrize("name,secret", [
    ("WANDB_API_KEY", True), ("hf_token", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("MY_CREDENTIAL_FILE", True),
    ("CUBLAS_WORKSPACE_CONFIG", False), ("PYTHONHASHSEED", False), ("OMP_NUM_THREADS", False), ("LR", False),
])
def test_is_secret_name(name, secret):
    assert is_secret_name(name) is secret


def test_secret_values_are_never_written(tmp_path):
    run_dir = create_run_dir(tmp_path, RID)
    rec = synthetic_record(RID)
    rec["env"]["passed"] = {"WANDB_API_KEY": "wk-very-secret-1", "LR": "0.1"}
    rec["env"]["determinism"]["HF_TOKEN"] = "hf-very-secret-2"
    rec["invocation"]["config"]["env"] = {"GITHUB_TOKEN": "ghp-very-secret-3", "MODE": "fast"}
    written = write_record(run_dir, rec)
    assert written["env"]["passed"] == {"LR": "0.1"}
    assert written["env"]["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert written["invocation"]["config"]["env"] == {"GITHUB_TOKEN": "<redacted>", "MODE": "fast"}
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert b"very-secret" not in f.read_bytes(), f
    assert b"very-secret" not in (tmp_path / ".index.jsonl").read_bytes()
    assert env_section({"A_KEY": "x"}, {"B": "y", "C_PASSWORD": "z"}) == {
        "determinism": {}, "passed": {"B": "y"}, "secrets": ["A_KEY", "C_PASSWORD"]}


def test_new_run_id_is_sortable_and_named():
    t1 = datetime(2026, 11, 29, 21, 45, 0, tzinfo=timezone.utc)
    t2 = datetime(2026, 11, 29, 21, 45, 1, tzinfo=timezone.utc)
    a, b = new_run_id(t1), new_run_id(t2, name="My Run/ v2!")
    assert re.fullmatch(r"20261129-214500-[0-9a-f]{6}", a)
    assert re.fullmatch(r"20261129-214501-[0-9a-f]{6}-my-run-v2", b)
    assert sorted([b, a]) == [a, b]
    assert new_run_id(t1) != new_run_id(t1)


def test_metrics_summary(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "loss": 2.5, "val": {"acc": 0.5}, "time": 1700000000.1}\n'
                 '{"step": 2, "loss": 1.5, "lr": 0.1, "done": true}\n'
                 '{"step": 3, "loss": NaN}\n'
                 '{"step": 4, "loss": 0.')  # a writer killed mid-line
    assert metrics_summary(p) == {"final": {"loss": "NaN", "lr": 0.1, "val.acc": 0.5}, "steps": 3}
    p.write_text('{"loss": 1}\n{"loss": 2}\n')
    assert metrics_summary(p) == {"final": {"loss": 2}, "steps": 2}
    p.write_text('{"loss": 1}\nnot json\n{"loss": 2}\n')
    with pytest.raises(HermeticError, match=r"metrics\.jsonl:2: not a JSON object"):
        metrics_summary(p)
    assert metrics_summary(tmp_path / "absent.jsonl") == {"final": {}, "steps": None}


def test_hash_outputs(tmp_path):
    out = tmp_path / "outputs"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "model.pt").write_bytes(b"weights")
    (out / "metrics.jsonl").write_text('{"loss": 1}\n')
    os.symlink("ckpt/model.pt", out / "latest.pt")
    files = hash_outputs(out)["files"]
    assert list(files) == ["ckpt/model.pt", "latest.pt", "metrics.jsonl"]
    assert files["ckpt/model.pt"] == {"sha256": hashlib.sha256(b"weights").hexdigest(), "size": 7}
    assert files["latest.pt"]["symlink"] == "ckpt/model.pt"


def test_begin_and_finish_record(tmp_path):
    run_dir = create_run_dir(tmp_path, RID)
    full = synthetic_record(RID)
    rec = begin_record(RID, argv=["hermetic", "run", "train.py"], script="train.py", args=[],
                       config=full["invocation"]["config"], config_sha256=full["invocation"]["config_sha256"],
                       started_at=datetime(2026, 11, 29, 21, 45, tzinfo=timezone.utc), gpus=None)
    with pytest.raises(RecordError, match=r"^.*run\.json: image: "):
        write_record(run_dir, rec)
    for key in ("image", "code", "data", "seed", "env", "software", "hardware"):
        rec[key] = full[key]
    early = write_record(run_dir, rec)
    assert early["record"]["status"] == "interrupted" and early["record"]["finished_at"] is None
    (run_dir / "outputs" / "metrics.jsonl").write_text('{"step": 10, "loss": 0.25}\n')
    (run_dir / "outputs" / "model.pt").write_bytes(b"w")
    done = write_record(run_dir, finish_record(rec, run_dir, status="succeeded", exit_code=0))
    m = done["metrics"]
    assert (m["final"], m["steps"], m["file"]) == ({"loss": 0.25}, 10, "outputs/metrics.jsonl")
    assert m["sources"] == {"metrics.jsonl": {"files": ["metrics.jsonl"], "metrics": ["loss"]}}
    assert m["series"]["file"] == "metrics/series.jsonl" and m["series"]["points"] == 1
    assert sorted(done["outputs"]["files"]) == ["metrics.jsonl", "model.pt"]
    assert load_record(run_dir)["record"]["status"] == "succeeded"


def test_readme_explains_how_to_reproduce(tmp_path):
    assert template_path("run-README.md").is_file()
    run_dir = create_run_dir(tmp_path, RID)
    rec = synthetic_record(RID)
    rec["env"]["passed"] = {"WANDB_API_KEY": "s3cret"}
    written = write_record(run_dir, rec)
    text = (run_dir / "README.md").read_text()
    assert text == render_readme(written)
    assert f"hermetic replay runs/{RID}" in text
    assert written["image"]["id"] in text and written["image"]["manifest_digest"] in text
    assert "docker run --rm --network none" in text and "--gpus all" in text
    assert '-v "$PWD/data/mnist:/data/mnist:ro"' in text and "data/mnist.sha256" in text
    assert "Seed 0" in text
    assert written["code"]["git"]["commit"] in text
    assert "-e WANDB_API_KEY \\" in text and "s3cret" not in text
    assert "$" + "{" not in text and "$run_id" not in text  # every placeholder filled


def test_the_package_imports_its_modules_on_first_use():
    """`import hermetic.record` costs nothing before a run's container starts: each public name is imported from
    its module when first asked for, and names that are also a module's (seal) stay the function."""
    import subprocess
    import sys

    code = ("import sys, hermetic.record as r\n"
            "before = sorted(m for m in sys.modules if m.startswith('hermetic.record.'))\n"
            "import hermetic.record.rundir\n"
            "assert callable(r.seal) and callable(r.verify_seal), r.seal\n"
            "missing = [n for n in r.__all__ if not callable(getattr(r, n))]\n"
            "print(before, missing)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hermetic.record.seal'] []"
