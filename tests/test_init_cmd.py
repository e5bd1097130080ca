"""``hermetic init``: the CI templates it writes (never clobbering a file), and what it reads from a project:
requirements from its packaging metadata without running it, its own package made importable, its script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from hermetic import __version__
from hermetic.cli.init_cmd import CI_TEMPLATES, VERSION_PLACEHOLDER, render_ci
from hermetic.core.errors import DataError, NotFound, UsageError
from hermetic.scaffold.projectmeta import declared_requirements, own_package
from hermetic.scaffold import guess_script
from run_support import hermetic_run

REPO_ROOT = Path(__file__).resolve().parent.parent


def _init(*args: str) -> subprocess.CompletedProcess:
    return run_cli("init", *args, cwd=REPO_ROOT, timeout=60)


def _steps_text(doc: dict) -> str:
    """Every shell line the CI file runs, joined."""
    if "jobs" in doc:  # GitHub Actions
        return "\n".join(s.get("run", "") for job in doc["jobs"].values() for s in job["steps"])
    return "\n".join(line for job in doc.values() if isinstance(job, dict) for line in job.get("script", []))


@pytest.mark.parametrize("ci", sorted(CI_TEMPLATES))
def test_template_builds_with_the_cache_then_runs(ci: str) -> None:
    text = render_ci(ci)
    assert VERSION_PLACEHOLDER not in text
    doc = yaml.safe_load(text)
    script = _steps_text(doc)
    assert "hermetic==" + __version__ in script  # the CI installs the hermetic that wrote it
    build = script.index('hermetic build --cache "$REGISTRY/$REPO"')
    assert build < script.index("hermetic run ")
    # Credentials come from the CI's secret store through the environment, never inline.
    assert "HERMETIC_REGISTRY_USER" in text and "HERMETIC_REGISTRY_PASSWORD" in text
    if ci == "github":
        assert doc["env"]["HERMETIC_REGISTRY_PASSWORD"] == "${{ secrets.GITHUB_TOKEN }}"
        assert doc["permissions"]["packages"] == "write"
    else:
        common = doc[".hermetic"]  # the docker-executor job and the shell-runner job extend it
        assert common["variables"]["HERMETIC_REGISTRY_PASSWORD"] == "$CI_REGISTRY_PASSWORD"
        assert common["variables"]["REGISTRY"] == "$CI_REGISTRY"
        assert doc["hermetic"]["extends"] == doc["hermetic-shell"]["extends"] == ".hermetic"
    # A fresh runner has no base and no data: both come before the build (tests/test_ci_templates.py runs them)
    assert script.index("hermetic base bootstrap") < script.index("hermetic data verify") < build
    assert "hermetic push" in script and "hermetic pull" in script


@pytest.mark.parametrize("ci,dest", [(ci, dest) for ci, (_, dest) in sorted(CI_TEMPLATES.items())])
def test_init_writes_and_refuses_to_overwrite_without_force(tmp_path: Path, ci: str, dest: str) -> None:
    r = _init("--ci", ci, "--dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    path = tmp_path / dest
    assert json.loads(r.stdout) == {"ci": ci, "path": str(path), "replaced": False}
    assert path.read_text() == render_ci(ci)

    path.write_text("# my own pipeline\n")
    r = _init("--ci", ci, "--dir", str(tmp_path))
    assert r.returncode == 73
    assert r.stderr.strip() == f"hermetic: error: {path} already exists; pass --force to overwrite it"
    assert path.read_text() == "# my own pipeline\n"

    r = _init("--ci", ci, "--dir", str(tmp_path), "--force")
    assert r.returncode == 0, r.stderr
    assert path.read_text() == render_ci(ci)
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".") and p.suffix == ".tmp"] == []


def test_init_refuses_an_unknown_ci_and_a_project_without_requirements(tmp_path: Path) -> None:
    r = _init("--ci", "jenkins", "--dir", str(tmp_path))
    assert r.returncode == 64 and "jenkins" in r.stderr
    r = _init("--dir", str(tmp_path), "--base", "x@sha256:" + "0" * 64)
    assert r.returncode == 66 and "no requirements.in" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_init_with_a_single_file_as_data_says_what_a_dataset_is_and_what_to_do(tmp_path: Path) -> None:
    # makemore reads names.txt beside its script: a new user tries `--data names.txt`.
    (tmp_path / "names.txt").write_text("emma\nolivia\n")
    (tmp_path / "requirements.in").write_text("numpy\n")
    r = _init("--dir", str(tmp_path), "--data", "names.txt")
    assert r.returncode == 64 and "Traceback" not in r.stderr
    assert "hermetic: error: --data names.txt: not a directory; a dataset is a directory" in r.stderr
    assert "hermetic: hint: move names.txt into a directory of its own" in r.stderr
    assert "part of the code snapshot" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["names.txt", "requirements.in"]  # nothing written


# --- projects that `pip install -e .` (issue 25): requirements from their metadata, their own package ------


BASE = "x@sha256:" + "0" * 64
# minGPT's setup.py, but for pyyaml (locked from the local index in a second, where torch is 2 GB of CUDA)
MINGPT_SETUP = """from setuptools import setup

