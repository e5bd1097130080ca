"""hermetic.runtime on the host: the parts that need neither numpy nor torch.

The runtime ships into images as the top-level package ``hermetic_runtime``,
so some tests copy it under that name and import it in a fresh interpreter
started with ``-S -I`` (no site-packages: no hermetic, numpy or torch), the
situation of an image without numpy.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hermetic.runtime as hr
from hermetic.runtime import _env, report
from hermetic.runtime.metrics import format_metrics_line

RUNTIME_SRC = Path(hr.__file__).resolve().parent
ENV_VARS = ("HERMETIC_SEED", "HERMETIC_DETERMINISM", "HERMETIC_OUTPUTS", "HERMETIC_RUNTIME_REPORT", "RANK")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # seed_everything remembers its seed for the DataLoader helpers.
    monkeypatch.setattr("hermetic.runtime.seeding._current_seed", None)


@pytest.fixture(scope="module")
def image_copy(tmp_path_factory) -> Path:
    """hermetic/runtime copied the way the builder puts it into an image."""
    root = tmp_path_factory.mktemp("image-site")
    shutil.copytree(RUNTIME_SRC, root / "hermetic_runtime", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def run_isolated(site: Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``code`` in ``python -I -S`` with only ``site`` added to sys.path."""
    prog = f"import sys; sys.path.insert(0, {str(site)!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-I", "-S", "-c", prog], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), **(env or {})}, timeout=60)


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


def test_image_copy_imports_without_site_packages(image_copy):
    proc = run_isolated(image_copy, """
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


def test_strict_warns_on_missing_image_knobs(image_copy):
    proc = run_isolated(image_copy, """
        import os, hermetic_runtime as hr
        r = hr.enable_determinism("strict")
        print(sorted(r.env_missing), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['CUBLAS_WORKSPACE_CONFIG', 'OMP_NUM_THREADS', 'PYTHONHASHSEED'] :4096:8"
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic_runtime: warning:")]
    assert len(warnings) == 3
    assert any("PYTHONHASHSEED" in w for w in warnings)


def test_strict_is_quiet_when_the_image_sets_the_knobs(image_copy):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    proc = run_isolated(image_copy, """
        import os, hermetic_runtime as hr
        r = hr.enable_determinism()
        print(r.mode, r.env_missing, r.env_set_in_process, os.environ["CUBLAS_WORKSPACE_CONFIG"])
    """, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "strict () {} :16:8"
    assert proc.stderr == ""


@pytest.mark.parametrize("mode", ["statistical", "off"])
def test_non_strict_modes_check_nothing(image_copy, mode):
    proc = run_isolated(image_copy, f"""
        import os, hermetic_runtime as hr
        r = hr.enable_determinism({mode!r})
        print(r.mode, r.warnings, "CUBLAS_WORKSPACE_CONFIG" in os.environ)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{mode} () False"
    assert proc.stderr == ""


# --- RNG state and checkpoints -------------------------------------------------


def test_rng_state_roundtrip_with_random_only(image_copy):
    proc = run_isolated(image_copy, """
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


def test_checkpoint_without_torch_resumes_python_rng(image_copy, tmp_path):
    ck = tmp_path / "out" / "ck.bin"
    proc = run_isolated(image_copy, f"""
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


def test_report_merges_sections_and_keeps_foreign_keys(tmp_path, monkeypatch):
    path = tmp_path / "rt" / "runtime.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"written_by": "hermetic run", "seed": {"policy": "fixed"}}))
    monkeypatch.setenv("HERMETIC_RUNTIME_REPORT", str(path))
    monkeypatch.setenv("HERMETIC_SEED", "5")
    hr.seed_everything()
    hr.enable_determinism("statistical")
    doc = json.loads(path.read_text())
    assert doc["written_by"] == "hermetic run"
    assert doc["seed"]["policy"] == "fixed"  # merged, not replaced
    assert doc["seed"]["value"] == 5 and doc["seed"]["source"] == "env:HERMETIC_SEED"
    assert doc["seed"]["seeded"][0] == "python"
    assert doc["determinism"]["mode"] == "statistical"
    assert doc["schema"] == "hermetic-runtime-report/1"
    assert doc["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert sorted(p.name for p in path.parent.iterdir()) == ["runtime.json"]  # no temp or lock file


def test_report_is_identical_for_identical_runs(image_copy, tmp_path):
    code = """
        import hermetic_runtime as hr
        hr.enable_determinism()
        hr.seed_everything()
    """
    docs = []
    for name in ("a.json", "b.json"):
        env = {"HERMETIC_RUNTIME_REPORT": str(tmp_path / name), "HERMETIC_SEED": "3", "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        proc = run_isolated(image_copy, code, env)
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


def test_startup_seeds_random_after_its_first_import_and_then_leaves(startup_site):
    proc = run_isolated(startup_site, STARTUP_PROBE, env={"HERMETIC_SEED": "77"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["draw"] == seen["expected"]
    # numpy and torch are not installed here: the hook stays for them, costing one set lookup per import
    assert seen["hooked"] is True


@pytest.mark.parametrize("env", [{}, {"HERMETIC_SEED": "77", "HERMETIC_STARTUP_SEEDING": "0"},
                                 {"HERMETIC_SEED": "not-a-seed"}], ids=["outside-a-run", "switched-off", "bad-seed"])
def test_startup_does_nothing_outside_a_run_or_when_switched_off(startup_site, env):
    proc = run_isolated(startup_site, STARTUP_PROBE, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["hooked"] is False and seen["draw"] != seen["expected"]


def test_startup_reports_what_it_seeded_at_exit(startup_site, tmp_path):
    report = tmp_path / "runtime.json"
    proc = run_isolated(startup_site, "import _hermetic_startup, random\n",
                        env={"HERMETIC_SEED": "5", "HERMETIC_RUNTIME_REPORT": str(report)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["startup"] == {"seed": 5, "seeded": ["random"]}
