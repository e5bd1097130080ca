"""Lock readers (requirements.txt, uv.lock, pylock.toml) and `hermetic lock`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli, tree_digest
from hermetic.core.errors import LockError
from hermetic.lock.model import Target
from hermetic.lock.read import read_lock
from wheelfactory import make_wheel

FIX = Path(__file__).parent / "fixtures" / "locks" / "equiv"
T311 = Target(python_version="3.11")
BASE = "hermetic/debian-bookworm-python3@sha256:" + "a" * 64


def test_three_formats_read_to_the_same_set():
    """uv wrote these three from one input (tests/fixtures/locks/equiv)."""
    req = read_lock(FIX / "requirements.txt", T311)
    pyl = read_lock(FIX / "pylock.toml", T311)
    uvl = read_lock(FIX / "uv.lock", T311)
    pins = {(w.name, w.version) for w in req.wheels}
    assert pins == {(w.name, w.version) for w in pyl.wheels} == {(w.name, w.version) for w in uvl.wheels}
    assert {"requests", "pyyaml", "urllib3", "idna", "certifi", "charset-normalizer"} == {n for n, _ in pins}
    r, p, u = req.by_name(), pyl.by_name(), uvl.by_name()
    for name in r:
        # uv.lock lists every wheel of the release; requirements.txt every file (wheels + sdist);
        # pylock.toml written for one platform lists that platform's wheels: nested sets.
        assert p[name].sha256s <= u[name].sha256s <= r[name].sha256s, name
        assert p[name].sha256s, name


def test_markers_are_evaluated_for_the_image(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(textwrap.dedent(f"""\
        foo==1.0 ; sys_platform == 'linux' --hash=sha256:{'1' * 64}
        pywin32==306 ; sys_platform == 'win32' --hash=sha256:{'2' * 64}
        tomli==2.0.1 ; python_version < '3.11' --hash=sha256:{'3' * 64}
    """))
    names = [w.name for w in read_lock(lock, T311).wheels]
    assert names == ["foo"]
    assert [w.name for w in read_lock(lock, Target(python_version="3.10")).wheels] == ["foo", "tomli"]


REFUSALS = [
    ("numpy==2.1.0\n", "numpy==2.1.0 has no --hash", ":1"),
    (f"numpy>=2 --hash=sha256:{'a' * 64}\n", "numpy is not pinned with ==", ":1"),
    (f"ok==1.0 --hash=sha256:{'a' * 64}\n-e ./src\n", "editable", ":2"),
    ("git+https://example.invalid/x.git#egg=x\n", "VCS", ":1"),
    ("x @ https://example.invalid/x-1.0-py3-none-any.whl\n", "x: URL requirement without a --hash", ":1"),
    (f"x @ https://example.invalid/x-1.0.tar.gz --hash=sha256:{'a' * 64}\n", "not a wheel", ":1"),
    ("-r other.txt\n", "nested file", ":1"),
    (f"numpy==2.1.0 --hash=md5:{'a' * 32}\n", "only sha256", ":1"),
    (f"numpy==2.1.0 --hash=sha256:{'z' * 64}\n", "malformed sha256", ":1"),
]


@pytest.mark.parametrize("text,needle,line", REFUSALS)
def test_requirements_refusals_name_file_line_and_package(tmp_path, cache_dir, text, needle, line):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.lock").write_text(text)
    before = tree_digest(cache_dir)
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "requirements.lock" + line, needle)
    assert tree_digest(cache_dir) == before


def test_uv_lock_sdist_only_is_refused(tmp_path):
    text = (FIX / "uv.lock").read_text()
    start = text.index('[[package]]\nname = "idna"')
    end = text.index("[[package]]", start + 10)
    block = text[start:end]
    no_wheels = block[: block.index("wheels = [")] + "\n"
    p = tmp_path / "uv.lock"
    p.write_text(text[:start] + no_wheels + text[end:])
    with pytest.raises(LockError, match=r"idna==3\.20: no wheel in the lock \(sdist only\)"):
        read_lock(p, T311)


def test_pylock_sdist_only_and_missing_hash_are_refused(tmp_path):
    text = (FIX / "pylock.toml").read_text()
    start = text.index('name = "idna"')
    end = text.index("[[packages]]", start)
    block = text[start:end]
    p = tmp_path / "pylock.toml"
    p.write_text(text[:start] + block[: block.index("wheels = ")] + "\n" + text[end:])
    with pytest.raises(LockError, match="idna==3.20: no wheel in the lock"):
        read_lock(p, T311)
    p.write_text(text.replace('hashes = { sha256 = "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c" }', "hashes = {}"))
    with pytest.raises(LockError, match="idna.*has no sha256 hash"):
        read_lock(p, T311)


def test_pinned_twice_is_refused(tmp_path):
    p = tmp_path / "requirements.lock"
    p.write_text(f"a==1 --hash=sha256:{'1' * 64}\nA==1 --hash=sha256:{'1' * 64}\n")
    with pytest.raises(LockError, match=r"requirements.lock:2: a is pinned twice"):
        read_lock(p, T311)


def test_hermetic_lock_resolves_offline_from_find_links(tmp_path, isolated_pip):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    make_wheel(wheels, "alpha", "2.0")
    make_wheel(wheels, "beta", "0.5", tag="cp311-cp311-manylinux_2_17_x86_64")
    make_wheel(wheels, "beta", "0.6", tag="cp312-cp312-manylinux_2_17_x86_64")  # wrong Python for the image
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\nalpha\nbeta\n")
    proc = run_cli("lock", "-C", str(proj), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["packages"] == 2 and out["target"]["python"] == "3.11"
    lock = read_lock(proj / "requirements.lock", T311)
    assert [(w.name, w.version) for w in lock.wheels] == [("alpha", "2.0"), ("beta", "0.5")]
    assert str(wheels) not in (proj / "requirements.lock").read_text()  # machine paths stay out of the lock


def test_hermetic_lock_keeps_unreachable_index_and_warns(tmp_path, isolated_pip):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(
        f"--extra-index-url http://127.0.0.1:9/simple\n--no-index\n--find-links {wheels}\nalpha==1.0\n")
    proc = run_cli("lock", "-C", str(proj))
    assert proc.returncode == 0, proc.stderr
    assert "does not answer" in proc.stderr
    text = (proj / "requirements.lock").read_text()
    assert "--extra-index-url http://127.0.0.1:9/simple" in text
    assert read_lock(proj / "requirements.lock", T311).index_urls == ("http://127.0.0.1:9/simple",)


def test_hermetic_lock_failure_names_input_and_writes_nothing(tmp_path, isolated_pip):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {tmp_path}\nnot-there==1.0\n")
    proc = run_cli("lock", "-C", str(proj))
    assert_clean_error(proc, 65, "requirements.in", "resolution failed")
    assert not (proj / "requirements.lock").exists()
    assert not [p for p in proj.iterdir() if p.name.startswith(".hermetic-lock") or p.name.startswith("hermetic-lock")]


def test_pip_tools_resolver_where_host_python_matches(tmp_path, isolated_pip):
    import sys

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    make_wheel(wheels, "alpha", "2.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\npython:\n  version: '{host}'\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\nalpha\n")
    proc = run_cli("lock", "-C", str(proj), "--resolver", "pip-tools")
    assert proc.returncode == 0, proc.stderr
    lock = read_lock(proj / "requirements.lock", Target(python_version=host))
    assert [(w.name, w.version) for w in lock.wheels] == [("alpha", "2.0")]
    text = (proj / "requirements.lock").read_text()
    assert "resolver: pip-tools" in text and str(wheels) not in text


def test_pip_tools_refuses_a_different_image_python(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\npython:\n  version: '3.9'\n")
    (proj / "requirements.in").write_text("alpha\n")
    proc = run_cli("lock", "-C", str(proj), "--resolver", "pip-tools")
    assert_clean_error(proc, 64, "pip-tools resolves for the running interpreter", "Python 3.9", "--resolver uv")


def _lock_project(tmp_path, wheels) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\nalpha\nbeta>=0.5\n")
    return proj


def test_hermetic_lock_is_a_function_of_its_inputs(tmp_path, isolated_pip):
    """Same input, target and resolver: the same bytes, from whichever directory and whatever the
    input file is called (its name and place are not inputs: the lock says `-r <input>`)."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    make_wheel(wheels, "beta", "0.5", tag="cp311-cp311-manylinux_2_17_x86_64")
    make_wheel(wheels, "gamma", "1.0")
    proj = _lock_project(tmp_path, wheels)
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\nalpha\nbeta>=0.5\ngamma\n")
    lock = proj / "requirements.lock"
    assert run_cli("lock", "-C", str(proj)).returncode == 0
    first = lock.read_bytes()
    assert b"hermetic-lock." not in first and b"requirements.in" not in first
    assert first.count(b"# via -r <input>") == 3  # the three direct requirements
    lock.unlink()
    assert run_cli("lock", "-C", str(proj)).returncode == 0
    assert lock.read_bytes() == first  # twice: the same bytes
    # The same requirements in a file with another name, in another directory, locked from elsewhere.
    other = tmp_path / "elsewhere" / "deps"
    other.mkdir(parents=True)
    (other / "gpu-stack.txt").write_text((proj / "requirements.in").read_text())
    lock.unlink()
    proc = run_cli("lock", "-C", str(proj), str(other / "gpu-stack.txt"), cwd=tmp_path / "elsewhere")
    assert proc.returncode == 0, proc.stderr
    assert lock.read_bytes() == first
    assert not [p for p in [*proj.iterdir(), *other.iterdir()] if "hermetic-lock" in p.name]


