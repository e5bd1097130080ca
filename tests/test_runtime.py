"""hermetic.inimage.runtime on the host: the parts that need neither numpy nor torch.

The runtime ships into images as the top-level package ``hermetic_runtime``,
so some tests copy it under that name and import it in a fresh interpreter
started with ``-S -I`` (no site-packages: no hermetic, numpy or torch), the
situation of an image without numpy. They start it through the ``run_python``
fixture: here this interpreter; test_runtime_pythons.py runs the same tests on
each catalog Python inside a container of the base. The last tests (marked
docker) run scripts that reseed, or probe for torch before importing it, in
real images.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hermetic.inimage.runtime as hr
from hermetic.inimage.runtime import _env, report
from hermetic.inimage.runtime.metrics import format_metrics_line

RUNTIME_SRC = Path(hr.__file__).resolve().parent
ENV_VARS = ("HERMETIC_SEED", "HERMETIC_DETERMINISM", "HERMETIC_OUTPUTS", "HERMETIC_RUNTIME_REPORT", "RANK")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # seed_everything remembers its seed for the DataLoader helpers.
    monkeypatch.setattr("hermetic.inimage.runtime.seeding._current_seed", None)


@pytest.fixture(scope="module")
def image_copy(tmp_path_factory) -> Path:
    """hermetic/runtime copied the way the builder puts it into an image."""
    root = tmp_path_factory.mktemp("image-site")
    shutil.copytree(RUNTIME_SRC, root / "hermetic_runtime", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def isolated_command(python: str, site: Path, code: str) -> list[str]:
    """``python -I -S -c code`` with only ``site`` added to sys.path."""
    return [python, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + textwrap.dedent(code)]


def run_isolated(site: Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``code`` in this interpreter, ``-I -S``, with only ``site`` added to sys.path and only ``env`` (and PATH)."""
    return subprocess.run(isolated_command(sys.executable, site, code), capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), **(env or {})}, timeout=60)


@pytest.fixture(scope="module")
def run_python():
    """run_isolated's signature: how a test runs the image's copy in a fresh interpreter (another module may
    give the same tests another Python)."""
    return run_isolated


def python_version(text: str) -> tuple[int, ...]:
    """``"3.10"`` -> (3, 10): what a test's code printed of the interpreter it ran on."""
    return tuple(int(part) for part in text.strip().split("."))


# --- packaging constraints -------------------------------------------------


def test_runtime_imports_only_stdlib_and_itself():
    optional = {"numpy", "torch", "jax"}
    for path in sorted(RUNTIME_SRC.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 9))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top != "hermetic", f"{path.name}:{node.lineno}: absolute import of hermetic"
                assert top not in optional, f"{path.name}:{node.lineno}: {top} must be imported lazily via _optional"
                # _startup.py ships beside the package as _hermetic_startup: it imports it by its image name
                own = top == "hermetic_runtime" and path.name == "_startup.py"
                assert top in sys.stdlib_module_names or top == "__future__" or own, \
                    f"{path.name}:{node.lineno}: {name} is not in the standard library"


