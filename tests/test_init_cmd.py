"""``hermetic init --ci``: the CI templates it writes, and that it never clobbers a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hermetic import __version__
from hermetic.cli.init_cmd import CI_TEMPLATES, VERSION_PLACEHOLDER, render_ci

REPO_ROOT = Path(__file__).resolve().parent.parent


def _init(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermetic", "init", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60)


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
