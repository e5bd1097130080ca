"""`hermetic submit` without a registry, on each engine: the real Slurm test cluster (scripts/ensure-slurm),
a store the nodes mount (--shared-store), and Docker, Podman and Charliecloud on the nodes.

The numpy example as a 2-seed array per engine: the tasks take the image from the shared store by digest
(no registry is running in this module), each record names its engine and the store, the group summary
says 2 of 2; the check before submitting says which way the image travels and why; an image never pushed
and in no shared store is still refused, naming both ways.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from run_support import sha256_file

from conftest import assert_clean_error, run_cli

pytestmark = [pytest.mark.slurm, pytest.mark.docker]


def submit(project: Path, *args: str, expect: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = run_cli("submit", *args, cwd=project, timeout=timeout)
    assert proc.returncode == expect, (proc.returncode, proc.stdout[-3000:], proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> Path:
    """One cache standing for a filesystem every node mounts (the test cluster's nodes are this machine)."""
    return tmp_path_factory.mktemp("shared") / "hermetic"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["docker", "podman", "charliecloud"])
def test_an_array_runs_from_a_shared_store_with_no_registry(logreg, slurm_cluster, shared_store, engine):
    proc = submit(logreg, "--engine", engine, "--shared-store", str(shared_store), "--seeds", "2",
                  "--name", f"shared-{engine}", "--wait", "--json", "train.py", "--epochs", "2", "--seed", "{seed}")
    # said before anything was submitted: which way the image goes, and why
    assert f"the tasks take it from the store in {shared_store}" in proc.stderr, proc.stderr
    assert "no registry" in proc.stderr
    group = json.loads(proc.stdout)
    sl = group["slurm"]
    assert (sl["total"], sl["succeeded"], sl["summary"]) == (2, 2, "2 of 2 tasks succeeded"), sl
    runs = logreg / "runs"
    for m in group["members"]:
        rec = json.loads((runs / m["run_id"] / "run.json").read_text())
        assert rec["record"]["status"] == "succeeded"
        assert rec["invocation"]["engine"]["name"] == engine
        s = rec["slurm"]
        assert s["image_store"] == str(shared_store) and s["image_pulled_from"] is None
        assert s["node"] in slurm_cluster.nodes
    sub = json.loads((runs / group["group"]["group_id"] / "slurm" / "submit.json").read_text())
    assert sub["engine"] == engine and sub["shared_store"] == str(shared_store)
    index = json.loads((shared_store / "oci" / "index.json").read_text())
    assert any(d["digest"] == rec["image"]["manifest_digest"] for d in index["manifests"])
    if engine == "charliecloud":  # one file on the shared filesystem, placed once; each task checked and mounted it
        files = list((shared_store / "squashfs").glob("*.sqfs"))
        assert [f.name for f in files] == [f"sha256-{rec['image']['manifest_digest'][7:]}.sqfs"]
        assert sub["squashfs"] == {"path": str(files[0]), "sha256": sha256_file(files[0])}
        assert "the image as one file for the nodes" in proc.stderr
        for m in group["members"]:
            image = json.loads((runs / m["run_id"] / "run.json").read_text())["invocation"]["engine"]["image"]
            assert image == {"form": "squashfs", **sub["squashfs"]}
    else:
        assert sub["squashfs"] is None


@pytest.mark.timeout(900)
def test_a_task_refuses_an_image_file_altered_after_submission(logreg, slurm_cluster, tmp_path):
    """The file is placed at submit time; a task checks its sha256 in full before anything mounts it."""
    store = tmp_path / "store"
    proc = submit(logreg, "--engine", "charliecloud", "--shared-store", str(store), "--sbatch-arg=--hold",
                  "--name", "altered", "--json", "train.py", "--epochs", "1")
    doc = json.loads(proc.stdout)
    sub = json.loads((Path(doc["dir"]) / "slurm" / "submit.json").read_text())
    sqfs = Path(sub["squashfs"]["path"])
    data = bytearray(sqfs.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sqfs.write_bytes(bytes(data))
    subprocess.run(["scontrol", "release", str(doc["job_id"])], check=True)
    (task,) = slurm_cluster.wait(doc["job_id"], timeout=300)
    assert task.exit_code == 65, task
    log = "".join(p.read_text() for p in (Path(doc["dir"]) / "slurm" / "logs").glob("*.out"))
    assert "truncated or altered" in log and str(sqfs) in log, log[-3000:]
    assert "Traceback" not in log
    rec = Path(doc["dir"]) / "run.json"
    assert not rec.exists() or json.loads(rec.read_text())["record"]["status"] != "succeeded"


def test_an_image_in_no_shared_store_and_never_pushed_is_refused_naming_both_ways(project, slurm_cluster):
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text().replace("threads: 1", "threads: 3"))  # an image nobody pushed
    proc = submit(project, "--engine", "podman", "--name", "nowhere", "train.py", expect=66)
    assert_clean_error(proc, 66, "never pushed", "hermetic push", "--shared-store DIR")
    assert not list((project / "runs").glob("*nowhere*")) if (project / "runs").exists() else True


def test_a_shared_store_on_a_node_local_filesystem_is_refused(project, slurm_cluster):
    proc = submit(project, "--shared-store", "/dev/shm/hermetic-not-shared", "--name", "local", "train.py",
                  expect=64)
    assert_clean_error(proc, 64, "--shared-store", "only this machine sees")
