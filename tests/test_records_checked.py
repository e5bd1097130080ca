"""Records are checked, not trusted (issue 24, item 10): what compares or reuses a run rehashes what its
record holds a digest of first; a renamed run directory is refused; `hermetic runs verify`.

The unit tests use synthetic run directories (tests/synthetic_records.py writes real output files that
agree with the record); the tests marked docker change real runs of examples/numpy-logreg after the fact.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.core.errors import IntegrityError
from synthetic_records import synthetic_record, write_synthetic_run
from hermetic.record.verify import CACHE_NAME, check_outputs, require_as_recorded, verify_run
from run_support import git_commit_all, hermetic_run, run_dir_of, run_dirs

A = "20261129-214500-aaaaaa"
B = "20261129-220000-bbbbbb"
C = "20261130-090000-cccccc"


def two_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    write_synthetic_run(runs, synthetic_record(A))
    write_synthetic_run(runs, synthetic_record(B, minutes=15))
    return runs


def flip_byte(path: Path, offset: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def settle() -> None:
    """Let files written just now leave the racy window (git's racy-clean rule: an entry recorded within a
    clock tick of the file's last change is not trusted), so that a first look's cache can vouch for them."""
    time.sleep(0.2)


# --- the outputs' stat cache ---------------------------------------------------------------------


def test_a_second_look_rehashes_nothing_and_a_changed_file_is_read_again(tmp_path):
    runs = tmp_path / "runs"
    rec = synthetic_record(A)
    rec["outputs"]["files"] = {f"shard/{i:04d}.bin": {"sha256": "0" * 63 + f"{i % 10}", "size": 1} for i in range(50)}
    sealed = write_synthetic_run(runs, rec)
    run_dir = runs / A
    settle()
    first = check_outputs(run_dir, sealed)
    assert first.ok and (first.files, first.hashed, first.cached) == (50, 50, 0)
    assert (run_dir / CACHE_NAME).is_file()
    second = check_outputs(run_dir, sealed)
    assert second.ok and (second.hashed, second.cached) == (0, 50)  # every digest from the cache
    # Same size, other bytes: the stat key moved (mtime, ctime), so the cache does not vouch for it.
    flip_byte(run_dir / "outputs" / "shard" / "0007.bin", 5)
    third = check_outputs(run_dir, sealed)
    assert third.changed == ["shard/0007.bin"] and third.hashed == 1 and third.cached == 49
    # Without the cache every file is read, and the answer is the same.
    assert check_outputs(run_dir, sealed, cache=False).changed == ["shard/0007.bin"]


def test_a_file_replaced_by_one_with_its_old_times_is_not_taken_from_the_cache(tmp_path):
    runs = two_runs(tmp_path)
    rec = json.loads((runs / A / "run.json").read_text())
    settle()
    assert check_outputs(runs / A, rec).ok
    model = runs / A / "outputs" / "model.pt"
    st = model.stat()
    replacement = model.with_name("model.new")
    replacement.write_bytes(model.read_bytes().replace(b"synthetic", b"SYNTHETIC"))
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime: only inode and ctime differ
    os.replace(replacement, model)
    check = check_outputs(runs / A, rec)
    assert check.changed == ["model.pt"] and check.hashed == 1


def test_a_cache_written_for_other_bytes_is_not_trusted(tmp_path):
    """The cache file is the run directory's, so anyone may write it: it is keyed by the file's stat key,
    and a key that does not match the file's is never used (here: the cache of another run, copied in)."""
    runs = two_runs(tmp_path)
    rec_b = json.loads((runs / B / "run.json").read_text())
    settle()
    check_outputs(runs / A, json.loads((runs / A / "run.json").read_text()))
    (runs / B / CACHE_NAME).write_bytes((runs / A / CACHE_NAME).read_bytes())
    check = check_outputs(runs / B, rec_b)
    assert check.ok and check.hashed == 2  # B's files have other inodes: nothing came from A's entries


def test_a_cache_that_does_not_parse_is_ignored(tmp_path):
    runs = two_runs(tmp_path)
    (runs / A / CACHE_NAME).write_bytes(b"not a stat cache")
    assert check_outputs(runs / A, json.loads((runs / A / "run.json").read_text())).ok


# --- diff, replay and show refuse a run directory that is not as recorded ----------------------------


def test_diff_refuses_a_changed_or_missing_output_naming_it(tmp_path):
    runs = two_runs(tmp_path)
    assert run_cli("diff", "--runs-dir", str(runs), A, B).returncode == 0
    flip_byte(runs / B / "outputs" / "model.pt")
    proc = run_cli("diff", "--runs-dir", str(runs), A, B)
    assert_clean_error(proc, 65, "outputs/model.pt changed since the record was sealed", B, "hermetic diff")
    assert "bitwise identical" not in proc.stdout
    (runs / A / "outputs" / "metrics.jsonl").unlink()
    proc = run_cli("diff", "--json", "--runs-dir", str(runs), A, B)
    assert_clean_error(proc, 65, "outputs/metrics.jsonl is missing", A)
    assert proc.stdout == ""


def test_an_output_added_after_the_run_is_not_refused_by_diff_but_reported_by_verify(tmp_path):
    runs = two_runs(tmp_path)
    (runs / A / "outputs" / "later.txt").write_text("written after the run\n")
    assert run_cli("diff", "--runs-dir", str(runs), A, B).returncode == 0  # nothing compared changed
    proc = run_cli("runs", "verify", "--runs-dir", str(runs), A)
    assert_clean_error(proc, 65, "1 of 1 runs differ", "outputs/later.txt is not in the record (added since)")


def test_a_changed_manifest_copy_is_refused_by_diff(tmp_path):
    runs = two_runs(tmp_path)
    copy = runs / A / "data" / "mnist.sha256"
    copy.write_text(copy.read_text().replace("train/0003.png", "train/0003.PNG"))
    proc = run_cli("diff", "--runs-dir", str(runs), A, B)
    assert_clean_error(proc, 65, "data/mnist.sha256 (dataset mnist's manifest copy) changed since the record")


def test_require_as_recorded_raises_integrity_error(tmp_path):
    runs = two_runs(tmp_path)
    rec = json.loads((runs / A / "run.json").read_text())
    (runs / A / "outputs" / "model.pt").unlink()
    with pytest.raises(IntegrityError, match="outputs/model.pt is missing") as e:
        require_as_recorded(runs / A, rec, what="hermetic replay")
    assert e.value.exit_code == 65 and "hermetic runs verify" in e.value.hint


def test_runs_show_says_whether_outputs_were_rehashed(tmp_path):
    runs = two_runs(tmp_path)
    proc = run_cli("runs", "show", "--runs-dir", str(runs), A)
    assert proc.returncode == 0, proc.stderr
    assert "2 output files rehashed, as recorded: 2 read, 0 from the stat cache" in proc.stdout
    proc = run_cli("runs", "show", "--no-rehash", "--runs-dir", str(runs), A)
    assert proc.returncode == 0 and "output files not rehashed" in proc.stdout
    flip_byte(runs / A / "outputs" / "model.pt")
    proc = run_cli("runs", "show", "--runs-dir", str(runs), A)
    assert_clean_error(proc, 65, "outputs/model.pt changed since the record was sealed")
    assert "outputs differ from the record: outputs/model.pt changed" in proc.stdout


def test_a_renamed_run_directory_is_refused_everywhere(tmp_path):
    runs = two_runs(tmp_path)
    os.rename(runs / B, runs / C)  # another valid run ID
    said = f"the directory is named '{C}' but its record is run '{B}'"
    assert_clean_error(run_cli("runs", "show", "--runs-dir", str(runs), C), 65, said)
    assert_clean_error(run_cli("diff", "--runs-dir", str(runs), A, C), 65, said)
    assert_clean_error(run_cli("replay", str(runs / C)), 65, said)
    proc = run_cli("runs", "verify", "--runs-dir", str(runs), C)
    assert_clean_error(proc, 65, said)
    proc = run_cli("run", "--resume-from", C, "train.py", cwd=tmp_path)  # no project here: refused before that
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


# --- runs verify ------------------------------------------------------------------------------------


def test_runs_verify_ok_and_what_differs(tmp_path):
    runs = two_runs(tmp_path)
    proc = run_cli("runs", "verify", "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[:2] for ln in proc.stdout.splitlines()] == [["ok", A], ["ok", B]]
    flip_byte(runs / B / "outputs" / "model.pt")
    (runs / B / "code" / "source.tar").unlink()
    (runs / B / "data" / "mnist.sha256").unlink()
    proc = run_cli("runs", "verify", "--runs-dir", str(runs), "--json")
    assert proc.returncode == 65
    doc = json.loads(proc.stdout)
    assert (doc["ok"], doc["checked"], doc["differ"]) == (False, 2, 1)
    by_id = {r["run_id"]: r for r in doc["runs"]}
    assert by_id[A]["status"] == "ok" and by_id[A]["problems"] == []
    problems = by_id[B]["problems"]
    assert "outputs/model.pt changed since the record was sealed" in problems
    assert "data/mnist.sha256 (dataset mnist's manifest copy) is missing" in problems
    assert "code/source.tar (the source snapshot) is missing" in problems
    assert by_id[B]["outputs"]["changed"] == ["model.pt"]


def test_runs_verify_skips_what_has_no_record_and_says_66_when_nothing_was_found(tmp_path):
    runs = tmp_path / "runs"
    (runs / "20261129-214500-aaaaaa").mkdir(parents=True)  # prepared by `hermetic submit`: no record yet
    proc = run_cli("runs", "verify", "--runs-dir", str(runs))
    assert_clean_error(proc, 66, "no run records to verify")
    assert "skipped" in proc.stdout and "no run.json" in proc.stdout
    assert_clean_error(run_cli("runs", "verify", "--runs-dir", str(tmp_path / "none")), 66, "no run records")


def test_a_run_whose_driver_died_is_checked_for_what_its_record_holds(tmp_path):
    """An early record (never sealed at the end: finished_at null) holds no outputs; what the script left
    is not part of the record, so it is not a difference; the snapshot and manifest copies still are."""
    runs = tmp_path / "runs"
    rec = synthetic_record(A)
    rec["record"].update(status="interrupted", exit_code=None, finished_at=None)
    rec["outputs"] = {"files": {}}
    rec["metrics"] = {"final": {}, "steps": None, "file": None}
    write_synthetic_run(runs, rec)
    (runs / A / "outputs" / "partial.ckpt").write_bytes(b"half a checkpoint")
    assert verify_run(runs / A).status == "ok"
    (runs / A / "code" / "source.tar").write_bytes(b"other code")
    assert verify_run(runs / A).problems == [
        "code/source.tar (the source snapshot) changed since the record was sealed (sha256 "
        f"{json.loads((runs / A / 'run.json').read_text())['code']['snapshot']['sha256'][:12]} recorded, "
        f"{hashlib.sha256(b'other code').hexdigest()[:12]} now)"]


def test_verify_run_reports_a_broken_seal_as_a_problem(tmp_path):
    runs = two_runs(tmp_path)
    doc = json.loads((runs / A / "run.json").read_text())
    doc["metrics"]["final"]["accuracy"] = 0.999
    (runs / A / "run.json").write_text(json.dumps(doc))
    result = verify_run(runs / A)
    assert result.status == "differs" and "record_sha256 does not match" in result.problems[0]


# --- on real runs ------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_real_runs_changed_after_the_fact_are_refused_and_reported(project):
    _, ra = hermetic_run(project, "train.py", "--epochs", "2")
    _, rb = hermetic_run(project, "train.py", "--epochs", "2")
    da, db = run_dir_of(project, ra), run_dir_of(project, rb)
    proc = run_cli("runs", "verify", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert sorted(ln.split()[:2][1] for ln in proc.stdout.splitlines()) == sorted([da.name, db.name])
    first = run_cli("diff", str(da), str(db))
    assert first.returncode == 0 and first.stdout.startswith("bitwise identical")
    assert check_outputs(db, rb).hashed == 0  # the diff's look left a stat cache: nothing read again

    flip_byte(db / "outputs" / "weights.bin", 10)  # one bit of one output, after the run
    proc = run_cli("diff", str(da), str(db))
    assert_clean_error(proc, 65, "outputs/weights.bin changed since the record was sealed")
    before = run_dirs(project)
    proc = run_cli("replay", str(db), "--json")
    assert_clean_error(proc, 65, "outputs/weights.bin changed since the record was sealed", "hermetic replay")
    assert run_dirs(project) == before  # refused before anything ran
    proc = run_cli("runs", "verify", "--json", cwd=project)
    assert proc.returncode == 65
    runs = {r["run_id"]: r for r in json.loads(proc.stdout)["runs"]}
    assert runs[da.name]["status"] == "ok"
    assert runs[db.name]["problems"] == ["outputs/weights.bin changed since the record was sealed"]
    flip_byte(db / "outputs" / "weights.bin", 10)  # back as it was: as recorded again
    assert run_cli("diff", str(da), str(db)).returncode == 0

    # a run directory renamed to another valid run ID
    other = "20991231-235959-abcdef"
    os.rename(db, db.parent / other)
    for proc in (run_cli("diff", str(da), str(db.parent / other)), run_cli("replay", str(db.parent / other)),
                 run_cli("runs", "show", other, cwd=project)):
        assert_clean_error(proc, 65, f"is named '{other}' but its record is run '{db.name}'")
    proc = run_cli("run", "--resume-from", other, "train.py", "--resume", cwd=project)
    assert_clean_error(proc, 65, f"is named '{other}' but its record is run '{db.name}'")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_dataset_linked_from_outside_the_project_runs_and_is_kept_out_of_the_snapshot(project, tmp_path):
    """data -> a directory outside the project (git lists the link as a file, even with `data/` ignored):
    the dataset is verified and mounted, and the link is not part of the code."""
    outside = tmp_path / "big-disk" / "logreg"
    outside.parent.mkdir()
    os.rename(project / "data", outside)
    os.symlink(outside, project / "data")
    git_commit_all(project)
    _, rec = hermetic_run(project, "train.py", "--epochs", "1")
    assert rec["record"]["status"] == "succeeded"
    assert "data" not in rec["code"]["snapshot"]["files"]
    assert rec["data"]["logreg"]["count"] > 0


def test_the_source_listing_beside_the_image_check_answers_and_refuses_in_the_callers_thread():
    """`hermetic run` lists the code (git) in a thread beside the image's no-op check: its answer, or its
    refusal (the DataError of a link out of the project), comes out of ``result`` in the caller's thread, as
    often as asked (before a build, then before the run directory)."""
    import threading

    from hermetic.core.errors import DataError
    from hermetic.run.runner import _BESIDE

    seen = []
    listed = _BESIDE.submit(lambda a, b: (seen.append(threading.current_thread()), [a, b])[1], "x", "y")
    assert listed.result() == ["x", "y"] == listed.result() and seen[0] is not threading.current_thread()

    def refuse():
        raise DataError("ckpt: a symbolic link with an absolute target (/tmp); nothing was started")

    refused = _BESIDE.submit(refuse)
    for _ in range(2):
        with pytest.raises(DataError, match="ckpt: a symbolic link"):
            refused.result()


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_link_out_of_the_project_is_refused_before_a_build_the_config_asks_for(project, tmp_path):
    """The code is listed (git) beside the image's no-op check; when the config asks for a build, a link the
    snapshot could not hold is refused before it: no image built, hermetic.image.json as it was."""
    git_commit_all(project)
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text().replace("threads: 1", "threads: 2"))  # OMP_NUM_THREADS: another image
    assert "threads: 2" in cfg.read_text()
    os.symlink(tmp_path, project / "ckpt")
    recorded = (project / "hermetic.image.json").read_bytes()
    before = run_dirs(project)
    proc = run_cli("run", "train.py", cwd=project)
    assert_clean_error(proc, 65, "ckpt: a symbolic link with an absolute target", "nothing was started")
    assert "built image" not in proc.stderr and (project / "hermetic.image.json").read_bytes() == recorded
    assert run_dirs(project) == before


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_link_out_of_the_project_is_refused_before_any_run_directory(project, tmp_path):
    git_commit_all(project)
    (tmp_path / "scratch").mkdir()
    os.symlink(tmp_path / "scratch", project / "ckpt")
    before = run_dirs(project)
    proc = run_cli("run", "train.py", cwd=project)
    assert_clean_error(proc, 65, "ckpt: a symbolic link with an absolute target", "nothing was started")
    assert run_dirs(project) == before
    os.unlink(project / "ckpt")
    os.symlink("../../outside-the-project", project / "ckpt")  # relative, and still out
    assert_clean_error(run_cli("run", "train.py", cwd=project), 65, "ckpt: a symbolic link out of the project")
    os.unlink(project / "ckpt")
    os.symlink(project / "data", project / "data-link")  # into the dataset: named
    proc = run_cli("run", "train.py", cwd=project)
    assert_clean_error(proc, 65, "data-link: a symbolic link to dataset logreg")
    assert "/data/logreg" in proc.stderr  # where the container sees it
    assert run_dirs(project) == before
