"""Bytecode in the image: PEP 552 hash-based .pyc, compiled by the base image's own interpreter.

The compiler is the base's python copied out of its layers and run on the host
(hermetic/builder/interpreter.py); the first test proves that it writes the
same bytes as that interpreter running inside a container of the base.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from buildsupport import build_json, make_project
from conftest import run_cli
from wheelfactory import make_index, make_wheel

pytestmark = pytest.mark.docker

SITE = "opt/venv/lib/python3.11/site-packages"

TRICKY = {  # sources whose bytecode depends on the compiler's details
    "plain.py": b"x = 1\n",
    "latin1.py": "# -*- coding: latin-1 -*-\ns = 'caf\xe9'\n".encode("latin-1"),
    "consts.py": b"def f(a):\n    return a in {'x', 'y', 'zz', 1, 2.5} and a not in frozenset()\nBIG = 2 ** 200\n"
                 b"T = ('a', ('b', ('c',)), b'\\x00' * 300)\n",
    "fstr.py": b"def g(n):\n    return f'{n!r:>10}' + f\"{n=}\"\n",
    "nested.py": b"class A:\n    def m(self):\n        def inner():\n            return lambda: self\n        return inner\n",
    "async_gen.py": b"async def ag():\n    async for x in y():\n        yield [i async for i in x]\n",
    "doc.py": b'"""module doc"""\ndef h():\n    """doc"""\n    assert h, "msg"\n',
    "broken.py": b"def (:\n",
    "nul.py": b"x = 1\x00\n",
}


@pytest.fixture(scope="module")
def base(session_cache, base_ref):
    """The bootstrapped base: (store, BaseImage, BaseFacts)."""
    from hermetic.builder.base import resolve_base, scan_base
    from hermetic.store.oci import OciStore

    store = OciStore(session_cache / "oci")
    b = resolve_base(store, base_ref)
    return store, b, scan_base(store, b, session_cache / "bases")


@pytest.fixture(scope="module")
def interpreter(base, session_cache):
    from hermetic.builder.interpreter import base_interpreter

    store, b, facts = base
    return base_interpreter(store, b, facts, "/usr/bin/python3", "3.11", session_cache / "bases",
                            session_cache / "tmp")


def _jobs() -> list[tuple[str, bytes]]:
    jobs = [(f"/{SITE}/tricky/{name}", src) for name, src in sorted(TRICKY.items())]
    pkg = Path(__file__).resolve().parent.parent / "hermetic"
    for p in sorted(pkg.rglob("*.py")):  # ~200 real modules of every shape
        jobs.append((f"/{SITE}/hermetic/{p.relative_to(pkg).as_posix()}", p.read_bytes()))
    return jobs


def _frames(jobs: list[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    for path, src in jobs:
        p = path.encode()
        out += len(p).to_bytes(4, "little") + p + len(src).to_bytes(4, "little") + src
    return bytes(out)


def _answers(data: bytes, n: int) -> tuple[dict, list[bytes | None]]:
    size = int.from_bytes(data[:4], "little")
    hello = json.loads(data[4:4 + size])
    pos, out = 4 + size, []
    for _ in range(n):
        status, length = data[pos], int.from_bytes(data[pos + 1:pos + 5], "little")
        out.append(data[pos + 5:pos + 5 + length] if status == 0 else None)
        pos += 5 + length
    assert pos == len(data)
    return hello, out


def test_the_copied_interpreter_compiles_exactly_as_the_base_does_in_a_container(base, interpreter, docker_client):
    from hermetic.builder.bytecode import SERVER, Compiler
    from hermetic.builder.bytecode import _ENV
    from hermetic.engines.dockerimages import load_image

    store, b, _facts = base
    assert interpreter.version[:2] == (3, 11) and interpreter.cache_tag == "cpython-311"
    jobs = _jobs()
    with Compiler.start(interpreter, "unchecked-hash") as c:
        native = c.compile_all(jobs)
        maps = c.hello["maps"]
    # every file mapped into the compiler is the base's own copy, none of the host's
    assert maps and all(os.path.realpath(m).startswith(str(interpreter.root.resolve())) for m in maps)
    assert any("libc.so" in m for m in maps) and any(m.endswith("python3.11") for m in maps)
    image_id = load_image(store, b.manifest_digest)
    env = [a for k, v in _ENV.items() if k != "PATH" for a in ("-e", f"{k}={v}")]
    proc = subprocess.run(["docker", "run", "-i", "--rm", "--network", "none", "--read-only", *env, image_id,
                           "/usr/bin/python3", "-S", "-s", "-c", SERVER.read_text(), "unchecked-hash"],
                          input=_frames(jobs), capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    hello, in_container = _answers(proc.stdout, len(jobs))
    assert (hello["magic"], hello["cache_tag"]) == (interpreter.magic, interpreter.cache_tag)
    assert hello["version"][:3] == list(interpreter.version)
    differ = [path for (path, _), a, b in zip(jobs, native, in_container) if a != b]
    assert differ == [], differ[:5]
    by_path = dict(zip((p for p, _ in jobs), native))
    assert by_path[f"/{SITE}/tricky/broken.py"] is None and by_path[f"/{SITE}/tricky/nul.py"] is None
    assert sum(x is not None for x in native) == len(jobs) - 2


def test_each_file_compiles_the_same_alone_or_after_others(interpreter):
    """The compiler's state after a file does not leak into the next one's bytes (FLAG_REF, interning)."""
    from hermetic.builder.bytecode import Compiler

    jobs = _jobs()
    with Compiler.start(interpreter, "unchecked-hash") as c:
        together = c.compile_all(list(reversed(jobs)))[::-1]
    for i in range(0, len(jobs), max(1, len(jobs) // 12)):
        with Compiler.start(interpreter, "unchecked-hash") as c:
            assert c.compile_all([jobs[i]]) == [together[i]], jobs[i][0]


def test_pyc_bytes_are_pep552_hash_based_with_the_final_path(interpreter):
    from hermetic.builder.bytecode import Compiler, pyc_path

    path, src = f"/{SITE}/tricky/plain.py", TRICKY["plain.py"]
    with Compiler.start(interpreter, "unchecked-hash") as c:
        [unchecked] = c.compile_all([(path, src)])
    with Compiler.start(interpreter, "checked-hash") as c:
        [checked] = c.compile_all([(path, src)])
    assert unchecked and checked and pyc_flags(unchecked) == 1 and pyc_flags(checked) == 3
    assert unchecked[:4] == bytes.fromhex(interpreter.magic) and unchecked[8:16] == checked[8:16]
    import importlib.util

    if importlib.util.MAGIC_NUMBER == unchecked[:4]:  # the host reads this marshal format too
        assert unchecked[8:16] == importlib.util.source_hash(src)
        assert marshal.loads(unchecked[16:]).co_filename == path
    assert pyc_path(f"{SITE}/a/b.py", "cpython-311") == f"{SITE}/a/__pycache__/b.cpython-311.pyc"


def pyc_flags(data: bytes) -> int:
    """The PEP 552 flags word: 0 timestamp-based, 1 unchecked hash, 3 checked hash."""
    return int.from_bytes(data[4:8], "little")


def _layer_members(store, manifest_digest: str, base_layers: int) -> dict[str, bytes | None]:
    """path -> bytes (regular files) of every layer above the base."""
    manifest = store.read_json(manifest_digest)
    out: dict[str, bytes | None] = {}
    for layer in manifest["layers"][base_layers:]:
        with tarfile.open(store.blob_path(layer["digest"])) as tf:
            for m in tf:
                if m.isreg():
                    out[m.name] = tf.extractfile(m).read()
    return out


@pytest.fixture
def pyc_wheels(tmp_path_factory, isolated_pip, monkeypatch):
    src = tmp_path_factory.mktemp("pycwheels")
    files = {
        "alpha": make_wheel(src, "alpha", "1.0", files={"alpha/util.py": b"def f():\n    return 42\n",
                                                         "alpha/broken.py": b"def (:\n"}),
        "beta": make_wheel(src, "beta", "2.0"),
    }
    monkeypatch.setenv("PIP_INDEX_URL", make_index(src / "index", list(files.values())))
    return files


def test_the_image_ships_hash_based_pycs_that_its_interpreter_uses_without_compiling(
        tmp_path, use_session_cache, base_ref, pyc_wheels, docker_client):
    from hermetic.builder.bytecode import pyc_path
    from hermetic.store.oci import OciStore

    proj = make_project(tmp_path / "p", base_ref, pyc_wheels)
    out = build_json(proj)
    store = OciStore(use_session_cache / "oci")
    members = _layer_members(store, out["manifest_digest"], 1)
    sources = sorted(p for p in members if p.startswith(SITE + "/") and p.endswith(".py"))
    assert f"{SITE}/alpha/util.py" in sources and f"{SITE}/hermetic_runtime/seeding.py" in sources
    for py in sources:
        pyc = pyc_path(py, "cpython-311")
        if py.endswith("alpha/broken.py"):
            assert pyc not in members  # does not compile: no .pyc, as with pip
            continue
        data = members[pyc]
        assert data is not None and pyc_flags(data) == 1, py  # unchecked-hash: no timestamp
    labels = json.loads((proj / "hermetic.image.json").read_text())["labels"]
    assert labels["org.hermetic.bytecode"].startswith("unchecked-hash cpython-311 (Python 3.11.")
    # In a container with a read-only root, every module of ours is loaded from its .pyc, none compiled.
    proc = subprocess.run(["docker", "run", "--rm", "--read-only", "--network", "none", out["image_id"],
                           "python", "-v", "-c", "import alpha.util, beta, hermetic_runtime.seeding"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    compiled = [ln for ln in proc.stderr.splitlines() if ln.startswith("# code object from /opt/venv/")]
    assert compiled == []
    matched = {ln.split()[1] for ln in proc.stderr.splitlines() if " matches /opt/venv/" in ln}
    for mod in ("alpha/__init__", "alpha/util", "beta/__init__", "hermetic_runtime/seeding", "_hermetic_startup"):
        head, _, name = mod.rpartition("/")
        assert f"/{SITE}/{head + '/' if head else ''}__pycache__/{name}.cpython-311.pyc" in matched, mod


def test_checked_hash_and_no_bytecode_are_choices_of_the_image(tmp_path, use_session_cache, base_ref, pyc_wheels):
    from hermetic.store.oci import OciStore

    store = OciStore(use_session_cache / "oci")
    ids = {}
    for mode in ("checked-hash", "none"):
        proj = make_project(tmp_path / mode, base_ref, pyc_wheels, extra=f"build:\n  bytecode: {mode}\n")
        out = build_json(proj, "--no-load")
        ids[mode] = out["image_id"]
        pycs = {p: d for p, d in _layer_members(store, out["manifest_digest"], 1).items() if p.endswith(".pyc")}
        if mode == "none":
            assert pycs == {}
        else:
            assert pycs and {pyc_flags(d or b"") for d in pycs.values()} == {3}
    assert ids["checked-hash"] != ids["none"]


def test_read_elf_and_the_host_library_guard(tmp_path):
    from hermetic.builder.bytecode import BytecodeError, check_maps
    from hermetic.builder.interpreter import read_elf

    info = read_elf(Path("/bin/sh").resolve().read_bytes(), "/bin/sh")
    assert info.interpreter and "libc.so.6" in info.needed
    with pytest.raises(BytecodeError, match="not an ELF"):
        read_elf(b"#!/bin/sh\n", "/usr/bin/python3")
    root = tmp_path / "copy"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libc.so.6").write_bytes(b"")
    check_maps([str(root / "lib" / "libc.so.6"), "/proc/self/fd/3"], root)
    with pytest.raises(BytecodeError, match="from this host"):
        check_maps([str(root / "lib" / "libc.so.6"), "/usr/lib/x86_64-linux-gnu/libc.so.6"], root)


def test_a_python_version_the_base_does_not_have_is_refused(tmp_path, cache_dir, session_cache, base_ref, pyc_wheels):
    from conftest import assert_clean_error
    from buildsupport import share_base

    share_base(session_cache, cache_dir)
    proj = make_project(tmp_path / "p", base_ref, pyc_wheels, extra='python:\n  version: "3.12"\n')
    proc = run_cli("build", "-C", str(proj), "--no-load")
    assert_clean_error(proc, 78, "python.version 3.12", "/usr/lib/python3.11")