def test_hermetic_lock_keeps_the_current_pins_unless_upgrade(tmp_path, isolated_pip):
    """A re-lock of unchanged input gives the same lock even when the index has a newer release."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    make_wheel(wheels, "beta", "0.5", tag="cp311-cp311-manylinux_2_17_x86_64")
    proj = _lock_project(tmp_path, wheels)
    lock = proj / "requirements.lock"
    assert run_cli("lock", "-C", str(proj)).returncode == 0
    first = lock.read_bytes()
    make_wheel(wheels, "alpha", "2.0")  # released since
    assert run_cli("lock", "-C", str(proj)).returncode == 0
    assert lock.read_bytes() == first
    assert run_cli("lock", "-C", str(proj), "--upgrade").returncode == 0
    assert [(w.name, w.version) for w in read_lock(lock, T311).wheels] == [("alpha", "2.0"), ("beta", "0.5")]


def _torch_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text("torch==2.13.0\n")
    return proj


def test_no_pip_find_links_lets_the_index_build_win_over_a_local_cpu_wheel(tmp_path, isolated_pip, monkeypatch):
    """A machine whose pip config points find-links at a local torch+cpu wheel: `2.13.0+cpu` satisfies
    `torch==2.13.0` and sorts above it, so it wins unless the lock ignores pip's find-links."""
    from wheelfactory import make_index

    tag = "cp311-cp311-manylinux_2_28_x86_64"
    local = tmp_path / "local-wheels"
    make_wheel(local, "torch", "2.13.0+cpu", tag=tag)
    index = make_index(tmp_path / "index", [make_wheel(tmp_path / "published", "torch", "2.13.0", tag=tag)])
    monkeypatch.setenv("PIP_FIND_LINKS", str(local))
    monkeypatch.setenv("UV_DEFAULT_INDEX", index)  # this test's stand-in for PyPI
    proj = _torch_project(tmp_path)
    proc = run_cli("lock", "-C", str(proj))
    assert proc.returncode == 0, proc.stderr
    assert [(w.name, w.version) for w in read_lock(proj / "requirements.lock", T311).wheels] == [("torch", "2.13.0+cpu")]
    proc = run_cli("lock", "-C", str(proj), "--no-pip-find-links")
    assert proc.returncode == 0, proc.stderr
    assert [(w.name, w.version) for w in read_lock(proj / "requirements.lock", T311).wheels] == [("torch", "2.13.0")]


