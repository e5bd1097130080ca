"""The network hint after a failed run (hermetic.run.hints): what it recognizes, and what it leaves alone.

The pure part reads text; the real-engine tests fail scripts for want of network inside the container.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from hermetic.run.hints import TAIL_BYTES, failure_hint, network_hint, read_tail
from run_support import hermetic_run

# Tracebacks as the libraries print them (abridged to their last lines).
REQUESTS = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='example.org', port=443): Max retries "
            "exceeded with url: /data.csv (Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection "
            "object at 0x7f>: Failed to resolve 'example.org' ([Errno -3] Temporary failure in name resolution)\"))")
HUB = ("OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached "
       "files and it looks like gpt2 is not the path to a directory containing a file named config.json.")
HUB_REQUESTS = ("urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
                "exceeded with url: /api/models/gpt2 (Caused by NewConnectionError('Failed to establish a new "
                "connection: [Errno -3] Temporary failure in name resolution'))")
OFFLINE = "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/gpt2: offline mode"
LOCAL_ENTRY = "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file"
EVALUATE = ("FileNotFoundError: Couldn't find a module script at /workspace/accuracy/accuracy.py. Module 'accuracy' "
            "doesn't exist on the Hugging Face Hub either.")
DATASETS = "FileNotFoundError: Dataset 'wikitext' doesn't exist on the Hugging Face Hub"
URLLIB = "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"
UNREACHABLE = "OSError: [Errno 101] Network is unreachable"
NAME_UNKNOWN = "socket.gaierror: [Errno -2] Name or service not known"


@pytest.mark.parametrize("stderr,kind", [
    (REQUESTS, "network"), (URLLIB, "network"), (UNREACHABLE, "network"), (NAME_UNKNOWN, "network"),
    (HUB, "hub"), (HUB_REQUESTS, "hub"), (OFFLINE, "hub"), (LOCAL_ENTRY, "hub"), (DATASETS, "hub"),
    (EVALUATE, "evaluate"),
], ids=["requests", "urllib", "unreachable", "gaierror", "hub-connect", "hub-requests", "hub-offline",
        "hub-local-entry", "datasets", "evaluate"])
def test_a_failed_download_gets_one_line_saying_why_and_what_to_do(stderr: str, kind: str) -> None:
    hint = network_hint("Traceback (most recent call last):\n  File \"train.py\", line 3\n" + stderr + "\n")
    assert hint is not None and "\n" not in hint
    assert hint.startswith("the container has no network")
    assert hint.endswith("or rerun with `--network host` (recorded in run.json)")
    if kind == "evaluate":
        assert "commit the metric's directory" in hint and 'evaluate.load("./accuracy")' in hint
    elif kind == "hub":
        assert "huggingface-cli download NAME --local-dir DIR" in hint and "HF_HUB_OFFLINE=1" in hint
    else:
        assert "commit what it downloads into the project, or make it a dataset" in hint


@pytest.mark.parametrize("stderr", [
    "ValueError: shapes (3,) and (4,) not aligned",
    "ModuleNotFoundError: No module named 'mingpt'",
    "ConnectionRefusedError: [Errno 111] Connection refused",  # a local server the script started: not the network
    "",
], ids=["plain", "import", "refused-locally", "empty"])
def test_other_failures_get_no_hint(stderr: str) -> None:
    assert network_hint(stderr) is None


def test_the_quoted_text_is_escaped_and_short() -> None:
    hint = network_hint("\x1b[31mMax retries exceeded with url: /x\x1b[0m")
    assert hint is not None and "\x1b" not in hint and "'Max retries exceeded with url'" in hint


def test_only_the_tail_of_the_log_is_read(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "stderr.log").write_bytes(URLLIB.encode() + b"\n" + b"x" * TAIL_BYTES)
    assert failure_hint(tmp_path) is None  # the error scrolled out of the last 64 KiB
    (logs / "stderr.log").write_bytes(b"\xff\xfe not utf-8 \n" * 10 + URLLIB.encode())
    assert failure_hint(tmp_path) is not None
    (logs / "stderr.log").unlink()
    os.symlink("/etc/passwd", logs / "stderr.log")
    assert read_tail(logs / "stderr.log") == ""  # a link is not followed
    assert failure_hint(tmp_path / "nowhere") is None


def test_a_rank_s_own_log_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "logs" / "rank1").mkdir(parents=True)
    (tmp_path / "logs" / "stderr.log").write_text("torch.distributed.elastic.multiprocessing.errors.ChildFailedError\n")
    (tmp_path / "logs" / "rank1" / "stderr.log").write_text(HUB + "\n")
    assert "huggingface-cli download" in (failure_hint(tmp_path) or "")


# --- on the real engine: the container really has no network -------------------------------------------

URLOPEN = """import urllib.request
urllib.request.urlopen("https://huggingface.co", timeout=10)
"""
# What `evaluate.load("accuracy")` raises without network (evaluate itself is not installed in this image).
EVALUATE_LIKE = f"""raise FileNotFoundError({EVALUATE.split(': ', 1)[1]!r})
"""


@pytest.mark.docker
def test_a_script_that_downloads_fails_with_the_hint(project) -> None:
    (project / "fetch.py").write_text(URLOPEN)
    (project / "metric.py").write_text(EVALUATE_LIKE)
    (project / "plain.py").write_text("raise SystemExit('no such file: data/missing.csv')\n")
    proc = run_cli("run", "fetch.py", cwd=project)
    assert proc.returncode == 1, proc.stderr
    hints = [ln for ln in proc.stderr.splitlines() if ln.startswith("hermetic: hint: ")]
    assert len(hints) == 1 and "the container has no network" in hints[0], proc.stderr
    assert "URLError" in proc.stderr  # the script's own traceback is there too, before the hint
    assert proc.stderr.rstrip().splitlines()[-1] == hints[0]  # the last line: after the failure
    proc, _ = hermetic_run(project, "metric.py", expect=1)  # --json: the record on stdout, the hint on stderr
    assert "hermetic: hint: the container has no network" in proc.stderr and "commit the metric" in proc.stderr
    proc = run_cli("run", "plain.py", cwd=project)
    assert proc.returncode == 1 and "hermetic: hint" not in proc.stderr, proc.stderr
