"""``hermetic diff``: why two runs (or two multi-seed groups) differ, or that they do not.

``diff_paths`` (runs or groups), ``diff_runs`` (the directories checked against their records first, and what
differs inside changed output files: hermetic.diff.contents), ``diff_records`` (pure); ``result.verdict``,
``result.to_json()``, and hermetic.diff.render for the terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from hermetic.diff.compare import compare_outputs, compare_sections
from hermetic.diff.groups import GroupDiff, compare_group_metrics, decide_groups
from hermetic.diff.manifests import read_manifest_file
from hermetic.diff.model import LogsDiff, RunDiff
from hermetic.diff.verdict import decide
from hermetic.record.schema import Record, parse_record

DEFAULT_RTOL = 1e-5  # numpy.isclose's defaults
DEFAULT_ATOL = 1e-8


def diff_records(a: dict[str, Any] | Record, b: dict[str, Any] | Record, *, manifests_a: dict[str, Any] | None = None,
                 manifests_b: dict[str, Any] | None = None, rtol: float = DEFAULT_RTOL,
                 atol: float = DEFAULT_ATOL, label_a: str | None = None, label_b: str | None = None,
                 read_contents: Callable[[Iterable[str]], dict[str, Any]] | None = None) -> RunDiff:
    """Compare two records (or their models, hermetic.record.schema.Record); ``manifests_*`` map dataset name ->
    {path: sha256} (per-file detail); ``read_contents(paths)``: what differs inside the changed output files
    (hermetic.diff.contents), when the run directories are at hand."""
    a, b = (r if isinstance(r, Record) else parse_record(r, sealed=False) for r in (a, b))
    sections = compare_sections(a, b, manifests_a or {}, manifests_b or {})
    outputs = compare_outputs(a, b, rtol=rtol, atol=atol)
    if read_contents is not None:
        outputs.contents = read_contents([f.path for f in outputs.files if f.status == "changed"])
    verdict = decide(sections, outputs, a, b)
    return RunDiff(label_a or a.record.run_id, label_b or b.record.run_id, sections, outputs, verdict,
                   {"rtol": rtol, "atol": atol})


def run_manifests(run_dir: Path, record: Record) -> dict[str, Any]:
    """The dataset manifest copies kept in the run dir (None for a missing one)."""
    return {name: read_manifest_file(run_dir / ds.manifest_file) for name, ds in record.data.items()}


def diff_runs(dir_a: str | Path, dir_b: str | Path, *, rtol: float = DEFAULT_RTOL,
              atol: float = DEFAULT_ATOL) -> RunDiff:
    from hermetic.record.rundir import load_run
    from hermetic.record.verify import require_as_recorded

    da, db = Path(dir_a), Path(dir_b)
    (a, va), (b, vb) = load_run(da), load_run(db)
    # The records are compared; the files beside them must still be what they say (stat-cached rehash).
    require_as_recorded(da, a, what="hermetic diff")
    require_as_recorded(db, b, what="hermetic diff")
    def read_contents(paths: Iterable[str]) -> dict[str, Any]:
        from hermetic.diff.contents import compare_contents

        return compare_contents(da, db, a["outputs"]["files"], b["outputs"]["files"], paths)

    d = diff_records(va, vb, manifests_a=run_manifests(da, va), manifests_b=run_manifests(db, vb), rtol=rtol,
                     atol=atol, read_contents=read_contents)
    d.logs = compare_logs(da, db)
    return d


def compare_logs(dir_a: Path, dir_b: Path) -> LogsDiff:
    """How many lines of the two runs' stdout and stderr differ (context, never the verdict)."""
    import difflib

    def lines_differing(name: str) -> int | None:
        try:
            la = (dir_a / "logs" / name).read_bytes().splitlines()
            lb = (dir_b / "logs" / name).read_bytes().splitlines()
        except FileNotFoundError:
            return None
        if la == lb:
            return 0
        ops = difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
        return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")

    return LogsDiff(lines_differing("stdout.log"), lines_differing("stderr.log"))


def diff_groups(dir_a: str | Path, dir_b: str | Path) -> GroupDiff:
    from hermetic.record.group import load_group

    da, db = Path(dir_a), Path(dir_b)
    ga, gb = load_group(da), load_group(db)
    metrics = compare_group_metrics(ga, gb)
    notes: list[str] = []
    inputs = []
    ra, rb = _first_member(da, ga, notes), _first_member(db, gb, notes)
    if ra is not None and rb is not None:
        ma = run_manifests(da.parent / ra.record.run_id, ra)
        mb = run_manifests(db.parent / rb.record.run_id, rb)
        inputs = [s for s in compare_sections(ra, rb, ma, mb) if s.name != "seed"]
    for g, label in ((ga, "A"), (gb, "B")):
        if g["inputs"]["mixed"]:
            notes.append(f"group {label}'s members differ in more than the seed: {', '.join(g['inputs']['mixed'])}")
        failed = [m["run_id"] for m in g["members"] if m["status"] != "succeeded"]
        if failed:
            notes.append(f"group {label}: {len(failed)} member(s) did not succeed and are left out: "
                         f"{', '.join(failed)}")
    verdict = decide_groups(metrics, inputs)
    return GroupDiff(ga["group"]["group_id"], gb["group"]["group_id"], metrics, inputs, verdict, notes)


def _first_member(group_dir: Path, group: dict[str, Any], notes: list[str]) -> Record | None:
    from hermetic.core.errors import HermeticError
    from hermetic.record.rundir import load_run

    members = [m for m in group["members"] if m["status"] == "succeeded"] or group["members"]
    try:
        return load_run(group_dir.parent / members[0]["run_id"])[1]
    except HermeticError as e:
        notes.append(f"inputs not compared: {e}")
        return None


def diff_paths(dir_a: str | Path, dir_b: str | Path, *, rtol: float = DEFAULT_RTOL,
               atol: float = DEFAULT_ATOL) -> RunDiff | GroupDiff:
    """Runs or groups, whichever the two directories hold (both must be the same kind)."""
    from hermetic.record.index import is_group_dir
    from hermetic.core.errors import UsageError

    da, db = Path(dir_a), Path(dir_b)
    kinds = ["group" if is_group_dir(d) else "run" for d in (da, db)]
    if kinds[0] != kinds[1]:
        raise UsageError(f"cannot compare a {kinds[0]} ({da}) with a {kinds[1]} ({db}); compare two runs "
                          "or two groups")
    if kinds[0] == "group":
        return diff_groups(da, db)
    return diff_runs(da, db, rtol=rtol, atol=atol)


__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "GroupDiff", "RunDiff", "diff_groups", "diff_paths", "diff_records",
           "diff_runs"]
