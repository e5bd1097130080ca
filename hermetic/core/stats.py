"""Seed-noise statistics without SciPy: mean, sample SD, Student-t 95% intervals, Welch's test.

The t quantile comes from a table for 1..30 degrees of freedom, then a Cornish-Fisher expansion; Welch's non-integer
degrees of freedom are rounded down, so the test errs towards "within seed noise"."""

from __future__ import annotations

import math
from typing import Any, Sequence

Z975 = 1.959963984540054  # the standard normal 0.975 quantile
# T975[df] for df = 1..30
T975 = (
    math.nan,
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836,
    2.446911851, 2.364624252, 2.306004135, 2.262157163, 2.228138852,
    2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546,
    2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447,
    2.079613845, 2.073873068, 2.068657610, 2.063898562, 2.059538553,
    2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
)


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    if df <= 30:
        return T975[math.floor(df)]  # rounded down: conservative
    z = Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, sample SD (n-1) and the 95% interval of the mean (None where n is too small)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci95": None, "t": None}
    mean = math.fsum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "ci95": None, "t": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    t = t975(n - 1)
    half = t * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half], "t": t}


def welch(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Welch's two-sided t-test at the 5% level on two ``summarize`` results.

    ``within_noise`` is True when the difference of means is not significant (|t| below the 0.975 quantile at the
    Welch-Satterthwaite df), False when it is, None when either side has fewer than two values (no noise estimate).
    With zero spread on both sides, equal means are within noise and any difference is not."""
    out: dict[str, Any] = {"diff": None, "se": None, "df": None, "t": None, "t_crit": None, "within_noise": None}
    if a["mean"] is None or b["mean"] is None:
        out["reason"] = "metric missing on one side"
        return out
    out["diff"] = b["mean"] - a["mean"]
    if a["n"] < 2 or b["n"] < 2:
        out["reason"] = "fewer than 2 seeds on one side: no estimate of seed noise"
        return out
    va, vb = a["sd"] ** 2 / a["n"], b["sd"] ** 2 / b["n"]
    se = math.sqrt(va + vb)
    out["se"] = se
    if se == 0:
        out["within_noise"] = out["diff"] == 0
        out["reason"] = "no spread across seeds on either side"
        return out
    df = (va + vb) ** 2 / (va**2 / (a["n"] - 1) + vb**2 / (b["n"] - 1))
    t = out["diff"] / se
    crit = t975(max(df, 1.0))
    out.update(df=df, t=t, t_crit=crit, within_noise=abs(t) < crit,
               reason="Welch's t-test, two-sided, 5% level")
    return out
