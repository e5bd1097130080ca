"""The two examples under `hermetic run`, in their real images (issue 6).

Each example is copied, pinned to the session's base and built once per run of the suite
(run_support's `logreg` and `torch_project`: this module's own checkouts of those builds).
Two runs give the same bytes (hermetic diff's verdict and the outputs'
sha256); a run stopped right after its checkpoint and resumed with
`--resume-from` ends bit for bit like an uninterrupted one; the in-image
runtime reports the seed and determinism settings it applied, and another seed
changes the weights. The data generators must reproduce the committed
manifests on any host (no engine needed for that).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from run_support import EXAMPLES, diff_json, hermetic_run, output_digests, run_dir_of, sha256_file

SEED = 1234
NUMPY_OUTPUTS = {"metrics.jsonl", "weights.bin", "weights.json", "checkpoint.ckpt"}
TORCH_OUTPUTS = {"metrics.jsonl", "weights.bin", "weights.json", "checkpoint.pt"}


def read_manifest(path: Path) -> dict[str, str]:
    """`sha256sum -c` format -> {relative path: hex}."""
    out = {}
    for line in path.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        out[rel] = digest
    return out


@pytest.mark.parametrize("example", ["numpy-logreg", "torch-mlp", "torch-ddp"])
def test_make_data_reproduces_the_committed_manifest(example, tmp_path):
    manifest = read_manifest(EXAMPLES / example / "data.sha256")
    assert list(manifest) == sorted(manifest), "manifest lines must be sorted by path"
    subprocess.run([sys.executable, str(EXAMPLES / example / "make_data.py"), "--out", str(tmp_path / "data")],
                   check=True, capture_output=True, timeout=120)
    made = {p.name: sha256_file(p) for p in sorted((tmp_path / "data").iterdir())}
    assert made == manifest


def assert_identical(proj: Path, a: dict, b: dict, names: set[str]) -> None:
    """Same bytes by hermetic diff's verdict and by the outputs' own sha256."""
    code, d = diff_json(run_dir_of(proj, a), run_dir_of(proj, b))
    assert (code, d["verdict"]["kind"]) == (0, "identical"), d["verdict"]
    assert d["verdict"]["line"].startswith("bitwise identical (") and "compared: " in d["verdict"]["line"]
    da, db = output_digests(run_dir_of(proj, a)), output_digests(run_dir_of(proj, b))
    assert set(da) == names and da == db
    assert {k: v["sha256"] for k, v in b["outputs"]["files"].items()} == db


def assert_resume_equals(proj: Path, full: dict, checkpoint: str, *args: str) -> None:
    """--stop-after-checkpoint, then --resume-from that run with --resume == the uninterrupted run."""
    _, stopped = hermetic_run(proj, "train.py", *args, "--stop-after-checkpoint")
    sd = run_dir_of(proj, stopped)
    assert (sd / "outputs" / checkpoint).is_file() and not (sd / "outputs" / "weights.bin").exists()
    stopped_lines = (sd / "outputs" / "metrics.jsonl").read_text().count("\n")
    assert 0 < stopped_lines < (run_dir_of(proj, full) / "outputs" / "metrics.jsonl").read_text().count("\n")
    _, resumed = hermetic_run(proj, "--resume-from", stopped["record"]["run_id"], "train.py", *args, "--resume")
    rd = run_dir_of(proj, resumed)
    full_digests = output_digests(run_dir_of(proj, full))
    assert output_digests(rd) == full_digests
    assert output_digests(sd)[checkpoint] == full_digests[checkpoint]  # the resumed run started from it
    ckpt = resumed["seed"]["applied"]["checkpoint"]
    assert ckpt["resumed_from"]["sha256"] == full_digests[checkpoint] and "last_saved" not in ckpt
    _, d = diff_json(run_dir_of(proj, full), rd)
    assert d["outputs"]["identical"] is True  # the arguments differ (--resume); the bytes do not


def assert_runtime_report(proj: Path, rec: dict, seed: int = SEED) -> dict:
    """What the runtime in the image says it applied (the record's seed.applied), no warnings."""
    assert "hermetic_runtime: warning" not in (run_dir_of(proj, rec) / "logs" / "stderr.log").read_text()
    applied = rec["seed"]["applied"]
    assert applied["schema"] == "hermetic-runtime-report/1"
    assert applied["seed"]["value"] == seed and applied["seed"]["source"] == "env:HERMETIC_SEED"
    assert applied["determinism"]["mode"] == "strict" and applied["determinism"]["warnings"] == []
    assert applied["determinism"]["env_missing"] == []
    return applied


# --- numpy-logreg ---------------------------------------------------------------------------------

@pytest.mark.docker
def test_numpy_logreg_repeats_resumes_and_takes_its_seed(logreg):
    _, a = hermetic_run(logreg, "train.py")
    _, b = hermetic_run(logreg, "train.py")
    assert_identical(logreg, a, b, NUMPY_OUTPUTS)
    applied = assert_runtime_report(logreg, a)
    assert {"python", "numpy", "numpy.Generator"} <= set(applied["seed"]["seeded"])
    assert "resumed_from" not in applied["checkpoint"]
    assert applied["checkpoint"]["last_saved"]["sha256"] == a["outputs"]["files"]["checkpoint.ckpt"]["sha256"]
    assert_resume_equals(logreg, a, "checkpoint.ckpt")
    _, other = hermetic_run(logreg, "--seed", str(SEED + 1), "train.py")
    assert_runtime_report(logreg, other, SEED + 1)
    assert other["outputs"]["files"]["weights.bin"]["sha256"] != a["outputs"]["files"]["weights.bin"]["sha256"]


# --- torch-mlp ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_mlp(torch_project, torch_built) -> tuple[Path, dict]:
    """This module's checkout of the torch example and the JSON of the build that made its image."""
    return torch_project, torch_built[1]


@pytest.fixture(scope="module")
def torch_pair(torch_mlp) -> tuple[dict, dict]:
    proj, _ = torch_mlp
    return hermetic_run(proj, "train.py")[1], hermetic_run(proj, "train.py")[1]


@pytest.mark.docker
@pytest.mark.slow
def test_torch_mlp_two_runs_are_bitwise_identical(torch_mlp, torch_pair):
    proj, _ = torch_mlp
    a, b = torch_pair
    assert_identical(proj, a, b, TORCH_OUTPUTS)
    assert a["software"]["torch"]["version"] == "2.13.0+cpu"
    assert {p["name"]: p["version"] for p in a["image"]["packages"]}["torch"] == "2.13.0+cpu"


@pytest.mark.docker
@pytest.mark.slow
def test_torch_mlp_stop_and_resume_equals_an_uninterrupted_run(torch_mlp, torch_pair):
    proj, _ = torch_mlp
    assert_resume_equals(proj, torch_pair[0], "checkpoint.pt")


@pytest.mark.docker
@pytest.mark.slow
def test_torch_mlp_applies_seed_and_determinism(torch_mlp, torch_pair):
    proj, _ = torch_mlp
    applied = assert_runtime_report(proj, torch_pair[0])
    assert "torch" in applied["seed"]["seeded"]
    assert applied["determinism"]["torch"]["use_deterministic_algorithms"] is True
    assert applied["determinism"]["torch"]["cudnn.benchmark"] is False
    assert applied["determinism"]["torch"]["fill_uninitialized_memory"] is True  # torch >= 2.1, set by strict mode
    assert torch_pair[0]["env"]["determinism"]["NCCL_NVLS_ENABLE"] == "0"  # NVLS reductions off (nccl#1497)
    assert applied["dataloader"]["seed"] == SEED
    # torch's default seed is a constant, so equal runs alone would not show that the seed is
    # applied: another seed must change the weights (one epoch each, to keep this short)
    _, same = hermetic_run(proj, "train.py", "--epochs", "1")
    _, other = hermetic_run(proj, "--seed", str(SEED + 1), "train.py", "--epochs", "1")
    assert other["seed"]["applied"]["dataloader"]["seed"] == SEED + 1
    weights = [r["outputs"]["files"]["weights.bin"]["sha256"] for r in (same, other, torch_pair[0])]
    assert len(set(weights)) == 3  # the seed and --epochs both reach the run


@pytest.mark.docker
@pytest.mark.slow
def test_torch_mlp_diff_finds_no_missing_knob(torch_mlp, torch_pair):
    proj, _ = torch_mlp
    _, d = diff_json(*(run_dir_of(proj, r) for r in torch_pair))
    assert d["verdict"]["knobs_not_set"] == []


@pytest.mark.docker
@pytest.mark.slow
def test_torch_image_runs_under_plain_docker_by_the_printed_id(torch_mlp, docker_client):
    proj, built = torch_mlp
    image_id = built["image_id"]
    inspect = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image_id],
                             capture_output=True, text=True, timeout=60)
    assert inspect.returncode == 0, inspect.stderr
    assert inspect.stdout.strip() == image_id == docker_client.images.get(image_id).id
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", image_id, "python", "-c",
                           "import torch, numpy; print(torch.__version__, numpy.__version__)"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (numpy_pin,) = re.findall(r"(?m)^numpy==(\S+)", (proj / "requirements.lock").read_text())
    assert proc.stdout.split() == ["2.13.0+cpu", numpy_pin]


