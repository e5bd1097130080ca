"""What a diff is made of: changes grouped by section, output comparisons, one verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["input", "environment", "output"]
VerdictKind = Literal["identical", "wall_clock", "nothing_compared", "nondeterminism", "environment",  # two runs
                      "inputs",
                      "data_changed",  # two runs, a dataset changed while one of them read it
                      "within_noise", "beyond_noise", "undetermined"]  # two seed groups


@dataclass(frozen=True)
class Change:
    """One difference: ``key`` in ``section`` went from ``a`` to ``b``; ``material`` when it can explain different
    outputs (else context: a branch name, a GPU's UUID)."""

    section: str
    key: str
    kind: Literal["added", "removed", "changed"]
    a: Any  # a JSON value, or a part of the record as its model (hermetic.record.schema: JSON by model_dump)
    b: Any
    note: str
    material: bool = True
    headline: bool = True  # False for identities that restate other changes (image ID, tree sha256)
    effect: bool = False  # reported by the runtime (seed.applied): a consequence, not a cause


@dataclass
class SectionDiff:
    name: str
    title: str
    role: Role
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    same_as: str = ""  # short description of the shared value when nothing material differs

    def add(self, key: str, kind: Literal["added", "removed", "changed"], a: Any, b: Any, note: str,
            material: bool = True, **flags: bool) -> None:
        """One more change of this section (``flags``: headline, effect)."""
        self.changes.append(Change(self.name, key, kind, a, b, note, material, **flags))

    @property
    def material(self) -> list[Change]:
        return [c for c in self.changes if c.material]

    @property
    def differs(self) -> bool:
        return bool(self.material)

    @property
    def only_effects(self) -> bool:
        """Every material change is one the runtime reported (a consequence): ranked after the real inputs."""
        return self.differs and all(c.effect for c in self.material)

    def summary(self, limit: int = 3) -> str:
        """A phrase naming the most telling material changes, e.g. ``numpy 1.26.4 -> 2.0.0``; causes before
        what the runtime reported."""
        material = sorted(self.material, key=lambda c: c.effect)
        notes = [c.note for c in material if c.headline] or [c.note for c in material]
        if len(notes) > limit:
            return "; ".join(notes[:limit]) + f"; +{len(notes) - limit} more"
        return "; ".join(notes)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "role": self.role, "differs": self.differs,
                "summary": self.summary(99), "same_as": self.same_as, "warnings": self.warnings,
                "changes": [{k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in asdict(c).items()}
                            for c in self.changes]}


@dataclass(frozen=True)
class FileComparison:
    path: str
    status: Literal["equal", "changed", "only_a", "only_b", "not_compared"]  # not_compared: volatile in a run
    a: str | None  # sha256
    b: str | None


@dataclass(frozen=True)
class MetricComparison:
    name: str
    status: Literal["equal", "close", "different", "only_a", "only_b"]
    a: Any
    b: Any
    abs_diff: float | None = None
    rel_diff: float | None = None


