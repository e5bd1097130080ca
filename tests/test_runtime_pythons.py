"""The in-image runtime's tests from test_runtime.py (seeding, start-up seeding, determinism switches, the
report, RNG state and checkpoints), run again inside a container, once per catalog Python that can be had here.

The same test functions, imported: only ``run_python`` differs. Here it runs the code in one container of the
session's bootstrapped base (test_probe_container's ``python_image``: Debian bookworm minbase + python3, read-only
root, no network), with the host's pytest temp folder mounted at its own path, so the image copy of the runtime
and every test's files are where the test says. Which interpreter runs it:

- ``base-python3``: the base's own ``python3``, Debian 12's 3.11.2 (a catalog base: the real thing).
- ``pyenv-3.10``, ``pyenv-3.12``, ``pyenv-3.13``: no catalog base for these can be had here (Ubuntu 22.04 and
  24.04 and python:3.12/3.13 come from registries this machine cannot reach), so a CPython of that version built
  by pyenv on this host (Debian 12, the base's glibc) is mounted read-only at its own path and run in the same
  container. It is the real interpreter and standard library of that version, not the distribution's build of
  it (Ubuntu's 3.10.12, say, carries its own patches). Skipped, saying so, where pyenv has no such version.

With HERMETIC_TEST_PYTHON_IMAGE set, that image replaces the base (``python3`` is then its own).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from test_probe_container import python_image  # noqa: F401 (fixture)
from test_runtime import (  # noqa: F401 (fixtures and the tests themselves, collected here again)
    fake_torch_site,
    image_copy,
    isolated_command,
    python_version,
    startup_site,
    test_checkpoint_without_torch_resumes_python_rng,
    test_image_copy_imports_without_site_packages,
    test_non_strict_modes_check_nothing,
    test_report_is_identical_for_identical_runs,
    test_report_merges_sections_and_keeps_foreign_keys,
    test_rng_state_roundtrip_with_random_only,
    test_seed_wrappers_pass_through_and_note_the_seed_applied,
    test_startup_does_nothing_outside_a_run_or_when_switched_off,
    test_startup_reports_what_it_seeded_at_exit,
    test_startup_seeds_random_after_its_first_import_and_then_leaves,
    test_startup_seeds_torch_on_its_import_even_after_a_find_spec_probe,
    test_strict_is_quiet_when_the_image_sets_the_knobs,
    test_strict_warns_on_missing_image_knobs,
    test_the_report_says_which_seed_a_script_reseeded_random_with,
)

pytestmark = pytest.mark.docker

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_MINOR = "3.11"  # the bootstrapped base's python3 (Debian 12)
MOUNTED_MINORS = ("3.10", "3.12", "3.13")  # the catalog's other Pythons


def pyenv_python(minor: str) -> Path | None:
    """The newest pyenv CPython ``minor`` (a release: x.y.z) on this host, or None."""
    versions = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [p for p in versions.glob(f"{minor}.*/bin/python{minor}") if re.fullmatch(r"\d+\.\d+\.\d+", p.parts[-3])]
    return max(found, key=lambda p: tuple(int(n) for n in p.parts[-3].split(".")), default=None)


# (id, the command in the container, its minor, its prefix on the host to mount or None)
INTERPRETERS = [("base-python3", "python3", BASE_MINOR, None)] + [
    (f"pyenv-{m}", str(exe) if exe else None, m, str(exe.parent.parent) if exe else None)
    for m in MOUNTED_MINORS for exe in [pyenv_python(m)]
]


@pytest.fixture(scope="module")
def pythons_container(docker_client, python_image, tmp_path_factory):  # noqa: F811 (python_image is a fixture)
    """One container for every interpreter: the tests' temp folder read-write, each pyenv prefix read-only, both
    at their host paths; this user, as on the host (the tests read what it writes)."""
    base = str(tmp_path_factory.getbasetemp())
    volumes = {base: {"bind": base, "mode": "rw"}}
    volumes.update({prefix: {"bind": prefix, "mode": "ro"} for *_, prefix in INTERPRETERS if prefix})
    container = docker_client.containers.run(
        python_image, ["sleep", "infinity"], detach=True, read_only=True, network_mode="none",
        user=f"{os.getuid()}:{os.getgid()}", volumes=volumes)
    try:
        yield container
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module", params=INTERPRETERS, ids=[i[0] for i in INTERPRETERS])
def run_python(request, pythons_container):
    name, python, minor, _ = request.param
    if python is None:
        pytest.skip(f"no CPython {minor} under pyenv's root on this host to mount into the base")

    def run(site: Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        # env -i: only PATH and ``env``, as run_isolated gives on the host
        argv = ["env", "-i", f"PATH={CONTAINER_PATH}", *(f"{k}={v}" for k, v in (env or {}).items()),
                *isolated_command(python, site, code)]
        result = pythons_container.exec_run(argv, demux=True)
        out, err = result.output
        return subprocess.CompletedProcess(argv, result.exit_code, (out or b"").decode("utf-8", "replace"),
                                           (err or b"").decode("utf-8", "replace"))

    proc = run(Path("/"), "import platform; print(platform.python_version())")
    if proc.returncode != 0 and python != "python3" and os.environ.get("HERMETIC_TEST_PYTHON_IMAGE"):
        pytest.skip(f"{python} does not run in HERMETIC_TEST_PYTHON_IMAGE: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, f"{name}: {proc.stderr}"
    run.version = proc.stdout.strip()
    # what it must be: another image's own python3 is whatever that image has
    run.minor = None if python == "python3" and os.environ.get("HERMETIC_TEST_PYTHON_IMAGE") else minor
    return run


def test_each_python_is_the_one_named(run_python):
    assert run_python.minor is None or run_python.version.startswith(run_python.minor + "."), run_python.version
