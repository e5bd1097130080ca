"""A run directory checked against its sealed record: records are checked, not trusted.

``check_outputs`` rehashes outputs/ against ``outputs.files`` (``require_as_recorded``: diff, replay);
``verify_run`` (``hermetic runs verify``) checks everything the record holds a digest of. Rehashing is
stat-cached in ``runs/<id>/.outputs.statcache`` (hermetic.data.statcache's format).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.hostfs import safetree
from hermetic.hostfs.fsutil import stat_key
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.record.outputs import hash_outputs_at

CACHE_NAME = ".outputs.statcache"
_RUN_FILE = "/"  # cache keys of run-directory files start so (an output's record name never does)
_SHOWN = 3  # files a one-line refusal names


class OutputsStatCache:
    """hash_outputs_at's DigestCache over hermetic.data.statcache.StatCache, for one run directory.

    ``hashed`` lists the files it could not vouch for this time (read again), ``cached`` how many it did."""

    def __init__(self, run_dir: str | os.PathLike[str]):
        from hermetic.data.statcache import StatCache

        self._cache = StatCache(Path(run_dir) / CACHE_NAME)
        self._recorded_ns = time.time_ns()  # before any stat of this look: the racy-clean reference
        self._seen: list[str] = []
        self.hashed: list[str] = []
        self.cached = 0

    def get(self, rel: str, key: tuple[int, int, int, int, int]) -> str | None:
        self._seen.append(rel)
        digest = self._cache.get(rel, key)
        if digest is None:
            self.hashed.append(rel)
        else:
            self.cached += 1
        return digest

    def put(self, rel: str, key: tuple[int, int, int, int, int], sha256: str) -> None:
        self._cache.put(rel, key, sha256, self._recorded_ns)

    def save(self, *, complete: bool = False) -> None:
        """Write what was learnt; never fails. ``complete``: this look saw every file the cache is for (a
        whole-run verify), so entries of files gone since are dropped."""
        if complete:
            self._cache.retain(self._seen)
        self._cache.save()


@dataclass
class OutputsCheck:
    """``outputs/`` against ``outputs.files`` (record names). ``hashed``: how many files were read this time;
    ``cached``: how many the stat cache vouched for."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    files: int = 0
    hashed: int = 0
    cached: int = 0
    error: str | None = None  # outputs/ could not be walked (a link, not a directory)

    @property
    def as_recorded(self) -> bool:
        """No recorded output changed or went missing (what diff and replay need)."""
        return not (self.changed or self.missing or self.error)

    @property
    def ok(self) -> bool:
        return self.as_recorded and not self.added

    def problems(self) -> list[str]:
        out = [f"outputs/: {self.error}"] if self.error else []
        out += [f"outputs/{p} changed since the record was sealed" for p in self.changed]
        out += [f"outputs/{p} is missing" for p in self.missing]
        out += [f"outputs/{p} is not in the record (added since)" for p in self.added]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "hashed": self.hashed, "cached": self.cached, "changed": self.changed,
                "missing": self.missing, "added": self.added, "error": self.error}


def _same_entry(recorded: dict[str, Any], actual: dict[str, Any]) -> bool:
    return all(recorded.get(k) == actual.get(k) for k in ("sha256", "size", "symlink", "type"))


def check_outputs(run_dir: str | os.PathLike[str], record: dict[str, Any], *, cache: bool = True,
                  digests: OutputsStatCache | None = None) -> OutputsCheck:
    """Rehash ``run_dir/outputs`` against ``record``'s outputs: stat-cached unless ``cache`` is False;
    ``digests``: a cache the caller saves (verify_run), else this look's own, saved here."""
    run_dir = Path(run_dir)
    recorded: dict[str, dict[str, Any]] = record["outputs"]["files"]
    try:
        rootfd = safetree.open_root(run_dir / "outputs")
    except FileNotFoundError:
        return OutputsCheck(missing=sorted(recorded), files=len(recorded))
    except OSError as e:  # a link (ELOOP), or not a directory
        return OutputsCheck(files=len(recorded), error=f"cannot be walked: {e.strerror} (a link, or not a "
                                                       "directory)")
    own = digests is None and cache
    if own:
        digests = OutputsStatCache(run_dir)
    try:
        actual = hash_outputs_at(rootfd, [], digests if cache else None)["files"]
    except (OSError, safetree.UnsafePath) as e:  # something changed under the walk
        why = getattr(e, "message", None) or str(e)
        return OutputsCheck(files=len(recorded), error=f"cannot be rehashed: {safetree.display(why)}")
    finally:
        os.close(rootfd)
    if own:
        digests.save()
    regular = sum(1 for f in actual.values() if not f.get("type") and f.get("symlink") is None)
    hashed = len(digests.hashed) if cache and digests is not None else regular
    changed = sorted(p for p in recorded.keys() & actual.keys() if not _same_entry(recorded[p], actual[p]))
    return OutputsCheck(changed, sorted(recorded.keys() - actual.keys()), sorted(actual.keys() - recorded.keys()),
                        files=len(recorded), hashed=hashed, cached=regular - hashed)


