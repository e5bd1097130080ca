"""dpkg's status database (``var/lib/dpkg/status``, deb822), parsed: which packages a root filesystem has."""

from __future__ import annotations

import re

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def paragraphs(text: str) -> list[dict[str, str]]:
    """Each paragraph's fields (continuation lines left out: no reader here needs them)."""
    out = []
    for para in _PARAGRAPH_BREAK.split(text):
        fields: dict[str, str] = {}
        for line in para.splitlines():
            if line[:1].isspace() or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields:
            out.append(fields)
    return out


def installed_packages(text: str) -> dict[str, str]:
    """{package: version} of the installed packages, sorted by name.

    A paragraph without a Status field counts as installed: distroless
    images keep one file per package in ``var/lib/dpkg/status.d/`` without it.
    """
    out: dict[str, str] = {}
    for fields in paragraphs(text):
        if fields.get("Package") and "installed" in fields.get("Status", "install ok installed").split():
            out[fields["Package"]] = fields.get("Version", "")
    return dict(sorted(out.items()))
