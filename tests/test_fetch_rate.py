"""A wheel index that trickles ends `hermetic fetch` (issue 40, item 6): the registry's minimum transfer rate over a
window (hermetic.core.transfer, HERMETIC_MIN_RATE / HERMETIC_RATE_WINDOW) holds for wheel downloads too; exit 75
naming the wheel and the index, no wheel and no temp file left in the store. The registry's own variables still
hold for the registry, and win over the general ones there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buildsupport import make_project
from conftest import assert_clean_error, run_cli
from slow_server import SlowWheels
from wheelfactory import make_wheel

LIMITS = {"HERMETIC_MIN_RATE": "4096", "HERMETIC_RATE_WINDOW": "1", "PIP_NO_INDEX": "1"}


def wheel_project(tmp_path: Path) -> tuple[Path, Path]:
    big = make_wheel(tmp_path / "w", "bigpkg", "1.0", files={"bigpkg/blob.bin": os.urandom(256 << 10)})
    return big, make_project(tmp_path / "p", "hermetic/none@sha256:" + "0" * 64, {"bigpkg": big})


def test_a_trickling_index_ends_fetch_with_75_naming_the_wheel_and_the_index(tmp_path, cache_dir, isolated_pip):
    big, proj = wheel_project(tmp_path)
    with SlowWheels([big], bytes_per_s=1000) as server:
        proc = run_cli("fetch", "-C", str(proj), env={**LIMITS, "PIP_FIND_LINKS": server.url}, timeout=120)
    assert_clean_error(proc, 75, "bigpkg==1.0", big.name, server.url, " bytes/s over the last 1 s",
                       "below the minimum of 4096 bytes/s", "HERMETIC_MIN_RATE")
    assert not list((cache_dir / "wheels").rglob("*.whl"))
    assert not list((cache_dir / "wheels" / "tmp").iterdir())


def test_the_same_wheel_served_fast_is_fetched_under_the_same_limit(tmp_path, cache_dir, isolated_pip):
    big, proj = wheel_project(tmp_path)
    with SlowWheels([big], bytes_per_s=64 << 20) as server:
        proc = run_cli("fetch", "-C", str(proj), env={**LIMITS, "PIP_FIND_LINKS": server.url}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (cache_dir / "wheels").rglob("*.whl")] == [big.name]


@pytest.mark.parametrize("env, rate", [({"HERMETIC_MIN_RATE": "5"}, 5.0),
                                       ({"HERMETIC_MIN_RATE": "5", "HERMETIC_REGISTRY_MIN_RATE": "7"}, 7.0),
                                       ({}, 1024.0)])
def test_the_registry_takes_the_general_minimum_unless_its_own_is_set(env, rate):
    from hermetic.registry.deadlines import Timeouts

    assert Timeouts.from_env(env).min_rate == rate
