"""hermetic diff: one planted difference is named, and only that one; verdicts and exit codes."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from conftest import run_cli

from hermetic.data.manifest import parse_manifest
from hermetic.diff import diff_records, diff_runs
from hermetic.diff.compare import INPUT_SECTIONS
from synthetic_records import DATA_MANIFEST, h, synthetic_record, write_synthetic_run

A = "20261129-214500-aaaaaa"
B = "20261129-220000-bbbbbb"


def hermetic(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd)


def pair(tmp_path, plant=None, manifest_b: str | None = None):
    """Write run A and run B (a copy of A with ``plant`` applied) and diff them from disk."""
    rec_a = synthetic_record(A)
    rec_b = synthetic_record(B, minutes=15)
    if plant:
        plant(rec_b)
    runs = tmp_path / "runs"
    write_synthetic_run(runs, rec_a)
    write_synthetic_run(runs, rec_b, {"mnist": manifest_b} if manifest_b else None)
    return runs, diff_runs(runs / A, runs / B)


def _image_package(rec):
    pkg = next(p for p in rec["image"]["packages"] if p["name"] == "numpy")
    pkg.update(version="2.2.0", sha256=h("numpy-2.2.0"), filename="numpy-2.2.0-py3-none-any.whl")
    rec["image"].update(id="sha256:" + h("image2"), manifest_digest="sha256:" + h("manifest2"), lock_sha256=h("lock2"))
    rec["software"]["numpy"]["version"] = "2.2.0"  # what the probe would then report
    rec["outputs"]["files"]["model.pt"]["sha256"] = h("model2")


def _code_line(rec):
    files = rec["code"]["snapshot"]["files"]
    files["train.py"] = h("train.py, one line changed")
    rec["code"]["snapshot"]["sha256"] = h("tree2")
    rec["metrics"]["final"]["loss"] = 0.0712


def _config_value(rec):
    cfg = rec["invocation"]["config"]
    cfg["determinism"]["threads"] = 4
    from hermetic.core.canonical import canonical_sha256
    rec["invocation"]["config_sha256"] = canonical_sha256(cfg)
    rec["outputs"]["files"]["model.pt"]["sha256"] = h("model2")


def _seed(rec):
    rec["seed"]["value"] = 1
    rec["seed"]["policy"] = "cli"  # --seed 1: the config is unchanged
    rec["metrics"]["final"]["loss"] = 0.0644


def _determinism_var(rec):
    del rec["env"]["determinism"]["CUBLAS_WORKSPACE_CONFIG"]
    del rec["software"]["env"]["CUBLAS_WORKSPACE_CONFIG"]  # the probe sees it missing too
    rec["outputs"]["files"]["model.pt"]["sha256"] = h("model2")


DATA_B = DATA_MANIFEST.replace(h("img3"), h("img3, one pixel changed"))


@pytest.mark.parametrize("section,plant,manifest_b,expect", [
    ("image", _image_package, None, "numpy 2.1.3 -> 2.2.0"),
    ("code", _code_line, None, "train.py changed"),
    ("config", _config_value, None, "determinism.threads 1 -> 4"),
    ("data", None, DATA_B, "mnist: train/0003.png changed"),
    ("seed", _seed, None, "seed 0 -> 1"),
    ("env", _determinism_var, None, "CUBLAS_WORKSPACE_CONFIG :4096:8 -> unset"),
])
def test_one_planted_difference_is_named_and_only_it(tmp_path, section, plant, manifest_b, expect):
    runs, d = pair(tmp_path, plant, manifest_b)
    inputs = [s.name for s in d.sections if s.role == "input" and s.differs]
    assert inputs == [section]
    assert d.verdict.kind == "inputs" and d.verdict.exit_code == 1
    assert d.verdict.line.startswith(f"inputs differ: {section} (")
    assert expect in d.verdict.line
    assert [c.note for c in d.section(section).material] == [expect] or section in ("image", "code")
    # the machine is the same: nothing there may be blamed
    assert [s.name for s in d.sections if s.role == "environment" and s.differs] == (
        ["software"] if section == "image" else [])
    # the CLI says the same, first line, and exits 1
    r = hermetic("diff", "--runs-dir", str(runs), A, B)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[0] == d.verdict.line


def test_image_diff_lists_the_package_first(tmp_path):
    _, d = pair(tmp_path, _image_package)
    notes = [c.note for c in d.section("image").material]
    assert notes[0] == "numpy 2.1.3 -> 2.2.0"
    assert any(n.startswith("image sha256:") for n in notes)


def test_data_diff_reads_manifest_copies(tmp_path):
    _, d = pair(tmp_path, None, DATA_B)
    [change] = d.section("data").material
    assert (change.key, change.kind) == ("mnist/train/0003.png", "changed")
    assert parse_manifest(DATA_B).entries["train/0003.png"] == change.b


def test_identical_runs(tmp_path):
    runs, d = pair(tmp_path)
    assert d.verdict.line == "bitwise identical (2 files and 2 metrics compared: metrics.jsonl, model.pt, accuracy, loss)"
    assert d.verdict.exit_code == 0 and d.outputs.identical
    assert not any(s.changes for s in d.sections if s.name in INPUT_SECTIONS)
    r = hermetic("diff", "--runs-dir", str(runs), A, B)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("bitwise identical (2 files and 2 metrics compared: ")
    r = hermetic("diff", "--json", str(runs / A), str(runs / B))
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["verdict"]["kind"] == "identical" and doc["outputs"]["identical"]


def test_same_inputs_different_output_is_nondeterminism(tmp_path):
    def plant(rec):
        rec["outputs"]["files"]["model.pt"]["sha256"] = h("model, other bits")
    _, d = pair(tmp_path, plant)
    assert d.verdict.kind == "nondeterminism"
    assert d.verdict.line == "same inputs, outputs differ: nondeterminism (all known determinism knobs were set)"
    [f] = [f for f in d.outputs.files if f.status != "equal"]
    assert f.path == "model.pt"


def test_nondeterminism_names_the_knobs_not_set():
    a, b = synthetic_record(A), synthetic_record(B)
    for rec in (a, b):
        for var in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"):
            del rec["env"]["determinism"][var]
        rec["software"]["torch"]["cudnn_benchmark"] = True
    b["metrics"]["final"]["loss"] = 0.0614
    d = diff_records(a, b)
    assert d.verdict.line == ("same inputs, outputs differ: nondeterminism (knobs not set: CUBLAS_WORKSPACE_CONFIG, "
                              "PYTHONHASHSEED, torch.backends.cudnn.benchmark=False)")


def test_metric_within_tolerance():
    a, b = synthetic_record(A), synthetic_record(B)
    b["metrics"]["final"]["loss"] = 0.0613 * (1 + 1e-7)
    b["metrics"]["final"]["accuracy"] = 0.9712
    d = diff_records(a, b, rtol=1e-5, atol=1e-8)
    status = {m.name: m.status for m in d.outputs.metrics}
    assert status == {"loss": "close", "accuracy": "different"}
    assert d.verdict.exit_code == 1  # close is not identical
    d = diff_records(a, b, rtol=0.0, atol=0.0)
    assert {m.name: m.status for m in d.outputs.metrics}["loss"] == "different"


def test_hardware_only_difference_says_so_and_warns_about_cublas():
    a, b = synthetic_record(A), synthetic_record(B)
    gpu = b["hardware"]["gpus"][0]
    gpu.update(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", sm_count=108, uuid="GPU-other")
    b["outputs"]["files"]["model.pt"]["sha256"] = h("model on A100")
    d = diff_records(a, b)
    assert d.verdict.kind == "environment"
    assert d.verdict.line.startswith("same inputs on different hardware, outputs differ: driver and GPU (")
    assert [s.name for s in d.sections if s.differs] == ["gpu"]
    assert any("cuBLAS only promises identical bits" in w and "sm_count 132 vs 108" in w for w in d.verdict.notes)
    # the same hardware change with identical outputs is still a success
    b["outputs"] = copy.deepcopy(a["outputs"])
    d = diff_records(a, b)
    assert d.verdict.line.startswith("bitwise identical (") and d.verdict.exit_code == 0
    assert any("machine differs" in n for n in d.verdict.notes)


def test_mig_slice_warns():
    a, b = synthetic_record(A), synthetic_record(B)
    b["hardware"]["gpus"][0].update(name="NVIDIA H200 MIG 3g.71gb", sm_count=60, mig_mode="enabled")
    b["metrics"]["final"]["loss"] = 0.0615
    d = diff_records(a, b)
    assert d.verdict.kind == "environment"
    [warning] = d.section("gpu").warnings
    assert "sm_count 132 vs 60, mig_mode disabled vs enabled" in warning and "MIG slice" in warning


def test_immaterial_differences_do_not_count():
    a, b = synthetic_record(A), synthetic_record(B)
    b["code"]["git"]["branch"] = "feature"      # same bytes, other branch name
    b["hardware"]["gpus"][0]["uuid"] = "GPU-x"   # another card of the same model
    b["hardware"]["gpus"][0]["clocks"]["sm_max_mhz"] = 1755
    b["hardware"]["gpus"][0]["pci_bus_id"] = "00000000:1A:00.0"
    b["hardware"]["kernel"]["release"] = "6.1.0-29-amd64"
    b["invocation"]["name"] = "again"
    d = diff_records(a, b)
    assert d.verdict.line == "bitwise identical (2 files and 2 metrics compared: metrics.jsonl, model.pt, accuracy, loss)"
    assert {c.key for s in d.sections for c in s.changes} == {
        "git.branch", "gpus[0].uuid", "gpus[0].clocks.sm_max_mhz", "gpus[0].pci_bus_id", "kernel.release"}
    assert not any(c.material for s in d.sections for c in s.changes)


def test_two_causes_most_likely_first():
    a, b = synthetic_record(A), synthetic_record(B)
    _seed(b)
    _image_package(b)
    d = diff_records(a, b)
    assert d.verdict.causes[:2] == ["image", "seed"]
    assert d.verdict.line.startswith("inputs differ: image (numpy 2.1.3 -> 2.2.0")
    assert "; then seed (seed 0 -> 1)" in d.verdict.line


def test_runs_that_are_not_there_exit_66(tmp_path):
    runs = tmp_path / "runs"
    write_synthetic_run(runs, synthetic_record(A))
    r = hermetic("diff", "--runs-dir", str(runs), A, "20991231")
    assert r.returncode == 66
    assert r.stderr.startswith("hermetic: error: 20991231: no run with this ID or prefix")
    r = hermetic("diff", str(runs / A), str(tmp_path / "nowhere"))
    assert r.returncode == 66 and "no such run directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = hermetic("diff", str(runs / A), str(tmp_path / "empty"))
    assert r.returncode == 66 and "no run.json here" in r.stderr
    assert "Traceback" not in r.stderr


def test_json_output_has_every_change(tmp_path):
    runs, d = pair(tmp_path, _image_package)
    r = hermetic("diff", "--json", "--runs-dir", str(runs), A[:16], B[:16])
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    image = next(s for s in doc["sections"] if s["name"] == "image")
    assert image["differs"] and {"key": "packages.numpy", "kind": "changed"}.items() <= image["changes"][0].items()
    assert doc["verdict"]["causes"] == ["image", "software"]


# --- files written under another name each run (makemore's TensorBoard event files) ---------------

def _logged(seed_host: str, volatile: bool, metrics: bool = False) -> dict:
    rec = synthetic_record()
    event = f"out/events.out.tfevents.1796123715.{seed_host}.8.0"
    rec["outputs"]["files"] = {"out/model.pt": {"sha256": h("model"), "size": 5},
                               event: {"sha256": h(event), "size": 40}}
    if volatile:
        rec["outputs"]["volatile"] = [event]
    if not metrics:
        rec["metrics"] = {"final": {}, "steps": None, "file": None}
    return rec


def test_a_volatile_file_is_kept_listed_and_never_compared():
    d = diff_records(_logged("a09514e7ee3d", True), _logged("093c9afaa36d", True))
    assert d.verdict.kind == "identical" and d.verdict.exit_code == 0
    # each run kept its own (one path in A, another in B): counted per run, not summed
    assert d.verdict.line == ("bitwise identical (1 file and 0 metrics compared: out/model.pt; "
                              "1 file in each run kept but not compared (run.outputs.volatile))")
    assert sorted(f.status for f in d.outputs.files) == ["equal", "not_compared", "not_compared"]


def test_only_volatile_files_is_nothing_compared_and_says_what_was_kept():
    a, b = _logged("a", True), _logged("b", True)
    for r in (a, b):
        del r["outputs"]["files"]["out/model.pt"]
    d = diff_records(a, b)
    assert d.verdict.kind == "nothing_compared"
    assert "kept but not compared" in d.outputs.summary()


def test_files_in_one_run_only_are_not_blamed_on_a_determinism_knob():
    # Records from before run.outputs.volatile (or a log it does not know): each run wrote one file the
    # other did not, and the file both wrote matched. That is a name, not the computation.
    d = diff_records(_logged("a09514e7ee3d", False), _logged("093c9afaa36d", False))
    assert d.verdict.kind == "nondeterminism" and d.verdict.exit_code == 1
    line = d.verdict.line
    assert line.startswith("same inputs, outputs differ: 2 files are in one run only "
                           "(out/events.out.tfevents.1796123715.093c9afaa36d.8.0 in B, "
                           "out/events.out.tfevents.1796123715.a09514e7ee3d.8.0 in A)"), line
    assert line.endswith("; the 1 file both runs wrote is identical (out/model.pt)"), line
    assert "knobs not set" not in line
    assert "run.outputs.volatile" in d.verdict.notes[0]


def test_a_changed_file_beside_an_unpaired_one_is_still_nondeterminism_with_the_knobs():
    a, b = _logged("a", False), _logged("b", False)
    b["outputs"]["files"]["out/model.pt"]["sha256"] = h("other model")
    d = diff_records(a, b)
    assert d.verdict.line.startswith("same inputs, outputs differ: nondeterminism (")


# --- causes before effects (issue 25) -------------------------------------------------------------

def test_what_the_runtime_reported_ranks_after_every_real_input():
    # A run that failed (ModuleNotFoundError) for want of PYTHONPATH, against a good one: which modules the
    # runtime got to seed follows from what the script imported; the variable is the cause.
    a, b = synthetic_record(A), synthetic_record(B)
    for rec, seeded in ((a, ["random", "torch"]), (b, ["random", "torch", "numpy"])):
        rec["seed"]["applied"] = {"startup": {"seeded": seeded}}
    b["env"]["passed"]["PYTHONPATH"] = "/workspace"
    a["record"].update(status="failed", exit_code=1)
    d = diff_records(a, b)
    assert d.verdict.causes == ["env", "seed"]
    assert d.verdict.line == ("inputs differ: env (PYTHONPATH unset -> /workspace); and what the runtime reported: "
                              "seed (applied.startup.seeded [random, torch] -> [random, torch, numpy])")
    assert all(c.effect for c in d.section("seed").material)
    # alone, it is still named (something made the runtime seed other modules), as what the runtime reported
    del b["env"]["passed"]["PYTHONPATH"]
    assert diff_records(a, b).verdict.line.startswith("inputs differ: what the runtime reported: seed (")
    # a real seed change beside it comes first within its section, and the section is a cause again
    b["seed"]["value"] = 7
    d = diff_records(a, b)
    assert d.verdict.line.startswith("inputs differ: seed (seed 0 -> 7; applied.startup.seeded")


def test_a_change_of_run_outputs_volatile_alone_is_no_cause(tmp_path):
    # hermetic.yaml changed (run.outputs.volatile) and was committed: the tree and the commit differ, but only
    # in a file the config section judges, and the key only steers hermetic's comparison.
    from hermetic.core.canonical import canonical_sha256

    def plant(rec):
        cfg = rec["invocation"]["config"]
        cfg["run"] = {"outputs": {"volatile": ["**/events.out.tfevents.*", "out/all_results.json"]}}
        rec["invocation"]["config_sha256"] = canonical_sha256(cfg)
        rec["code"]["snapshot"]["files"]["hermetic.yaml"] = h("hermetic.yaml, volatile added")
        rec["code"]["snapshot"]["sha256"] = h("tree with the new hermetic.yaml")
        rec["code"]["git"]["commit"] = h("the commit that changed it")[:40]

    def before(rec):
        rec["invocation"]["config"]["run"] = {"outputs": {"volatile": ["**/events.out.tfevents.*"]}}
        from hermetic.core.canonical import canonical_sha256 as c
        rec["invocation"]["config_sha256"] = c(rec["invocation"]["config"])
        rec["code"]["snapshot"]["files"]["hermetic.yaml"] = h("hermetic.yaml")

    a, b = synthetic_record(A), synthetic_record(B)
    before(a)
    plant(b)
    d = diff_records(a, b)
    assert [s.name for s in d.sections if s.differs] == []
    assert d.verdict.kind == "identical", d.verdict.line
    [change] = d.section("config").changes
    assert change.key == "run.outputs.volatile" and not change.material
    assert change.note.endswith("(steers hermetic's comparison, not the script)")
    assert {c.key for c in d.section("code").changes} == {"hermetic.yaml", "snapshot.sha256", "git.commit"}
    # the same commit changing train.py too: that is code, and the commit with it
    b["code"]["snapshot"]["files"]["train.py"] = h("train.py, changed")
    d = diff_records(a, b)
    assert d.verdict.line.startswith("inputs differ: code (train.py changed")
    assert any(c.key == "git.commit" and c.material for c in d.section("code").changes)


LONG_ARGS = ["--model_type", "gpt2", "--tokenizer_name", "tok", "--train_file", "data/train.txt",
             "--per_device_train_batch_size", "4", "--learning_rate", "5e-4", "--num_train_epochs", "1",
             "--seed", "42", "--output_dir", "out", "--do_train"]


def test_long_arguments_are_shown_as_the_tokens_that_changed(tmp_path):
    def plant(rec):
        rec["invocation"]["args"] = LONG_ARGS + ["--full_determinism"]
        rec["metrics"]["final"]["loss"] = 0.07

    def base(rec):
        rec["invocation"]["args"] = list(LONG_ARGS)

    rec_a, rec_b = synthetic_record(A), synthetic_record(B, minutes=15)
    base(rec_a)
    plant(rec_b)
    runs = tmp_path / "runs"
    write_synthetic_run(runs, rec_a)
    write_synthetic_run(runs, rec_b)
    d = diff_runs(runs / A, runs / B)
    assert d.verdict.line == ("inputs differ: config (arguments: added --full_determinism (the other 17 tokens "
                              "the same))")
    r = hermetic("diff", "--runs-dir", str(runs), A, B)
    assert r.returncode == 1
    assert r.stdout.count("--tokenizer_name") == 0  # the whole string: never, let alone three times
    assert r.stdout.count("added --full_determinism") == 3  # verdict, section line, its change
    from hermetic.diff.compare import changed_tokens

    other = list(LONG_ARGS)
    other[other.index("5e-4")] = "1e-3"
    assert changed_tokens(LONG_ARGS, other) == "--learning_rate 5e-4 -> 1e-3 (the other 16 tokens the same)"
    assert changed_tokens(LONG_ARGS, LONG_ARGS[:-1]) == "removed --do_train (the other 16 tokens the same)"
