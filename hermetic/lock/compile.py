"""``hermetic lock``: resolve requirements for the image's platform with uv (or pip-tools, where the host's
Python is the image's). Index lines stay in the lock; an index that does not answer here is left out of this
resolution with a warning (the hashes keep other sources safe). The lock is a function of the input's content,
the target and the versions, byte for byte: existing pins are kept unless ``--upgrade``, and the input's name
never appears in it. The resolver runs in the input's directory, so its relative paths mean what pip reads.
"""

from __future__ import annotations

import errno
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hermetic.core.errors import LockError, NotFound, Unavailable, UsageError, disk_full
from hermetic.hostfs.fsutil import OwnedTemp, atomic_write_text, sweep_dead
from hermetic.lock.indexes import read_pip_sources, reachable
from hermetic.lock.model import Target
from hermetic.lock.read import lock_format, read_lock
from hermetic.lock.torchbuild import TorchBuild, mismatched_companions, torch_build


INPUT_LABEL = "<input>"  # how the lock names the requirements file it was made from
_TMP_PREFIX = ".hermetic-lock."


@dataclass
class CompileResult:
    output: Path
    packages: int
    resolver: str
    warnings: list[str] = field(default_factory=list)
    torch: TorchBuild | None = None  # which torch build the lock holds (hermetic.lock.torchbuild)


def find_input(root: Path) -> Path:
    for name in ("requirements.in", "pyproject.toml"):
        if (root / name).is_file():
            return root / name
    raise NotFound(f"{root}: no requirements.in or pyproject.toml to lock (pass one: hermetic lock FILE)")


def _split_index_lines(text: str) -> tuple[list[str], list[str], list[str]]:
    """(index option lines, find-links, the rest) of a requirements.in."""
    index_lines, find_links, rest = [], [], []
    for line in text.splitlines():
        s = line.strip()
        try:
            toks = shlex.split(s, comments=True)
        except ValueError:
            toks = []
        if toks and toks[0].split("=")[0] in ("-i", "--index-url", "--extra-index-url"):
            index_lines.append(" ".join(toks))
            continue
        if toks and toks[0].split("=")[0] in ("-f", "--find-links"):
            find_links.append(toks[0].partition("=")[2] or (toks[1] if len(toks) > 1 else ""))
            continue
        rest.append(line)
    return index_lines, find_links, rest


def uv_binary() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        import shutil

        found = shutil.which("uv")
        if not found:
            raise Unavailable("uv is not installed; install hermetic's dependencies (make venv) or `pip install uv`") from None
        return found


