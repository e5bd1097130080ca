"""Dataset manifests: ``sha256sum -c`` format, which is also BagIt's manifest-sha256.txt (RFC 8493 2.1.3).

``<64 hex>  <path>`` per regular file, paths relative, sorted by UTF-8 bytes, CR, LF and % percent-encoded;
the sha256 of the bytes is the dataset's ID. Strict where ambiguity would change the meaning (``..``, absolute
paths, duplicates, Unicode twins, short hashes), tolerant of what ``sha256sum -c`` reads (``*`` marker, ``./``,
CRLF, GNU ``\\`` escapes). Refusals name ``file:line`` and never quote a line that is not a manifest's.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Iterable, Mapping

from hermetic.core.errors import DataError

HEX_LEN = 64
# A line is a hash, a separator and a path; paths are at most PATH_MAX (4096) bytes, percent-encoding
# triples at worst: 64 KiB is ample for a real line, and bounds what one line costs the parser.
MANIFEST_LINE_MAX = 64 << 10
_LONG_CHARS = MANIFEST_LINE_MAX // 4  # a line of fewer characters cannot hold more bytes than the bound
_DIGEST_LEN = HEX_LEN // 2
_HEX_PREFIX = re.compile(r"[0-9a-fA-F]*")
# RFC 8493: only CR, LF and % are encoded; anything else after a % is malformed.
_PERCENT = re.compile(r"%(25|0[aAdD])")
_PERCENT_DECODE = {"25": "%", "0a": "\n", "0A": "\n", "0d": "\r", "0D": "\r"}
_HEAD_LEN = HEX_LEN + 2  # the hash and its separator
_HEAD = itemgetter(slice(0, _HEAD_LEN))
_PATH = itemgetter(slice(_HEAD_LEN, None))
# In the newline-framed blob of all paths, substrings that only a path needing the
# slow, per-line parser holds (decoding, './' stripping, or refusal): a character...
_SUSPECT_CHARS = ("%", "\0", "\r")
# ...two separators in a row (an empty path or component, an absolute path, a trailing
# '/': "//" once every LF is a '/'), or a '.' component, looked for only past a '/.'.
_SUSPECT_DOT = ("/./", "/../", "\n./", "\n../", "/.\n", "/..\n", "\n.\n", "\n..\n")


class ManifestError(DataError):
    """A manifest that cannot be trusted as written (like a bad lockfile)."""


@dataclass(frozen=True)
class Manifest:
    """path -> sha256 hex in line order; ``sha256`` of the bytes (the dataset ID); ``total_bytes`` only for a
    manifest made from a directory (a sha256sum file carries no sizes)."""

    entries: dict[str, str]
    sha256: str
    total_bytes: int | None = None
    source: str = field(default="<manifest>", compare=False)

    @property
    def file_count(self) -> int:
        return len(self.entries)

    @property
    def oxum(self) -> str | None:
        """BagIt's Payload-Oxum, ``<bytes>.<count>``, when the bytes are known."""
        return None if self.total_bytes is None else f"{self.total_bytes}.{len(self.entries)}"


@dataclass(frozen=True)
class ManifestColumns:
    """A manifest as ``verify --full`` compares it: path -> raw 32-byte digest, and its sha256."""

    digests: dict[str, bytes]
    sha256: str


# ---------------------------------------------------------------- writing


def encode_path(path: str) -> str:
    """Percent-encode CR, LF and % (RFC 8493 2.1.3); everything else stays as is."""
    if "%" in path or "\n" in path or "\r" in path:
        path = path.replace("%", "%25").replace("\n", "%0A").replace("\r", "%0D")
    return path


def format_manifest(entries: Mapping[str, str]) -> bytes:
    """The canonical bytes: sorted by path (code point order is UTF-8 byte order), LF line ends."""
    out = []
    for path in sorted(entries):
        reason = path_problem(path)
        if reason:
            raise ValueError(f"{path!r}: {reason}")
        out.append(f"{entries[path]}  {encode_path(path)}\n")
    return "".join(out).encode("utf-8")


def make_manifest(entries: Mapping[str, str], total_bytes: int | None = None) -> Manifest:
    data = format_manifest(entries)
    ordered = {p: entries[p] for p in sorted(entries)}
    return Manifest(ordered, hashlib.sha256(data).hexdigest(), total_bytes)


