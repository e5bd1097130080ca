"""Multi-seed groups: the t quantile, Welch's test, group.json, and diffing two groups."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from conftest import run_cli

from hermetic.core.canonical import canonical_sha256
from hermetic.diff import diff_paths
from hermetic.core.stats import summarize, t975, welch
from hermetic.core.errors import IntegrityError
from hermetic.record import load_group, write_group
from hermetic.record.schema import RecordError
from synthetic_records import synthetic_record, write_synthetic_run


def student_t_cdf(t: float, df: float, steps: int = 20000) -> float:
    """Independent reference: Simpson's rule over the t density from 0 to t."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    pdf = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731
    hstep = t / steps
    total = pdf(0) + pdf(t) + sum((4 if i % 2 else 2) * pdf(i * hstep) for i in range(1, steps))
    return 0.5 + total * hstep / 3


@pytest.mark.parametrize("df", [*range(1, 31), 31, 35, 45, 60, 100, 1000])
def test_t975_is_the_0975_quantile(df):
    assert student_t_cdf(t975(df), df) == pytest.approx(0.975, abs=2e-7)


@pytest.mark.parametrize("df", [1.5, 2.3, 7.7, 29.5, 30.4])
def test_t975_between_table_entries_is_conservative(df):
    # Welch's df is fractional: rounding down gives a slightly larger quantile, never a smaller one
    if df > 30:  # the expansion is continuous in df: simply accurate there
        assert student_t_cdf(t975(df), df) == pytest.approx(0.975, abs=1e-8)
    else:
        assert student_t_cdf(t975(df), df) >= 0.975
        assert t975(df) == t975(math.floor(df))


def test_summarize_and_welch():
    a = summarize([0.30, 0.31, 0.32])
    assert (a["n"], a["mean"], a["sd"]) == (3, pytest.approx(0.31), pytest.approx(0.01))
    assert a["ci95"] == [pytest.approx(0.31 - 4.302652730 * 0.01 / math.sqrt(3)),
                         pytest.approx(0.31 + 4.302652730 * 0.01 / math.sqrt(3))]
    close = summarize([0.305, 0.315, 0.325])
    far = summarize([0.40, 0.41, 0.42])
    assert welch(a, close)["within_noise"] is True
    w = welch(a, far)
    assert w["within_noise"] is False and w["df"] == pytest.approx(4.0) and w["t"] == pytest.approx(12.247, rel=1e-4)
    assert welch(summarize([0.3]), far)["within_noise"] is None
    flat = summarize([0.3, 0.3])
    assert welch(flat, flat)["within_noise"] is True
    assert welch(flat, summarize([0.4, 0.4]))["within_noise"] is False


def make_group(root, gid: str, losses: list[float], *, lr: float | None = None, fail: int | None = None) -> list[str]:
    ids = []
    for seed, loss in enumerate(losses):
        rid = f"{gid[:13]}{seed:02d}-{seed:06x}"
        rec = synthetic_record(rid, seed=seed)
        rec["invocation"]["group"] = gid
        rec["seed"]["policy"] = "group"
        rec["metrics"]["final"] = {"loss": loss}
        if lr is not None:
            rec["invocation"]["args"] = ["--lr", str(lr)]
        if seed == fail:
            rec["record"].update(status="failed", exit_code=1)
        write_synthetic_run(root, rec)
        ids.append(rid)
    write_group(root, gid, ids)
    return ids


def test_write_group_statistics(tmp_path):
    root = tmp_path / "runs"
    make_group(root, "20261129-210000-aaaaaa-g", [0.30, 0.31, 0.32, 9.0], fail=3)
    g = load_group(root / "20261129-210000-aaaaaa-g")
    assert g["group"]["status"] == "failed"  # one member failed...
    loss = g["metrics"]["loss"]
    assert loss["n"] == 3 and loss["mean"] == pytest.approx(0.31)  # ...and is left out
    assert [m["seed"] for m in g["members"]] == [0, 1, 2, 3]
    assert g["inputs"]["mixed"] == []


