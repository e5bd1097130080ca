"""Comparing two multi-seed groups: is the difference of means bigger than seed noise?

Welch's two-sided t-test at 5% on the members' final values (hermetic.core.stats.welch): interval overlap is a
~99% test, and Welch does not assume equal variances. Inputs are compared through the first members, seed left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hermetic.diff.model import SectionDiff, Verdict
from hermetic.core.errors import EXIT_DIFFERENT
from hermetic.core.stats import welch


@dataclass(frozen=True)
class MetricSeedComparison:
    name: str
    status: str  # within_noise | beyond_noise | undetermined | only_a | only_b
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    test: dict[str, Any] | None


@dataclass
class GroupDiff:
    a: str
    b: str
    metrics: list[MetricSeedComparison]
    inputs: list[SectionDiff]
    verdict: Verdict
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "groups",
            "a": self.a,
            "b": self.b,
            "verdict": asdict(self.verdict),
            "method": "Welch's t-test, two-sided, 5% level, on each metric's per-seed final values",
            "metrics": [asdict(m) for m in self.metrics],
            "inputs": [s.to_json() for s in self.inputs],
            "notes": self.notes,
        }


def _stats(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m[k] for k in ("n", "mean", "sd", "ci95")}


def compare_group_metrics(ga: dict[str, Any], gb: dict[str, Any]) -> list[MetricSeedComparison]:
    out = []
    ma, mb = ga["metrics"], gb["metrics"]
    for name in sorted(ma.keys() | mb.keys()):
        if name not in mb or name not in ma:
            side = "only_a" if name in ma else "only_b"
            out.append(MetricSeedComparison(name, side, ma.get(name) and _stats(ma[name]),
                                            mb.get(name) and _stats(mb[name]), None))
            continue
        test = welch(ma[name], mb[name])
        status = {True: "within_noise", False: "beyond_noise", None: "undetermined"}[test["within_noise"]]
        out.append(MetricSeedComparison(name, status, _stats(ma[name]), _stats(mb[name]), test))
    return out


def fmt_stats(s: dict[str, Any] | None) -> str:
    if not s or s["mean"] is None:
        return "-"
    sd = f" ± {s['sd']:.4g}" if s["sd"] is not None else ""
    return f"{s['mean']:.4g}{sd} (n={s['n']})"


def decide_groups(metrics: list[MetricSeedComparison], inputs: list[SectionDiff]) -> Verdict:
    beyond = [m for m in metrics if m.status == "beyond_noise"]
    unknown = [m for m in metrics if m.status == "undetermined"]
    one_sided = [m for m in metrics if m.status in ("only_a", "only_b")]
    changed = [s for s in inputs if s.differs]
    cause = ("; inputs differ: " + "; then ".join(f"{s.name} ({s.summary(2)})" for s in changed)) if changed else \
        "; no input differs besides the seeds"
    causes = [s.name for s in changed]
    if beyond:
        detail = ", ".join(f"{m.name} {fmt_stats(m.a)} -> {fmt_stats(m.b)}" for m in beyond[:3])
        return Verdict("beyond_noise", f"differs beyond seed noise: {detail}{cause}", causes, [], [], EXIT_DIFFERENT)
    if one_sided:
        # A metric one group has and the other lacks says nothing about seed noise.
        what = ", ".join(f"{m.name} only in {'A' if m.status == 'only_a' else 'B'}" for m in one_sided[:4])
        return Verdict("undetermined", f"cannot judge: {what}{cause}", causes, [], [], EXIT_DIFFERENT)
    if not metrics:
        # Seed noise is judged on metrics; output files differ from seed to seed by design.
        return Verdict("undetermined", "cannot judge seed noise: neither group has a metric (seed groups are "
                       "compared by their metrics, from /outputs/metrics.jsonl; output files are not compared "
                       f"across seeds){cause}", causes, [], [], EXIT_DIFFERENT)
    if unknown:
        what = ", ".join(m.name for m in unknown)
        return Verdict("undetermined", f"cannot judge seed noise (fewer than 2 seeds with values): {what}{cause}",
                       causes, [], [], EXIT_DIFFERENT)
    names = ", ".join(m.name for m in metrics[:6]) + (", ..." if len(metrics) > 6 else "")
    return Verdict("within_noise", f"within seed noise: {names} (Welch's t-test, 5% level){cause}", causes, [], [], 0)
