"""Issue 40, item 3: what came from a run, a record, a registry or a file name reaches no terminal, log or page raw.

Each surface (runs, runs show, runs verify, diff, replay, logs, doctor, runs export) is fed a record or a file
that holds terminal escapes, a C1 control, a bidi override and a CR LF that would start a forged
"bitwise identical" line; none of those characters may reach the output (the output's own newlines aside).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import cli_in_process as cli
from hermetic.core.escape import shown, shown_tree
from synthetic_records import synthetic_record, write_synthetic_run

HOSTILE = "\x1b]0;owned\x07\x1b[8m\x9b\u202e\r\nbitwise identical"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # any but "\n"
A, B = "20261129-214500-aaaaaa", "20261129-214500-bbbbbb"



def assert_escaped(*texts: str) -> None:
    for text in texts:
        assert RAW.search(text) is None, text
        assert not any(line.startswith("bitwise identical") for line in text.splitlines()), text


def hostile_record(run_id: str, **kw) -> dict:
    r = synthetic_record(run_id, **kw)
    r["metrics"]["final"] = {f"{HOSTILE}/val_loss": 0.5, "steps_done": 3}  # the listing's key metric
    r["env"]["passed"]["NOTE"] = HOSTILE
    r["image"]["repo_digests"] = [f"registry.example/x{HOSTILE}@sha256:{'1' * 64}"]
    r["hardware"]["gpus"][0]["name"] = HOSTILE
    r["invocation"]["args"] = ["--tag", HOSTILE]
    return r


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_synthetic_run(root, hostile_record(A))
    write_synthetic_run(root, synthetic_record(B, seed=1))
    return root


def test_the_rule() -> None:
    assert shown("plain — ünïcode ok") == "plain — ünïcode ok"
    assert shown(HOSTILE) == "\\x1b]0;owned\\x07\\x1b[8m\\x9b\\u202e\\r\\nbitwise identical"
    assert shown("a\tb\nc\x1b", "text") == "a\tb\nc\\x1b"
    assert shown("*x*<b>", "markdown") == "\\*x\\*\\<b\\>"
    assert shown("<b>&\x1b", "html") == "&lt;b&gt;&amp;\\x1b"
    doc = json.dumps({"k": HOSTILE}, ensure_ascii=False)
    assert RAW.search(shown(doc, "json")) is None and json.loads(shown(doc, "json")) == {"k": HOSTILE}
    assert shown_tree({HOSTILE: [HOSTILE, 1]}) == {shown(HOSTILE): [shown(HOSTILE), 1]}


def test_runs_lists_escaped(runs: Path) -> None:
    code, out, err = cli("runs", "--runs-dir", str(runs))
    assert code == 0 and "val_loss=0.5" in out
    assert_escaped(out, err)


def test_runs_json_escapes_what_json_leaves_raw(runs: Path) -> None:
    code, out, _ = cli("runs", "--runs-dir", str(runs), "--json")
    assert code == 0 and RAW.search(out) is None
    assert any(f"{HOSTILE}/val_loss" in e["final"] for e in json.loads(out))  # the same value, escaped as JSON


def test_runs_show_escaped(runs: Path) -> None:
    code, out, err = cli("runs", "--runs-dir", str(runs), "show", A)
    assert code == 0 and "\\x1b]0;owned\\x07" in out, err
    assert_escaped(out, err)
    code, out, _ = cli("runs", "--runs-dir", str(runs), "show", A, "--json")
    assert code == 0 and RAW.search(out) is None and json.loads(out)["env"]["passed"]["NOTE"] == HOSTILE


def test_runs_verify_escaped(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    r = synthetic_record(A)
    r["outputs"]["files"]["weights.bin"] = {"sha256": "0" * 64, "size": 1}
    write_synthetic_run(root, r)
    (root / A / "outputs" / f"x{HOSTILE}").write_text("added since")  # a file name the script chose
    code, out, err = cli("runs", "--runs-dir", str(root), "verify")
    assert code == 65 and "added since" in out
    assert_escaped(out, err)


def test_diff_escaped(runs: Path) -> None:
    code, out, err = cli("diff", "--runs-dir", str(runs), A, B)
    assert code == 1 and "\\x1b]0;owned\\x07" in out, (out, err)
    assert_escaped(out, err)


def test_replay_shows_its_diff_escaped(runs: Path) -> None:
    """replay's output after the run is the diff's rendering and the record's IDs: the rendering, on a replay
    whose original holds the hostile names (the run itself needs an engine: tests/test_replay.py)."""
    from hermetic.diff import diff_paths
    from hermetic.diff.render import render

    import click

    text = click.unstyle(render(diff_paths(runs / B, runs / A)))
    assert "\\x1b]0;owned\\x07" in text
    assert_escaped(text)


def test_logs_escaped_unless_raw(runs: Path) -> None:
    logs = runs / A / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "combined.log").write_bytes(f"epoch 1\tok\n{HOSTILE}\n".encode() + b"\xff\n")
    code, out, err = cli("logs", "--runs-dir", str(runs), A)
    assert code == 0 and out.startswith("epoch 1\tok\n") and "\\xff" in out
    assert RAW.search(out.replace("\t", " ")) is None, out  # the script's own lines and tabs, nothing else
    code, out, _ = cli("logs", "--runs-dir", str(runs), A, "--raw")
    assert code == 0 and HOSTILE in out


def test_doctor_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_CACHE", str(tmp_path / f"cache{HOSTILE}"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    code, out, err = cli("doctor", "--quick")
    assert code in (0, 69) and "cache\\x1b" in out, out
    assert_escaped(out, err)


def test_export_params_and_tags_escaped(runs: Path) -> None:
    """What `hermetic runs export` sends to the MLflow page (params, tags, the dataset's mount)."""
    from hermetic.integrations.mlflow import run_params, run_tags
    from hermetic.record.rundir import load_run

    r = load_run(runs / A)[1]
    params, tags = run_params(r), run_tags(r)
    assert_escaped(*params.values(), *tags.values())
    assert "--tag" in params["args"] and "\\x1b" in tags["hermetic.hardware.gpus"]