@dataclass
class OutputsDiff:
    files: list[FileComparison]
    metrics: list[MetricComparison]
    status: tuple[Any, Any]  # (status, exit_code) of each run
    steps: tuple[Any, Any]
    # path -> hermetic.diff.contents.ContentDiff for changed JSON/YAML/pickle files (when the run directories
    # were at hand: diff_runs); a file without one was compared as bytes only
    contents: dict[str, Any] = field(default_factory=dict)

    @property
    def compared_files(self) -> list[FileComparison]:
        """Every file but the volatile ones (run.outputs.volatile: kept, never compared)."""
        return [f for f in self.files if f.status != "not_compared"]

    @property
    def not_compared(self) -> list[FileComparison]:
        return [f for f in self.files if f.status == "not_compared"]

    @property
    def identical(self) -> bool:
        return (all(f.status == "equal" for f in self.compared_files) and all(m.status == "equal" for m in self.metrics)
                and self.status[0] == self.status[1] and self.steps[0] == self.steps[1])

    @property
    def compared(self) -> int:
        """How many output files and metrics the two runs had to compare (0: nothing was compared)."""
        return len(self.compared_files) + len(self.metrics)

    def wall_clock_only(self, f: FileComparison) -> bool:
        """A file both runs wrote whose bytes differ, read as JSON/YAML/a pickle: only wall-clock fields differ."""
        c = self.contents.get(f.path)
        return f.status == "changed" and c is not None and c.wall_clock_only

    @property
    def wall_clock_files(self) -> list[FileComparison]:
        return [f for f in self.compared_files if self.wall_clock_only(f)]

    @property
    def wall_clock_metrics(self) -> list[MetricComparison]:
        """Metrics that differ and measure time by their name (train_runtime, samples_per_second)."""
        from hermetic.diff.wallclock import is_wall_clock_name

        return [m for m in self.metrics if m.status in ("close", "different") and is_wall_clock_name(m.name)]

    def _same_but_names_and_clocks(self) -> bool:
        clock = {m.name for m in self.wall_clock_metrics}
        return (all(f.status != "changed" or self.wall_clock_only(f) for f in self.compared_files)
                and all(m.status == "equal" or m.name in clock for m in self.metrics)
                and self.status[0] == self.status[1] and self.steps[0] == self.steps[1])

    @property
    def only_wall_clock_differs(self) -> bool:
        """Every file both runs wrote and every metric is equal but for wall-clock fields (a run's duration,
        its throughput, a time in a path), at least one of which differs; no file is in one run only."""
        return (not self.identical and self._same_but_names_and_clocks()
                and all(f.status in ("equal", "changed") for f in self.compared_files))

    @property
    def only_unpaired_files_differ(self) -> bool:
        """Whether every difference is a file that one run wrote and the other did not (names that carry a
        time, a host or a PID), every file both wrote being identical (or differing in wall-clock fields
        only) and every metric equal."""
        return any(f.status in ("only_a", "only_b") for f in self.compared_files) and self._same_but_names_and_clocks()

    def not_compared_note(self) -> str:
        """``; 1 file kept but not compared (run.outputs.volatile)``, per run when the runs kept other files
        (``; files kept but not compared: 3 in each run``), or nothing."""
        files = self.not_compared
        if not files:
            return ""
        in_a = sum(1 for f in files if f.a is not None)
        in_b = sum(1 for f in files if f.b is not None)
        if in_a == in_b == len(files):  # the same paths in both runs
            return f"; {len(files)} file{'s' if len(files) != 1 else ''} kept but not compared (run.outputs.volatile)"
        if in_a == in_b:
            return (f"; {in_a} file{'s' if in_a != 1 else ''} in each run kept but not compared "
                    "(run.outputs.volatile)")
        return f"; files kept but not compared: {in_a} in A, {in_b} in B (run.outputs.volatile)"

    def compared_names(self, limit: int = 4) -> str:
        """e.g. ``2 files and 1 metric compared: model.pt, out/ckpt.pt, loss``."""
        files = self.compared_files
        names = [f.path for f in files] + [m.name for m in self.metrics]
        shown = ", ".join(names[:limit]) + (f", +{len(names) - limit} more" if len(names) > limit else "")
        nf, nm = len(files), len(self.metrics)
        return (f"{nf} file{'s' if nf != 1 else ''} and {nm} metric{'s' if nm != 1 else ''} compared: {shown}"
                + self.not_compared_note())

    def unpaired_text(self) -> str:
        """``8 files in one run only (4 in A, 4 in B), none in both to compare``, or ``2 files in one run
        only (1 in A, 1 in B)``."""
        files = self.compared_files
        in_a = sum(1 for f in files if f.status == "only_a")
        in_b = sum(1 for f in files if f.status == "only_b")
        n = in_a + in_b
        text = f"{n} file{'s' if n != 1 else ''} in one run only ({in_a} in A, {in_b} in B)"
        if not any(f.status in ("equal", "changed") for f in files):
            text += ", none in both runs to compare byte for byte"
        return text

    def summary(self) -> str:
        files = self.compared_files
        paired = [f for f in files if f.status in ("equal", "changed")]
        clock = [f.path for f in files if self.wall_clock_only(f)]
        changed = [f.path for f in files if f.status == "changed" and f.path not in clock]
        parts = []
        if self.status[0] != self.status[1]:
            parts.append(f"status {_status(self.status[0])} -> {_status(self.status[1])}")
        if changed:
            parts.append(f"{len(changed)} of {len(paired)} files both runs wrote differ ({', '.join(changed[:3])}"
                         + (", ..." if len(changed) > 3 else "") + ")")
        if clock:
            parts.append(f"{len(clock)} of {len(paired)} differ only in wall-clock fields ({', '.join(clock[:3])}"
                         + (", ..." if len(clock) > 3 else "") + ")")
        if any(f.status in ("only_a", "only_b") for f in files):
            parts.append(self.unpaired_text())
        clock_metrics = {m.name for m in self.wall_clock_metrics}
        diff = [m.name for m in self.metrics if m.status in ("different", "only_a", "only_b")
                and m.name not in clock_metrics]
        close = [m.name for m in self.metrics if m.status == "close" and m.name not in clock_metrics]
        if diff:
            parts.append("metrics differ: " + ", ".join(diff[:4]) + (", ..." if len(diff) > 4 else ""))
        if close:
            parts.append("within tolerance: " + ", ".join(close[:4]) + (", ..." if len(close) > 4 else ""))
        if clock_metrics:
            parts.append("wall-clock metrics differ: " + ", ".join(sorted(clock_metrics)[:4]))
        if self.steps[0] != self.steps[1]:
            parts.append(f"steps {self.steps[0]} -> {self.steps[1]}")
        if not parts and not self.compared:
            return "nothing to compare: no output files, no metrics" + self.not_compared_note()
        return ("; ".join(parts) if parts else f"all {len(files)} files and {len(self.metrics)} metrics identical") \
            + self.not_compared_note()


