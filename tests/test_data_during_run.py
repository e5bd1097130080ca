"""The data the script read is the data verified (issue 24, item 4).

The verification's own stats are each dataset's identity (hermetic.data.identity); after the container
exits `hermetic run` checks them again. A change at any time after the verification -- before the
container started or while it ran -- is recorded (data.<name>.changed_during_run: which files), fails the
run (status failed, exit 65 unless the script failed first) and is what `hermetic diff` names, never
nondeterminism. The unit tests check the identity against real directories; the docker test changes a
dataset file on the host while a real container reads the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli
from hermetic.data.identity import check_identity, identity_of
from hermetic.data.manifest import format_manifest
from hermetic.data.statcache import stat_key
from hermetic.data.verify import verify_dataset
from hermetic.diff import diff_records
from hermetic.record.schema import validate_record
from synthetic_records import synthetic_record
from hermetic.record import seal
from run_support import hermetic_run, run_dir_of


@pytest.fixture(autouse=True)
def _cache(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tests' own cache (their stat caches); the docker test uses the module's, with the base in it."""
    if request.node.get_closest_marker("docker") is None:
        monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))


def make_dataset(tmp_path: Path, n: int = 5) -> tuple[Path, Path]:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(n):
        (root / f"part-{i}.bin").write_bytes(bytes([i]) * (100 + i))
    (root / "sub").mkdir()
    (root / "sub" / "labels.txt").write_text("a\nb\n")
    entries = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in root.rglob("*") if p.is_file()}
    manifest = tmp_path / "data.sha256"
    manifest.write_bytes(format_manifest(entries))
    return root, manifest


def verified(tmp_path: Path):
    root, manifest = make_dataset(tmp_path)
    time.sleep(0.12)  # out of the racy window: the stat keys alone vouch for the files
    report = verify_dataset(root, manifest)
    assert report.ok and report.identity is not None
    return root, report


# --- the identity -------------------------------------------------------------------------------------


def test_an_unchanged_dataset_matches_its_identity_by_stat_alone(tmp_path):
    root, report = verified(tmp_path)
    ident = report.identity
    assert sorted(ident.paths) == ["part-0.bin", "part-1.bin", "part-2.bin", "part-3.bin", "part-4.bin",
                                   "sub/labels.txt"]
    assert ident.racy() == []
    assert check_identity(ident, report.manifest_bytes).ok


@pytest.mark.parametrize("full", [False, True])
def test_a_change_after_verification_is_named(tmp_path, full):
    """Whatever happens to a file after its verification stat -- before the container starts or while it
    runs -- moves its key: a rewrite with the same size, a touch back to the old mtime, a chmod."""
    root, manifest = make_dataset(tmp_path)
    time.sleep(0.12)
    report = verify_dataset(root, manifest, full=full)
    assert report.ok and report.identity is not None
    p = root / "part-1.bin"
    st = p.stat()
    p.write_bytes(b"\xff" * st.st_size)                  # other bytes, same size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))    # and the old mtime: the ctime still moved
    os.chmod(root / "part-2.bin", 0o600)                 # metadata only: the script may have seen either
    (root / "sub" / "labels.txt").unlink()
    (root / "new.bin").write_bytes(b"added")
    change = check_identity(report.identity, report.manifest_bytes)
    assert (change.changed, change.missing, change.added) == (["part-1.bin", "part-2.bin"], ["sub/labels.txt"],
                                                              ["new.bin"])
    assert change.summary() == "2 changed (part-1.bin, part-2.bin); 1 missing (sub/labels.txt); 1 added (new.bin)"
    assert change.to_json()["count"] == 4


def test_a_file_replaced_by_rename_is_changed(tmp_path):
    root, report = verified(tmp_path)
    tmp = root / "part-0.new"
    tmp.write_bytes((root / "part-0.bin").read_bytes())  # the same bytes, another inode
    os.replace(tmp, root / "part-0.bin")
    assert check_identity(report.identity, report.manifest_bytes).changed == ["part-0.bin"]


def test_a_dataset_gone_or_replaced_is_an_error_not_a_crash(tmp_path):
    root, report = verified(tmp_path)
    os.rename(root, tmp_path / "elsewhere")
    gone = check_identity(report.identity, report.manifest_bytes)
    assert not gone.ok and "no longer exists" in gone.error
    root.mkdir()  # a new, empty directory in its place
    other = check_identity(report.identity, report.manifest_bytes)
    assert not other.ok and "another directory now" in other.error
    os.rmdir(root)
    os.mkfifo(root)  # not even a directory
    assert not check_identity(report.identity, report.manifest_bytes).ok


def test_a_racy_file_is_hashed_again(tmp_path):
    """A key recorded within a clock tick of the file's last change could hide a change made in that same
    tick (git's racy-clean rule): such a file is compared by its bytes with the manifest."""
    root, report = verified(tmp_path)
    p = root / "part-3.bin"
    p.write_bytes(b"\x00" * p.stat().st_size)  # other bytes
    ident = report.identity
    keys = [stat_key(os.stat(root / rel)) for rel in ident.paths]
    # An identity whose keys are today's stats, recorded right after part-3.bin changed (in the same clock
    # tick, as far as its key can tell): that key alone cannot vouch for it, so its bytes decide.
    changed_at = max(p.stat().st_mtime_ns, p.stat().st_ctime_ns)
    racy = identity_of(ident.root, ident.root_key, ident.paths, keys, changed_at + 1, ident.exclude)
    assert [ident.paths[i] for i in racy.racy()] == ["part-3.bin"]
    assert check_identity(racy, report.manifest_bytes).changed == ["part-3.bin"]
    # the same, with the bytes as verified: nothing changed
    p.write_bytes(bytes([3]) * 103)
    keys = [stat_key(os.stat(root / rel)) for rel in ident.paths]
    changed_at = max(p.stat().st_mtime_ns, p.stat().st_ctime_ns)
    assert check_identity(identity_of(ident.root, ident.root_key, ident.paths, keys, changed_at + 1, ident.exclude),
                          report.manifest_bytes).ok