@pytest.mark.docker
@pytest.mark.slow
def test_the_prepared_gpu_check_runs_every_section_as_a_cpu_rehearsal(torch_mlp, docker_client, tmp_path):
    # bench/gpu_check.py gets a few minutes on a lent GPU machine (issue 17): every section must work
    # before then. In the torch image, on the CPU, it runs them all and writes what it measured.
    _, built = torch_mlp
    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "gpu-check"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{repo}:/src:ro", "-v", f"{out}:/out",
                           "--tmpfs", "/tmp", "-w", "/src", "-e", "HOME=/tmp", "--user", "1000:1000", built["image_id"],
                           "/opt/venv/bin/python", "bench/gpu_check.py", "--rehearse-on-cpu", "--out", "/out",
                           "--budget", "240"], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["rehearsal"] is True and report["device"] == "cpu"
    for name in ("probe", "nondeterministic_ops", "torch_mlp_cuda", "strict_knobs"):
        assert "result" in report[name], (name, report[name])
    train = report["torch_mlp_cuda"]["result"]["summary"]
    assert train["strict"]["all_exit_0"] and train["strict"]["weights_bitwise_equal"]
    knobs = report["strict_knobs"]["result"]
    assert knobs["fill_uninitialized_memory"] is True and knobs["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert (out / "probe.json").is_file()
    assert "a CPU rehearsal" in proc.stdout


@pytest.mark.parametrize("example", ["numpy-logreg", "torch-mlp"])
def test_the_examples_build_to_their_committed_image(example, request, base_ref):
    """The identity promise on the examples: from the committed inputs, this tree builds the image ID and
    manifest digest their hermetic.image.json names. A change to what goes into an image (the runtime
    layer, a label, the config's canonical form) fails here until the examples are rebuilt and recommitted
    with the reason. Only where the session's base is the one the examples pin (Debian's mirror moves)."""
    committed = json.loads((EXAMPLES / example / "hermetic.image.json").read_text())
    if committed["base"]["reference"] != base_ref:
        pytest.skip(f"the session's base {base_ref} is not the examples' pin {committed['base']['reference']}")
    _, built = request.getfixturevalue("logreg_built" if example == "numpy-logreg" else "torch_built")
    assert (built["image_id"], built["manifest_digest"]) == (committed["image_id"], committed["manifest_digest"])