def _status(s: tuple[str, Any]) -> str:
    return f"{s[0]}" + (f" (exit {s[1]})" if s[1] not in (None, 0) else "")


@dataclass(frozen=True)
class Verdict:
    """The first line of the diff and the exit code it implies (``kind``: VerdictKind; docs/run-record.md,
    "Verdicts")."""

    kind: VerdictKind
    line: str
    causes: list[str]          # sections that differ materially, most likely cause first
    knobs_not_set: list[str]
    notes: list[str]
    exit_code: int
    # run.outputs.volatile as it would keep the files that differ only in wall-clock fields without comparing
    # them (the run's own globs first); empty when there is nothing to silence
    suggested_volatile: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LogsDiff:
    """The two runs' stdout and stderr, line by line: context for the verdict, never its cause."""

    stdout: int | None  # lines that differ (0: the same), None when a log is missing
    stderr: int | None

    def summary(self) -> str:
        def one(n: int | None, what: str) -> str:
            return f"{what} not recorded" if n is None else (f"{what} same" if n == 0 else f"{what} {n} lines differ")

        return f"{one(self.stdout, 'stdout')}, {one(self.stderr, 'stderr')}"


@dataclass
class RunDiff:
    a: str
    b: str
    sections: list[SectionDiff]
    outputs: OutputsDiff
    verdict: Verdict
    tolerance: dict[str, float]
    logs: LogsDiff | None = None

    def section(self, name: str) -> SectionDiff:
        return next(s for s in self.sections if s.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "runs",
            "a": self.a,
            "b": self.b,
            "verdict": asdict(self.verdict),
            "sections": [s.to_json() for s in self.sections],
            "outputs": {
                "identical": self.outputs.identical,
                "status": {"a": list(self.outputs.status[0]), "b": list(self.outputs.status[1])},
                "steps": {"a": self.outputs.steps[0], "b": self.outputs.steps[1]},
                "files": [asdict(f) for f in self.outputs.files],
                "metrics": [asdict(m) for m in self.outputs.metrics],
                "only_wall_clock_differs": self.outputs.only_wall_clock_differs,
                "contents": {p: c.to_json() for p, c in sorted(self.outputs.contents.items())},
            },
            "tolerance": self.tolerance,
            "logs": asdict(self.logs) if self.logs is not None else None,
        }
