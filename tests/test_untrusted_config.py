"""hermetic.yaml, its lock and manifests come with a repository that may be hostile (issue 40, item 1):
the paths it names stay inside the project unless HERMETIC_ALLOW_PATHS widens them, errors never echo a
file's text, mount targets are checked in one spelling, sizes have a ceiling."""

from __future__ import annotations

import posixpath

import pytest

from conftest import assert_clean_error, run_cli

BASE = "base: x@sha256:" + "0" * 64 + "\n"
SECRET = "root:$6$SECRETSALT$c2VjcmV0:19000:0:99999:7:::"


def project(tmp_path, body: str):
    root = tmp_path / "p"
    root.mkdir(exist_ok=True)
    (root / "hermetic.yaml").write_text("name: t\n" + BASE + body)
    return root


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "shadow"
    path.write_text(SECRET + "\n")
    return path


def show(root, **env):
    return run_cli("config", "show", "-C", str(root), env=env or None)


@pytest.mark.parametrize("key, value", [
    ("runs_dir", "/anywhere"), ("runs_dir", "../../x"), ("lock", "/etc/shadow"), ("lock", "../../../etc/passwd"),
    ("datasets[0].path", "/etc"), ("datasets[0].path", "../elsewhere"), ("datasets[0].manifest", "/etc/passwd"),
    ("datasets[0].manifest", "data/../../d.sha256"),
])
def test_a_path_out_of_the_project_is_refused_naming_key_and_line(tmp_path, key, value):
    if key.startswith("datasets"):
        field = key.split(".")[1]
        d = {"path": "data", "manifest": "d.sha256", field: value}
        body = f"datasets:\n  - {{name: d, path: '{d['path']}', manifest: '{d['manifest']}', mount: /d}}\n"
    else:
        body = f"{key}: '{value}'\n"
    root = project(tmp_path, body)
    line = 4 if key.startswith("datasets") else 3
    assert_clean_error(show(root), 78, f"{root.resolve() / 'hermetic.yaml'}:{line}: {key}: ",
                       f"{posixpath.normpath(value)} is outside the project",
                       "HERMETIC_ALLOW_PATHS")
    # every command that reads the config: the runs listing too
    assert_clean_error(run_cli("runs", "-C", str(root)), 78, f"{key}: ", "is outside the project")
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_a_link_in_the_project_does_not_lead_lock_manifest_or_runs_out(tmp_path, secret):
    root = project(tmp_path, "")
    (root / "lock").symlink_to(secret)
    (root / "r").symlink_to(tmp_path)
    (root / "d.sha256").symlink_to(secret)
    for key, body in (("lock", "lock: lock\n"), ("runs_dir", "runs_dir: r/out\n"),
                      ("datasets[0].manifest", "datasets: [{name: d, path: data, manifest: d.sha256}]\n")):
        (root / "hermetic.yaml").write_text("name: t\n" + BASE + body)
        proc = show(root)
        assert_clean_error(proc, 78, f"hermetic.yaml:3: {key}: ", "(a link to ", "is outside the project")
        assert SECRET not in proc.stderr


def test_a_dataset_through_a_link_and_an_allowed_place_still_load(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "data").mkdir(parents=True)
    root = project(tmp_path, "datasets: [{name: d, path: data, manifest: d.sha256}]\n")
    (root / "data").symlink_to(scratch / "data")  # as today: a dataset on a big disk, reached by a link
    assert show(root).returncode == 0, show(root).stderr
    dataset = f"{{name: d, path: {scratch}/data, manifest: d.sha256, mount: /d}}"
    (root / "hermetic.yaml").write_text("name: t\n" + BASE + f"runs_dir: {tmp_path}/runs\nlock: ../p/x.lock\n"
                                        f"datasets: [{dataset}]\n")
    assert_clean_error(show(root), 78, "runs_dir: ")
    proc = show(root, HERMETIC_ALLOW_PATHS=f"/nowhere::{tmp_path}/")
    assert proc.returncode == 0, proc.stderr
    assert_clean_error(show(root, HERMETIC_ALLOW_PATHS="scratch"), 78,
                       "HERMETIC_ALLOW_PATHS: scratch is not an absolute")


