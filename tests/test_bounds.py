"""Bounds on input (issue 24, item 8): what a command line or a file asks for is refused, in one line and
before anything is built, when it is larger than hermetic will take.

--seeds (at most MAX_GROUP_SEEDS members, checked by arithmetic), --gpus (all, a count, device=IDs),
a lock file (LOCK_MAX_BYTES), a dataset manifest line (MANIFEST_LINE_MAX); hermetic.yaml's own bounds
are in test_config.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, assert_clean_error, run_cli
from run_support import labelled_containers
from hermetic.data.manifest import MANIFEST_LINE_MAX, ManifestError, parse_columns, parse_manifest
from hermetic.core.errors import UsageError
from hermetic.config.gpus import GpuRequest, gpu_count, parse_gpus
from hermetic.lock.read import LOCK_MAX_BYTES
from hermetic.run.group import GROUP_WRITE_SHARE, group_write_due
from hermetic.config.seedargs import MAX_GROUP_SEEDS, SEED_MAX, parse_seeds, seed_ranges

BASE = "hermetic/debian-bookworm-python3@sha256:" + "a" * 64
# Nothing may reach the engine: a refusal that came after an engine check would say 69 (no engine) instead.
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


@pytest.fixture
def project(tmp_path) -> Path:
    """A config that loads, and a script; no image, no engine: refusals must come before either is needed."""
    (tmp_path / "hermetic.yaml").write_text(f"name: bounds\nbase: {BASE}\ndeterminism:\n  seed: 0\n")
    (tmp_path / "train.py").write_text("print('never runs')\n")
    return tmp_path


def nothing_made(project: Path) -> bool:
    return sorted(p.name for p in project.iterdir()) == ["hermetic.yaml", "train.py"]


# ---------------------------------------------------------------- --seeds

@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize("seeds, says", [
    ("0-4294967295", "4294967296 seeds; a group holds at most 1000"),
    ("99999999999", "99999999999 seeds; a group holds at most 1000"),
    ("100000", "100000 seeds; a group holds at most 1000"),
    ("1001", "1001 seeds; a group holds at most 1000"),
    ("0-999,5000", "1001 seeds; a group holds at most 1000"),
    ("9" * 5000, "far more seeds; a group holds at most 1000"),
    ("0-1,4294967296", f"seeds go up to {SEED_MAX}"),
    ("0-3,2-5", "a seed is given twice"),
    ("3-1", "range 3-1 runs backwards"),
    ("0,x", "'x' is not a seed or a range A-B"),
])
def test_seeds_beyond_the_bound_are_refused_before_anything(project, command, seeds, says):
    proc = run_cli(command, "--seeds", seeds, "train.py", cwd=project, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 64, "--seeds ", says)
    assert len(proc.stderr) < 400  # a 5000-digit value is not echoed back whole
    assert nothing_made(project)


@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_count_that_runs_past_the_last_seed_is_refused_once_the_config_is_read(project, command):
    (project / "hermetic.yaml").write_text(f"name: bounds\nbase: {BASE}\ndeterminism:\n  seed: {SEED_MAX}\n")
    proc = run_cli(command, "--seeds", "2", "train.py", cwd=project, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 64, "--seeds '2'", f"from determinism.seed {SEED_MAX} on go past {SEED_MAX}")
    assert nothing_made(project)


def test_seeds_are_checked_before_the_config_is_looked_for(tmp_path):
    proc = run_cli("run", "--seeds", "0-4294967295", "train.py", cwd=tmp_path, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 64, "--seeds '0-4294967295'")  # not 78 (no hermetic.yaml here)


def test_parse_seeds_up_to_the_bound():
    assert MAX_GROUP_SEEDS == 1000
    assert parse_seeds("1000", 7) == list(range(7, 1007))
    assert parse_seeds("0-998,5000", 0) == [*range(999), 5000]
    assert parse_seeds("10,0-2", 0) == [10, 0, 1, 2]  # the order given
    assert parse_seeds(f"{SEED_MAX - 1}-{SEED_MAX}", 0) == [SEED_MAX - 1, SEED_MAX]
    assert seed_ranges("0-999", 0) == [(0, 999)]
    for text in ("1001", "0-1000", "0-4294967295", "1", "0,0"):
        with pytest.raises(UsageError):
            seed_ranges(text, 0)


# ---------------------------------------------------------------- group.json, written O(n) times in all

def test_group_writes_take_a_bounded_share_of_the_sweep():
    assert group_write_due(0.0, 0.0)  # the first member's summary: always
    assert group_write_due(0.01, 10.0)  # writes that cost little next to the runs: after every member
    assert not group_write_due(1.0, 10.0)  # a summary that costs 10% of the sweep: skipped this time
    assert group_write_due(1.0, 1.0 / GROUP_WRITE_SHARE)  # ... until the members ran long enough again


def test_write_group_records_is_write_group_without_reloading(tmp_path):
    from datetime import datetime, timezone

    from hermetic.record import load_group, load_record, write_group
    from hermetic.record.group import write_group_records
    from synthetic_records import synthetic_record, write_synthetic_run

    root, gid = tmp_path / "runs", "20261129-210000-aaaaaa-g"
    ids = []
    for seed in range(3):
        rid = f"20261129-2100{seed:02d}-{seed:06x}"
        rec = synthetic_record(rid, seed=seed)
        rec["invocation"]["group"], rec["seed"]["policy"] = gid, "group"
        write_synthetic_run(root, rec)
        ids.append(rid)
    now = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)
    write_group(root, gid, ids, now=now, planned=[0, 1, 2, 3])
    by_ids = (root / gid / "group.json").read_bytes()
    write_group_records(root, gid, [load_record(root / r) for r in ids], now=now, planned=[0, 1, 2, 3])
    assert (root / gid / "group.json").read_bytes() == by_ids
    assert load_group(root / gid)["group"]["status"] == "interrupted"  # 3 of the 4 planned seeds ran


# ---------------------------------------------------------------- --gpus

@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize("value, says", [
    ("garbage", "expected all, a count such as 2, or device=ID[,ID...]"),
    ("0", "leave --gpus out to run without GPUs"),
    ("-1", "expected all"),
    ("99999", "more than 1024 GPUs"),
    ("device=", "device= needs IDs"),
    ("device=0,,1", "device= needs IDs"),
    ("device=0;rm", "'0;rm' is not a GPU index or UUID"),
    ("device=1,1", "a device is named twice"),
])
def test_gpus_that_are_not_all_a_count_or_devices_are_refused_naming_the_value(project, command, value, says):
    proc = run_cli(command, "--gpus", value, "train.py", cwd=project, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 64, f"--gpus {value!r}", says)
    assert "NVIDIA" not in proc.stderr  # refused as typed, before any engine is asked about a runtime
    assert nothing_made(project)


def test_gpus_are_checked_before_the_config_is_looked_for(tmp_path):
    proc = run_cli("run", "--gpus", "garbage", "train.py", cwd=tmp_path, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 64, "--gpus 'garbage'")


def test_the_one_gpus_grammar():
    assert parse_gpus(None) is None and parse_gpus("") is None
    assert parse_gpus("all") == GpuRequest() and parse_gpus("all").all
    assert parse_gpus("2") == GpuRequest(count=2)
    assert parse_gpus('"device=0,1"') == GpuRequest(device_ids=("0", "1"))  # docker's quoting
    uuid = "GPU-3b5c1f42-6d2e-4d6a-9b1f-0a1b2c3d4e5f"
    assert parse_gpus(f"device={uuid}").device_ids == (uuid,)
    assert parse_gpus("device=MIG-GPU-3b5c1f42/1/0").device_ids == ("MIG-GPU-3b5c1f42/1/0",)
    assert [gpu_count(v) for v in (None, "all", "3", "device=0,2")] == [0, None, 3, 2]


def test_every_gpus_reader_goes_through_the_one_parser():
    """The container's device request, --nproc-per-node's rank check and Slurm's --gpus-per-node."""
    from hermetic.engines.gpu import device_requests
    from hermetic.run.distributed import DistributedConfigError, plan_distributed
    from hermetic.slurm.submit import _gpus_per_node

    (req,) = device_requests("device=0,1")
    assert req["DeviceIDs"] == ["0", "1"] and not req["Count"]
    assert device_requests("all")[0]["Count"] == -1 and device_requests(None) == []
    with pytest.raises(DistributedConfigError):
        plan_distributed(4, gpus="device=0,1")
    assert _gpus_per_node("device=0,1") == "2" and _gpus_per_node(None) is None
    for reader in (device_requests, lambda v: plan_distributed(1, gpus=v), _gpus_per_node):
        with pytest.raises(UsageError, match="--gpus 'garbage'"):
            reader("garbage")