# ---------------------------------------------------------------- reading


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Parse a manifest file; ManifestError with ``file:line: reason`` if malformed."""
    return parse_manifest(read_manifest_bytes(path), str(path))


def read_manifest_bytes(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: is a directory, not a manifest file") from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e.strerror}") from None


def parse_manifest(data: bytes | str, source: str = "<manifest>") -> Manifest:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    columns = parse_columns(data, source)
    h = b"".join(columns.digests.values()).hex()
    entries = dict(zip(columns.digests, [h[i:i + HEX_LEN] for i in range(0, len(h), HEX_LEN)]))
    return Manifest(entries, columns.sha256, None, source)


def parse_columns(data: bytes, source: str = "<manifest>") -> ManifestColumns:
    """Like ``parse_manifest``, as ``verify --full`` wants it (see ManifestColumns)."""
    digest = hashlib.sha256(data).hexdigest()
    fast = _columns_in_pieces(data)
    if fast is not None:
        paths, digests = fast
        by_path = dict(zip(paths, digests))
        if len(by_path) == len(paths):
            return ManifestColumns(by_path, digest)
    lines = _lines(data, source)
    entries = _parse_slow(lines, source)  # refuses what the fast path only noticed
    return ManifestColumns({p: bytes.fromhex(h) for p, h in entries.items()}, digest)


def _columns_in_pieces(data: bytes, piece: int = 1 << 20) -> tuple[list[str], list[bytes]] | None:
    """``_columns_fast`` on ~1 MiB of whole lines at a time (each piece freed before the next reuses its
    memory): (paths, 32-byte digests)."""
    if data and not data.endswith(b"\n"):
        data += b"\n"  # the last line's LF, which sha256sum does not require
    paths: list[str] = []
    digests: list[bytes] = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", min(start + piece, len(data) - 1)) + 1  # the end of a whole line
        try:
            lines = data[start:end - 1].decode("utf-8").split("\n")
        except UnicodeDecodeError:
            return None
        start = end
        if max(map(len, lines)) > _LONG_CHARS:
            return None  # maybe a line too long: the careful parser says which
        fast = _columns_fast(lines)
        if fast is None:
            return None
        paths += fast[0]
        raw = fast[1]
        digests += [raw[i:i + _DIGEST_LEN] for i in range(0, len(raw), _DIGEST_LEN)]
    return paths, digests


def _lines(data: bytes, source: str) -> list[str]:
    """The lines without their LF."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ManifestError(f"{source}:{line}: not UTF-8 (BagIt manifests are UTF-8)") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final line's terminator
    if lines and max(map(len, lines)) > _LONG_CHARS:
        _refuse_long_lines(lines, source)
    return lines


def _refuse_long_lines(lines: list[str], source: str) -> None:
    for i, line in enumerate(lines):
        if len(line) > _LONG_CHARS:
            size = len(line.encode("utf-8", "surrogateescape"))
            if size > MANIFEST_LINE_MAX:
                raise ManifestError(f"{source}:{i + 1}: a line of {size} bytes; a manifest line holds at most "
                                    f"{MANIFEST_LINE_MAX} (a hash and a path of at most 4096 bytes): not parsed")


def _columns_fast(lines: list[str]) -> tuple[list[str], bytes] | None:
    """(paths, raw digests) by whole-column checks (joins, strided slices, substring searches) instead of
    per-line Python; None when any line needs the careful parser. Duplicates are the caller's to find."""
    n = len(lines)
    if not n:
        return [], b""
    # Every line's hash and separator, 66 characters each; joined a slice at a time, so
    # that the short-lived pieces reuse the same memory instead of faulting in new pages.
    step = 4096
    heads = "".join(["".join(map(_HEAD, lines[i:i + step])) for i in range(0, n, step)])
    if len(heads) != n * _HEAD_LEN or heads[HEX_LEN::_HEAD_LEN] != " " * n:
        return None  # a line too short to hold a hash and a separator, or no blank after the hash
    marks = heads[HEX_LEN + 1::_HEAD_LEN]  # ' ' (text) or '*' (binary), as sha256sum writes
    if marks != " " * n:
        if marks.count(" ") + marks.count("*") != n:
            return None
        heads = heads.replace("*", " ")  # a '*' inside a hash leaves it short: refused below
    # fromhex skips the blanks between the 32-byte groups; any other character, or a
    # blank inside a hash (which makes it short), shows in the error or the length.
    try:
        raw = bytes.fromhex(heads)
    except ValueError:
        return None
    if len(raw) != n * _DIGEST_LEN:
        return None
    paths = list(map(_PATH, lines))
    blob = "\n" + "\n".join(paths) + "\n"
    if not blob.isascii() or any(c in blob for c in _SUSPECT_CHARS):
        return None  # non-ASCII needs the normalization check; the rest need decoding or refusal
    slashes = blob.replace("\n", "/")  # one search below instead of one per separator pair
    if "//" in slashes or ("/." in slashes and any(s in blob for s in _SUSPECT_DOT)):
        return None
    return paths, raw


