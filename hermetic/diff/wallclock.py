"""Which differences measure time or name a host, not a computation: wall-clock fields.

By name: a key whose last part says time (``*runtime*``, ``*_per_second``, ``timestamp``, ``*_at``...) or a
host (``hostname``, ``node``, ``pid``). By value: strings that differ only in a date, a time, an epoch or a
container host name (``runs/Dec01_22-35-39_a09514e7ee3d``).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_WALL_CLOCK_NAME = re.compile(
    r"runtime|per_?sec(ond)?s?$|throughput"
    r"|^_?(time|timestamp|wall_?time|walltime|date|datetime|elapsed|duration|created|modified|now)$"
    r"|_(time|timestamp|date|datetime|at|elapsed|duration|seconds|secs)$"
    r"|^(host|hostname|host_name|node|nodename|node_name|pid)$|_(host|hostname)$"
)
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME_IN_TEXT = re.compile("|".join([
    r"\d{4}-\d{2}-\d{2}(?:[T _]\d{2}[:\-]\d{2}(?:[:\-]\d{2}(?:[.,]\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?",  # ISO 8601
    r"\d{8}[T_-]?\d{6}",  # 20261129-214500
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)?,? ?" + _MONTH + r"\s?\d{1,2}(?:[_ ,]+\d{2}[:\-]\d{2}[:\-]\d{2})?(?: \d{4})?",
    r"\d{1,2}[:\-]\d{2}[:\-]\d{2}(?:[.,]\d+)?",  # 22-35-39, 22:35:39.5
    r"(?<!\d)1\d{9}(?:\d{3})?(?:\.\d+)?(?!\d)",  # epoch seconds (or ms) 2001-2286
]))
_PICKLED_TIMES = ("datetime.datetime(", "datetime.date(", "datetime.time(")  # hermetic.diff.pickles' text of one
_HOST_IN_TEXT = re.compile(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])")  # a container's default host name


def last_name(key: str) -> str:
    """The last named part of a dotted key path (``log_history[3].train_runtime`` -> ``train_runtime``);
    indices and numeric keys are skipped (``epoch_times.3`` -> ``epoch_times``)."""
    for part in reversed(re.split(r"[./:]", re.sub(r"\[\d+\]", "", key))):
        if part and not part.isdigit():
            return part
    return key


def is_wall_clock_name(key: str) -> bool:
    """A key (or metric) whose name says it measures time or names a host: ``train_runtime``,
    ``train_samples_per_second``, ``timestamp``, ``epoch_time``, ``created_at``, ``hostname``."""
    return bool(_WALL_CLOCK_NAME.search(last_name(key).lower()))


def _masked(text: str, *, times: bool, hosts: bool) -> str:
    if times:
        text = _TIME_IN_TEXT.sub("\0t", text)
    if hosts:
        text = _HOST_IN_TEXT.sub("\0h", text)
    return text


def value_wall_clock(a: Any, b: Any) -> str:
    """How two differing values differ only in a date, time or host name: ``a time``, ``a host name``, ``a time
    and a host name``; "" when they differ otherwise."""
    if isinstance(a, (datetime.date, datetime.time)) and isinstance(b, (datetime.date, datetime.time)):
        return "a time"
    if not (isinstance(a, str) and isinstance(b, str)):
        return ""
    if a.startswith(_PICKLED_TIMES) and b.startswith(_PICKLED_TIMES):  # read_pickle's text for a datetime
        return "a time"
    for times, hosts, what in ((True, False, "a time"), (False, True, "a host name"),
                               (True, True, "a time and a host name")):
        if _masked(a, times=times, hosts=hosts) == _masked(b, times=times, hosts=hosts):
            return what
    return ""
