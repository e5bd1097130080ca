"""Write a pinned base reference into hermetic.yaml, touching only the ``base:`` line."""

from __future__ import annotations

import re
from pathlib import Path

from hermetic.hostfs.fsutil import atomic_write_text

_NAME_LINE = re.compile(r"^name:[^\n]*$", re.M)
_BASE_LINE = re.compile(r"^base:[ \t]*(?P<value>[^#\n]*?)(?P<comment>[ \t]+#[^\n]*)?$", re.M)


def pin_base(config_file: Path, reference: str) -> tuple[str | None, bool]:
    """Set ``base:`` to ``reference``. Returns (previous value, changed)."""
    text = config_file.read_text(encoding="utf-8")
    m = _BASE_LINE.search(text)
    if m is None:
        # No base yet (a config being written): add the line, after `name:` where there is one.
        name = _NAME_LINE.search(text)
        at = name.end() + 1 if name else 0
        if name and at > len(text):
            text += "\n"
        atomic_write_text(config_file, text[:at] + f"base: {reference}\n" + text[at:])
        return None, True
    old = m.group("value").strip().strip("'\"") or None
    if old == reference:
        return old, False
    new_line = f"base: {reference}{m.group('comment') or ''}"
    atomic_write_text(config_file, text[: m.start()] + new_line + text[m.end():])
    return old, True
