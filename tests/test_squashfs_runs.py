"""Charliecloud runs an image from its one SquashFS file by default (root: the kernel's squashfs where no user
can change the file, else squashfuse), from its layer directories where told or where it cannot mount one;
the same run any way gives the same bits, and the record says which, naming the file and its sha256."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import assert_clean_error, run_cli
from run_support import diff_json, hermetic_run, run_dir_of, sha256_file

pytestmark = [pytest.mark.docker, pytest.mark.engines]


def test_a_run_from_the_file_and_one_from_directories_are_bitwise_identical(logreg, module_cache):
    _, from_file = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "2")
    image = from_file["invocation"]["engine"]["image"]
    digest = from_file["image"]["manifest_digest"]
    assert image["form"] == "squashfs", image
    assert image["path"] == str(module_cache / "squashfs" / f"sha256-{digest[7:]}.sqfs")
    assert image["sha256"] == sha256_file(image["path"])
    side = json.loads(open(image["path"] + ".json").read())
    assert side["manifest_digest"] == digest and side["sha256"] == image["sha256"]
    assert any("SquashFS file" in n and image["sha256"] in n for n in from_file["invocation"]["engine"]["notes"])

    _, from_dirs = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "2",
                                env={"HERMETIC_IMAGE_FORM": "directory"})
    assert from_dirs["invocation"]["engine"]["image"]["form"] == "directory"
    assert any("HERMETIC_IMAGE_FORM=directory" in n for n in from_dirs["invocation"]["engine"]["notes"])
    code, diff = diff_json(run_dir_of(logreg, from_file), run_dir_of(logreg, from_dirs))
    assert code == 0 and diff["verdict"]["kind"] == "identical", diff["verdict"]


def test_the_kernels_mount_and_squashfuses_give_the_same_bits_and_leave_no_loop_device(logreg, module_cache):
    if os.geteuid() != 0:
        pytest.skip("only root mounts with the kernel")
    _, kernel = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "2")
    image = kernel["invocation"]["engine"]["image"]
    assert image["form"] == "squashfs", image
    mounters = [n for n in kernel["invocation"]["engine"]["notes"] if "SquashFS file" in n]
    assert mounters and mounters[0].endswith("mounted by the kernel's squashfs"), mounters
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    assert image["path"] not in loops, loops  # the loop device went with the run's mount namespace

    store = module_cache / "squashfs"
    mode = store.stat().st_mode & 0o7777
    store.chmod(mode | 0o020)  # a group could swap the file after its check: squashfuse reads it
    try:
        _, fuse = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "2")
    finally:
        store.chmod(mode)
    assert fuse["invocation"]["engine"]["image"] == image
    assert any(n.endswith("mounted by squashfuse") for n in fuse["invocation"]["engine"]["notes"])
    code, diff = diff_json(run_dir_of(logreg, kernel), run_dir_of(logreg, fuse))
    assert code == 0 and diff["verdict"]["kind"] == "identical", diff["verdict"]


def test_an_altered_file_in_the_cache_is_made_again_before_it_is_mounted(logreg, module_cache):
    _, first = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "1")
    image = first["invocation"]["engine"]["image"]
    inode = os.stat(image["path"]).st_ino
    with open(image["path"], "r+b") as f:  # rewritten in place: the size is the same, the stat is not
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    _, again = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "1")
    assert again["invocation"]["engine"]["image"] == image  # the same bytes, made again from the store's layers
    assert sha256_file(image["path"]) == image["sha256"] and os.stat(image["path"]).st_ino != inode


def test_an_unknown_form_is_a_usage_error(logreg):
    proc = run_cli("run", "--engine", "charliecloud", "train.py", cwd=logreg, env={"HERMETIC_IMAGE_FORM": "zip"})
    assert_clean_error(proc, 64, "HERMETIC_IMAGE_FORM='zip': one of auto, squashfs, directory")