def test_errors_about_a_lock_or_manifest_never_print_its_text(tmp_path, secret):
    """Widened by the user (or a file in the project that is not a lock): file:line and what was expected."""
    root = project(tmp_path, f"lock: {secret}\ndatasets: [{{name: d, path: data, manifest: {secret}}}]\n")
    (root / "data").mkdir()
    env = {"HERMETIC_ALLOW_PATHS": str(tmp_path), "DOCKER_HOST": "unix:///nonexistent"}
    proc = run_cli("fetch", "-C", str(root), env=env)
    assert_clean_error(proc, 65, f"{secret}:1: invalid requirement: Expected")
    assert "SECRETSALT" not in proc.stderr + proc.stdout
    proc = run_cli("data", "verify", "-C", str(root), env=env)
    assert_clean_error(proc, 65, f"{secret}:1: not a '<sha256>  <path>' line")
    assert "SECRETSALT" not in proc.stderr + proc.stdout
    (root / "hermetic.yaml").write_text("name: t\n" + BASE + f"lock: {secret}\n")
    secret.write_text("--" + SECRET + "\n")
    proc = run_cli("fetch", "-C", str(root), env=env)
    assert_clean_error(proc, 65, f"{secret}:1: unsupported option")
    assert "SECRETSALT" not in proc.stderr + proc.stdout


def test_init_never_prints_a_linked_setup_cfg(tmp_path, secret):
    root = tmp_path / "p"
    root.mkdir()
    (root / "setup.cfg").symlink_to(secret)
    proc = run_cli("init", "--base", "x@sha256:" + "0" * 64, cwd=root)
    assert_clean_error(proc, 65, f"{root / 'setup.cfg'}:1: not a valid setup.cfg")
    assert "SECRETSALT" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("mount", ["//opt/venv", "/opt/venv/.", "/opt//venv/..//venv", "/opt/venv/", "///opt/venv//",
                                   "//usr/lib", "//workspace"])
def test_mount_targets_are_checked_in_one_spelling(tmp_path, mount):
    """The container's filesystem is Linux's: case-sensitive, so /OPT/venv is another path (not folded)."""
    root = project(tmp_path, f"datasets: [{{name: d, path: data, manifest: d.sha256, mount: '{mount}'}}]\n")
    assert_clean_error(show(root), 78, "hermetic.yaml:3: datasets[0].mount: ")


def test_image_paths_are_spelled_once(tmp_path):
    root = project(tmp_path, "build: {workdir: '//work//space/.', prefix: '/opt/venv/'}\n")
    proc = run_cli("config", "show", "--json", "-C", str(root))
    assert proc.returncode == 0, proc.stderr
    assert '"workdir": "/work/space"' in proc.stdout and '"prefix": "/opt/venv"' in proc.stdout


@pytest.mark.parametrize("key", ["tmp_size", "workdir_size", "shm_size", "memory"])
def test_sizes_have_a_ceiling(tmp_path, key):
    root = project(tmp_path, f"run:\n  {key}: 9999999999999999999999999g\n")
    assert_clean_error(show(root), 78, f"hermetic.yaml:4: run.{key}: at most 16384g (16 TiB")
    (root / "hermetic.yaml").write_text("name: t\n" + BASE + f"run:\n  {key}: 16385g\n")
    assert_clean_error(show(root), 78, f"run.{key}: at most 16384g")
    (root / "hermetic.yaml").write_text("name: t\n" + BASE + f"run:\n  {key}: 16384g\n")
    assert show(root).returncode == 0


def test_pids_has_a_ceiling(tmp_path):
    root = project(tmp_path, "run:\n  pids: 99999999999999999999\n")
    assert_clean_error(show(root), 78, "hermetic.yaml:4: run.pids: ", "4194304")
