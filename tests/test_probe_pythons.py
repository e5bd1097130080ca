"""The probe where the Pythons a base can ship (3.10 to 3.13) differ: run for real on this interpreter.

`make test-pythons` runs these on each of them; on a Python without the difference they check the
same result all the same (PYTHONSAFEPATH is 3.11+, PYTHON_CPU_COUNT 3.13+).
"""

from __future__ import annotations

import json
import os

from test_probe import assert_shape, run_probe


def test_probe_finds_its_siblings_under_pythonsafepath():
    # 3.11+: PYTHONSAFEPATH (in the image's or the run's env) keeps the script's directory off sys.path
    proc = run_probe(env={"PYTHONSAFEPATH": "1"})
    assert proc.returncode == 0, proc.stderr
    assert_shape(json.loads(proc.stdout))


def test_probe_reports_the_machines_cores_whatever_python_cpu_count_says():
    cores = os.sysconf("SC_NPROCESSORS_ONLN")
    told = str(cores + 3)  # 3.13+: os.cpu_count() answers this instead
    proc = run_probe(env={"PYTHON_CPU_COUNT": told})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["hardware"]["cpu"]["logical_cores"] == cores
    assert doc["software"]["env"]["PYTHON_CPU_COUNT"] == told  # recorded: the pools' default sizes follow it
