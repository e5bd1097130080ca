"""``--resume-from RUN``: the earlier run's outputs, checked against its sealed record, put where its script wrote them.

A resumed run trains on what the earlier run left (a checkpoint, or data a
first step made), so those bytes are an input: they must be what the earlier
run's record says it produced. Every file is hashed against ``outputs.files``
of that run's run.json before anything starts (a changed, missing or added
file refuses the run, naming it), and again while it is copied (a file that
changes in between refuses it too). What the earlier script wrote to /outputs
goes to /outputs; what was collected from its working directory
(``outputs.workdir.collected``, e.g. ``out/model.pt``) goes back to that path
in the working directory, where the script will look for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hermetic.errors import DataError, NotFound

_CHUNK = 1 << 20


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_resume_source(run_dir: Path) -> ResumeSource:
    """The earlier run, every output file checked against its record (ResumeRefused naming the first few
    that differ; NotFound when it has no outputs or no record)."""
    outputs = run_dir / "outputs"
    if not outputs.is_dir():
        raise NotFound(f"--resume-from {run_dir.name}: no outputs/ in {run_dir}")
    try:
        record = json.loads((run_dir / "run.json").read_text())["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        raise NotFound(f"--resume-from {run_dir.name}: no readable record ({run_dir / 'run.json'}), so nothing "
                       "says what its outputs were") from None
    files = dict(record.get("files") or {})
    from_workdir = frozenset((record.get("workdir") or {}).get("collected") or [])
    problems = []
    on_disk = set()
    for dirpath, dirnames, filenames in os.walk(outputs):
        dirnames.sort()
        for name in sorted(filenames) + sorted(d for d in dirnames if (Path(dirpath) / d).is_symlink()):
            path = Path(dirpath) / name
            rel = path.relative_to(outputs).as_posix()
            on_disk.add(rel)
            want = files.get(rel)
            if want is None:
                problems.append(f"outputs/{rel} is not in its record (added since)")
            elif path.is_symlink() or want.get("symlink") is not None:
                if not (path.is_symlink() and os.readlink(path) == want.get("symlink")):
                    problems.append(f"outputs/{rel} changed since its record was sealed (a symbolic link)")
            elif _sha256(path) != want["sha256"]:
                problems.append(f"outputs/{rel} changed since its record was sealed (sha256 {want['sha256'][:12]})")
    problems += [f"outputs/{rel} is missing" for rel in sorted(set(files) - on_disk)]
    if problems:
        more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
        raise ResumeRefused(f"--resume-from {run_dir.name}: {'; '.join(problems[:2])}{more} — no container was "
                            "started", details=problems[:20],
                            hint="resume from a run whose outputs are as recorded, or run the earlier step again")
    return ResumeSource(run_dir, files, from_workdir)


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
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                fout.write(chunk)
        if h.hexdigest() != want["sha256"]:
            raise ResumeRefused(f"--resume-from {source.run_id}: outputs/{rel} changed while it was copied")
        shutil.copymode(src / rel, dest)
