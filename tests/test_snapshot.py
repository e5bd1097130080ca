"""The code snapshot holds the code: what an earlier local run left and git ignores stays out (issue 25)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

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
