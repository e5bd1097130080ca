"""Findings: what a compatibility check says, and the rule that turns failures into one error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from hermetic.core.errors import HermeticError

Severity = Literal["warn", "fail"]


@dataclass(frozen=True)
class Finding:
    check: str  # "torch-cuda" | "cuda-family" | "glibc" | "python-abi" | "driver" | "arch" | "hardware"
    severity: Severity
    message: str  # one line, names the culprit and both sides

    def __str__(self) -> str:
        return self.message


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "fail"]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "warn"]


def raise_for_failures(findings: Iterable[Finding], error: type[HermeticError] = HermeticError) -> None:
    """Raise the first failure as a one-line HermeticError (the count of others in the hint)."""
    fails = failures(findings)
    if not fails:
        return
    more = len(fails) - 1
    hint = f"{more} more check(s) failed: " + "; ".join(f.message for f in fails[1:]) if more else None
    raise error(fails[0].message, hint=hint)