def require_as_recorded(run_dir: str | os.PathLike[str], record: dict[str, Any], *, what: str) -> OutputsCheck:
    """check_outputs and the dataset manifest copies, or IntegrityError (exit 65) naming the first changed or
    missing files; ``what`` says who refuses (``hermetic diff``). An output added since is not compared by
    anyone, so not refused here (``hermetic runs verify`` reports it)."""
    run_dir = Path(run_dir)
    digests = OutputsStatCache(run_dir)
    check = check_outputs(run_dir, record, digests=digests)
    problems = [p for p in check.problems() if not p.endswith("(added since)")]
    problems += _files_problems(run_dir, record, digests, code=False)
    digests.save()
    if problems:
        more = f" (+{len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise IntegrityError(f"{run_dir}: {'; '.join(problems[:_SHOWN])}{more}; {what} compares a run only as "
                             "its record says it ended", details=problems[:20] if len(problems) > 1 else [],
                             hint=f"hermetic runs verify {run_dir.name} lists what differs")
    return check


# ---------------------------------------------------------------- the whole run directory


@dataclass
class RunVerification:
    """``hermetic runs verify``'s answer for one run directory: ``problems`` empty means ok."""

    run_dir: Path
    run_id: str | None
    problems: list[str] = field(default_factory=list)
    outputs: OutputsCheck | None = None
    skipped: str | None = None  # why it was not checked (no record yet, still running)

    @property
    def ok(self) -> bool:
        return not self.problems and self.skipped is None

    @property
    def status(self) -> str:
        return "skipped" if self.skipped is not None else ("ok" if not self.problems else "differs")

    def to_json(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "run_id": self.run_id, "status": self.status,
                "problems": self.problems, "skipped": self.skipped,
                "outputs": self.outputs.to_json() if self.outputs is not None else None}


def verify_run(run_dir: str | os.PathLike[str]) -> RunVerification:
    """Everything ``run_dir``'s sealed record holds a digest of, rehashed (module doc). Never raises for what
    it finds: each difference is one line of ``problems``."""
    from hermetic.record.liveness import is_running
    from hermetic.record.rundir import RunNotFound, load_record

    run_dir = Path(run_dir)

    try:
        record = load_record(run_dir)  # the schema, the seal, the directory's name
    except RunNotFound:
        why = "running, no record yet" if is_running(run_dir) else "no run.json (not run yet, or not a run)"
        return RunVerification(run_dir, None, skipped=why)
    except HermeticError as e:
        return RunVerification(run_dir, None, [e.message])
    result = RunVerification(run_dir, record["record"]["run_id"])
    if record["record"]["finished_at"] is None and is_running(run_dir):
        result.skipped = "still running: its outputs are not final yet"
        return result
    digests = OutputsStatCache(run_dir)
    result.outputs = check_outputs(run_dir, record, digests=digests)
    if record["record"]["finished_at"] is None:
        # Never sealed at the end (its driver was killed): the record holds no outputs to differ from, and
        # what the script left is not part of it. Only a recorded one that changed or went missing counts.
        result.outputs.added = []
    result.problems += result.outputs.problems() + _files_problems(run_dir, record, digests, code=True)
    digests.save(complete=result.outputs.error is None)
    return result


def _files_problems(run_dir: Path, record: dict[str, Any], digests: OutputsStatCache, *, code: bool) -> list[str]:
    """The files beside outputs/ the record holds a digest of: the datasets' manifest copies, with ``code`` the
    source snapshot and git patch, the metric series (metrics/series.jsonl) and stdout kept as an output."""
    files = [(ds["manifest_file"], ds["manifest_sha256"], f"dataset {name}'s manifest copy")
             for name, ds in sorted(record["data"].items())]
    if code:
        snap, git = record["code"]["snapshot"], record["code"]["git"]
        files.append((snap["file"], snap["sha256"], "the source snapshot"))
        if git is not None and git.get("diff_file") and git.get("diff_sha256"):
            files.append((git["diff_file"], git["diff_sha256"], "the git patch"))
    series, stdout = record["metrics"].get("series"), record["outputs"].get("stdout")
    if series:
        files.append((series["file"], series["sha256"], "the metric series"))
    if stdout:
        files.append((stdout["file"], stdout["sha256"], "stdout, an output (run.outputs.stdout)"))
    return [p for rel, sha256, what in files for p in _file_problems(run_dir, rel, sha256, what, digests)]


def _file_problems(run_dir: Path, rel: str, sha256: str, what: str, digests: OutputsStatCache) -> list[str]:
    """[] when ``run_dir/rel`` is a regular file (never through a link) whose bytes hash to ``sha256``."""
    try:
        rootfd = safetree.open_root(run_dir)
        try:
            fd = safetree.open_regular(rootfd, rel)
        finally:
            os.close(rootfd)
    except FileNotFoundError:
        return [f"{rel} ({what}) is missing"]
    except (OSError, safetree.UnsafePath) as e:
        return [f"{rel} ({what}) cannot be read: {getattr(e, 'message', None) or e.strerror}"]
    try:
        key = stat_key(os.fstat(fd))
        digest = digests.get(_RUN_FILE + rel, key)
        if digest is None:
            digest, _size = safetree.hash_fd(fd)
            if key == stat_key(os.fstat(fd)):
                digests.put(_RUN_FILE + rel, key, digest)
    finally:
        os.close(fd)
    if digest != sha256:
        return [f"{rel} ({what}) changed since the record was sealed (sha256 {sha256[:12]} recorded, "
                f"{digest[:12]} now)"]
    return []

