"""Shared by the probe's modules: error bookkeeping that never raises (standard library only, Python 3.8+)."""

from __future__ import annotations


def reason(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return " ".join(text.split())  # one line


def safe(errors, path, fn, *args):
    """fn(*args), or None with "path: reason" appended to errors."""
    try:
        return fn(*args)
    except Exception as e:  # a probe never raises
        errors.append("%s: %s" % (path, reason(e)))
        return None


def read_text(path):
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return f.read()


def cuda_version_string(code):
    """12040 -> "12.4" (CUDA encodes major*1000 + minor*10)."""
    if code is None:
        return None
    code = int(code)
    return "%d.%d" % (code // 1000, (code % 1000) // 10)
