"""PEP 552 bytecode for every installed module, compiled by the image's own interpreter.

Hash-based .pyc files (no timestamp) beside each site-packages ``.py``, compiled from its final in-image
path by the base's interpreter (interpreter.py copies it out: ``BaseInterpreter``; hermetic/inimage/pyc_server.py
is what it runs), one compiler per layer. Not in RECORD.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import posixpath
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hermetic.builder.inputs import COMPILER_FORMAT
from hermetic.builder.tarlayer import Entry
from hermetic.core.errors import Unavailable
from hermetic.hostfs.filesystems import filesystem_of

INTERPRETER_FORMAT = COMPILER_FORMAT
NO_BYTECODE_HINT = "set `build.bytecode: none` in hermetic.yaml to build the image without bytecode"
_LIBDIR = ".lib"  # inside the copy: every needed library under its soname
_ENV = {  # the whole environment of the compiler: nothing of the host's
    "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
    "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "1", "LC_ALL": "C", "PATH": "/nonexistent",
}


class BytecodeError(Unavailable):
    """The base's interpreter cannot be found, copied or run on this host (EX_UNAVAILABLE)."""


@dataclass(frozen=True)
class BaseInterpreter:
    """The base's python, copied out and runnable here; what it reported when it first ran."""

    root: Path
    loader: str | None  # relative to root
    executable: str  # relative to root
    home: str  # relative to root: the prefix (PYTHONHOME), e.g. "usr"
    identity: str
    magic: str
    cache_tag: str
    version: tuple[int, int, int]

    def argv(self, *args: str) -> list[str]:
        exe = str(self.root / self.executable)
        if self.loader is None:
            return [exe, *args]
        loader = str(self.root / self.loader)
        inhibit = ["--inhibit-cache"] if "ld-linux" in posixpath.basename(self.loader) else []
        return [loader, *inhibit, "--library-path", str(self.root / _LIBDIR), exe, *args]

    def env(self) -> dict[str, str]:
        return {**_ENV, "PYTHONHOME": str(self.root / self.home)}

    def to_json(self) -> dict[str, Any]:
        return {"format": INTERPRETER_FORMAT, "loader": self.loader, "executable": self.executable, "home": self.home,
                "identity": self.identity, "magic": self.magic, "cache_tag": self.cache_tag,
                "version": list(self.version)}

    @classmethod
    def from_json(cls, root: Path, d: dict[str, Any]) -> "BaseInterpreter":
        return cls(root, d["loader"], d["executable"], d["home"], d["identity"], d["magic"], d["cache_tag"],
                   tuple(d["version"]))  # type: ignore[arg-type]


def check_maps(maps: list[str], root: Path) -> None:
    """Every file mapped into the compiler comes from the copy of the base."""
    prefix = str(root.resolve()) + os.sep
    for path in maps:
        if path.startswith("/proc/"):
            continue
        if not os.path.realpath(path).startswith(prefix):
            raise BytecodeError(f"the base's interpreter loaded {path} from this host, not from the image; "
                                "refusing to compile with it", hint=NO_BYTECODE_HINT)


MODES = ("unchecked-hash", "checked-hash")
SERVER = Path(__file__).resolve().parent.parent / "inimage" / "pyc_server.py"


def pyc_path(py_path: str, cache_tag: str) -> str:
    """Where the interpreter looks for a module's bytecode (importlib.util.cache_from_source)."""
    head, tail = posixpath.split(py_path)
    stem = tail.rpartition(".")[0]
    return posixpath.join(head, "__pycache__", f"{stem}.{cache_tag}.pyc")


@dataclass(frozen=True)
class BytecodeSpec:
    """What compiling a layer's bytecode needs: the interpreter and the mode."""

    interpreter: BaseInterpreter
    mode: str


def _cannot_start(interp: BaseInterpreter, e: OSError) -> BytecodeError:
    """Why the copy of the base's interpreter (under HERMETIC_CACHE/bases) did not start: a cache on a
    filesystem mounted noexec (a hardened home or /tmp) is named as such."""
    try:
        noexec = e.errno in (errno.EACCES, errno.EPERM) and bool(os.statvfs(interp.root).f_flag & os.ST_NOEXEC)
    except OSError:
        noexec = False
    if noexec:
        found = filesystem_of(interp.root)
        where = f"{found[1]} at {found[0]}" if found is not None else "its filesystem"
        return BytecodeError(f"cannot run the base's interpreter /{interp.executable} on this host: its copy in "
                             f"{interp.root} is on a filesystem mounted noexec ({where})",
                             hint="set HERMETIC_CACHE to a directory on a filesystem that allows running programs, "
                             "or " + NO_BYTECODE_HINT)
    return BytecodeError(f"cannot run the base's interpreter /{interp.executable} on this host: {e}",
                         hint=NO_BYTECODE_HINT)


