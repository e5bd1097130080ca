"""Secrets are never baked (issue 24, item 9): a secret given at run time reaches the container and no file
hermetic writes, whether it is one to commit (hermetic.image.json, hermetic.provenance.json), one to push
(the image itself) or one to share (the run's record, code snapshot and diff).

One real run on the real engine: the project is a git checkout with a tracked change (so the run keeps
code/diff.patch) and an untracked script (so code/source.tar holds files git has not seen), and its
hermetic.yaml gains an `env:` entry, so that this very command builds a new image and writes the image
record and the provenance while the secrets are in its argv and its environment. A secret-looking name
in hermetic.yaml itself is refused before any of this (tests/test_config.py).
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from run_support import copy_project, git_commit_all, hermetic_run, run_dir_of

pytestmark = pytest.mark.docker

BY_VALUE = "hf-secret-value-7c41e93b0d"  # --env HF_TOKEN=<value>: on the command line
BY_NAME = "wandb-secret-value-5a82f1c6e4"  # --env WANDB_API_KEY: from hermetic's own environment
SECRETS = (BY_VALUE, BY_NAME)

SHOW_DIGESTS = """import hashlib, os
for name in ("HF_TOKEN", "WANDB_API_KEY"):
    print(name, hashlib.sha256(os.environ.get(name, "").encode()).hexdigest())
"""


def leaks(data: bytes) -> list[str]:
    return [s for s in SECRETS if s.encode() in data]


@pytest.fixture(scope="module")
def secret_run(logreg, tmp_path_factory, docker_client):
    project = copy_project(logreg, tmp_path_factory.mktemp("secrets") / "numpy-logreg")
    git_commit_all(project, "clean")  # data/ and runs/ ignored
    with open(project / "hermetic.yaml", "a") as f:  # a new image config: this run builds (and records) it
        f.write("env:\n  PLAIN_FLAG: visible\n")
    with open(project / "train.py", "a") as f:  # a tracked change: the run keeps code/diff.patch
        f.write("# changed after the commit\n")
    (project / "show_secrets.py").write_text(SHOW_DIGESTS)  # untracked: in source.tar only
    before = {p: p.stat().st_mtime_ns for p in (project / "hermetic.image.json", project / "hermetic.provenance.json")}
    proc, rec = hermetic_run(project, "--env", f"HF_TOKEN={BY_VALUE}", "--env", "WANDB_API_KEY",
                             "show_secrets.py", env={"WANDB_API_KEY": BY_NAME})
    return {"project": project, "proc": proc, "rec": rec, "run_dir": run_dir_of(project, rec), "before": before,
            "client": docker_client}


def test_the_container_got_both_secrets(secret_run):
    stdout = (secret_run["run_dir"] / "logs" / "stdout.log").read_text()
    for name, value in (("HF_TOKEN", BY_VALUE), ("WANDB_API_KEY", BY_NAME)):
        assert f"{name} {hashlib.sha256(value.encode()).hexdigest()}" in stdout
    assert secret_run["rec"]["env"]["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]


@pytest.mark.parametrize("name", ["hermetic.image.json", "hermetic.provenance.json"])
def test_the_committed_build_records_hold_no_secret(secret_run, name):
    path = secret_run["project"] / name
    assert path.stat().st_mtime_ns != secret_run["before"][path]  # written by the run that had the secrets
    assert "PLAIN_FLAG" in path.read_text()  # the config's env: is recorded, by value
    assert leaks(path.read_bytes()) == []


def test_the_image_itself_holds_no_secret(secret_run):
    image = secret_run["client"].images.get(secret_run["rec"]["image"]["id"])
    config = image.attrs["Config"]
    assert "PLAIN_FLAG=visible" in config["Env"]
    assert leaks(repr(config).encode()) == []
    assert not any(e.startswith(("HF_TOKEN=", "WANDB_API_KEY=")) for e in config["Env"])


def test_the_code_snapshot_holds_no_secret(secret_run):
    tar_path = secret_run["run_dir"] / "code" / "source.tar"
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        assert "show_secrets.py" in names and "hermetic.yaml" in names
        contents = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert leaks(contents) == [] and leaks(tar_path.read_bytes()) == []


def test_the_snapshot_diff_holds_no_secret(secret_run):
    diff = secret_run["run_dir"] / "code" / "diff.patch"
    assert secret_run["rec"]["code"]["git"]["diff_file"] == "code/diff.patch"
    assert "changed after the commit" in diff.read_text() and "PLAIN_FLAG" in diff.read_text()
    assert leaks(diff.read_bytes()) == []


def test_the_record_and_every_file_of_the_run_hold_no_secret(secret_run):
    rd: Path = secret_run["run_dir"]
    assert leaks((rd / "run.json").read_bytes()) == []
    assert any("HF_TOKEN=<redacted>" in a for a in secret_run["rec"]["invocation"]["argv"])
    found = {str(p.relative_to(rd)): leaks(p.read_bytes()) for p in rd.rglob("*") if p.is_file()}
    assert {p: s for p, s in found.items() if s} == {}
    proc = secret_run["proc"]
    assert leaks((proc.stdout + proc.stderr).encode()) == []


def test_the_runs_index_holds_no_secret(secret_run):
    runs = secret_run["project"] / "runs"
    assert {str(p.relative_to(runs)): leaks(p.read_bytes()) for p in runs.glob(".*") if p.is_file()
            and leaks(p.read_bytes())} == {}
