"""hermetic.config.determinism is the one list of knobs; the copies inside the image must agree with it.

The in-image runtime (hermetic/inimage/runtime/_env.py) and the probe
(hermetic/inimage/probe/probe.py) run where hermetic is not installed, so they keep
stdlib-only copies of the names: these tests fail when one drifts.
"""

from __future__ import annotations

import typing

from hermetic.config import determinism
from hermetic.config.load import DeterminismConfig
from hermetic.inimage.probe import probe
from hermetic.inimage.runtime import _env as runtime_env


def test_modes_agree_with_config_and_runtime():
    assert typing.get_args(DeterminismConfig.model_fields["mode"].annotation) == determinism.MODES
    assert runtime_env.MODES == determinism.MODES
    assert runtime_env.DETERMINISM_ENV == determinism.MODE_ENV


def test_runtime_reports_every_knob_the_process_can_see():
    # The mode variable and SOURCE_DATE_EPOCH are hermetic's own; the runtime reports the rest.
    expected = set(determinism.KNOB_NAMES) - {determinism.MODE_ENV, determinism.SOURCE_DATE_EPOCH}
    assert set(runtime_env.DETERMINISM_VARS) == expected


def test_runtime_strict_expectations_are_strict_knobs():
    strict = determinism.knob_env("strict", 1, 0, {})
    assert set(runtime_env.STRICT_ENV_EXPECTED) <= set(strict)


def test_probe_captures_every_knob_that_changes_numerics():
    def captured(name: str) -> bool:
        return name in probe.ENV_EXACT or name.startswith(probe.ENV_PREFIXES) or name.endswith(probe.ENV_SUFFIXES)

    # SOURCE_DATE_EPOCH stamps times into files, it changes no number: the probe leaves it out.
    missing = [k for k in determinism.KNOB_NAMES if not captured(k) and k != determinism.SOURCE_DATE_EPOCH]
    assert missing == []


def test_knob_env_by_mode():
    off = determinism.knob_env("off", 4, 0, {})
    assert off == {"HERMETIC_DETERMINISM": "off"}
    stat = determinism.knob_env("statistical", 4, 0, {})
    assert {stat[k] for k in determinism.THREAD_KNOBS} == {"4"} and stat["PYTHONHASHSEED"] == "0"
    assert not set(determinism.STRICT_FIXED) & set(stat)
    strict = determinism.knob_env("strict", 2, 7, {"NCCL_ALGO": "Tree"})
    assert strict["SOURCE_DATE_EPOCH"] == "7" and strict["NCCL_ALGO"] == "Tree"  # hermetic.yaml wins
    assert set(strict) <= set(determinism.KNOB_NAMES)


def test_seed_is_outside_identity():
    cfg = {"name": "x", "determinism": {"mode": "strict", "seed": 5, "threads": 1, "env": {}}}
    assert determinism.without_seed(cfg) == {"name": "x", "determinism": {"mode": "strict", "threads": 1, "env": {}}}
    assert "seed" not in determinism.identity_part("strict", 1, {})
    assert determinism.SEED_KEY == "determinism.seed"


def test_env_knobs_not_set():
    assert determinism.env_knobs_not_set(determinism.knob_env("strict", 1, 0, {})) == []
    assert determinism.env_knobs_not_set({"CUBLAS_WORKSPACE_CONFIG": ":16:8", "PYTHONHASHSEED": "random"}) == [
        "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "SOURCE_DATE_EPOCH"]
    # statistical mode leaves the time to writers: a PDF's CreationDate differs every run (pytorch/examples'
    # time_sequence_prediction), so the knob is named
    assert determinism.env_knobs_not_set(determinism.knob_env("statistical", 1, 0, {})) == [
        "CUBLAS_WORKSPACE_CONFIG", "SOURCE_DATE_EPOCH"]
