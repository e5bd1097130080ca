"""Reader for requirements.txt locks with ``--hash`` (uv pip compile / pip-compile output)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from hermetic.core.canonical import is_sha256_hex
from hermetic.core.errors import LockError
from hermetic.lock.model import LockedWheel, Target

_VCS_PREFIXES = ("git+", "hg+", "svn+", "bzr+")
_HASH = re.compile(r"(?:^|\s)--hash(?:=|\s+)(\S+)")
_COMMENT = re.compile(r"(?:^|[ \t])#.*")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations; strip comments ('#' at a line's start or after whitespace: pip's rule).
    Returns (first line no, text) of each non-empty logical line."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines() + [""], start=1):  # (the empty last line ends a continuation)
        line = _COMMENT.sub("", raw).rstrip()
        if not parts:
            start = no
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            joined = " ".join(parts).strip()
            parts = []
            if joined:
                out.append((start, joined))
    return out


def read_requirements_lock(path: Path, text: str, target: Target) -> tuple[list[LockedWheel], list[str], list[str]]:
    """Returns (wheels, index_urls, find_links). Raises LockError naming file:line."""
    env = target.marker_environment()
    wheels: list[LockedWheel] = []
    index_urls: list[str] = []
    find_links: list[str] = []
    seen: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        where = f"{path}:{lineno}"
        if line.startswith("-"):
            try:
                tokens = shlex.split(line, posix=True)
            except ValueError as e:
                raise LockError(f"{where}: cannot parse line: {e}") from None
            _option_line(where, tokens, index_urls, find_links)
            continue
        # requirement [--hash=sha256:...]... (markers keep their quotes: no shlex here)
        hashes: set[str] = set()
        for value in _HASH.findall(line):
            algo, _, hexpart = value.partition(":")
            if algo != "sha256":
                raise LockError(f"{where}: only sha256 hashes are accepted, got {value!r}")
            if not is_sha256_hex(hexpart.lower()):
                raise LockError(f"{where}: malformed sha256 hash {value!r}")
            hashes.add(hexpart.lower())
        rest = _HASH.sub(" ", line)
        stray = re.search(r"(?:^|\s)(--?[A-Za-z][\w-]*)", rest)
        if stray:
            raise LockError(f"{where}: unsupported per-requirement option {stray.group(1)!r}")
        req_text = rest.strip()
        if req_text.startswith(_VCS_PREFIXES):
            raise LockError(f"{where}: {req_text.split()[0]}: VCS requirements need a build and are not hermetic; pin a wheel with a hash")
        try:
            req = Requirement(req_text)
        except InvalidRequirement as e:
            # packaging's message quotes the line after its first line: the file's text is never echoed
            raise LockError(f"{where}: invalid requirement: {str(e).splitlines()[0]}") from None
        name = canonicalize_name(req.name)
        try:
            if req.marker is not None and not req.marker.evaluate(env):
                continue
        except Exception as e:  # packaging raises UndefinedEnvironmentName etc.
            raise LockError(f"{where}: cannot evaluate marker {req.marker}: {e}") from None
        if req.url:
            if req.url.startswith(_VCS_PREFIXES):
                raise LockError(f"{where}: {name}: VCS requirements need a build and are not hermetic; pin a wheel with a hash")
            if not hashes:
                raise LockError(f"{where}: {name}: URL requirement without a --hash; add --hash=sha256:<hex>")
            filename = req.url.rsplit("/", 1)[-1].split("#")[0]
            if not filename.endswith(".whl"):
                raise LockError(f"{where}: {name}: {filename} is not a wheel; sdists need a build, which is not hermetic")
            try:
                _, version, _, _ = parse_wheel_filename(filename)
            except InvalidWheelFilename as e:
                raise LockError(f"{where}: {name}: {e}") from None
            wheel = LockedWheel(name, str(version), frozenset(hashes), where, urls=(req.url,), filenames=(filename,))
        else:
            specs = list(req.specifier)
            if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
                shown = str(req.specifier) or "(no version)"
                raise LockError(f"{where}: {name} is not pinned with == ({shown}); lock it with: hermetic lock")
            if not hashes:
                raise LockError(f"{where}: {name}=={specs[0].version} has no --hash; regenerate the lock with hashes (hermetic lock)")
            wheel = LockedWheel(name, specs[0].version, frozenset(hashes), where)
        if name in seen:
            raise LockError(f"{where}: {name} is pinned twice (also at {seen[name]})")
        seen[name] = where
        wheels.append(wheel)
    return wheels, index_urls, find_links


def _option_line(where: str, tokens: list[str], index_urls: list[str], find_links: list[str]) -> None:
    opt, _, value = tokens[0].partition("=")
    if not value and len(tokens) > 1:
        value = tokens[1]
    if opt in ("-i", "--index-url"):
        index_urls.insert(0, value)
    elif opt == "--extra-index-url":
        index_urls.append(value)
    elif opt in ("-f", "--find-links"):
        find_links.append(value)
    elif opt in ("-e", "--editable"):
        raise LockError(f"{where}: editable requirement {value!r} is not hermetic; lock a built wheel with a hash")
    elif opt in ("-r", "--requirement", "-c", "--constraint"):
        raise LockError(f"{where}: nested file {value!r}: a lock must be one self-contained file")
    elif opt in ("--no-index", "--only-binary", "--prefer-binary", "--trusted-host", "--no-binary", "--pre", "--index-strategy"):
        if opt == "--no-binary":
            raise LockError(f"{where}: --no-binary asks for source builds, which are not hermetic")
    else:
        shown = f" {opt!r}" if re.fullmatch(r"--?[A-Za-z][\w-]*", opt) else ""
        raise LockError(f"{where}: unsupported option{shown}")
