"""The C hashing loop (hermetic/data/_filehash.c) against the Python one it replaces.

Both loops have one contract (hashing._hash_span): the same digests, the same
stat keys, the same errors for the same files. Every case a dataset can present
goes through both and the outputs are compared byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.data import hashing
from hermetic.data.statcache import stat_key

native = hashing._native


def test_the_c_loop_is_built() -> None:
    """A build that silently fell back to Python (setup.py's extension is optional) is slower, not
    wrong: fail here so that the test suite notices. HERMETIC_PURE_PYTHON=1 is the way to opt out."""
    if os.environ.get("HERMETIC_PURE_PYTHON"):
        pytest.skip("HERMETIC_PURE_PYTHON is set")
    assert native is not None, (
        "hermetic.data._filehash is not built: a C compiler and OpenSSL's headers (libssl-dev) are "
        "needed when hermetic is installed (pip install -e . builds it)")


needs_native = pytest.mark.skipif(native is None, reason="hermetic.data._filehash is not built")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_both(paths: list[str], dir_fd: int | None = None, start: int = 0, end: int | None = None
             ) -> tuple[tuple[int, list, bytes, bytes], tuple[int, list, bytes, bytes]]:
    end = len(paths) if end is None else end
    out = []
    for loop in (hashing._hash_span, hashing._hash_span_py):
        digests = bytearray(b"\xee" * (len(paths) * 32))  # junk: every slot in the span must be written
        keys = bytearray(b"\xee" * (len(paths) * 40))
        nbytes, errors = loop(paths, start, end, digests, keys, None, dir_fd)
        out.append((nbytes, errors, bytes(digests), bytes(keys)))
    return out[0], out[1]


@pytest.fixture
def odd_tree(tmp_path: Path) -> tuple[Path, dict[str, bytes | None]]:
    """Every size class the loops treat differently, names that are not ASCII or not UTF-8,
    and paths that are not regular files or are gone."""
    root = tmp_path / "t"
    (root / "sub").mkdir(parents=True)
    contents: dict[str, bytes | None] = {
        "empty": b"",
        "one": b"x",
        "sub/page": os.urandom(4096),
        "exactly-128k": os.urandom(128 << 10),
        "one-mib": os.urandom(1 << 20),
        "one-mib-plus-one": os.urandom((1 << 20) + 1),
        "three-mib": os.urandom(3 << 20),
        "caf\u00e9": b"accented",
        os.fsdecode(b"latin1-\xe9"): b"not utf-8",  # a surrogate-escaped name: its bytes must reach open()
    }
    for rel, data in contents.items():
        assert data is not None
        (root / rel).write_bytes(data)
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    (root / "link").symlink_to("one")
    contents.update({"fifo": None, "dir": None, "gone": None, "link": b"x", "sub/../one": b"x",
                     "one/not-a-dir": None})
    return root, contents


@needs_native
@pytest.mark.parametrize("relative", [True, False])
def test_c_and_python_loops_agree_on_every_kind_of_path(
        odd_tree: tuple[Path, dict[str, bytes | None]], relative: bool) -> None:
    root, contents = odd_tree
    names = list(contents)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        paths = names if relative else [os.path.join(str(root), n) for n in names]
        c, py = run_both(paths, fd if relative else None)
    finally:
        os.close(fd)
    assert c == py
    nbytes, errors, digests, keys = c
    by_index = dict(errors)
    for i, name in enumerate(names):
        data = contents[name]
        if data is None:
            assert digests[i * 32:i * 32 + 32] == bytes(32) and keys[i * 40:i * 40 + 40] == bytes(40)
        else:
            assert i not in by_index
            assert digests[i * 32:i * 32 + 32].hex() == sha(data), name
            key = hashing.Hashed(keys, digests).key(i)
            assert key == stat_key(os.stat(root / name)), name
    assert nbytes == sum(len(d) for d in contents.values() if d is not None)
    assert by_index == {
        names.index("fifo"): "no longer a regular file",
        names.index("dir"): "no longer a regular file",
        names.index("gone"): None,  # vanished, not an error
        names.index("one/not-a-dir"): os.strerror(20),  # ENOTDIR
    }


@needs_native
def test_files_over_the_c_limit_go_to_the_python_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large files are read by the Python loop, which reports progress inside them (and can stop)."""
    monkeypatch.setattr(hashing, "_NATIVE_MAX", 1000)
    files = [tmp_path / f"f{i}" for i in range(6)]
    for i, p in enumerate(files):
        p.write_bytes(os.urandom([10, 5000, 999, 1000, 1001, 300_000][i]))
    files[2].unlink()  # vanished between two deferred ones
    paths = [str(p) for p in files]
    calls: list[int] = []
    real_py = hashing._hash_span_py

    def spy(paths, start, end, *args):  # type: ignore[no-untyped-def]
        calls.append(start)
        return real_py(paths, start, end, *args)

    monkeypatch.setattr(hashing, "_hash_span_py", spy)
    digests, keys = bytearray(len(paths) * 32), bytearray(len(paths) * 40)
    nbytes, errors = hashing._hash_span(paths, 0, len(paths), digests, keys, None)
    assert calls == [1, 4, 5]  # only the files over 1000 bytes
    assert errors == [(2, None)]
    assert nbytes == 10 + 5000 + 1000 + 1001 + 300_000
    for i, p in enumerate(files):
        if i != 2:
            assert digests[i * 32:i * 32 + 32].hex() == sha(p.read_bytes())


@needs_native
def test_a_span_inside_the_list_writes_only_its_own_slots(tmp_path: Path) -> None:
    paths = []
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * i)
        paths.append(str(tmp_path / f"f{i}"))
    c, py = run_both(paths, None, 3, 7)
    assert c == py
    _, _, digests, keys = c
    assert digests[:3 * 32] == b"\xee" * 96 and digests[7 * 32:] == b"\xee" * 96
    assert [digests[i * 32:i * 32 + 32].hex() for i in range(3, 7)] == [sha(bytes([i]) * i) for i in range(3, 7)]


