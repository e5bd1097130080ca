"""The C hashing loop (hermetic/data/_filehash.c) against the Python one it replaces.

Both loops have one contract (hashing.hash_span): the same digests, the same
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


def test_the_multi_buffer_hasher_is_used_where_the_library_is_installed() -> None:
    """Likewise for intel-ipsec-mb: installed here (scripts/ensure-build-deps) but not compiled in
    means a build that did not find it."""
    import ctypes.util

    if native is None or ctypes.util.find_library("IPSec_MB") is None or os.environ.get("HERMETIC_NO_IPSEC_MB"):
        pytest.skip("no C loop, or no intel-ipsec-mb on this machine")
    assert native.backend().startswith("intel-ipsec-mb "), native.backend()


needs_native = pytest.mark.skipif(native is None, reason="hermetic.data._filehash is not built")


@pytest.fixture(params=["multi-buffer", "openssl-only"])
def c_sha256(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each C-loop test twice: with intel-ipsec-mb (where built in) and with OpenSSL alone."""
    if request.param == "openssl-only":
        monkeypatch.setenv("HERMETIC_NO_IPSEC_MB", "1")
    else:
        monkeypatch.delenv("HERMETIC_NO_IPSEC_MB", raising=False)
        if native is not None and not native.backend().startswith("intel-ipsec-mb"):
            pytest.skip("built without intel-ipsec-mb")
    return request.param


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_both(paths: list[str], dir_fd: int | None = None, start: int = 0, end: int | None = None
             ) -> tuple[tuple[int, list, bytes, bytes], tuple[int, list, bytes, bytes]]:
    end = len(paths) if end is None else end
    out = []
    for loop in (hashing.hash_span, hashing._hash_span_py):
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
        odd_tree: tuple[Path, dict[str, bytes | None]], relative: bool, c_sha256: str) -> None:
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
def test_many_files_of_every_size_around_the_block_and_buffer_limits(tmp_path: Path, c_sha256: str) -> None:
    """Enough files to cycle every multi-buffer slot several times, sizes on both sides of sha256's
    block boundaries and of the multi-buffer job limit (65534 bytes), with failures in between."""
    import random

    rng = random.Random(7)
    sizes = [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 4095, 4096, 65533, 65534, 65535, 65536, 200_000]
    sizes += [rng.randrange(0, 70_000) for _ in range(400)]
    rng.shuffle(sizes)
    pool = os.urandom(200_001)
    paths, expected = [], []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i:04d}"
        data = pool[i % 1000:i % 1000 + size]
        p.write_bytes(data)
        paths.append(str(p))
        expected.append(sha(data))
        if i % 50 == 7:  # a path that fails among the jobs in flight
            paths.append(str(tmp_path / f"gone{i}"))
            expected.append(None)
    c, py = run_both(paths)
    assert c == py
    _, errors, digests, _ = c
    assert [i for i, _ in errors] == [i for i, e in enumerate(expected) if e is None]
    assert all(digests[i * 32:i * 32 + 32].hex() == e for i, e in enumerate(expected) if e is not None)


@needs_native
def test_the_loop_is_safe_to_run_in_several_threads_at_once(tmp_path: Path, c_sha256: str) -> None:
    """The GIL is released for the whole span: threads hash at the same time, each with its own
    multi-buffer manager."""
    from concurrent.futures import ThreadPoolExecutor

    paths = []
    for i in range(300):
        (tmp_path / f"f{i}").write_bytes(os.urandom(i * 97 % 30_000))
        paths.append(str(tmp_path / f"f{i}"))
    want = [sha(Path(p).read_bytes()) for p in paths]

    def one(_: int) -> list[str]:
        digests, keys = bytearray(len(paths) * 32), bytearray(len(paths) * 40)
        hashing.hash_span(paths, 0, len(paths), digests, keys, None)
        return [digests[i * 32:i * 32 + 32].hex() for i in range(len(paths))]

    with ThreadPoolExecutor(4) as pool:
        assert all(got == want for got in pool.map(one, range(8)))


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
    nbytes, errors = hashing.hash_span(paths, 0, len(paths), digests, keys, None)
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
    assert r.returncode == 65 and "1 changed (f123)" in r.stdout + r.stderr
    # The manifest the Python loop wrote is the one sha256sum agrees with.
    (root / "f123").unlink()
    r = subprocess.run(["sha256sum", "-c", "--quiet", str(manifest)], cwd=root, capture_output=True, text=True)
    assert r.returncode == 1 and "f123" in r.stdout + r.stderr
