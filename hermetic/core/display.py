"""Text that came from outside (a registry's error body, a header, a name) made safe to print as one line.

C0 and C1 controls, DEL, the Unicode line separators and bidirectional overrides are written as Python-style escapes
(``\\n``, ``\\x1b``, ``\\u202e``): such text cannot start a line, move the cursor or send an escape."""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str, limit: int | None = None) -> str:
    """``text`` with control characters escaped; with ``limit``, cut to about that many characters
    (the cut is said: ``… (12345 characters)``), so a huge value cannot flood a terminal either."""
    cut = ""
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], f"… ({len(text)} characters)"
    return _UNSAFE.sub(_escape, text) + cut