class Compiler:
    """One compiler process of the base's interpreter: sources in, .pyc bytes out."""

    def __init__(self, interp: BaseInterpreter, mode: str, proc: subprocess.Popen) -> None:
        self.interp = interp
        self.mode = mode
        self._proc = proc
        self.hello = self._read_hello()
        check_maps(list(self.hello.get("maps") or []), interp.root)

    @classmethod
    def start(cls, interp: BaseInterpreter, mode: str) -> "Compiler":
        if mode not in MODES:
            raise ValueError(mode)
        try:
            proc = subprocess.Popen(interp.argv("-S", "-s", "-c", SERVER.read_text(), mode), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=interp.env(),
                                    cwd=str(interp.root), close_fds=True)
        except OSError as e:
            raise _cannot_start(interp, e) from None
        return cls(interp, mode, proc)

    def _read_exact(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        data = self._proc.stdout.read(n)
        if len(data) != n:
            raise self._died()
        return data

    def _died(self, err: bytes | None = None) -> BytecodeError:
        """Why it stopped: the end of what it wrote to stderr (read here, after killing it, unless given)."""
        if err is None:
            self._proc.kill()
            err = self._proc.stderr.read()  # type: ignore[union-attr]
        tail = " ".join(err.decode("utf-8", "replace").strip().splitlines()[-3:]) or f"exit status {self._proc.wait()}"
        return BytecodeError(f"the base's interpreter /{self.interp.executable} stopped while compiling: {tail}",
                             hint=NO_BYTECODE_HINT)

    def _read_hello(self) -> dict:
        n = int.from_bytes(self._read_exact(4), "little")
        hello = json.loads(self._read_exact(n).decode("utf-8", "surrogateescape"))
        if self.interp.magic and (hello["magic"], hello["cache_tag"]) != (self.interp.magic, self.interp.cache_tag):
            raise BytecodeError(f"the base's interpreter /{self.interp.executable} now reports magic "
                                f"{hello['magic']} ({hello['cache_tag']}), not the {self.interp.magic} it was copied "
                                "with; remove its copy under $HERMETIC_CACHE/bases and build again")
        return hello

    def compile_all(self, jobs: list[tuple[str, bytes]]) -> list[bytes | None]:
        """The .pyc of each job (in-image path, source), or None where its source does not compile; the
        compiler ends with the batch."""
        frames = []
        for path, data in jobs:
            p = path.encode("utf-8", "surrogateescape")
            frames += [len(p).to_bytes(4, "little"), p, len(data).to_bytes(4, "little"), data]
        out, err = self._proc.communicate(b"".join(frames))
        answers: list[bytes | None] = []
        pos = 0
        for _ in jobs:
            n = int.from_bytes(out[pos + 1:pos + 5], "little")
            if pos + 5 + n > len(out):
                raise self._died(err)
            answers.append(out[pos + 5:pos + 5 + n] if out[pos] == 0 else None)
            pos += 5 + n
        return answers

    def close(self) -> None:
        with contextlib.suppress(OSError):  # (a dead compiler's pipe)
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()  # type: ignore[union-attr]
        self._proc.stderr.close()  # type: ignore[union-attr]

    def __enter__(self) -> "Compiler":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None and self._proc.poll() is None:
            self._proc.kill()
        self.close()


# -- a layer's entries, with their bytecode ------------------------------------------------------

def add_bytecode(entries: list[Entry], site_packages: str, spec: BytecodeSpec) -> list[Entry]:
    """``entries`` plus a .pyc entry for every .py under ``site_packages`` that compiles."""
    root = site_packages.strip("/") + "/"
    have = {e.path for e in entries}
    out, jobs = [], []
    for e in entries:
        pyc = pyc_path(e.path, spec.interpreter.cache_tag)
        # (a wheel that ships its own .pyc keeps it: RECORD names it)
        if e.kind == "file" and e.path.startswith(root) and e.path.endswith(".py") and pyc not in have:
            assert e.open is not None
            with e.open() as f:
                data = f.read()
            e = replace(e, open=lambda d=data: io.BytesIO(d))  # (the tar takes the bytes read here)
            jobs.append((pyc, "/" + e.path, data))
        out.append(e)
    if not jobs:
        return entries
    with Compiler.start(spec.interpreter, spec.mode) as compiler:
        pycs = compiler.compile_all([(path, data) for _pyc, path, data in jobs])
    return out + [Entry(pyc, "file", 0o644, size=len(code), open=lambda c=code: io.BytesIO(c))
                  for (pyc, _path, _src), code in zip(jobs, pycs) if code is not None]
