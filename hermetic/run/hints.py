"""One line of advice after a failed run, read from what the script wrote on stderr.

``network_hint`` recognizes the errors of a script that downloads something in a container without network
(requests, urllib, name resolution, huggingface_hub, ``evaluate.load``). The log's bytes are only searched.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TAIL_BYTES = 64 * 1024
MAX_RANK_LOGS = 8  # multi-process runs: the first ranks' own stderr logs are read too

# What a failed connection looks like from Python, most specific first: (kind, pattern).
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(p)) for kind, p in (
    ("evaluate", r"Couldn't find a module script"),
    ("hub", r"OfflineModeIsEnabled"),
    ("hub", r"LocalEntryNotFoundError"),
    ("hub", r"We couldn't connect to '?https?://huggingface\.co"),
    ("hub", r"doesn't exist on the Hugging Face Hub"),
    ("hub", r"Couldn't find '[^'\n]+' on the Hugging Face Hub"),
    ("hub", r"(?:Max retries exceeded|NewConnectionError|Failed to establish a new connection)"
            r"[^\n]*huggingface\.co|huggingface\.co[^\n]*(?:Max retries exceeded|NewConnectionError)"),
    ("network", r"Max retries exceeded with url"),
    ("network", r"NewConnectionError"),
    ("network", r"Failed to establish a new connection"),
    ("network", r"Temporary failure in name resolution"),
    ("network", r"Name or service not known"),
    ("network", r"\bURLError\b"),
    ("network", r"socket\.gaierror|\bgaierror\b"),
    ("network", r"\[Errno 101\] Network is unreachable"),
))

_OR_HOST = "or rerun with `--network host` (recorded in run.json)"
_ADVICE = {
    "evaluate": ("evaluate.load(\"accuracy\") fetches the metric's script from the Hub: commit the metric's "
                 "directory (metrics/accuracy/ of github.com/huggingface/evaluate) into the project and load it by "
                 "path, evaluate.load(\"./accuracy\"); " + _OR_HOST),
    "hub": ("download the model, tokenizer or dataset beforehand (huggingface-cli download NAME --local-dir DIR), "
            "commit DIR or make it a dataset, give the script that path and `--env HF_HUB_OFFLINE=1`; " + _OR_HOST),
    "network": ("commit what it downloads into the project, or make it a dataset (hermetic data manifest DIR, "
                "then datasets: in hermetic.yaml), and point the script at it; " + _OR_HOST),
}


def network_hint(text: str) -> str | None:
    """The hint for a failed run whose stderr is ``text``, or None when it shows no network failure."""
    for kind, pattern in _PATTERNS:
        m = pattern.search(text)
        if m:
            seen = " ".join(m.group(0).split())[:80]
            return f"the container has no network and the script's stderr shows a failed download ({seen!r}): " \
                   + _ADVICE[kind]
    return None


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a regular file as text (undecodable bytes replaced); "" when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        import stat

        if not stat.S_ISREG(st.st_mode):
            return ""
        start = max(0, st.st_size - limit)
        return os.pread(fd, limit, start).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def failure_hint(run_dir: Path) -> str | None:
    """network_hint over the run's stderr (logs/stderr.log, then the first ranks' logs/rank<R>/stderr.log)."""
    logs = Path(run_dir) / "logs"
    paths = [logs / "stderr.log"]
    ranks = sorted((p for p in _dirs(logs) if p.name.startswith("rank") and p.name[4:].isdigit()),
                   key=lambda p: int(p.name[4:]))
    paths += [p / "stderr.log" for p in ranks[:MAX_RANK_LOGS]]
    for path in paths:
        hint = network_hint(read_tail(path))
        if hint:
            return hint
    return None


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
