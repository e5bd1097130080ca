"""``--resume-from RUN``: the earlier run's outputs, checked against its sealed record, put where its script wrote them.

Every file is hashed against that run's ``outputs.files`` before anything starts and again while it is copied;
/outputs files go to /outputs, collected working-directory files back to their path there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic.hostfs import safetree
from hermetic.core.errors import DataError, NotFound
from hermetic.hostfs.privdrop import call_as
from hermetic.record import load_record
from hermetic.record.outputs import hash_outputs_at


class ResumeRefused(DataError):
    """The earlier run's outputs are not what its record says: nothing was started from them."""


@dataclass(frozen=True)
class ResumeSource:
    run_dir: Path
    files: dict[str, dict]  # outputs.files of its record
    from_workdir: frozenset[str]  # outputs.workdir.collected
    status: str = "succeeded"  # record.status of the earlier run
    exit_code: int | None = 0

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def warnings(self) -> list[str]:
        """What resuming from it means when that run did not succeed or left nothing (the run goes on)."""
        ended = f"{self.status}" + (f" (exit {self.exit_code})" if self.exit_code not in (None, 0) else "")
        head = f"--resume-from {self.run_id}: that run {ended}"
        if not self.files:
            if self.status == "succeeded":
                head = f"--resume-from {self.run_id}: that run succeeded"
            return [f"{head} and left no outputs: there is nothing to resume from, so this run starts as a fresh "
                    "one would (resume from a run that wrote a checkpoint, or run the earlier step again)"]
        if self.status != "succeeded":
            n = len(self.files)
            return [f"{head}: its {n} output{'s' if n != 1 else ''} are what it had written when it stopped, "
                    "perhaps a partial checkpoint; this run starts from them"]
        return []


def check_resume_source(run_dir: Path, *, uid: int, gid: int) -> ResumeSource:
    """The earlier run, its record's seal verified (load_record) and its outputs hashed as that record
    hashed them (hash_outputs, as ``uid``: a script wrote them) and compared: ResumeRefused naming the
    first few that differ; NotFound when it has no outputs/."""
    outputs = run_dir / "outputs"
    if not outputs.is_dir() or outputs.is_symlink():
        raise NotFound(f"--resume-from {run_dir.name}: no outputs/ in {run_dir}")
    record = load_record(run_dir)
    recorded = record["outputs"]
    files = recorded["files"]
    actual = call_as(uid, gid, _hash, str(outputs), open_dirs=[str(outputs)], read_any=True)["files"]
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
    return ResumeSource(run_dir, files, frozenset((recorded.get("workdir") or {}).get("collected") or []),
                        record["record"]["status"], record["record"]["exit_code"])


def _hash(fds: dict[str, int], outputs: str) -> dict[str, Any]:
    return hash_outputs_at(fds[outputs])


def seed_outputs(source: ResumeSource, outputs: Path, workspace: Path, *, uid: int, gid: int) -> None:
    """Copy the checked outputs (/outputs' into ``outputs``, working-directory ones into ``workspace``), each
    rehashed as it is copied (ResumeRefused if changed), as ``uid`` through safetree: a recorded link is
    recreated as a link, never written through, and nothing is overwritten.
    """
    src = str(source.run_dir / "outputs")
    call_as(uid, gid, _seed, src, source.run_id, source.files, sorted(source.from_workdir), str(outputs),
            str(workspace), open_dirs=[src, str(outputs), str(workspace)], read_any=True)


def _clear_regular(rootfd: int, rel: str) -> None:
    """Remove ``rel`` when it is a regular file (never a link, never through one)."""
    try:
        st = safetree.lstat_beneath(rootfd, rel)
    except safetree.UnsafePath:
        return  # the copy below refuses it, naming it
    if st is not None and safetree.kind_of(st.st_mode) == "file":
        head, tail = safetree.split(rel)
        d = safetree.open_dir(rootfd, head)
        try:
            os.unlink(tail, dir_fd=d)
        finally:
            os.close(d)


def _seed(fds: dict[str, int], src: str, run_id: str, files: dict[str, dict], from_workdir: list[str],
          outputs: str, workspace: str) -> None:
    workdir_set = set(from_workdir)
    roots = {"src": fds[src], "outputs": fds[outputs], "workspace": fds[workspace]}
    for rel, want in sorted(files.items()):
        fs_rel = safetree.fs_name(rel)
        dest = roots["workspace" if rel in workdir_set else "outputs"]
        try:
            _clear_regular(dest, fs_rel)  # the snapshot's own copy of a file the earlier run rewrote
            if want.get("symlink") is not None:
                safetree.symlink(safetree.fs_name(want["symlink"]), dest, fs_rel)
            elif want.get("type") == "fifo":
                safetree.mkfifo(dest, fs_rel)
            elif want.get("type"):
                continue  # a socket or device node: recorded by kind, nothing to copy
            else:
                safetree.copy(roots["src"], fs_rel, dest, fs_rel, expect_sha256=want["sha256"])
        except safetree.UnsafePath as e:
            raise ResumeRefused(f"--resume-from {run_id}: outputs/{rel}: {e.message}; nothing of it is "
                                "written through a link") from None
        except FileExistsError:
            raise ResumeRefused(f"--resume-from {run_id}: outputs/{rel}: its place is already taken "
                                "(the code snapshot, or another output)") from None