# ---------------------------------------------------------------- a lock file

def test_the_lock_bound_is_far_above_every_real_lock():
    locks = [p for d in (REPO / "tests" / "fixtures" / "locks", REPO / "examples") for p in d.rglob("*")
             if p.is_file() and (p.name.endswith((".lock", ".txt")) or p.name.startswith("pylock"))]
    biggest = max(p.stat().st_size for p in locks)
    assert 10_000 < biggest < LOCK_MAX_BYTES // 100, biggest


def test_a_lock_over_the_bound_is_refused_unread(project):
    big = project / "requirements.lock"
    with open(big, "wb") as f:
        f.truncate(LOCK_MAX_BYTES + 1)  # sparse: a 16 MiB lock costs no disk
    proc = run_cli("fetch", "--offline", "--lock", str(big), cwd=project, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 65, f"{big}: {LOCK_MAX_BYTES + 1} bytes", "at most 16777216 bytes (16 MiB)")


# ---------------------------------------------------------------- a dataset manifest line

def manifest_with_a_long_line(path_len: int) -> bytes:
    good = f"{'0' * 64}  a.txt\n"
    return (good + f"{'1' * 64}  {'p' * path_len}\n" + f"{'2' * 64}  z.txt\n").encode()


def test_a_manifest_line_over_the_bound_is_refused_naming_file_and_line():
    data = manifest_with_a_long_line(MANIFEST_LINE_MAX)
    for parse in (parse_manifest, parse_columns):
        with pytest.raises(ManifestError, match=r"^data\.sha256:2: a line of 65602 bytes; a manifest line "
                                                r"holds at most 65536"):
            parse(data, "data.sha256")
    # multi-byte characters count as the bytes they are
    wide = f"{'0' * 64}  {'é' * (MANIFEST_LINE_MAX // 2)}\n".encode()
    with pytest.raises(ManifestError, match=r"^m:1: a line of 65602 bytes"):
        parse_manifest(wide, "m")
    # a long but legal path (PATH_MAX, 4096 bytes) is no concern of the bound
    assert len(parse_manifest(f"{'0' * 64}  {'d/' * 2047}f\n".encode(), "m").entries) == 1


