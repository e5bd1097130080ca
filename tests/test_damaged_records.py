"""Issue 40, item 4: a damaged record is data, not a bug.

A generator of damaged records (hypothesis is not in requirements.lock; the sweep is exhaustive instead: every
place of every section, each way of damaging it) feeds `runs show`, `diff`, `replay`, `runs verify` and
`runs export` sealed records of wrong types, huge numbers, missing and extra keys, and
run.json files nested thousands of levels deep: every case ends as a verdict or in one error line, never in
an internal error (exit 70) or a traceback; a record Python cannot even parse is exit 65 naming its file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import cli_in_process as cli
from hermetic.core.canonical import pretty_json
from hermetic.record.seal import seal
from synthetic_records import synthetic_record, write_synthetic_run

A, B = "20261129-214500-aaaaaa", "20261129-214500-bbbbbb"
MISSING = object()
SECTIONS = ("invocation", "image", "code", "data", "seed", "env", "software", "hardware", "outputs", "metrics")



def assert_data_not_bug(argv: tuple[str, ...], code: int, err: str, *, expect: int | None = None) -> None:
    assert code != 70 and "Traceback" not in err, (argv, code, err[-2000:])
    if code not in (0, 1):
        assert len([ln for ln in err.splitlines() if ln.startswith("hermetic: error: ")]) == 1, (argv, err)
    if expect is not None:
        assert code == expect, (argv, code, err)


def paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*prefix, i))


def variants(value: Any) -> list[Any]:
    """What replaces a value: a scalar of the wrong type (a huge number for a string), a container of the
    wrong kind, the same mapping with a key no hermetic writes; MISSING removes the key."""
    if isinstance(value, (dict, list)):
        scalar = -1
    else:
        scalar = 10**400 if isinstance(value, str) else "x" if value is not None else 1e308
    extra = [{**value, "zz_extra": {"deep": [None, {}]}}] if isinstance(value, dict) else []
    return [MISSING, scalar, [] if isinstance(value, dict) else {"zz": [1]}, *extra]


def damaged(record: dict[str, Any], section: str) -> Iterator[dict[str, Any]]:
    """Every record one change away from ``record`` under ``section``: each place, each variant."""
    for where in paths(record[section], (section,)):
        parent = record
        for k in where[:-1]:
            parent = parent[k]
        for v in variants(parent[where[-1]]):
            rec = copy.deepcopy(record)
            target = rec
            for k in where[:-1]:
                target = target[k]
            if v is MISSING:
                del target[where[-1]]
            else:
                target[where[-1]] = v
            yield rec


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def commands(root: Path, export_to: Path) -> list[tuple[str, ...]]:
    where = ("--runs-dir", str(root))
    return [("runs", *where, "show", A), ("diff", *where, A, B), ("runs", *where, "verify", A),
            ("runs", *where, "export", "--mlflow", export_to.as_uri(), A)]


@pytest.fixture()
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "runs"
    record = synthetic_record(A)
    record["image"]["repo_digests"] = []  # replay looks for the image in the local store only
    sealed = write_synthetic_run(root, record)
    write_synthetic_run(root, synthetic_record(B, seed=1))
    return root, sealed


@pytest.mark.parametrize("section", SECTIONS)
def test_damaged_records_are_data_not_bugs(runs, tmp_path: Path, section: str) -> None:
    root, record = runs
    for i, rec in enumerate(damaged(record, section)):
        (root / A / "run.json").write_text(pretty_json(seal(rec)))
        every = [*commands(root, tmp_path / "mlruns"), ("replay", str(root / A))]
        for argv in every if i % 15 == 0 else every[:3]:  # export and replay (the slow ones): a sample
            code, _, err = cli(*argv)
            assert_data_not_bug(argv, code, err)


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deep_nesting_is_exit_65_naming_the_record(runs, tmp_path: Path, depth: int) -> None:
    root, _ = runs
    (root / A / "run.json").write_text('{"record": ' + nested(depth) + "}")
    for argv in [*commands(root, tmp_path / "mlruns"), ("replay", str(root / A))]:
        code, _, err = cli(*argv)
        assert_data_not_bug(argv, code, err, expect=65)
        assert f"{root / A / 'run.json'}" in err, err


def test_deep_nesting_inside_a_sealed_record_is_exit_65(runs, tmp_path: Path) -> None:
    """Nesting Python's json reads but the readers after it recurse past the limit (the seal, the formatters)."""
    import sys

    root, record = runs
    rec = copy.deepcopy(record)
    inner: Any = []
    for _ in range(sys.getrecursionlimit() - 60):
        inner = [inner]
    rec["hardware"]["deep"] = inner
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(old * 4)  # to seal it, as a crafted file would be
    try:
        text = pretty_json(seal(rec))
    finally:
        sys.setrecursionlimit(old)
    (root / A / "run.json").write_text(text)
    for argv in [*commands(root, tmp_path / "mlruns"), ("replay", str(root / A))]:
        code, _, err = cli(*argv)
        assert_data_not_bug(argv, code, err)