def compile_lock(input_path: Path, output_path: Path, target: Target, *, resolver: str = "uv",
                 upgrade: bool = False, check_indexes: bool = True, pip_find_links: bool = True) -> CompileResult:
    """``pip_find_links=False`` resolves without the find-links directories of pip's configuration
    (a machine whose local wheel directory holds ``torch-X+cpu`` would otherwise always win over
    PyPI's CUDA build of the same version: a local version sorts above the plain one)."""
    if not input_path.is_file():
        raise NotFound(f"{input_path}: no such input file")
    fmt = lock_format(output_path)
    if fmt == "uv.lock":
        raise UsageError(f"{output_path}: hermetic lock writes requirements.txt-style or pylock.toml locks; "
                        "for uv.lock run `uv lock` in your project (hermetic reads uv.lock as it is)")
    warnings: list[str] = []
    text = input_path.read_text(encoding="utf-8")
    pip = read_pip_sources()
    # pip's configured find-links mean paths from here; the resolver runs in the input's directory.
    find_links = [f if "://" in f or not Path(f).exists() else str(Path(f).resolve())
                  for f in (pip.find_links if pip_find_links else ())]
    for d in {input_path.parent, output_path.parent}:
        sweep_dead(d, lambda name: name.startswith(_TMP_PREFIX))  # a killed lock's files
    tmp_input: OwnedTemp | None = None
    if input_path.name == "pyproject.toml":
        index_lines: list[str] = []
        resolve_input = input_path
    else:
        index_lines, in_find_links, rest = _split_index_lines(text)
        find_links += in_find_links
        keep = []
        for line in index_lines:
            toks = line.split()
            url = toks[0].partition("=")[2] or (toks[1] if len(toks) > 1 else "")
            if check_indexes and not reachable(url):
                warnings.append(f"index {url} does not answer from this machine; resolving without it "
                                f"(its packages must come from pip's configured sources; hashes still decide)")
                continue
            keep.append(line)
        # Beside the input, so that its relative paths still hold.
        tmp_input = OwnedTemp(input_path.parent, _TMP_PREFIX, ".in", mode=0o644)
        with tmp_input.open("w", encoding="utf-8") as f:
            f.write("\n".join(keep + rest) + "\n")
        resolve_input = tmp_input.path
    out = OwnedTemp(output_path.parent, _TMP_PREFIX, ".out")
    tmp_out = str(out.path)
    if not upgrade and output_path.is_file():
        # The current pins, as preferences: re-locking unchanged input gives the same lock.
        with out.open("wb") as f:
            f.write(output_path.read_bytes())
    try:
        if resolver == "uv":
            cmd = [uv_binary(), "pip", "compile", resolve_input.name, "--generate-hashes", "--no-header",
                   "--python-platform", target.platform, "--python-version", target.python_version,
                   "--only-binary", ":all:", "--quiet", "-o", tmp_out]
            if fmt == "pylock.toml":
                cmd += ["--format", "pylock.toml"]
        elif resolver == "pip-tools":
            host = f"{sys.version_info.major}.{sys.version_info.minor}"
            if host != target.python_version:
                raise UsageError(f"pip-tools resolves for the running interpreter (Python {host}), "
                                f"but the image runs Python {target.python_version}; use --resolver uv")
            if fmt != "requirements":
                raise UsageError("pip-tools writes requirements.txt-style locks only")
            cmd = [sys.executable, "-m", "piptools", "compile", resolve_input.name, "--generate-hashes",
                   "--no-header", "--no-emit-find-links", "--no-emit-index-url", "--pip-args", "--only-binary :all:",
                   "--quiet", "-o", tmp_out]
        else:
            raise UsageError(f"unknown resolver {resolver!r} (uv or pip-tools)")
        if upgrade:
            cmd.append("--upgrade")
        for fl in find_links:
            cmd += ["--find-links", fl]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=input_path.parent)
        except FileNotFoundError as e:
            raise Unavailable(f"cannot run the resolver: {e}") from None
        if proc.returncode != 0:
            if resolver == "pip-tools" and "No module named piptools" in proc.stderr:
                raise Unavailable("pip-tools is not installed (pip install pip-tools), or use --resolver uv")
            detail = _first_error(proc.stderr) or f"exit {proc.returncode}"
            for code, words in ((errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "Disk quota exceeded")):
                if words in proc.stderr:  # the resolver writes the lock's temp file beside it: a full disk, not a bad lock
                    raise disk_full(OSError(code, words), output_path.parent,
                                    what=f"{output_path.name} (the resolver: {detail})")
            # The indexes left out are often why (a +cpu wheel only download.pytorch.org has): say so.
            raise LockError(f"{input_path}: resolution failed: {detail}", details=warnings)
        body = Path(tmp_out).read_text(encoding="utf-8")
        if tmp_input is not None:
            # However the resolver spells the temporary input's path, the lock says <input>.
            body = re.sub(r"\S*" + re.escape(tmp_input.path.name), INPUT_LABEL, body)
        out_text = _with_header(body, fmt, input_path, output_path, target, resolver, index_lines)
        # Refuse to write a lock we could not read back (same file name: it selects the format).
        with tempfile.TemporaryDirectory(prefix="hermetic-lockcheck.") as check_dir:
            check = Path(check_dir) / output_path.name
            check.write_text(out_text, encoding="utf-8")
            lock = read_lock(check, target)
        atomic_write_text(output_path, out_text)
        torch = torch_build(lock)
        warnings += mismatched_companions(lock, torch)
        return CompileResult(output_path, len(lock.wheels), resolver, warnings, torch)
    finally:
        out.discard()
        if tmp_input is not None:
            tmp_input.discard()


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("error:", "×", "ERROR")):
            rest = [x for x in lines[lines.index(ln) + 1:] if x.startswith(("╰─▶", "Because", "hint", "cause:"))]
            msg = ln.removeprefix("error:").removeprefix("×").strip()
            if rest:  # uv's reason: `╰─▶ Because ...` (pip-style) or `cause: Because ...` (newer uv)
                msg += ": " + rest[0].removeprefix("╰─▶").removeprefix("cause:").strip()
            return msg
    return lines[-1] if lines else ""


def _with_header(body: str, fmt: str, input_path: Path, output_path: Path, target: Target,
                 resolver: str, index_lines: list[str]) -> str:
    from hermetic import __version__

    note = (f"Generated by hermetic {__version__} (`hermetic lock`, resolver: {resolver}) for {target.platform} / "
            f"CPython {target.python_version}.\nDo not edit: rerun hermetic lock.")
    if input_path.name != "pyproject.toml":
        note += f" {INPUT_LABEL}: the input file (its name and place are not part of the lock)."
    header = "".join(f"# {ln}\n" for ln in note.splitlines())
    if fmt != "pylock.toml":  # (pylock.toml names each package's index itself)
        header += "".join(line + "\n" for line in index_lines)
    return header + body
