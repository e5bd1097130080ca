"""The CI templates of `hermetic init --ci`, run (issue 18).

GitLab: the generated .gitlab-ci.yml runs under gitlab-ci-local (its shell
executor: the `hermetic-shell` job, chosen by HERMETIC_EXECUTOR=shell) in
fresh clones of a project (examples/numpy-logreg) against a local
docker-registry standing in for GitLab's registry. The first pipeline finds
nothing: it bootstraps the base, pushes it, misses the build cache, builds
and publishes; the second, in another fresh clone with an empty hermetic
cache, pulls the base and the image and fetches no wheel.

GitHub: the generated workflow passes @action-validator/cli (GitHub's
workflow schema), and its `run:` steps are run in order, as the runner runs
them (bash -eo pipefail, $GITHUB_ENV carried between steps), in a fresh
clone with a fresh cache. The `uses:` steps are done by the test instead:
actions/checkout is `git clone`; actions/setup-python puts this test's
Python 3.11 (which has this hermetic) first on PATH; actions/cache restores
nothing (a first run on a new cache key); actions/upload-artifact copies its
path into an artifacts directory. `${{ github.actor }}` and
`${{ secrets.GITHUB_TOKEN }}` become a user name and an empty token (the
local registry has no auth), and env.REGISTRY (ghcr.io) becomes the local
registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from run_support import copy_example, git_commit_all

from hermetic import __version__

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.timeout(1200)]

NODE_BIN = REPO / ".cache" / "node-tools" / "node_modules" / ".bin"
REMOTE = "https://gitlab.example.invalid/acme/Demo.git"  # read by gitlab-ci-local for CI_PROJECT_PATH; never contacted
CACHE_REPO = "acme/demo/hermetic-cache"  # ${CI_REGISTRY_IMAGE#*/}/hermetic-cache, and the lowercased GitHub repo


def node_tool(name: str) -> Path:
    path = NODE_BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/ensure-test-deps (it runs scripts/ensure-node-tools)")
    return path


def tool_env(home: Path) -> dict[str, str]:
    """This test's Python (and its hermetic) first on PATH; a private HOME; no hermetic cache setting."""
    env = {k: v for k, v in os.environ.items() if k not in ("HERMETIC_CACHE", "XDG_CACHE_HOME")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", HOME=str(home),
               NO_COLOR="1", FORCE_COLOR="0")
    home.mkdir(parents=True, exist_ok=True)
    return env


def registry_tags(registry, repo: str = CACHE_REPO) -> list[str]:
    with urllib.request.urlopen(f"{registry.url}/v2/{repo}/tags/list", timeout=10) as r:
        return sorted(json.load(r).get("tags") or [])


def clone(src: Path, dest: Path) -> Path:
    """A fresh checkout whose origin is the project's (made-up) GitLab URL, as on a runner."""
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(dest), "remote", "set-url", "origin", REMOTE], check=True)
    return dest


@pytest.fixture(scope="module")
def ci_project(tmp_path_factory, base_ref) -> Path:
    """examples/numpy-logreg with both generated CI files, committed in git (data/ and runs/ ignored)."""
    proj = copy_example("numpy-logreg", tmp_path_factory.mktemp("ci") / "demo", base_ref)
    for ci in ("github", "gitlab"):
        proc = run_cli("init", "--ci", ci, "--dir", str(proj))
        assert proc.returncode == 0, proc.stderr
    git_commit_all(proj, "a project with hermetic's CI files")
    return proj


def gitlab_pipeline(project: Path, workdir: Path, registry, *, elsewhere: bool = False
                    ) -> tuple[subprocess.CompletedProcess, Path]:
    """One pipeline of the generated .gitlab-ci.yml in a fresh clone (so a fresh $CI_PROJECT_DIR/.hermetic/cache);
    ``elsewhere``: under another time zone and umask than the suite's (TZ a job variable, umask 002 inherited:
    077 would leave the data the job makes unreadable to the container's user, which hermetic refuses)."""
    checkout = clone(project, workdir / "checkout")
    # as root the template's as_root is nothing; through sudo (another user) TZ and the umask would not reach
    # the bootstrap, and the check would check nothing
    assert not elsewhere or os.geteuid() == 0, "the suite runs as root (make test)"
    where = ["--variable", "TZ=Pacific/Kiritimati"] if elsewhere else []
    proc = subprocess.run(
        [str(node_tool("gitlab-ci-local")), "--variable", "HERMETIC_EXECUTOR=shell",
         "--variable", f"REGISTRY={registry.host}", *where],
        cwd=checkout, env=tool_env(workdir / "home"), capture_output=True, text=True, timeout=900,
        umask=0o002 if elsewhere else -1)
    return proc, checkout