@needs_native
def test_bad_arguments_raise_instead_of_writing_out_of_bounds(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"f")
    paths = [str(tmp_path / "f")] * 4
    ok_d, ok_k = bytearray(4 * 32), bytearray(4 * 40)
    with pytest.raises(IndexError):
        native.hash_span(paths, 2, 5, ok_d, ok_k, -1, 1 << 20)
    with pytest.raises(IndexError):
        native.hash_span(paths, 3, 2, ok_d, ok_k, -1, 1 << 20)
    with pytest.raises(ValueError, match="too small"):
        native.hash_span(paths, 0, 4, bytearray(3 * 32), ok_k, -1, 1 << 20)
    with pytest.raises(ValueError, match="too small"):
        native.hash_span(paths, 0, 4, ok_d, bytearray(4 * 40 - 1), -1, 1 << 20)
    with pytest.raises(TypeError):
        native.hash_span(paths, 0, 4, bytes(4 * 32), ok_k, -1, 1 << 20)  # read-only output
    with pytest.raises(TypeError, match="not a str"):
        native.hash_span([str(tmp_path / "f"), b"f"], 0, 2, ok_d, ok_k, -1, 1 << 20)
    with pytest.raises(ValueError, match="null byte"):
        native.hash_span(["f\0g"], 0, 1, ok_d, ok_k, -1, 1 << 20)
    assert native.hash_span(paths, 4, 4, ok_d, ok_k, -1, 1 << 20) == (0, [], [])


def test_the_python_loop_verifies_end_to_end_when_the_c_loop_is_switched_off(tmp_path: Path) -> None:
    """HERMETIC_PURE_PYTHON=1: the fallback of a build without a compiler, through the CLI."""
    root = tmp_path / "data"
    root.mkdir()
    for i in range(300):  # enough for the worker processes
        (root / f"f{i:03d}").write_bytes(os.urandom(2000 + i))
    env = dict(os.environ, HERMETIC_PURE_PYTHON="1", HERMETIC_CACHE=str(tmp_path / "cache"))
    cli = [sys.executable, "-m", "hermetic", "data"]
    manifest = tmp_path / "data.sha256"
    subprocess.run([*cli, "manifest", str(root), "-o", str(manifest)], env=env, check=True, capture_output=True)
    probe = "import hermetic.data.hashing as h; print(h._native)"
    assert subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout == "None\n"
    (root / "f123").write_bytes(b"changed")
    r = subprocess.run([*cli, "verify", str(root), str(manifest), "--full"], env=env, capture_output=True, text=True)
    assert r.returncode == 3 and "1 changed (f123)" in r.stdout + r.stderr
    # The manifest the Python loop wrote is the one sha256sum agrees with.
    (root / "f123").unlink()
    r = subprocess.run(["sha256sum", "-c", "--quiet", str(manifest)], cwd=root, capture_output=True, text=True)
    assert r.returncode == 1 and "f123" in r.stdout + r.stderr
