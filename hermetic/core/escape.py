"""The one escaping rule for what hermetic shows that came from a run, a record, a registry or a file name.

Control characters (C0 with ESC, CR, LF and TAB; DEL; C1), the Unicode line separators and the bidi controls become
visible escapes (``\\x1b``, ``\\u202e``: hermetic.core.display), so no such text can retitle a terminal, colour or
hide a line, or start a forged one. A context adds what its medium needs."""

from __future__ import annotations

import html
import re
from typing import Any

from hermetic.core.display import escape_controls

_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~#!&])")
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(text: object, context: str = "line", limit: int | None = None) -> str:
    """``text`` (str() of anything else) made safe to show: "line" (a terminal or log line), "text" (several lines:
    newlines and tabs kept), "markdown" (also Markdown's punctuation backslash-escaped), "html" (also
    html.escape), "json" (a JSON document already dumped: what JSON leaves raw, as ``\\uXXXX``)."""
    s = text if isinstance(text, str) else str(text)
    if context == "json":
        return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    if context == "text":
        return "\n".join("\t".join(escape_controls(p) for p in line.split("\t")) for line in s.split("\n"))
    s = escape_controls(s, limit)
    if context == "markdown":
        return _MARKDOWN.sub(r"\\\1", s)
    return html.escape(s) if context == "html" else s


def shown_tree(node: Any) -> Any:
    """Every string (keys too) in nested dicts, lists and pydantic models (a record's: hermetic.record.schema, copied
    unchecked), as ``shown``: a record made safe to format."""
    if hasattr(node, "model_construct"):
        fields = {shown(k): shown_tree(v) for k, v in node}
        return node.model_construct({shown(k) for k in node.model_fields_set}, **fields)
    if isinstance(node, str):
        return shown(node)
    if isinstance(node, dict):
        return {shown_tree(k): shown_tree(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [shown_tree(v) for v in node]
    return node
