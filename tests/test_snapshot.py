"""The code snapshot holds the code: what an earlier local run left and git ignores stays out (issue 25)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from hermetic.run.snapshot import list_source_files, take_snapshot


def _leftovers(root: Path) -> None:
    """A project after a local run: Lightning's logs, a plot, a checkpoint, caches; its .gitignore says so."""
    (root / "lightning_logs" / "version_0" / "checkpoints").mkdir(parents=True)
    (root / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0.ckpt").write_bytes(b"\0" * 64)
    (root / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    (root / "reconstruction.png").write_bytes(b"\x89PNG")
    (root / "model.pt").write_bytes(b"weights")
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"cache")
    (root / "pkg" / "m.py").write_text("X = 1\n")
    (root / "train.py").write_text("import pkg.m\n")
    (root / "pkg" / ".gitignore").write_text("local_notes.txt\n")  # a nested .gitignore counts too
    (root / "pkg" / "local_notes.txt").write_text("mine\n")
    (root / ".gitignore").write_text("lightning_logs/\n*.png\n*.pt\n")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                   check=True, capture_output=True)


CODE = [".gitignore", "pkg/.gitignore", "pkg/m.py", "train.py"]


def test_in_git_ignored_leftovers_stay_out_and_a_tracked_one_stays_in(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    _leftovers(root)
    with (root / ".gitignore").open("a") as f:
        f.write("__pycache__/\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "add", "-f", "model.pt")  # tracked although ignored: git has it, so it is code
    _git(root, "commit", "-q", "-m", "x")
    paths, in_git = list_source_files(root, [])
    assert in_git and paths == [".gitignore", "model.pt", "pkg/.gitignore", "pkg/m.py", "train.py"]
    (root / "scratch.py").write_text("untracked, not ignored: part of the code\n")
    assert "scratch.py" in list_source_files(root, [])[0]


def test_outside_git_the_gitignore_files_are_honoured(tmp_path):
    root = tmp_path / "proj"  # a downloaded example: no .git, but its .gitignore came along
    root.mkdir()
    _leftovers(root)
    (root / "data").mkdir()
    (root / "data" / "x.bin").write_bytes(b"a dataset: excluded by the caller")
    paths, in_git = list_source_files(root, ["data"])
    assert not in_git and paths == CODE
    snap = take_snapshot(root, tmp_path / "run", ["data"])
    assert sorted(snap.files) == CODE
    with tarfile.open(snap.tar_path) as tf:
        assert sorted(m.name for m in tf.getmembers() if m.isfile()) == CODE


def test_replay_extracts_every_recorded_file(tmp_path):
    # A snapshot taken again from an extracted one (replay): nothing may be dropped, whatever a .gitignore says.
    root = tmp_path / "workspace"
    root.mkdir()
    _leftovers(root)
    paths, _ = list_source_files(root, [], use_git=False)
    assert "reconstruction.png" in paths and "lightning_logs/version_0/hparams.yaml" in paths


def test_without_git_installed_every_file_is_taken(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    _leftovers(root)
    (tmp_path / "nobin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no git to ask
    paths, in_git = list_source_files(root, [])
    assert not in_git and "reconstruction.png" in paths and "pkg/m.py" in paths
    assert not any("__pycache__" in p for p in paths)


def test_a_repository_nested_in_a_plain_directory_is_still_taken(tmp_path):
    root = tmp_path / "proj"
    (root / "vendor" / "lib").mkdir(parents=True)
    _git(root / "vendor" / "lib", "init", "-q")
    (root / "vendor" / "lib" / "lib.py").write_text("Y = 2\n")
    (root / "train.py").write_text("print(1)\n")
    paths, _ = list_source_files(root, [])
    assert paths == ["train.py", "vendor/lib/lib.py"]


def test_a_project_in_a_subdirectory_records_its_commit_branch_and_untracked_files(tmp_path):
    # The git state in one `rev-parse` (commit, branch, the project's place in the work tree): a project below
    # the repository's top names its untracked files relative to itself, as the snapshot does.
    repo = tmp_path / "repo"
    root = repo / "papers" / "proj"
    root.mkdir(parents=True)
    (root / "train.py").write_text("print(1)\n")
    (repo / "README.md").write_text("top\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "x")
    (root / "new.py").write_text("print(2)\n")
    snap = take_snapshot(root, tmp_path / "run", [])
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert sorted(snap.files) == ["new.py", "train.py"]
    assert snap.git == {"commit": head, "branch": "main", "dirty": True, "diff_sha256": None, "diff_file": None,
                        "untracked": {"new.py": snap.files["new.py"]}}
    _git(repo, "checkout", "-q", "--detach")
    assert take_snapshot(root, tmp_path / "run2", []).git["branch"] is None  # detached: no branch


def test_a_project_with_a_directory_named_as_its_place_in_the_repository_keeps_it(tmp_path):
    # repo/proj/ holds proj/model.py: git's paths are relative to the project already; taking the project's
    # place ("proj/") off them again dropped proj/model.py from the snapshot and the untracked list.
    repo = tmp_path / "repo"
    root = repo / "proj"
    (root / "proj").mkdir(parents=True)
    (root / "train.py").write_text("import proj.model\n")
    (root / "proj" / "model.py").write_text("M = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "x")
    (root / "proj" / "layers.py").write_text("L = 2\n")
    paths, in_git = list_source_files(root, [])
    assert in_git and paths == ["proj/layers.py", "proj/model.py", "train.py"]
    snap = take_snapshot(root, tmp_path / "run", [])
    assert sorted(snap.files) == paths
    assert snap.git["untracked"] == {"proj/layers.py": snap.files["proj/layers.py"]} and snap.git["dirty"]


def test_a_repository_without_commits_has_no_commit_and_no_branch(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print(1)\n")
    _git(root, "init", "-q", "-b", "main")
    snap = take_snapshot(root, tmp_path / "run", [])
    assert snap.git is not None and snap.git["commit"] is None and snap.git["branch"] is None
    assert snap.git["untracked"] == {"train.py": snap.files["train.py"]} and snap.git["dirty"]


def test_the_links_check_and_the_snapshot_read_one_listing(tmp_path, monkeypatch):
    """`hermetic run` lists the source files once: the snapshot takes the list the links check made."""
    from hermetic.run import snapshot

    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print(1)\n")
    (root / "extra.py").write_text("print(2)\n")
    listed = list_source_files(root, [])
    assert listed == (["extra.py", "train.py"], False)
    calls = []
    monkeypatch.setattr(snapshot, "list_source_files", lambda *a, **k: calls.append(a) or listed)
    snap = take_snapshot(root, tmp_path / "run", [], listed=(["train.py"], False))
    assert sorted(snap.files) == ["train.py"] and calls == []


def test_what_a_script_left_in_runs_is_not_opened_by_git(tmp_path):
    """A run's outputs live under runs/, inside the project: a script can leave a FIFO there. Named .gitignore,
    git's walk for untracked files would open it and wait forever (the next `hermetic run`, often root, hung):
    the excluded trees are kept out of git's walk, in and outside a repository, and out of the git state's."""
    import threading

    for in_git in (True, False):
        root = tmp_path / ("repo" if in_git else "plain") / "proj"
        root.mkdir(parents=True)
        (root / "train.py").write_text("print(1)\n")
        if in_git:
            _git(root, "init", "-q", "-b", "main")
            _git(root, "add", "-A")
            _git(root, "commit", "-q", "-m", "x")
        left = root / "runs" / "20261203-190000-abcdef" / "outputs"
        left.mkdir(parents=True)
        fifo = left / ".gitignore"
        os.mkfifo(fifo)
        done: list = []
        worker = threading.Thread(target=lambda: done.append(take_snapshot(root, tmp_path / f"run-{in_git}", ["runs"])),
                                  daemon=True)
        worker.start()
        worker.join(60)
        if worker.is_alive():  # let the blocked git go (a writer opens the FIFO), then fail
            fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
            worker.join(30)
            os.close(fd)
            pytest.fail(f"git opened {fifo} (in a repository: {in_git})")
        assert sorted(done[0].files) == ["train.py"]
        assert (done[0].git is not None) == in_git


def test_a_listed_file_gone_before_the_snapshot_is_left_out(tmp_path):
    """`hermetic run` lists the code beside the image's no-op check, which may rewrite hermetic.image.json
    through a temp file beside it: a name listed then renamed away is not part of the code, not an error."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('x')\n")
    (run_dir := tmp_path / "run").mkdir()
    listed = list_source_files(root, [])
    assert listed[0] == ["train.py"]
    snap = take_snapshot(root, run_dir, [], listed=(["train.py", ".hermetic.image.json.x1y2.tmp"], listed[1]))
    assert list(snap.files) == ["train.py"]
    with tarfile.open(snap.tar_path) as tar:
        assert [m.name for m in tar.getmembers() if m.isfile()] == ["train.py"]