def test_image_copy_imports_without_site_packages(image_copy, run_python):
    proc = run_python(image_copy, """
        import hermetic_runtime as hr, random
        r = hr.seed_everything(5)
        print(r.seeded, r.numpy_generator, r.jax_key)
        print(random.random() == __import__("random").Random(5).random())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["('python',) None None", "True"]


# --- seeds -------------------------------------------------------------------


def test_derive_seed_is_documented_sha256_prefix():
    expected = int.from_bytes(hashlib.sha256(b"1234:0:1").digest()[:8], "big")
    assert hr.derive_seed(1234, 0, 1) == expected
    assert hr.derive_seed(1234, 0, 1) == 5808533030116532748  # pinned: must never change
    assert hr.derive_seed(1234, 0, "loader") == int.from_bytes(hashlib.sha256(b"1234:0:loader").digest()[:8], "big")


def test_derive_seed_separates_what_addition_confuses():
    # seed + worker_id would give 2 for both.
    assert hr.derive_seed(1, 0, 1) != hr.derive_seed(2, 0, 0)
    seeds = {hr.derive_seed(s, r, w) for s in range(4) for r in range(3) for w in range(4)}
    assert len(seeds) == 4 * 3 * 4
    assert all(0 <= s < 2**64 for s in seeds)


@pytest.mark.parametrize("bad", [1.0, True, None, b"x"])
def test_derive_seed_rejects_non_int_str_parts(bad):
    with pytest.raises(ValueError):
        hr.derive_seed(1, bad)


def test_seed_defaults_to_zero_then_env_then_argument(monkeypatch):
    assert _env.resolve_seed(None) == (0, "default")
    monkeypatch.setenv("HERMETIC_SEED", "42")
    assert _env.resolve_seed(None) == (42, "env:HERMETIC_SEED")
    assert _env.resolve_seed(7) == (7, "argument")


@pytest.mark.parametrize("raw", ["abc", "-1", "4294967296", "1.5"])
def test_bad_seed_env_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("HERMETIC_SEED", raw)
    with pytest.raises(ValueError, match="HERMETIC_SEED"):
        hr.seed_everything()


def test_seed_everything_seeds_python_random(monkeypatch):
    monkeypatch.setenv("HERMETIC_SEED", "99")
    result = hr.seed_everything()
    got = [random.random() for _ in range(5)]
    ref = random.Random(99)
    assert got == [ref.random() for _ in range(5)]
    assert (result.seed, result.source) == (99, "env:HERMETIC_SEED")
    assert result.seeded[0] == "python"


def test_loader_seed_follows_seed_everything(monkeypatch):
    monkeypatch.setenv("HERMETIC_SEED", "1")
    hr.seed_everything(77)  # an explicit seed beats the env for the loader too
    assert hr.loader_seed() == hr.derive_seed(77, 0, "loader")
    monkeypatch.setenv("RANK", "3")
    assert hr.loader_seed(epoch=2) == hr.derive_seed(77, 3, "loader", 2)


def test_rank_env_must_be_a_non_negative_int(monkeypatch):
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        hr.loader_seed(1)


# --- determinism mode --------------------------------------------------------


def test_mode_defaults_to_strict_and_reads_env(monkeypatch):
    assert _env.resolve_mode(None) == ("strict", "default")
    monkeypatch.setenv("HERMETIC_DETERMINISM", "statistical")
    assert _env.resolve_mode(None) == ("statistical", "env:HERMETIC_DETERMINISM")
    monkeypatch.setenv("HERMETIC_DETERMINISM", "fast")
    with pytest.raises(ValueError, match="HERMETIC_DETERMINISM='fast'"):
        hr.enable_determinism()
    with pytest.raises(ValueError, match="mode='nope'"):
        hr.enable_determinism("nope")


def test_strict_warns_on_missing_image_knobs(image_copy, run_python):
    proc = run_python(image_copy, """
        import os, hermetic_runtime as hr
        r = hr.enable_determinism("strict")
        print(sorted(r.env_missing), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['CUBLAS_WORKSPACE_CONFIG', 'OMP_NUM_THREADS', 'PYTHONHASHSEED'] :4096:8"
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic_runtime: warning:")]
    assert len(warnings) == 3
    assert any("PYTHONHASHSEED" in w for w in warnings)


def test_strict_is_quiet_when_the_image_sets_the_knobs(image_copy, run_python):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    proc = run_python(image_copy, """
        import os, hermetic_runtime as hr
        r = hr.enable_determinism()
        print(r.mode, r.env_missing, r.env_set_in_process, os.environ["CUBLAS_WORKSPACE_CONFIG"])
    """, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "strict () {} :16:8"
    assert proc.stderr == ""


@pytest.mark.parametrize("mode", ["statistical", "off"])
def test_non_strict_modes_check_nothing(image_copy, mode, run_python):
    proc = run_python(image_copy, f"""
        import os, hermetic_runtime as hr
        r = hr.enable_determinism({mode!r})
        print(r.mode, r.warnings, "CUBLAS_WORKSPACE_CONFIG" in os.environ)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{mode} () False"
    assert proc.stderr == ""


# --- RNG state and checkpoints -------------------------------------------------


def test_rng_state_roundtrip_with_random_only(image_copy, run_python):
    proc = run_python(image_copy, """
        import json, random, hermetic_runtime as hr
        random.seed(3); random.random(); random.gauss(0, 1)  # gauss leaves a cached value
        state = hr.rng_state()
        first = [random.random() for _ in range(3)] + [random.gauss(0, 1)]
        random.seed(12345)
        hr.set_rng_state(json.loads(json.dumps(state)))  # plain data survives JSON
        again = [random.random() for _ in range(3)] + [random.gauss(0, 1)]
        print(sorted(state), first == again)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['python'] True"


def test_checkpoint_without_torch_resumes_python_rng(image_copy, tmp_path, run_python):
    ck = tmp_path / "out" / "ck.bin"
    proc = run_python(image_copy, f"""
        import random, hermetic_runtime as hr
        hr.seed_everything(11)
        random.random()
        digest = hr.save_checkpoint({str(ck)!r}, epoch=2, batch=5, extra={{"step": 17}})
        expected = [random.random() for _ in range(4)]
        random.seed(0)
        c = hr.load_checkpoint({str(ck)!r})
        print(c.epoch, c.batch, c.extra, c.sha256 == digest, [random.random() for _ in range(4)] == expected)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2 5 {'step': 17} True True"
    assert ck.read_bytes()[:1] == b"\x80"  # a pickle: torch is not importable there
    assert [p.name for p in ck.parent.iterdir()] == ["ck.bin"]  # no temp file left behind


def test_load_checkpoint_refuses_other_files(tmp_path):
    import pickle

    p = tmp_path / "other.pkl"
    p.write_bytes(pickle.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a hermetic-checkpoint/1 checkpoint"):
        hr.load_checkpoint(p)


def test_checkpoint_position_must_be_non_negative(tmp_path):
    with pytest.raises(ValueError, match="batch"):
        hr.save_checkpoint(tmp_path / "c", epoch=0, batch=-1)
    assert not (tmp_path / "c").exists()


# --- metrics -----------------------------------------------------------------


def test_outputs_default_and_env(monkeypatch, tmp_path):
    assert _env.outputs_dir_path() == "/outputs"
    monkeypatch.setenv("HERMETIC_OUTPUTS", str(tmp_path / "o"))
    assert hr.metrics_path() == tmp_path / "o" / "metrics.jsonl"
    assert (tmp_path / "o").is_dir()


def test_metrics_line_format():
    line = format_metrics_line(3, {"loss": 0.1, "acc": 1, "name": "a", "ok": True, "nested": {"b": 2, "a": None}})
    assert line == '{"step": 3, "acc": 1, "loss": 0.1, "name": "a", "nested": {"a": null, "b": 2}, "ok": true}\n'
    assert format_metrics_line(0, {"x": float("nan"), "y": float("inf"), "z": -float("inf")}) == \
        '{"step": 0, "x": "nan", "y": "inf", "z": "-inf"}\n'


def test_metrics_floats_round_trip_exactly():
    rng = random.Random(1)
    values = [rng.random() * 10.0 ** rng.randint(-300, 300) for _ in range(500)] + [5e-324, 1.7976931348623157e308, 0.1]
    for v in values:
        assert json.loads(format_metrics_line(1, {"v": v}))["v"] == v


@pytest.mark.parametrize("step", [-1, 1.0, True, "1"])
def test_metrics_step_must_be_a_non_negative_int(step):
    with pytest.raises(ValueError, match="step"):
        format_metrics_line(step, {})


def test_metrics_refuse_what_json_cannot_hold():
    with pytest.raises(TypeError, match="loss"):
        format_metrics_line(1, {"loss": object()})


def test_log_metrics_appends_lines(monkeypatch, tmp_path):
    monkeypatch.setenv("HERMETIC_OUTPUTS", str(tmp_path))
    hr.log_metrics(1, loss=0.5)
    hr.log_metrics(2, loss=0.25, acc=0.75)
    assert (tmp_path / "metrics.jsonl").read_text() == \
        '{"step": 1, "loss": 0.5}\n{"step": 2, "acc": 0.75, "loss": 0.25}\n'


def test_trim_metrics_drops_later_steps_and_torn_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HERMETIC_OUTPUTS", str(tmp_path))
    for step in (1, 2, 3, 4):
        hr.log_metrics(step, loss=float(step))
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 5, "lo')  # a crash mid-write
    assert hr.trim_metrics(2) == 3
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 2.0}\n'
    assert hr.trim_metrics(2) == 0


# --- the runtime report --------------------------------------------------------


def test_report_unset_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hr.seed_everything(1)
    hr.enable_determinism("off")
    assert list(tmp_path.iterdir()) == []


def test_report_merges_sections_and_keeps_foreign_keys(image_copy, tmp_path, run_python):
    path = tmp_path / "rt" / "runtime.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"written_by": "hermetic run", "seed": {"policy": "fixed"}}))
    proc = run_python(image_copy, """
        import platform, hermetic_runtime as hr
        hr.seed_everything()
        hr.enable_determinism("statistical")
        print(platform.python_version())
    """, {"HERMETIC_RUNTIME_REPORT": str(path), "HERMETIC_SEED": "5"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(path.read_text())
    assert doc["written_by"] == "hermetic run"
    assert doc["seed"]["policy"] == "fixed"  # merged, not replaced
    assert doc["seed"]["value"] == 5 and doc["seed"]["source"] == "env:HERMETIC_SEED"
    assert doc["seed"]["seeded"][0] == "python"
    assert doc["determinism"]["mode"] == "statistical"
    assert doc["schema"] == "hermetic-runtime-report/1"
    assert doc["versions"]["python"] == proc.stdout.strip()
    assert sorted(p.name for p in path.parent.iterdir()) == ["runtime.json"]  # no temp or lock file


def test_report_is_identical_for_identical_runs(image_copy, tmp_path, run_python):
    code = """
        import hermetic_runtime as hr
        hr.enable_determinism()
        hr.seed_everything()
    """
    docs = []
    for name in ("a.json", "b.json"):
        env = {"HERMETIC_RUNTIME_REPORT": str(tmp_path / name), "HERMETIC_SEED": "3", "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        proc = run_python(image_copy, code, env)
        assert proc.returncode == 0, proc.stderr
        docs.append((tmp_path / name).read_bytes())
    assert docs[0] == docs[1]
    assert json.loads(docs[0])["env"]["PYTHONHASHSEED"] == "0"


def test_report_other_ranks_write_under_ranks(tmp_path, monkeypatch):
    path = tmp_path / "runtime.json"
    monkeypatch.setenv("HERMETIC_RUNTIME_REPORT", str(path))
    hr.seed_everything(1)
    monkeypatch.setenv("RANK", "2")
    hr.seed_everything(1)
    doc = json.loads(path.read_text())
    assert doc["seed"]["value"] == 1
    assert doc["ranks"]["2"]["seed"]["value"] == 1


def test_report_replaces_a_corrupt_file_with_a_warning(tmp_path, monkeypatch, capsys):
    path = tmp_path / "runtime.json"
    path.write_text("{not json")
    monkeypatch.setenv("HERMETIC_RUNTIME_REPORT", str(path))
    hr.seed_everything(4)
    assert json.loads(path.read_text())["seed"]["value"] == 4
    assert "not valid JSON" in capsys.readouterr().err


def test_report_write_failure_warns_and_training_goes_on(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HERMETIC_RUNTIME_REPORT", str(blocker / "runtime.json"))  # parent is a file
    assert hr.seed_everything(4).seed == 4
    assert "cannot write the runtime report" in capsys.readouterr().err


def test_deep_merge_replaces_lists_and_merges_mappings():
    base = {"a": {"x": 1, "l": [1, 2]}, "b": 1}
    out = report.deep_merge(base, {"a": {"y": 2, "l": [3]}, "c": {"z": 1}})
    assert out == {"a": {"x": 1, "y": 2, "l": [3]}, "b": 1, "c": {"z": 1}}
    assert base == {"a": {"x": 1, "l": [1, 2]}, "b": 1}  # input untouched


# --- weights file format -------------------------------------------------------


def test_read_weights_checks_the_index(tmp_path):
    blob = b"\x00\x00\x80?" + b"\x01\x00\x00\x00\x00\x00\x00\x00"
    index = {"format": "hermetic-weights/1", "byte_order": "little", "data": "w.bin",
             "data_sha256": hashlib.sha256(blob).hexdigest(), "tensors": [
                 {"name": "a", "dtype": "float32", "shape": [1], "offset": 0, "nbytes": 4,
                  "sha256": hashlib.sha256(blob[:4]).hexdigest()},
                 {"name": "n", "dtype": "int64", "shape": [], "offset": 4, "nbytes": 8,
                  "sha256": hashlib.sha256(blob[4:]).hexdigest()}]}
    (tmp_path / "w.bin").write_bytes(blob)
    (tmp_path / "w.json").write_text(json.dumps(index))
    got = hr.read_weights(tmp_path / "w.bin")
    assert got["a"].data == b"\x00\x00\x80?" and got["a"].shape == (1,)
    assert got["n"].dtype == "int64" and got["n"].shape == ()
    (tmp_path / "w.bin").write_bytes(blob[:-1] + b"\x02")
    with pytest.raises(ValueError, match="sha256"):
        hr.read_weights(tmp_path / "w.bin")


# --- seeding at interpreter start (_hermetic_startup, imported by hermetic-runtime.pth) -------------


@pytest.fixture(scope="module")
def startup_site(image_copy) -> Path:
    shutil.copy(RUNTIME_SRC / "_startup.py", image_copy / "_hermetic_startup.py")
    return image_copy


STARTUP_PROBE = """
    import _hermetic_startup, json, os, sys
    import random
    seed = os.environ.get("HERMETIC_SEED", "")
    print(json.dumps({"draw": random.random(), "expected": random.Random(int(seed)).random() if seed.isdigit() else None,
                      "hooked": any(type(f).__name__ == "SeedOnImport" for f in sys.meta_path)}))
"""


def test_startup_seeds_random_after_its_first_import_and_then_leaves(startup_site, run_python):
    proc = run_python(startup_site, STARTUP_PROBE, env={"HERMETIC_SEED": "77"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["draw"] == seen["expected"]
    # numpy and torch are not installed here: the hook stays for them, costing one set lookup per import
    assert seen["hooked"] is True


@pytest.mark.parametrize("env", [{}, {"HERMETIC_SEED": "77", "HERMETIC_STARTUP_SEEDING": "0"},
                                 {"HERMETIC_SEED": "not-a-seed"}], ids=["outside-a-run", "switched-off", "bad-seed"])
def test_startup_does_nothing_outside_a_run_or_when_switched_off(startup_site, env, run_python):
    proc = run_python(startup_site, STARTUP_PROBE, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["hooked"] is False and seen["draw"] != seen["expected"]


def test_startup_reports_what_it_seeded_at_exit(startup_site, tmp_path, run_python):
    report = tmp_path / "runtime.json"
    proc = run_python(startup_site, "import _hermetic_startup, random\n",
                      env={"HERMETIC_SEED": "5", "HERMETIC_RUNTIME_REPORT": str(report)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["startup"] == {"seed": 5, "seeded": ["random"]}


# A stand-in for torch where torch is not installed (the host's venv): just the two calls the hook and the
# report make. Real torch is seeded in a container below (test_torch_is_seeded_after_a_find_spec_probe...).
FAKE_TORCH = """_seed = 67280421310721  # torch's default CPU seed
def manual_seed(seed):
    global _seed
    _seed = int(seed)
def initial_seed():
    return _seed
"""


@pytest.fixture(scope="module")
def fake_torch_site(startup_site, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("fake-torch")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return site


NUMPY_SITE = str(Path(__import__("numpy").__file__).resolve().parent.parent)


def _with_paths(*paths: Path | str) -> str:
    return "".join(f"sys.path.insert(1, {str(p)!r})\n" for p in paths)


@pytest.mark.parametrize("probe", [False, True], ids=["plain-import", "find_spec-then-import"])
def test_startup_seeds_torch_on_its_import_even_after_a_find_spec_probe(startup_site, fake_torch_site, probe,
                                                                         run_python):
    # The datasets library asks importlib.util.find_spec("torch") long before it imports torch: the probe
    # must not use up the hook (it did: torch then ran with its own default seed).
    code = _with_paths(fake_torch_site) + "import _hermetic_startup, importlib.util\n"
    if probe:
        code += "assert importlib.util.find_spec('torch') is not None\nassert 'torch' not in sys.modules\n"
    code += "import torch\nprint(torch.initial_seed())\n"
    proc = run_python(startup_site, "import sys\n" + code, env={"HERMETIC_SEED": "77"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "77"


def test_startup_seeds_numpy_random_after_a_find_spec_probe(startup_site):
    code = ("import sys\n" + _with_paths(NUMPY_SITE) + "import _hermetic_startup, importlib.util\n"
            "import numpy\nassert importlib.util.find_spec('numpy.random') is not None\n"
            "import numpy.random\nprint(numpy.random.rand() == numpy.random.RandomState(77).rand())\n")
    proc = run_isolated(startup_site, code, env={"HERMETIC_SEED": "77"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


RESEEDS = """import sys
{paths}import _hermetic_startup
import random, numpy as np, torch
random.random(); np.random.rand(3)
if "--reseed" in sys.argv:  # what transformers' set_seed(42) and Lightning's seed_everything(42) do
    random.seed(42); np.random.seed(42); torch.manual_seed(42)
if "--entropy" in sys.argv:
    random.seed()
random.random(); np.random.rand(2)
"""


def _final_report(site: Path, tmp_path: Path, name: str, *args: str) -> dict:
    report = tmp_path / f"{name}.json"
    code = RESEEDS.format(paths=_with_paths(NUMPY_SITE, site / "faketorch"))
    prog = f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv[1:] = {list(args)!r}\n" + code
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", prog], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), "HERMETIC_SEED": "0",
                               "HERMETIC_RUNTIME_REPORT": str(report)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def reseed_site(startup_site, fake_torch_site) -> Path:
    if not (startup_site / "faketorch").exists():
        shutil.copytree(fake_torch_site, startup_site / "faketorch")
    return startup_site


def test_the_report_keeps_the_seeds_the_generators_ended_with(reseed_site, tmp_path):
    from hermetic.record.build import reseeded_text, seed_section

    kept = _final_report(reseed_site, tmp_path, "kept")
    seeds = kept["final"]["seeds"]
    assert {k: v.get("seed") for k, v in seeds.items()} == {"random": 0, "numpy": 0, "torch": 0}
    assert all(len(seeds[k]["state_sha256"]) == 64 for k in ("random", "numpy"))
    assert _final_report(reseed_site, tmp_path, "again")["final"] == kept["final"]  # identical runs, same report
    assert seed_section(0, "config", kept)["reseeded"] == {}

    reseeded = _final_report(reseed_site, tmp_path, "reseeded", "--reseed")
    section = seed_section(0, "config", reseeded)
    assert section["reseeded"] == {"random": 42, "numpy": 42, "torch": 42}
    assert reseeded_text(section["reseeded"]) == "the script reseeded random, numpy and torch to 42"
    # Reseeded to the run's own seed is no reseed.
    assert seed_section(42, "cli", reseeded)["reseeded"] == {}

    entropy = seed_section(0, "config", _final_report(reseed_site, tmp_path, "entropy", "--entropy"))
    assert entropy["reseeded"] == {"random": "entropy"}
    assert reseeded_text(entropy["reseeded"]) == "the script reseeded random from the OS's entropy (not repeatable)"


# random.seed applies an int without its sign and seeds with the hash of a float or, on Python 3.10 only, of any
# other hashable (deprecated since 3.9; 3.11+ raise TypeError): its wrapper notes the seed applied. The draws after
# each call check that the noted seed is the one that seeded.
SEED_WRAPPERS = """import _hermetic_startup, pickle, random, sys
assert random.seed.__name__ == "seed" and random.seed.__wrapped__ is not None and random.seed.__doc__
random.seed(5)
a = random.random()
random.Random(5).random() == a or sys.exit("the wrapped seed() seeded differently")
assert pickle.loads(pickle.dumps(random.seed)) is random.seed  # a spawn worker's target still pickles
last = _hermetic_startup._hook.last_seed
word = sys.maxsize * 2 + 1  # CPython seeds with a hash as an unsigned machine word
random.seed(-7)
print(last["random"], random.random() == random.Random(7).random())
random.seed(2.5)
print(last["random"] == "hash %d of a float" % hash(2.5), random.random() == random.Random(hash(2.5)).random())
given = object()
try:
    random.seed(given)
except TypeError:
    print("raised", last["random"] == "hash %d of a float" % hash(2.5))
else:
    print("hashed", last["random"] == "hash %d of a object (deprecated)" % (hash(given) & word),
          random.random() == random.Random(hash(given) & word).random())
print("%d.%d" % sys.version_info[:2])
"""


def test_seed_wrappers_pass_through_and_note_the_seed_applied(startup_site, run_python):
    proc = run_python(startup_site, SEED_WRAPPERS, env={"HERMETIC_SEED": "1"})
    assert proc.returncode == 0, proc.stderr
    *lines, version = proc.stdout.splitlines()
    assert lines[:2] == ["7 True", "True True"]
    if python_version(version) >= (3, 11):
        assert lines[2:] == ["raised True"]  # the call that raised noted nothing
        assert proc.stderr == ""
    else:  # 3.10 seeded with the object's hash, and its warning still names the script's line, not the wrapper's
        assert lines[2:] == ["hashed True True"]
        assert re.match(r"<string>:\d+: DeprecationWarning: Seeding based on hashing is deprecated", proc.stderr), \
            proc.stderr


def test_the_report_says_which_seed_a_script_reseeded_random_with(startup_site, tmp_path, run_python):
    from hermetic.record.build import reseeded_text, seed_section

    report = tmp_path / "runtime.json"
    code = """import _hermetic_startup, random, sys
random.random()
given = frozenset({1})
try:
    random.seed(given)
    print(hash(given) & (sys.maxsize * 2 + 1))
except TypeError:
    random.seed(-42)
print("%d.%d" % sys.version_info[:2])
"""
    proc = run_python(startup_site, code, env={"HERMETIC_SEED": "0", "HERMETIC_RUNTIME_REPORT": str(report)})
    assert proc.returncode == 0, proc.stderr
    *hashed, version = proc.stdout.splitlines()
    section = seed_section(0, "config", json.loads(report.read_text()))
    if python_version(version) >= (3, 11):
        assert hashed == [] and section["reseeded"] == {"random": 42}
        assert reseeded_text(section["reseeded"]) == "the script reseeded random to 42"
    else:
        assert section["reseeded"] == {"random": f"hash {hashed[0]} of a frozenset (deprecated)"}
        assert reseeded_text(section["reseeded"]) == \
            f"the script reseeded random with hash {hashed[0]} of a frozenset (deprecated)"


def test_seed_section_reads_the_runtime_report_defensively():
    from hermetic.record.build import seed_section

    assert "reseeded" not in seed_section(0, "config", {})  # no final report (older runtimes, a killed run)
    hostile = {"startup": {"seeded": ["torch", {"x": 1}]}, "seed": {"seeded": "python"},
               "final": {"seeds": {"torch": {"seed": True}, "numpy": {"seed": 3}, "random": "nonsense"}}}
    assert seed_section(0, "config", hostile)["reseeded"] == {}  # numpy was never seeded by hermetic
    runtime = {"seed": {"seeded": ["python", "numpy"]}, "final": {"seeds": {"random": {"seed": 9}, "numpy": {"seed": 9}}}}
    assert seed_section(0, "config", runtime)["reseeded"] == {"random": 9, "numpy": 9}


# --- in real images: the seed that was used, in the record, `runs show` and `diff` ----------------------

RESEEDING_SCRIPT = """import random, sys, numpy as np
seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else None
if seed is not None:  # what transformers' set_seed(args.seed) does (torch aside: not in this image)
    random.seed(seed); np.random.seed(seed)
open("draws.txt", "w").write(repr([random.random(), float(np.random.rand())]))
"""


@pytest.mark.docker
def test_a_script_that_reseeds_is_recorded_with_the_seed_it_used(project):
    from conftest import run_cli
    from run_support import diff_json, hermetic_run, run_dir_of

    (project / "reseeds.py").write_text(RESEEDING_SCRIPT)
    _, own = hermetic_run(project, "reseeds.py")
    assert own["seed"]["reseeded"] == {}
    assert "reseeded" not in run_cli("runs", "show", own["record"]["run_id"], cwd=project).stdout
    _, a = hermetic_run(project, "reseeds.py", "--seed", "42")
    _, b = hermetic_run(project, "--seed", "5", "reseeds.py", "--seed", "42")
    given = a["seed"]["value"]  # the example's determinism.seed
    assert given not in (5, 42) and a["seed"]["reseeded"] == {"random": 42, "numpy": 42}
    final = a["seed"]["applied"]["final"]["seeds"]
    assert final["random"]["seed"] == final["numpy"]["seed"] == 42
    shown = run_cli("runs", "show", a["record"]["run_id"], cwd=project).stdout
    assert f"{given} (from config); the script reseeded random and numpy to 42; seeded at start-up: " in shown
    # Two seeds given, 42 used by both: identical outputs, and the note says why.
    _, d = diff_json(run_dir_of(project, a), run_dir_of(project, b))
    line = d["verdict"]["line"]
    assert line.startswith(f"inputs differ: seed (seed {given} -> 5") and line.endswith("bitwise identical all the same")
    assert "the script reseeded random and numpy to 42 in both runs" in d["verdict"]["notes"][0]
    _, c = hermetic_run(project, "reseeds.py", "--seed", "43")
    _, d = diff_json(run_dir_of(project, a), run_dir_of(project, c))
    seed = next(s for s in d["sections"] if s["name"] == "seed")
    notes = [ch["note"] for ch in seed["changes"] if ch["material"]]
    assert notes == ["the script reseeded random and numpy to 42 -> the script reseeded random and numpy to 43"]
    # The final states are effects: listed, never a cause.
    assert all(not ch["material"] for ch in seed["changes"] if ch["key"].startswith("applied.final.seeds"))
    _, d = diff_json(run_dir_of(project, a), run_dir_of(project, a))
    seed = next(s for s in d["sections"] if s["name"] == "seed")
    assert seed["same_as"] == f"{given} (the script reseeded random and numpy to 42 in both)"


DATASETS_ORDER = """import importlib.util, sys
assert importlib.util.find_spec("torch") is not None  # what `import datasets` does first
import torch
if "--reseed" in sys.argv:
    torch.manual_seed(42)  # transformers' set_seed(42)
open("seed.txt", "w").write(str(torch.initial_seed()))
"""


@pytest.mark.docker
@pytest.mark.slow
def test_torch_is_seeded_after_a_find_spec_probe_and_a_reseed_is_recorded(torch_project):
    from conftest import run_cli
    from run_support import hermetic_run, run_dir_of

    proj = torch_project
    (proj / "probe_first.py").write_text(DATASETS_ORDER)
    _, plain = hermetic_run(proj, "probe_first.py")
    given = plain["seed"]["value"]  # the example's determinism.seed
    # The run's seed, not torch's default (before the fix: 15862232349720387702, torch never seeded)
    assert (run_dir_of(proj, plain) / "outputs" / "seed.txt").read_text() == str(given)
    assert "torch" in plain["seed"]["applied"]["startup"]["seeded"]
    assert plain["seed"]["applied"]["final"]["seeds"]["torch"] == {"seed": given} and plain["seed"]["reseeded"] == {}
    _, reseeded = hermetic_run(proj, "probe_first.py", "--reseed")
    assert reseeded["seed"]["reseeded"] == {"torch": 42}
    shown = run_cli("runs", "show", reseeded["record"]["run_id"], cwd=proj).stdout
    assert f"{given} (from config); the script reseeded torch to 42;" in shown


# torch.use_deterministic_algorithms imports TorchInductor's config (and torch._dynamo: as much CPU as
# `import torch`) to set its `deterministic` flag; enable_determinism sets that flag when the config is
# first imported instead. Each step checks the flags torch's own function would have left.
INDUCTOR_LATER = """import subprocess, sys
import torch, hermetic_runtime as hr
r = hr.enable_determinism("strict")
assert "torch._inductor" not in sys.modules and "torch._dynamo" not in sys.modules, "imported at enable"
assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
assert r.torch["use_deterministic_algorithms"] is True
import torch._inductor.config as config
assert config.deterministic is True, "strict, then the config imported"
torch.use_deterministic_algorithms(False)
assert config.deterministic is False and not torch.are_deterministic_algorithms_enabled()
hr.enable_determinism("strict")  # the config exists now: torch's own function
assert config.deterministic is True and torch.are_deterministic_algorithms_enabled()
later = "import torch, hermetic_runtime as hr; hr.enable_determinism('statistical'); import torch._inductor.config as c; print(c.deterministic, torch.are_deterministic_algorithms_enabled())"
out = subprocess.run([sys.executable, "-c", later], env={"TORCHINDUCTOR_DETERMINISTIC": "1"}, capture_output=True, text=True)
assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr  # as torch's call would: off, the env's 1 overridden
# torch.set_deterministic_debug_mode sets the C flag alone: inductor's stays as the last use_deterministic_algorithms left it
debug = "import torch, hermetic_runtime as hr; hr.enable_determinism('strict'); torch.set_deterministic_debug_mode(0); import torch._inductor.config as c; print(c.deterministic, torch.are_deterministic_algorithms_enabled())"
out = subprocess.run([sys.executable, "-c", debug], env={}, capture_output=True, text=True)
assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
print("ok")
"""


@pytest.mark.docker
@pytest.mark.slow
def test_strict_sets_torchs_flags_without_importing_inductor_and_inductor_gets_its_flag_on_import(torch_built):
    _, built = torch_built
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", built["image_id"],
                           "/opt/venv/bin/python", "-c", INDUCTOR_LATER], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-3000:]


def test_after_import_fires_once_on_execution_not_on_a_probe_and_never_breaks_the_import(tmp_path, monkeypatch,
                                                                                          capsys):
    import importlib.util

    from hermetic.inimage.runtime._onimport import after_import

    (tmp_path / "hr_watched.py").write_text("x = 1\n")
    (tmp_path / "hr_failing_hook.py").write_text("y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("hr_watched", "hr_failing_hook"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    calls = []
    after_import("hr_watched", lambda m: calls.append(m.x))
    spec = importlib.util.find_spec("hr_watched")  # a probe (datasets does this for torch): nothing yet
    assert calls == []
    module = importlib.import_module("hr_watched")
    assert calls == [1]
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # the probe's spec executed later: once only
    assert calls == [1]
    after_import("hr_watched", lambda m: calls.append("at once"))  # imported already
    assert calls == [1, "at once"] and module.x == 1
    after_import("hr_failing_hook", lambda m: 1 / 0)
    assert importlib.import_module("hr_failing_hook").y == 2  # the import itself goes on
    assert "after importing hr_failing_hook: ZeroDivisionError" in capsys.readouterr().err
    for name in ("hr_watched", "hr_failing_hook"):
        sys.modules.pop(name, None)