@pytest.mark.network  # PyPI's metadata for torch
def test_torch_cuda_13_build_resolves_from_pypi(tmp_path, isolated_pip, monkeypatch):
    """The documented way to the CUDA build (docs/gpu.md): resolves only (PyPI's metadata), downloads no wheel."""
    local = tmp_path / "local-wheels"
    make_wheel(local, "torch", "2.13.0+cpu", tag="cp311-cp311-manylinux_2_28_x86_64")
    monkeypatch.setenv("PIP_FIND_LINKS", str(local))  # as on a machine whose pip prefers a local +cpu wheel
    proj = _torch_project(tmp_path)
    proc = run_cli("lock", "-C", str(proj), "--no-pip-find-links", "--json")
    assert proc.returncode == 0, proc.stderr
    pins = {w.name: w.version for w in read_lock(proj / "requirements.lock", T311).wheels}
    assert pins["torch"] == "2.13.0"
    assert {"cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "triton"} <= set(pins)
    from hermetic.gpu.cuda import cuda_info

    info = cuda_info(read_lock(proj / "requirements.lock", T311).wheels)
    assert (info.runtime or "").startswith("13.") and info.cudnn


# --- which torch build a lock holds (hermetic.lock.torchbuild) ----------------------------------

def _lock_of(*pins: tuple[str, str]):
    from hermetic.lock.model import Lock, LockedWheel

    return Lock("requirements.lock", "requirements", Target(),
                tuple(LockedWheel(n, v, frozenset({"0" * 64})) for n, v in pins))


def test_the_examples_cpu_torch_lock_is_said_to_be_the_cpu_build():
    from hermetic.lock.model import Target
    from hermetic.lock.read import read_lock
    from hermetic.lock.torchbuild import torch_build

    tb = torch_build(read_lock(Path(__file__).parent.parent / "examples/torch-mlp/requirements.lock", Target()))
    assert (tb.kind, tb.version, tb.nvidia_wheels) == ("cpu", "2.13.0+cpu", 0)
    assert tb.sentence() == "torch 2.13.0+cpu: the CPU build (no CUDA wheels)"


def test_pypis_torch_with_nvidia_wheels_is_said_to_be_the_cuda_build_and_how_to_get_the_cpu_one():
    from hermetic.lock.model import Target
    from hermetic.lock.read import read_lock
    from hermetic.lock.torchbuild import torch_build

    # Real locks of PyPI's torch (uv, no find-links): what a new user gets from `torch` in requirements.in.
    locks = Path(__file__).parent / "fixtures/locks"
    tb = torch_build(read_lock(locks / "torch-2.11.0-cuda-toolkit.txt", Target()))
    assert (tb.kind, tb.cuda_major, tb.version, tb.nvidia_wheels) == ("cuda", 13, "2.11.0", 15)
    assert "the CUDA 13 build, with 15 nvidia-* wheels" in tb.sentence()
    assert "torch==2.11.0+cpu" in tb.sentence()
    tb = torch_build(read_lock(locks / "torch-2.9.1-cu12.txt", Target()))
    assert (tb.kind, tb.cuda_major) == ("cuda", 12)


def test_torch_builds_from_local_versions_and_cuda_12_suffixes():
    from hermetic.lock.torchbuild import torch_build

    assert torch_build(_lock_of(("numpy", "2.0.0"))) is None
    assert torch_build(_lock_of(("torch", "2.6.0+cu124"))).cuda_major == 12
    tb = torch_build(_lock_of(("torch", "2.5.1"), ("nvidia-cuda-runtime-cu12", "12.4.127"), ("nvidia-cublas-cu12", "1")))
    assert (tb.kind, tb.cuda_major, tb.nvidia_wheels) == ("cuda", 12, 2)
    assert torch_build(_lock_of(("torch", "2.5.1+rocm6.2"))).kind == "rocm"
    assert torch_build(_lock_of(("torch", "2.5.1"))).kind == "cpu"


def test_hermetic_lock_says_which_torch_build_it_locked(tmp_path, isolated_pip):
    # A fake torch and an nvidia-* wheel beside it: what PyPI's Linux torch looks like to the lock.
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "torch", "2.13.0")
    make_wheel(wheels, "nvidia-cuda-runtime", "13.0.96")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\ntorch\nnvidia-cuda-runtime\n")
    proc = run_cli("lock", "-C", str(proj))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("torch 2.13.0: the CUDA 13 build, with 1 nvidia-* wheel "), proc.stdout
    assert "torch==2.13.0+cpu" in proc.stdout
    proc = run_cli("lock", "-C", str(proj), "--json")
    assert json.loads(proc.stdout)["torch"] == {"version": "2.13.0", "kind": "cuda", "cuda_major": 13,
                                                "nvidia_wheels": 1}


