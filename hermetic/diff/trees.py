"""What differs between two plain trees (what JSON, YAML or a pickle was read into).

``diff_trees`` flattens both (``log_history[3].train_runtime``) and yields a FieldChange per differing leaf,
marked wall-clock or not; at most MAX_VALUES nodes, parts deeper than MAX_DEPTH compared whole.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterator

from hermetic.diff.wallclock import is_wall_clock_name, last_name, value_wall_clock

MAX_VALUES = 1_000_000  # values (nodes) walked per file: a YAML alias or pickle memo cannot make it explode
MAX_DEPTH = 200  # nesting walked; deeper parts compared whole


class Unreadable(Exception):
    """The content cannot be compared as a structure: the message says why (then compared as bytes)."""


@dataclass(frozen=True)
class FieldChange:
    """One value that differs inside a file: ``key`` (``log_history[3].train_runtime``) from ``a`` to ``b``
    (shortened text); ``wall_clock`` says why it is harmless (``name``: the key is a timing or host field;
    ``value``: the value differs only in a date, time or host name), or "" when it is not."""

    key: str
    kind: str  # changed | added | removed
    a: str | None
    b: str | None
    wall_clock: str = ""

    @property
    def name(self) -> str:
        return last_name(self.key)

    def text(self) -> str:
        if self.kind == "added":
            return f"{self.key} added ({self.b})"
        if self.kind == "removed":
            return f"{self.key} removed (was {self.a})"
        return f"{self.key} {self.a} -> {self.b}"


def show(value: Any, n: int = 60) -> str:
    """A value as one short line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<{value.bit_length()}-bit integer>"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:12]}>" if len(value) > 24 \
            else repr(bytes(value))
    if isinstance(value, str):
        text = value
    elif isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    text = _printable(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _printable(text: str) -> str:
    """``text`` with every character that is not printable (an escape code, a newline) as ``\\xNN``."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (math.isnan(x) and math.isnan(y))
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def flatten_tree(tree: Any) -> dict[str, Any]:
    """``{"a.b[0].c": leaf}`` for a plain tree (dicts, lists); lists of scalars stay leaves, as do parts
    nested deeper than MAX_DEPTH. Unreadable past MAX_VALUES nodes (a YAML alias bomb)."""
    out: dict[str, Any] = {}
    budget = [MAX_VALUES]

    def walk(value: Any, prefix: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise Unreadable(f"more than {MAX_VALUES} values")
        if isinstance(value, dict) and value and depth < MAX_DEPTH:
            for k, v in value.items():
                k = k if isinstance(k, str) else repr(k)
                walk(v, f"{prefix}.{k}" if prefix else k, depth + 1)
        elif isinstance(value, list) and depth < MAX_DEPTH and any(isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{prefix}[{i}]", depth + 1)
        else:
            out[prefix] = value

    walk(tree, "", 0)
    return out


def diff_trees(a: Any, b: Any) -> Iterator[FieldChange]:
    """Every leaf that differs between two plain trees, in key order of A then the keys only B has."""
    fa, fb = flatten_tree(a), flatten_tree(b)
    for key in list(fa) + [k for k in fb if k not in fa]:
        label = _printable(key) or "(the whole value)"  # a key is the script's text too: no escape codes
        if key in fa and key in fb:
            x, y = fa[key], fb[key]
            if _same(x, y):
                continue
            why = "name" if is_wall_clock_name(key) else value_wall_clock(x, y)
            yield FieldChange(label, "changed", show(x), show(y), why)
        elif key in fa:
            yield FieldChange(label, "removed", show(fa[key]), None)
        else:
            yield FieldChange(label, "added", None, show(fb[key]))