def normalization_twin(seen: dict[str, str], path: str) -> str | None:
    """An earlier path in ``seen`` (NFC form -> path) equal to ``path`` under Unicode normalization (one file
    on macOS, two on Linux), else None after recording ``path``."""
    import unicodedata

    nfc = unicodedata.normalize("NFC", path)
    other = seen.get(nfc)
    if other is None:
        seen[nfc] = path
    return other


def _parse_slow(lines: list[str], source: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    line_of: dict[str, int] = {}
    normalized: dict[str, str] = {}
    for lineno, line in enumerate(lines, 1):
        path, hexdigest = parse_line(line, f"{source}:{lineno}")
        if path in entries:
            raise ManifestError(f"{source}:{lineno}: duplicate entry for {path!r} (first on line {line_of[path]})")
        other = normalization_twin(normalized, path) if not path.isascii() else None
        if other is not None:
            raise ManifestError(
                f"{source}:{lineno}: {path!r} and {other!r} (line {line_of[other]}) differ only by "
                "Unicode normalization; they may be one file or two depending on the filesystem"
            )
        entries[path] = hexdigest
        line_of[path] = lineno
    return entries


def parse_line(line: str, where: str) -> tuple[str, str]:
    """One ``<hex>  <path>`` line -> (decoded path, lowercase hex)."""
    if line.endswith("\r"):
        line = line[:-1]  # CRLF line end (a CR inside a name is always %0D)
    gnu_escaped = line.startswith("\\")
    body = line[1:] if gnu_escaped else line
    if not body.strip():
        raise ManifestError(f"{where}: empty line")
    digits = _HEX_PREFIX.match(body)
    n = digits.end() if digits else 0
    if n != HEX_LEN:
        if 0 < n and body[n:n + 1] in (" ", "\t"):
            raise ManifestError(f"{where}: hash has {n} hex digits; a sha256 has {HEX_LEN}")
        if n > HEX_LEN:
            raise ManifestError(f"{where}: hash has more than {HEX_LEN} hex digits; a sha256 has {HEX_LEN}")
        first = body.split(None, 1)[0]
        if len(first) == HEX_LEN:
            raise ManifestError(f"{where}: hash is not hexadecimal")
        # the text is not echoed: a line that is not a manifest's may be any file's (a secret's)
        raise ManifestError(f"{where}: not a '<sha256>  <path>' line")
    # GNU's rule: one blank, then an optional mode marker (' ' text, '*' binary).
    if body[HEX_LEN:HEX_LEN + 1] not in (" ", "\t"):
        raise ManifestError(f"{where}: expected two spaces between the hash and the path")
    start = HEX_LEN + 2 if body[HEX_LEN + 1:HEX_LEN + 2] in (" ", "*") else HEX_LEN + 1
    raw = body[start:]
    path = _unescape_gnu(raw, where) if gnu_escaped else _decode_percent(raw, where)
    if path.startswith("./"):
        path = path[2:]  # what `find . | xargs sha256sum` writes
    reason = path_problem(path)
    if reason:
        raise ManifestError(f"{where}: {reason}: {_clip(path)!r}")
    return path, body[:HEX_LEN].lower()


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a manifest entry, or None if it can."""
    if not path:
        return "empty path"
    if "\0" in path:
        return "NUL in path"
    if path.startswith("/"):
        return "absolute path (paths are relative to the dataset root)"
    parts = path.split("/")
    if ".." in parts:
        return "'..' in path (entries must stay inside the dataset root)"
    if "" in parts:
        return "empty path component ('//' or a trailing '/'; directories are not listed)"
    if "." in parts:
        return "'.' component in path (write the path without it)"
    return None


def _decode_percent(raw: str, where: str) -> str:
    if "%" not in raw:
        return raw
    stray = _PERCENT.sub("", raw)
    if "%" in stray:
        raise ManifestError(
            f"{where}: bad percent-encoding in {_clip(raw)!r}: only %25, %0A and %0D are allowed "
            "(RFC 8493); write a literal '%' as %25"
        )
    return _PERCENT.sub(lambda m: _PERCENT_DECODE[m.group(1)], raw)


def _unescape_gnu(raw: str, where: str) -> str:
    """GNU coreutils marks a line with a leading backslash when it escaped the name."""
    out = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            nxt = raw[i + 1:i + 2]
            if nxt not in ("\\", "n", "r"):
                raise ManifestError(f"{where}: bad backslash escape in {_clip(raw)!r}")
            out.append({"\\": "\\", "n": "\n", "r": "\r"}[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _clip(s: str, n: int = 80) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def first_names(names: Iterable[str], limit: int = 3) -> str:
    """'a, b, c and 4 more' for one-line messages."""
    names = list(names)
    head = ", ".join(names[:limit])
    return head + (f" and {len(names) - limit} more" if len(names) > limit else "")
