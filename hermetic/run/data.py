"""The data step: every dataset verified against its manifest before any run directory or container,
and checked again, by stat alone, after the container exits (``changed_during_run``).

The run keeps the verified manifest bytes, never a second read of the file.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hermetic.data.access import unreadable
from hermetic.data.identity import IdentityChange, check_identity
from hermetic.data.verify import VerifyReport, problem_lines, verify_dataset
from hermetic.core.errors import DataError
from hermetic.run.plan import ContainerUser, DatasetPlan

# How many unreadable paths the refusal names on its line (all of them go to its details, up to this many more).
_NAMED, _DETAILED = 3, 20


class DataRefused(DataError):
    """A dataset does not match its manifest (or is missing): no container is started."""


class DataChanged(DataError):
    """A dataset changed after it was verified, while the run used it: the run failed (exit 65 unless the
    script's own code says it failed first); the record names the files."""


@dataclass(frozen=True)
class VerifiedDataset:
    """A dataset that passed verification against its manifest: its plan and report."""

    plan: DatasetPlan
    report: VerifyReport

    @property
    def manifest_bytes(self) -> bytes:
        return self.report.manifest_bytes

    @property
    def manifest_file(self) -> str:
        """Where the run directory keeps the manifest copy (relative to it)."""
        return f"data/{self.plan.name}.sha256"


def verify_datasets(plans: list[DatasetPlan], *, progress: bool, log: Callable[[str], None] | None = None,
                    say_how_to_accept: bool = True, reader: ContainerUser | None = None) -> list[VerifiedDataset]:
    """All of them verified, or DataRefused naming each failing one (also when ``reader``, the container's user,
    cannot read a file). ``say_how_to_accept``: the hint says how to write the manifest again (not for a replay).
    """
    verified, failed = [], []
    for d in plans:
        if not d.host_path.is_dir():
            raise DataRefused(f"dataset {d.name}: {d.host_path} is not a directory", hint=(
                "a dataset is a directory with a checksum manifest; a single file can move into a directory of its "
                "own, or be committed with the code (docs/your-script.md)") if d.host_path.is_file() else None)
        rep = verify_dataset(d.host_path, d.manifest_path, progress=progress)
        if rep.ok and reader is not None:
            refuse_unreadable(d, rep, reader)
        if rep.ok:
            verified.append(VerifiedDataset(d, rep))
            if log:
                log(f"data {d.name}: {rep.file_count} files, {rep.total_bytes} bytes verified ({rep.mode})")
        else:
            failed.append((d.name, rep))
    if failed:
        details = [line for name, rep in failed for line in problem_lines(rep, f"{name}: ")]
        # hermetic cannot know whether a change was meant: say how to accept one, never do it
        first = next(d for d in plans if d.name == failed[0][0])
        hint = (f"if the change is intended, write the manifest again and commit it: hermetic data manifest "
                f"{_shown(first.host_path)} -o {_shown(first.manifest_path)}") if say_how_to_accept else None
        raise DataRefused("; ".join(f"dataset {n}: {r.summary()}" for n, r in failed) + " — no container was started",
                          details=details, hint=hint)
    return verified


def _shown(path: Path) -> str:
    """A path as the user would type it here: relative to the working directory when below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def refuse_unreadable(plan: DatasetPlan, report: VerifyReport, reader: ContainerUser) -> None:
    """DataRefused when the container's user cannot read a file or directory of the dataset: the script
    would fail on it with PermissionError, after the container started (hermetic.data.access)."""
    restricted = report.restricted
    if restricted is None:  # a verification that took no stats: take them (run verifies with the stat cache)
        from hermetic.data.scan import scan_tree

        restricted = tuple(scan_tree(plan.host_path, stat=True).restricted)
    bad = unreadable(restricted, reader.uid, reader.gid)
    if not bad:
        return
    named = ", ".join(bad[:_NAMED]) + (f" (+{len(bad) - _NAMED} more)" if len(bad) > _NAMED else "")
    details = [f"{plan.name}: unreadable {p}" for p in bad[:_DETAILED]]
    if len(bad) > _DETAILED:
        details.append(f"{plan.name}: ... and {len(bad) - _DETAILED} more")
    raise DataRefused(f"dataset {plan.name}: the script runs as {reader.spec}, which cannot read {len(bad)} of its "
                      f"files or directories in {plan.host_path}: {named} — no container was started", details=details,
                      hint=f"let everyone read it: chmod -R a+rX {shlex.quote(str(plan.host_path))}")


def changed_during_run(datasets: list[VerifiedDataset]) -> dict[str, IdentityChange]:
    """Each dataset that is not, file by file, what its verification saw (by name): stat only, no hash
    (but for the few files hermetic.data.identity cannot trust by stat). Never raises."""
    out = {}
    for d in datasets:
        ident = d.report.identity
        if ident is None:
            continue
        change = check_identity(ident, d.manifest_bytes)
        if not change.ok:
            out[d.plan.name] = change
    return out


def record_data_changes(data_section: dict, changes: dict[str, IdentityChange]) -> str | None:
    """Put each change into the record's ``data.<name>.changed_during_run``; the run's failure reason (one
    line naming the datasets and files), or None when nothing changed."""
    if not changes:
        return None
    parts = []
    for name, change in sorted(changes.items()):
        data_section[name]["changed_during_run"] = change.to_json()
        parts.append(f"dataset {name}: {change.summary()}")
    return ("data changed during the run (after it was verified; the script may have read other bytes than "
            "the manifest says): " + "; ".join(parts))