def test_group_json_is_sealed(tmp_path):
    root = tmp_path / "runs"
    gid = "20261129-210000-aaaaaa-g"
    make_group(root, gid, [0.30, 0.31])
    path = root / gid / "group.json"
    doc = json.loads(path.read_text())
    doc["metrics"]["loss"]["mean"] = 0.2
    path.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError):
        load_group(root / gid)


def test_write_group_refuses_foreign_members(tmp_path):
    root = tmp_path / "runs"
    rec = synthetic_record("20261129-214500-abcdef")
    write_synthetic_run(root, rec)
    with pytest.raises(RecordError, match=r"invocation\.group: is None"):
        write_group(root, "20261129-214400-999999", ["20261129-214500-abcdef"])


def hermetic(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)


def test_diff_groups_within_and_beyond_seed_noise(tmp_path):
    root = tmp_path / "runs"
    make_group(root, "20261129-210000-aaaaaa-a", [0.300, 0.310, 0.320, 0.305, 0.315])
    make_group(root, "20261129-220000-bbbbbb-b", [0.304, 0.318, 0.309, 0.322, 0.301])
    make_group(root, "20261129-230000-cccccc-c", [0.350, 0.362, 0.355, 0.349, 0.360], lr=0.2)
    same = diff_paths(root / "20261129-210000-aaaaaa-a", root / "20261129-220000-bbbbbb-b")
    assert same.verdict.kind == "within_noise" and same.verdict.exit_code == 0
    assert same.verdict.line == ("within seed noise: loss (Welch's t-test, 5% level); no input differs besides "
                                 "the seeds")
    far = diff_paths(root / "20261129-210000-aaaaaa-a", root / "20261129-230000-cccccc-c")
    assert far.verdict.kind == "beyond_noise" and far.verdict.exit_code == 1
    assert far.verdict.line.startswith("differs beyond seed noise: loss 0.31 ± 0.007906 (n=5) -> ")
    assert far.verdict.line.endswith("inputs differ: config (arguments '--epochs 3' -> '--lr 0.2')")
    r = hermetic("diff", "--runs-dir", str(root), "20261129-210000-aaaaaa-a", "20261129-230000-cccccc-c")
    assert r.returncode == 1 and r.stdout.splitlines()[0] == far.verdict.line
    r = hermetic("diff", "--json", "--runs-dir", str(root), "20261129-210000-aaaaaa-a", "20261129-220000-bbbbbb-b")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["kind"] == "groups" and doc["metrics"][0]["status"] == "within_noise"
    # a group and a run cannot be compared
    r = hermetic("diff", "--runs-dir", str(root), "20261129-210000-aaaaaa-a", "20261129-210000-000000")
    assert r.returncode == 64 and "cannot compare a group" in r.stderr


def test_group_digest_is_over_canonical_json(tmp_path):
    root = tmp_path / "runs"
    gid = "20261129-210000-aaaaaa-g"
    make_group(root, gid, [0.30, 0.31])
    g = load_group(root / gid)
    blank = {**g, "group": {**g["group"], "group_sha256": ""}}
    assert g["group"]["group_sha256"] == canonical_sha256(blank)


def test_two_groups_without_metrics_cannot_be_judged_and_the_verdict_says_why(tmp_path):
    # makemore's sweeps: two seeds each, TensorBoard logs but no metrics.jsonl
    root = tmp_path / "runs"
    for gid in ("20261129-210000-aaaaaa-a", "20261129-220000-bbbbbb-b"):
        ids = []
        for seed in range(2):
            rid = f"{gid[:13]}{seed:02d}-{seed:06x}"
            rec = synthetic_record(rid, seed=seed)
            rec["invocation"]["group"], rec["seed"]["policy"] = gid, "group"
            rec["metrics"] = {"final": {}, "steps": None, "file": None}
            write_synthetic_run(root, rec)
            ids.append(rid)
        write_group(root, gid, ids)
    d = diff_paths(root / "20261129-210000-aaaaaa-a", root / "20261129-220000-bbbbbb-b")
    assert d.verdict.kind == "undetermined" and d.verdict.exit_code == 1
    assert d.verdict.line.startswith("cannot judge seed noise: neither group has a metric (seed groups are compared "
                                     "by their metrics, from /outputs/metrics.jsonl")
    assert "fewer than 2 seeds" not in d.verdict.line