def artifact_record(checkout: Path, job: str = "hermetic-shell") -> dict:
    from hermetic.record import load_record

    [run_json] = (checkout / ".gitlab-ci-local" / "artifacts" / job / "runs").glob("*/run.json")
    return load_record(run_json)


@pytest.fixture(scope="module")
def first_pipeline(ci_project, registry, tmp_path_factory):
    """The first GitLab pipeline: an empty cache registry and an empty hermetic cache, another TZ and umask
    (its base bootstrap is the suite's check that bootstrapping is reproducible there: the project pins the
    session's base by digest)."""
    with pytest.raises(urllib.error.HTTPError, match="404"):
        registry_tags(registry)  # nothing pushed yet
    proc, checkout = gitlab_pipeline(ci_project, tmp_path_factory.mktemp("pipeline1"), registry, elsewhere=True)
    return proc, checkout


def test_gitlab_first_pipeline_bootstraps_the_base_misses_and_publishes(first_pipeline, registry, base_ref):
    proc, checkout = first_pipeline
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "PASS  hermetic-shell" in log
    assert "not in the cache; bootstrapping debian-bookworm-python3" in log
    assert "cache miss: published" in log
    rec = artifact_record(checkout)
    assert rec["record"]["status"] == "succeeded" and rec["metrics"]["final"]["epoch"] == 19
    # bootstrapped in an empty cache, TZ Pacific/Kiritimati, umask 002: the digest the suite's own base has (the
    # template itself stops on another digest; this says which one it was)
    assert rec["image"]["base"] == base_ref, (rec["image"]["base"], base_ref)
    assert (checkout / "data" / "meta.json").stat().st_mode & 0o777 == 0o664  # the job's files: its umask, 002
    base_digest = rec["image"]["base"].split("@")[1]
    tags = registry_tags(registry)
    assert f"base-{base_digest.removeprefix('sha256:')}" in tags
    assert any(t.startswith("hk-") for t in tags), tags
    # the template's cache is under .hermetic/, which the run's code snapshot leaves out
    assert list((checkout / ".hermetic" / "cache" / "wheels").rglob("*.whl"))
    assert not any(f.startswith(".hermetic/") for f in rec["code"]["snapshot"]["files"])


def test_gitlab_second_pipeline_on_a_fresh_cache_hits_and_fetches_no_wheel(first_pipeline, ci_project, registry,
                                                                          tmp_path_factory):
    first = artifact_record(first_pipeline[1])
    proc, checkout = gitlab_pipeline(ci_project, tmp_path_factory.mktemp("pipeline2"), registry)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "pulled from the cache" in log and "bootstrapping" not in log
    assert "cache hit: pulled" in log and "cache miss" not in log
    cache = checkout / ".hermetic" / "cache"
    assert cache.is_dir() and not list(cache.rglob("*.whl"))  # not one wheel fetched
    rec = artifact_record(checkout)
    assert rec["record"]["status"] == "succeeded"
    assert rec["image"]["id"] == first["image"]["id"]
    assert rec["outputs"]["files"] == first["outputs"]["files"]  # the same training, bit for bit