open("SETUP_PY_WAS_RUN", "w").write("init must never run setup.py")
setup(name='minGPT',
      version='0.0.1',
      author='Andrej Karpathy',
      packages=['mingpt'],
      description='A PyTorch re-implementation of GPT',
      license='MIT',
      install_requires=[
            'pyyaml',
      ],
)
"""


def _mingpt(root: Path) -> Path:
    (root / "mingpt").mkdir(parents=True)
    (root / "mingpt" / "__init__.py").write_text("")
    (root / "projects" / "adder").mkdir(parents=True)
    (root / "projects" / "adder" / "adder.py").write_text("from mingpt import *\n")
    (root / "setup.py").write_text(MINGPT_SETUP)
    return root


def test_a_setup_py_project_gets_its_requirements_and_its_package_importable(tmp_path: Path) -> None:
    proj = _mingpt(tmp_path / "minGPT")
    r = _init("--dir", str(proj), "--base", BASE, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["requirements_in"] == "setup.py install_requires"
    assert out["lock_source"] == "locked from requirements.in, written from setup.py install_requires"
    assert out["env"] == {"PYTHONPATH": "/workspace"} and out["own_package"] == "mingpt/"
    assert not (proj / "SETUP_PY_WAS_RUN").exists()  # read with ast, never executed
    req_in = (proj / "requirements.in").read_text()
    assert [ln for ln in req_in.splitlines() if not ln.startswith("#")] == ["pyyaml"]
    assert "pyyaml==" in (proj / "requirements.lock").read_text()
    text = (proj / "hermetic.yaml").read_text()
    assert "  PYTHONPATH: /workspace  # the project's own package (mingpt/), as pip install -e . would\n" in text
    assert yaml.safe_load(text)["env"] == {"PYTHONPATH": "/workspace"}
    assert out["next"] == "hermetic run YOUR_SCRIPT.py"  # no top-level script: adder.py is one level down


@pytest.mark.parametrize("install_requires,why", [
    ("open('requirements-dev.txt').read().splitlines()", "open('requirements-dev.txt').read().splitlines()"),
    ("[line for line in REQS]", "[line for line in REQS]"),
], ids=["read-from-a-file", "comprehension"])
def test_install_requires_computed_at_run_time_is_refused_with_what_to_do(tmp_path: Path, install_requires: str,
                                                                          why: str) -> None:
    (tmp_path / "setup.py").write_text(f"from setuptools import setup\nREQS = []\n"
                                       f"setup(name='x',\n      install_requires={install_requires})\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    r = _init("--dir", str(tmp_path), "--base", BASE)
    assert r.returncode == 66 and "Traceback" not in r.stderr, r.stderr
    assert f"setup.py:4: install_requires is computed when setup.py runs (`{why}`)" in r.stderr
    assert "reads setup.py without running it" in r.stderr
    assert "hermetic: hint: list the packages the script imports in requirements.in" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_setup_py_names_and_joined_lists_are_read(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text(
        "import setuptools\nBASE = ['numpy>=1.24', 'pyyaml']\nTRAIN: list = ['torch']\n"
        "setuptools.setup(name='demo', install_requires=BASE + ['tqdm'],\n"
        "                 extras_require={'train': TRAIN, 'all': ['demo[train]', 'rich']})\n")
    assert declared_requirements(tmp_path).requirements == ["numpy>=1.24", "pyyaml", "tqdm"]
    both = declared_requirements(tmp_path, ["all"])
    assert both.requirements == ["numpy>=1.24", "pyyaml", "tqdm", "rich", "torch"]  # demo[train] expanded
    assert both.source == "setup.py install_requires + extra all"
    with pytest.raises(UsageError, match=r"--extra gpu: setup.py declares no such optional dependencies "
                                         r"\(it has: all, train\)"):
        declared_requirements(tmp_path, ["gpu"])


def test_setup_cfg_and_a_broken_setup_py(tmp_path: Path) -> None:
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = demo\n\n[options]\npackages = find:\n"
                                        "install_requires =\n    numpy\n    # a comment\n    pyyaml>=6\n"
                                        "\n[options.extras_require]\ndev = pytest\n")
    d = declared_requirements(tmp_path, ["dev"])
    assert d.requirements == ["numpy", "pyyaml>=6", "pytest"]
    assert d.source == "setup.cfg [options] install_requires + extra dev"
    (tmp_path / "setup.cfg").unlink()
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='x', install_requires=[\n")
    with pytest.raises(DataError, match=r"setup.py:2: not valid Python"):
        declared_requirements(tmp_path)
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(**CONFIG)\n")
    with pytest.raises(NotFound, match=r"setup.py:2: setup\(\) gets its arguments through \*\*"):
        declared_requirements(tmp_path)


def test_pyproject_extras_are_locked_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "1"\ndependencies = ["pyyaml"]\n'
        '[project.optional-dependencies]\ncli = ["click"]\n')
    r = _init("--dir", str(tmp_path), "--base", BASE, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["lock_source"] == "locked from pyproject.toml" and out["requirements_in"] is None  # as before
    assert "click==" not in (tmp_path / "requirements.lock").read_text()
    r = _init("--dir", str(tmp_path), "--base", BASE, "--extra", "cli", "--force")
    assert r.returncode == 64 and "the lock comes from requirements.lock (delete it to lock" in r.stderr, r.stderr
    (tmp_path / "requirements.lock").unlink()
    r = _init("--dir", str(tmp_path), "--base", BASE, "--extra", "cli", "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["requirements_in"] == "pyproject.toml [project].dependencies + extra cli"
    assert "click==" in (tmp_path / "requirements.lock").read_text()
    (tmp_path / "requirements.in").unlink()
    (tmp_path / "requirements.lock").unlink()
    r = _init("--dir", str(tmp_path), "--base", BASE, "--extra", "gpu", "--force")
    assert r.returncode == 64 and "--extra gpu: pyproject.toml declares no such optional dependencies (it has: cli)" \
        in r.stderr, r.stderr


def test_pyproject_dynamic_dependencies(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\ndynamic = ["version", "dependencies"]\n')
    with pytest.raises(NotFound, match=r"\[project\].dependencies are dynamic"):
        declared_requirements(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndynamic = ["dependencies"]\n'
        '[tool.setuptools.dynamic]\ndependencies = {file = ["reqs/base.txt"]}\n')
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "base.txt").write_text("pyyaml\n")
    d = declared_requirements(tmp_path)
    assert d.files == ["reqs/base.txt"] and d.requirements == []
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\ndynamic = ["dependencies"]\n')
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(install_requires=['pyyaml'])\n")
    assert declared_requirements(tmp_path).requirements == ["pyyaml"]  # setuptools takes them from setup.py


@pytest.mark.parametrize("layout", ["root", "src"])
def test_own_package_at_the_root_or_under_src(tmp_path: Path, layout: str) -> None:
    pkg = (tmp_path / "src" / "my_model") if layout == "src" else (tmp_path / "my_model")
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    assert own_package(tmp_path) is None  # not installable: a script at the root imports it anyway
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "my-model"\nversion = "1"\ndependencies = ["pyyaml"]\n')
    found = own_package(tmp_path)
    assert found is not None and (found.layout, found.names) == (layout, ["my_model"])
    r = _init("--dir", str(tmp_path), "--base", BASE, "--json")
    assert r.returncode == 0, r.stderr
    expected = "/workspace/src" if layout == "src" else "/workspace"
    assert json.loads(r.stdout)["env"] == {"PYTHONPATH": expected}
    shown = "src/my_model/" if layout == "src" else "my_model/"
    assert f"  PYTHONPATH: {expected}  # the project's own package ({shown}), as pip install -e . would\n" \
        in (tmp_path / "hermetic.yaml").read_text()


def test_next_names_the_one_obvious_script(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "utils.py").write_text("def f(): pass\n")
    assert guess_script(tmp_path) is None
    (tmp_path / "makemore.py").write_text("def main(): pass\n\nif __name__ == '__main__':\n    main()\n")
    assert guess_script(tmp_path) == "makemore.py"  # the only one with a main guard
    (tmp_path / "sample.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert guess_script(tmp_path) is None  # two: no guess
    (tmp_path / "main.py").write_text("")
    assert guess_script(tmp_path) == "main.py"
    only = tmp_path / "gallery"
    only.mkdir()
    (only / "plot_digits.py").write_text("print('a gallery script has no main guard')\n")
    assert guess_script(only) == "plot_digits.py"
    (only / "requirements.in").write_text("pyyaml\n")
    r = _init("--dir", str(only), "--base", BASE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "next: hermetic run plot_digits.py"


def test_a_setup_py_without_install_requires_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='x', packages=['x'])\n")
    r = _init("--dir", str(tmp_path), "--base", BASE)
    assert r.returncode == 66 and "setup.py: declares no install_requires" in r.stderr, r.stderr
    assert "hermetic: hint: list the packages the script imports in requirements.in" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["setup.py"]


@pytest.mark.docker
def test_a_project_that_imports_its_own_package_runs_from_a_subdirectory(tmp_path: Path, module_cache,
                                                                          base_ref) -> None:
    proj = _mingpt(tmp_path / "minGPT")
    (proj / "mingpt" / "model.py").write_text("class GPT:\n    name = 'gpt'\n")
    # minGPT's projects/adder/adder.py: `from mingpt.model import GPT`, run from the repository root
    (proj / "projects" / "adder" / "adder.py").write_text(
        "import yaml\nfrom mingpt.model import GPT\nopen('out.txt', 'w').write(GPT.name + ' ' + yaml.__version__)\n")
    r = run_cli("init", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert not (proj / "SETUP_PY_WAS_RUN").exists()
    _, rec = hermetic_run(proj, "projects/adder/adder.py")
    assert rec["record"]["status"] == "succeeded" and "out.txt" in rec["outputs"]["files"]
    assert (proj / "runs" / rec["record"]["run_id"] / "outputs" / "out.txt").read_text().startswith("gpt ")
