"""`hermetic data manifest|verify` as users run them, and sha256sum -c on what they write."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))


def hermetic(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=120)


def tricky_dataset(root: Path) -> dict[str, bytes]:
    """Names sha256sum -c must read back exactly as hermetic wrote them."""
    files = {
        "plain.txt": b"plain",
        "with space.txt": b"space",
        " leading space": b"lead",
        "trailing space ": b"trail",
        "-starts-with-dash": b"dash",
        "#hash-first": b"hash",
        "back\\slash": b"backslash",
        "tab\there": b"tab",
        "quote'and\"double": b"quotes",
        "caf\u00e9/\u65e5\u672c\u8a9e.bin": b"unicode",
        "nested/deeper/still/empty.bin": b"",
        "star*name": b"star",
    }
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    (root / "nested" / "link.bin").symlink_to("deeper/still/empty.bin")
    (root / "empty-dir").mkdir()
    return files


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_manifest_written_by_hermetic_passes_sha256sum_c_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "data"
    files = tricky_dataset(root)
    out = tmp_path / "data.sha256"
    r = hermetic("data", "manifest", str(root), "-o", str(out))
    assert r.returncode == 0, r.stderr
    check = subprocess.run(["sha256sum", "-c", "--strict", str(out)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    ok_lines = check.stdout.splitlines()
    assert len(ok_lines) == len(files) + 1 and all(line.endswith(": OK") for line in ok_lines)
    # ...and sha256sum notices tampering through the same file.
    (root / "plain.txt").write_bytes(b"PLAIN")
    check = subprocess.run(["sha256sum", "-c", "--quiet", str(out)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 1 and "plain.txt: FAILED" in check.stdout


def test_manifest_prints_count_bytes_and_dataset_id(tmp_path: Path) -> None:
    root = tmp_path / "data"
    tricky_dataset(root)
    out = tmp_path / "m.sha256"
    r = hermetic("data", "manifest", str(root), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    data = out.read_bytes()
    assert doc["sha256"] == hashlib.sha256(data).hexdigest()
    assert doc["file_count"] == data.count(b"\n") == 13
    assert doc["oxum"] == f"{doc['total_bytes']}.13"
    assert doc["total_bytes"] == sum(len(b) for b in [b"plain", b"space", b"lead", b"trail", b"dash", b"hash",
                                                      b"backslash", b"tab", b"quotes", b"unicode", b"star"])


def test_manifest_to_stdout_keeps_stdout_clean(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a").write_bytes(b"a")
    (root / "b").write_bytes(b"b")
    r = hermetic("data", "manifest", str(root))
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"{hashlib.sha256(b'b').hexdigest()}  b\n"
                        f"{hashlib.sha256(b'a').hexdigest()}  sub/a\n")
    assert "2 files, 2 bytes (bytes.count 2.2)" in r.stderr and "sha256 " in r.stderr


def test_manifest_redirected_into_the_dataset_does_not_list_itself(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "a").write_bytes(b"a")
    subprocess.run(f'"{sys.executable}" -m hermetic data manifest . > manifest-sha256.txt', shell=True,
                   cwd=root, check=True)
    assert (root / "manifest-sha256.txt").read_text() == f"{hashlib.sha256(b'a').hexdigest()}  a\n"
    assert hermetic("data", "verify", str(root), str(root / "manifest-sha256.txt")).returncode == 0


def test_verify_exit_codes_and_json(tmp_path: Path) -> None:
    root = tmp_path / "data"
    tricky_dataset(root)
    m = tmp_path / "m.sha256"
    assert hermetic("data", "manifest", str(root), "-o", str(m)).returncode == 0
    ok = hermetic("data", "verify", str(root), str(m))
    assert ok.returncode == 0 and ok.stdout.startswith("OK ") and "bytes.count" in ok.stdout

    (root / "plain.txt").write_bytes(b"PLAIN")
    (root / "with space.txt").unlink()
    (root / "stray").write_bytes(b"?")
    bad = hermetic("data", "verify", str(root), str(m), "--full", "--json")
    assert bad.returncode == 65
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["mode"] == "full"
    assert doc["missing"] == ["with space.txt"] and doc["extra"] == ["stray"]
    assert doc["changed"] == [{"path": "plain.txt", "expected": hashlib.sha256(b"plain").hexdigest(),
                               "actual": hashlib.sha256(b"PLAIN").hexdigest()}]
    assert bad.stderr.startswith("hermetic: error: ") and len(bad.stderr.splitlines()) == 1
    assert "1 changed (plain.txt)" in bad.stderr

    human = hermetic("data", "verify", str(root), str(m))
    assert human.returncode == 65
    assert "changed  plain.txt" in human.stdout and "missing  with space.txt" in human.stdout
    assert "extra    stray" in human.stdout


def test_verify_refuses_malformed_manifest_with_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    m = tmp_path / "m.sha256"
    m.write_text(f"{'a' * 64}  ok\n{'b' * 64}  /etc/passwd\n")
    r = hermetic("data", "verify", str(root), str(m))
    assert r.returncode == 65
    reason = "absolute path (paths are relative to the dataset root): '/etc/passwd'"
    assert r.stderr == f"hermetic: error: {m}:2: {reason}\n"
    assert "Traceback" not in r.stderr


def test_manifest_refuses_escaping_symlink_without_traceback(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink("../secret", root / "leak")
    r = hermetic("data", "manifest", str(root))
    assert r.returncode == 65 and r.stdout == ""
    assert r.stderr.startswith("hermetic: error: ") and "outside the dataset root" in r.stderr


def test_verify_usage_errors(tmp_path: Path) -> None:
    r = hermetic("data", "verify", str(tmp_path))
    assert r.returncode == 64 and "give both DIRECTORY and MANIFEST" in r.stderr


def test_verify_without_arguments_checks_every_configured_dataset(tmp_path: Path) -> None:
    project = tmp_path / "project"
    for name in ("train", "val"):
        (project / "data" / name).mkdir(parents=True)
        (project / "data" / name / f"{name}.bin").write_bytes(name.encode())
        assert hermetic("data", "manifest", str(project / "data" / name), "-o",
                        str(project / f"{name}.sha256")).returncode == 0
    (project / "hermetic.yaml").write_text(
        "name: demo\n"
        f"base: debian@sha256:{'0' * 64}\n"
        "datasets:\n"
        "  - {name: train, path: data/train, manifest: train.sha256, mount: /data/train}\n"
        "  - {name: val, path: ./data/val/, manifest: val.sha256, mount: /data/val}\n"
    )
    r = hermetic("data", "verify", cwd=project)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("OK ") == 2 and "train: OK" in r.stdout and "val: OK" in r.stdout

    (project / "data" / "val" / "val.bin").write_bytes(b"VAL")
    r = hermetic("data", "verify", "-C", str(project), "--json")
    assert r.returncode == 65
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and [d["name"] for d in doc["datasets"]] == ["train", "val"]
    assert [d["ok"] for d in doc["datasets"]] == [True, False]
    assert "dataset 'val':" in r.stderr and "1 changed (val.bin)" in r.stderr

    r = hermetic("data", "verify", "-C", str(project), "-d", "train")
    assert r.returncode == 0 and "val" not in r.stdout
    r = hermetic("data", "verify", "-C", str(project), "-d", "test")
    assert r.returncode == 64 and "no dataset named 'test' (declared: train, val)" in r.stderr


def test_help_teaches_with_examples() -> None:
    r = hermetic("data", "verify", "--help")
    assert r.returncode == 0 and "hermetic data verify data/train data/train.sha256" in r.stdout
    assert "--full" in r.stdout and "ctime" in r.stdout
    r = hermetic("data", "manifest", "--help")
    assert r.returncode == 0 and "-o data/train.sha256" in r.stdout