def test_the_manifest_inside_the_dataset_is_not_part_of_its_identity(tmp_path):
    root, _ = make_dataset(tmp_path)
    inside = root / "MANIFEST.sha256"
    inside.write_bytes((tmp_path / "data.sha256").read_bytes())
    time.sleep(0.12)
    report = verify_dataset(root, inside)
    assert report.ok and "MANIFEST.sha256" not in report.identity.paths
    assert check_identity(report.identity, report.manifest_bytes).ok


# --- the record and the diff ------------------------------------------------------------------------


def changed_record(run_id: str) -> dict:
    rec = synthetic_record(run_id, minutes=15)
    rec["record"].update(status="failed", exit_code=0, hermetic_exit_code=65,
                         reason="data changed during the run (...): dataset mnist: 1 changed (train/0003.png)")
    rec["data"]["mnist"]["changed_during_run"] = {"changed": ["train/0003.png"], "missing": [], "added": [],
                                                  "count": 1, "error": None}
    rec["outputs"]["files"]["model.pt"]["sha256"] = "ab" * 32
    return rec


def test_the_record_holds_which_files_changed():
    validate_record(seal(changed_record("20261129-220000-bbbbbb")))


def test_diff_names_the_data_change_never_nondeterminism():
    a, b = synthetic_record("20261129-214500-aaaaaa"), changed_record("20261129-220000-bbbbbb")
    d = diff_records(a, b)
    assert d.verdict.kind == "data_changed" and d.verdict.exit_code == 1
    assert d.verdict.line == "data changed during run B: mnist: 1 changed (train/0003.png)"
    assert "nondeterminism" not in d.verdict.line
    assert d.section("data").differs
    assert "mnist changed during run B: 1 changed (train/0003.png)" in d.section("data").summary()
    # the other way round, and with another input differing too
    b["seed"]["value"] = 7
    d = diff_records(b, a)
    assert d.verdict.line.startswith("data changed during run A: mnist: 1 changed (train/0003.png); inputs differ "
                                     "too: seed (seed 7 -> 0)")


# --- on the real engine --------------------------------------------------------------------------------


SLOW_READER = """\
    import hashlib, time
    print("reading the data soon", flush=True)
    time.sleep(4)
    digest = hashlib.sha256(open("/data/logreg/test-x.f32", "rb").read()).hexdigest()
    open("/outputs/seen.txt", "w").write(digest + "\\n")
"""


def wait_for_line(runs: Path, before: set[str], text: str, proc: subprocess.Popen, timeout: float) -> Path:
    """The new run's directory, once its stdout.log holds ``text`` (the container is running then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for d in (runs.iterdir() if runs.is_dir() else []):
            log = d / "logs" / "stdout.log"
            if d.name not in before and log.is_file() and text in log.read_text(errors="replace"):
                return d
        time.sleep(0.05)
    raise AssertionError(f"no run printed {text!r} within {timeout} s")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_dataset_file_changed_while_the_container_runs(project):
    (project / "slow_reader.py").write_text(textwrap.dedent(SLOW_READER))
    # a clean run first: the same script, the data as verified
    _, clean = hermetic_run(project, "slow_reader.py")
    assert clean["record"]["status"] == "succeeded" and "changed_during_run" not in clean["data"]["logreg"]
    runs = project / "runs"
    before = {p.name for p in runs.iterdir()}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hermetic", "run", "--json", "slow_reader.py"], cwd=project,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = wait_for_line(runs, before, "reading the data soon", proc, timeout=600)
        target = project / "data" / "test-x.f32"
        raw = bytearray(target.read_bytes())
        raw[100] ^= 0xFF
        target.write_bytes(bytes(raw))  # the host rewrites it while the script sleeps
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 65, err  # the script exited 0: hermetic's code for "the data changed"
    assert "Traceback" not in err
    rec = json.loads(out)
    assert rec["record"]["run_id"] == run_dir.name
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 0
    assert rec["record"]["hermetic_exit_code"] == 65
    assert rec["record"]["reason"].startswith("data changed during the run")
    assert "dataset logreg: 1 changed (test-x.f32)" in rec["record"]["reason"]
    assert rec["data"]["logreg"]["changed_during_run"] == {"changed": ["test-x.f32"], "missing": [], "added": [],
                                                           "count": 1, "error": None}
    # the script really read other bytes than the manifest says
    manifest = dict(reversed(line.split("  ", 1)) for line in (project / "data.sha256").read_text().splitlines())
    assert (run_dir / "outputs" / "seen.txt").read_text().strip() != manifest["test-x.f32"]
    # diff names it as the cause, never nondeterminism
    d = run_cli("diff", str(run_dir_of(project, clean)), str(run_dir), "--json")
    assert d.returncode == 1, d.stderr
    verdict = json.loads(d.stdout)["verdict"]
    assert verdict["kind"] == "data_changed"
    assert verdict["line"] == "data changed during run B: logreg: 1 changed (test-x.f32)"
    text = run_cli("diff", str(run_dir), str(run_dir_of(project, clean))).stdout
    assert text.splitlines()[0] == "data changed during run A: logreg: 1 changed (test-x.f32)"
    assert "nondeterminism" not in text