def test_github_workflow_passes_the_schema_validator(ci_project, tmp_path):
    validator = node_tool("action-validator")
    workflow = ci_project / ".github" / "workflows" / "hermetic.yml"
    proc = subprocess.run([str(validator), str(workflow)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the validator does look: a misspelt key fails
    broken = tmp_path / "broken.yml"
    broken.write_text(workflow.read_text().replace("runs-on:", "runs_on:"))
    proc = subprocess.run([str(validator), str(broken)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "runs_on" in proc.stdout + proc.stderr


EXPRESSIONS = {"github.actor": "hermetic-ci", "secrets.GITHUB_TOKEN": ""}


def expand(value: str) -> str:
    def sub(m: re.Match) -> str:
        return EXPRESSIONS[m.group(1).strip()]
    return re.sub(r"\$\{\{([^}]*)\}\}", sub, str(value))


def run_github_job(workflow: dict, project: Path, work: Path, registry) -> list[dict]:
    """Each step of the one job, in order, as described in the module docstring; a list of step results."""
    [job] = workflow["jobs"].values()
    workspace = work / "workspace"
    artifacts = work / "artifacts"
    github_env = work / "github_env"
    github_env.write_text("")
    env = tool_env(work / "home")
    env.update({k: expand(v) for k, v in workflow.get("env", {}).items()})
    env.update({k: expand(v) for k, v in job.get("env", {}).items()})
    env.update(REGISTRY=registry.host, GITHUB_REPOSITORY="Acme/Demo", GITHUB_ENV=str(github_env),
               GITHUB_WORKSPACE=str(workspace), CI="true", GITHUB_ACTIONS="true")
    results, failed = [], False
    for i, step in enumerate(job["steps"]):
        if failed and step.get("if") != "always()":
            results.append({"step": step.get("name") or step.get("uses"), "skipped": True})
            continue
        if "uses" in step:
            action = step["uses"].split("@")[0]
            if action == "actions/checkout":
                clone(project, workspace)
            elif action == "actions/setup-python":
                assert step["with"]["python-version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
            elif action == "actions/cache":
                pass  # a first run on this key: nothing restored
            elif action == "actions/upload-artifact":
                src = workspace / step["with"]["path"]
                if src.exists():
                    shutil.copytree(src, artifacts / step["with"]["name"] / step["with"]["path"])
            else:
                raise AssertionError(f"no stand-in for {step['uses']}")
            results.append({"step": action, "rc": 0})
            continue
        script = work / f"step{i}.sh"
        script.write_text(step["run"])
        assert "${{" not in step["run"], step["run"]
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                              env={**env, **{k: expand(v) for k, v in step.get("env", {}).items()}},
                              capture_output=True, text=True, timeout=900)
        for line in github_env.read_text().splitlines():
            key, eq, value = line.partition("=")
            if eq:
                env[key] = value
        results.append({"step": step.get("name"), "rc": proc.returncode, "log": proc.stdout + proc.stderr})
        failed = failed or proc.returncode != 0
    return results


def test_github_workflow_run_steps_in_a_fresh_clone_with_a_fresh_cache(first_pipeline, ci_project, registry,
                                                                       tmp_path):
    workflow = yaml.safe_load((ci_project / ".github" / "workflows" / "hermetic.yml").read_text())
    results = run_github_job(workflow, ci_project, tmp_path, registry)
    logs = {r["step"]: r for r in results}
    assert all(r.get("rc") == 0 for r in results), [(r["step"], r.get("log", "")[-3000:]) for r in results]
    names = [r["step"] for r in results]
    assert names.index("Base image (this runner's store, else the cache, else bootstrapped)") \
        < names.index("Data") < names.index("Build (or pull from the cache)") < names.index("Train")
    assert "pip install" not in logs["Install hermetic"]["log"]  # this hermetic is the version it pins
    assert "pulled from the cache" in logs["Base image (this runner's store, else the cache, else bootstrapped)"]["log"]
    assert "cache hit: pulled" in logs["Build (or pull from the cache)"]["log"]
    home_cache = tmp_path / "home" / ".cache" / "hermetic"
    assert home_cache.is_dir() and not list(home_cache.rglob("*.whl"))
    from hermetic.record import load_record

    [run_json] = (tmp_path / "artifacts" / "hermetic-runs" / "runs").glob("*/run.json")
    rec = load_record(run_json)
    assert rec["record"]["status"] == "succeeded" and rec["invocation"]["script"] == "train.py"
    assert rec["image"]["id"] == artifact_record(first_pipeline[1])["image"]["id"]
    assert f"hermetic=={__version__}" in (ci_project / ".github" / "workflows" / "hermetic.yml").read_text()
