"""``--resume-from RUN``: the earlier run's outputs, checked against its sealed record, put where its script wrote them.

A resumed run trains on what the earlier run left (a checkpoint, or data a
first step made), so those bytes are an input: they must be what the earlier
run's record says it produced. Every file is hashed against ``outputs.files``
of that run's sealed run.json before anything starts (a changed, missing or added
file refuses the run, naming it), and again while it is copied (a file that
changes in between refuses it too). What the earlier script wrote to /outputs
goes to /outputs; what was collected from its working directory
(``outputs.workdir.collected``, e.g. ``out/model.pt``) goes back to that path
in the working directory, where the script will look for it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hermetic.errors import DataError, NotFound
from hermetic.fsutil import READ_SIZE
from hermetic.record import load_record
from hermetic.record.outputs import hash_outputs


class ResumeRefused(DataError):
    """The earlier run's outputs are not what its record says: nothing was started from them."""


@dataclass(frozen=True)
class ResumeSource:
    run_dir: Path
    files: dict[str, dict]  # outputs.files of its record
    from_workdir: frozenset[str]  # outputs.workdir.collected

    @property
    def run_id(self) -> str:
        return self.run_dir.name


def check_resume_source(run_dir: Path) -> ResumeSource:
    """The earlier run, its record's seal verified (load_record) and its outputs hashed as that record
    hashed them (hash_outputs) and compared: ResumeRefused naming the first few that differ; NotFound
    when it has no outputs/."""
    outputs = run_dir / "outputs"
    if not outputs.is_dir():
        raise NotFound(f"--resume-from {run_dir.name}: no outputs/ in {run_dir}")
    recorded = load_record(run_dir)["outputs"]
    files = recorded["files"]
    actual = hash_outputs(outputs)["files"]
    problems = []
    for rel in sorted(files.keys() | actual.keys()):
        want, have = files.get(rel), actual.get(rel)
        if want is None:
            problems.append(f"outputs/{rel} is not in its record (added since)")
        elif have is None:
            problems.append(f"outputs/{rel} is missing")
        elif have != want:
            what = "a symbolic link" if want.get("symlink") is not None else f"sha256 {want['sha256'][:12]}"
            problems.append(f"outputs/{rel} changed since its record was sealed ({what})")
    if problems:
        more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
        raise ResumeRefused(f"--resume-from {run_dir.name}: {'; '.join(problems[:2])}{more} — no container was "
                            "started", details=problems[:20],
                            hint="resume from a run whose outputs are as recorded, or run the earlier step again")
    return ResumeSource(run_dir, files, frozenset((recorded.get("workdir") or {}).get("collected") or []))


def seed_outputs(source: ResumeSource, outputs: Path, workspace: Path) -> None:
    """Copy the checked outputs: /outputs' into ``outputs``, working-directory ones into ``workspace``;
    each file hashed again as it is copied (ResumeRefused if it changed since the check)."""
    src = source.run_dir / "outputs"
    for rel, want in sorted(source.files.items()):
        dest = (workspace if rel in source.from_workdir else outputs) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if want.get("symlink") is not None:
            os.symlink(want["symlink"], dest)
            continue
        h = hashlib.sha256()
        with open(src / rel, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(READ_SIZE):
                h.update(chunk)
                fout.write(chunk)
        if h.hexdigest() != want["sha256"]:
            raise ResumeRefused(f"--resume-from {source.run_id}: outputs/{rel} changed while it was copied")
        shutil.copymode(src / rel, dest)