def test_the_cli_refuses_a_long_manifest_line(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    mf = tmp_path / "d.sha256"
    mf.write_bytes(manifest_with_a_long_line(MANIFEST_LINE_MAX))
    proc = run_cli("data", "verify", str(tmp_path / "d"), str(mf), cwd=tmp_path, env=NO_ENGINE, timeout=60)
    assert_clean_error(proc, 65, f"{mf}:2: a line of 65602 bytes")


def test_bounds_are_documented():
    text = {p: (REPO / p).read_text() for p in ("docs/your-script.md", "docs/data.md", "docs/build.md")}
    assert "1000" in text["docs/your-script.md"] and "--gpus" in text["docs/your-script.md"]
    assert "64 KiB" in text["docs/data.md"]
    assert "16 MiB" in text["docs/build.md"] and "1 MiB" in text["docs/build.md"]


# ---------------------------------------------------------------- group.json after a kill -9 of the sweep

SLEEP_AFTER_FIRST = """import os, time
print("seed", os.environ["HERMETIC_SEED"], flush=True)
if os.environ["HERMETIC_SEED"] != "0":
    time.sleep(600)
"""


@pytest.mark.docker
def test_a_killed_sweep_leaves_a_sealed_group_of_the_members_that_ran(logreg, tmp_path, docker_client):
    """The first member's summary is always written (the write throttle only skips rewrites that would cost
    more than GROUP_WRITE_SHARE of the sweep), so SIGKILL of the driver mid-sweep leaves a valid group.json."""
    from kill_support import sigkill, start_hermetic, wait_for
    from run_support import copy_project

    from hermetic.record import load_group

    project = copy_project(logreg, tmp_path / "numpy-logreg")
    (project / "sleeper.py").write_text(SLEEP_AFTER_FIRST)
    p = start_hermetic("run", "--seeds", "0,1,2", "--name", "killed", "sleeper.py", cwd=project)

    def groups() -> list[Path]:
        runs = project / "runs"
        return [d for d in runs.glob("*-killed") if (d / "group.json").is_file()] if runs.is_dir() else []

    def second_member_running() -> bool:
        logs = [d / "logs" / "stdout.log" for d in (project / "runs").glob("*-killed")]
        return any(log.is_file() and "seed 1" in log.read_text() for log in logs)

    try:
        wait_for(p, lambda: bool(groups()), "group.json after the first member", timeout=600)
        wait_for(p, second_member_running, "the second member's container", timeout=300)
        sigkill(p)
    finally:
        if p.poll() is None:
            p.kill()
        for c in labelled_containers(docker_client, "killed"):  # the killed driver's container: ours to remove
            c.remove(force=True)
    (gdir,) = groups()
    group = load_group(gdir)  # sealed and valid
    assert group["group"]["status"] == "interrupted" and group["group"]["seeds"] == [0, 1, 2]
    assert [(m["seed"], m["status"]) for m in group["members"]] == [(0, "succeeded")]