def test_a_failed_resolution_says_why_and_which_index_was_left_out(tmp_path, isolated_pip):
    # dcgan with torchvision==0.28.0+cpu: the +cpu wheel lives only on an index this machine cannot reach.
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(
        f"--extra-index-url http://127.0.0.1:9/simple\n--no-index\n--find-links {wheels}\nalpha==1.0+cpu\n")
    proc = run_cli("lock", "-C", str(proj))
    assert_clean_error(proc, 65, "requirements.in: resolution failed", "alpha")
    [error] = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic: error: ")]
    assert "because" in error.lower(), error  # uv's own reason, not only "No solution found"
    assert "  index http://127.0.0.1:9/simple does not answer from this machine" in proc.stderr


def test_a_cuda_torchvision_beside_the_cpu_torch_is_warned_about(tmp_path, isolated_pip):
    # dcgan: torch==2.13.0+cpu and an unpinned torchvision; PyPI's torchvision is a CUDA build that then
    # fails at import with "operator torchvision::nms does not exist".
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "torch", "2.13.0+cpu")
    make_wheel(wheels, "torchvision", "0.28.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\ntorch==2.13.0+cpu\ntorchvision\n")
    proc = run_cli("lock", "-C", str(proj))
    assert proc.returncode == 0, proc.stderr
    assert ("hermetic: warning: torchvision 0.28.0 is a CUDA build (PyPI's Linux wheels are), but torch 2.13.0+cpu "
            "is the CPU build: it will not import; pin torchvision==0.28.0+cpu") in proc.stderr
    make_wheel(wheels, "torchvision", "0.28.0+cpu")
    (proj / "requirements.in").write_text(f"--no-index\n--find-links {wheels}\ntorch==2.13.0+cpu\n"
                                          "torchvision==0.28.0+cpu\n")
    proc = run_cli("lock", "-C", str(proj))
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
