"""PEP 552 bytecode for every installed module, compiled by the image's own interpreter.

Hash-based .pyc files (no timestamp) beside each site-packages ``.py``, compiled from its final in-image
path by the base's interpreter (interpreter.py copies it; hermetic/inimage/pyc_server.py is what it runs),
one compiler per layer fed in tar order so the compile overlaps the tar writing. Not in RECORD.
"""

from __future__ import annotations

import errno
import io
import json
import os
import posixpath
import subprocess
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hermetic.builder.baseinterp import NO_BYTECODE_HINT, BaseInterpreter, BytecodeError, check_maps
from hermetic.builder.tarlayer import Entry
from hermetic.hostfs.filesystems import filesystem_of

MODES = ("unchecked-hash", "checked-hash")
SERVER = Path(__file__).resolve().parent.parent / "inimage" / "pyc_server.py"


def pyc_path(py_path: str, cache_tag: str) -> str:
    """Where the interpreter looks for a module's bytecode (importlib.util.cache_from_source)."""
    head, tail = posixpath.split(py_path)
    stem = tail.rpartition(".")[0]
    return posixpath.join(head, "__pycache__", f"{stem}.{cache_tag}.pyc")


def pyc_flags(data: bytes) -> int:
    """The PEP 552 flags word: 0 timestamp-based, 1 unchecked hash, 3 checked hash."""
    return int.from_bytes(data[4:8], "little")


@dataclass(frozen=True)
class BytecodeSpec:
    """What a layer worker needs to compile (picklable): the interpreter and the mode."""

    interpreter: BaseInterpreter
    mode: str

    def key_part(self) -> dict[str, str]:
        """The part of a layer key that decides the .pyc bytes."""
        return {"mode": self.mode, "compiler": self.interpreter.identity}


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
    """One compiler process of the base's interpreter; sources in, .pyc bytes out, pipelined."""

    def __init__(self, interp: BaseInterpreter, mode: str, proc: subprocess.Popen) -> None:
        self.interp = interp
        self.mode = mode
        self._proc = proc
        self._results: dict[int, tuple[int, bytes]] = {}
        self._failed: BaseException | None = None
        self._done = threading.Condition()
        self._threads: list[threading.Thread] = []
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

    def _died(self) -> BytecodeError:
        self._proc.kill()
        err = self._proc.stderr.read().decode("utf-8", "replace") if self._proc.stderr else ""
        code = self._proc.wait()
        tail = " ".join(err.strip().splitlines()[-3:]) or f"exit status {code}"
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

    # -- pipelined use: submit everything, then take results in order ---------------------------

    def submit(self, jobs: list[tuple[str, Callable[[], bytes]]]) -> None:
        """Compile ``jobs`` ([(in-image path, source)]) in order, in the background."""
        def feed() -> None:
            stdin = self._proc.stdin
            assert stdin is not None
            try:
                for path, source in jobs:
                    data = source()
                    p = path.encode("utf-8", "surrogateescape")
                    stdin.write(len(p).to_bytes(4, "little") + p + len(data).to_bytes(4, "little"))
                    stdin.write(data)
                stdin.close()
            except BaseException as e:  # a bad zip member, or the compiler died (BrokenPipeError)
                self._fail(e)
                try:
                    stdin.close()
                except OSError:
                    pass

        def collect() -> None:
            try:
                for i in range(len(jobs)):
                    head = self._read_exact(5)
                    data = self._read_exact(int.from_bytes(head[1:], "little"))
                    with self._done:
                        self._results[i] = (head[0], data)
                        self._done.notify_all()
            except BaseException as e:
                self._fail(e)

        for target in (feed, collect):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def _fail(self, e: BaseException) -> None:
        with self._done:
            if self._failed is None:
                self._failed = e
            self._done.notify_all()

    def result(self, i: int) -> bytes | None:
        """Job ``i``'s .pyc, or None when its source does not compile (waits for it)."""
        with self._done:
            while i not in self._results and self._failed is None:
                self._done.wait()
            if i in self._results:
                status, data = self._results.pop(i)
                return data if status == 0 else None
            failed = self._failed
        if isinstance(failed, (BrokenPipeError, BytecodeError)):
            raise failed if isinstance(failed, BytecodeError) else self._died()
        raise failed  # type: ignore[misc]

    def compile_all(self, jobs: list[tuple[str, bytes]]) -> list[bytes | None]:
        self.submit([(path, (lambda s=src: s)) for path, src in jobs])
        return [self.result(i) for i in range(len(jobs))]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                if self._proc.stdin and not self._proc.stdin.closed:
                    self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for t in self._threads:
            t.join(timeout=5)
        for f in (self._proc.stdout, self._proc.stderr):
            if f:
                f.close()

    def __enter__(self) -> "Compiler":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None and self._proc.poll() is None:
            self._proc.kill()
        self.close()


# -- a layer's entries, with their bytecode ------------------------------------------------------

def add_bytecode(entries: list[Entry], site_packages: str, spec: BytecodeSpec,
                 reopen: dict[str, Callable[[], bytes]]) -> tuple[list[Entry], Compiler | None]:
    """``entries`` plus a .pyc entry for every .py under ``site_packages``, compiling in the background.

    ``reopen`` gives, for an entry's path, a way to read its source that is
    safe from another thread (the feeder's own zip handle); the bytes read are
    kept so that the tar's .py entry does not decompress them again. The caller
    closes the returned compiler once the layer is written.
    """
    root = site_packages.strip("/") + "/"
    have = {e.path for e in entries}
    jobs: list[tuple[str, str]] = []
    for e in entries:
        if e.kind == "file" and e.path.startswith(root) and e.path.endswith(".py"):
            pyc = pyc_path(e.path, spec.interpreter.cache_tag)
            if pyc not in have:  # a wheel that ships its own .pyc keeps it (RECORD names it)
                jobs.append((pyc, e.path))
    if not jobs:
        return entries, None
    jobs.sort(key=lambda j: j[0].encode("utf-8", "surrogateescape"))  # the order the tar writer needs them in
    compiled = {path for _pyc, path in jobs}
    compiler = Compiler.start(spec.interpreter, spec.mode)
    read_once: dict[str, bytes] = {}

    def source_of(path: str) -> Callable[[], bytes]:
        def read() -> bytes:
            data = reopen[path]()
            read_once[path] = data
            return data
        return read

    compiler.submit([("/" + path, source_of(path)) for _pyc, path in jobs])
    out = []
    for e in entries:
        if e.path in compiled:
            original = e.open

            def cached_open(path: str = e.path, original: Callable | None = original):
                data = read_once.pop(path, None)
                if data is None:  # the tar got here before the compiler's feeder did
                    assert original is not None
                    return original()
                return io.BytesIO(data)
            e = Entry(e.path, e.kind, e.mode, e.uid, e.gid, e.size, e.linkname, cached_open)
        out.append(e)
    for i, (pyc, _path) in enumerate(jobs):
        out.append(Entry(pyc, "file", 0o644, produce=(lambda i=i: compiler.result(i))))
    return out, compiler


class ZipMembers:
    """A wheel's members read through a zip handle of its own (for the compiler's feeder thread)."""

    def __init__(self, wheel: Path) -> None:
        self._wheel = wheel
        self._zf: zipfile.ZipFile | None = None
        self._lock = threading.Lock()

    def reader(self, name: str) -> Callable[[], bytes]:
        def read() -> bytes:
            with self._lock:
                if self._zf is None:
                    self._zf = zipfile.ZipFile(self._wheel)
                zf = self._zf
            return zf.read(name)
        return read

    def close(self) -> None:
        with self._lock:
            if self._zf is not None:
                self._zf.close()
                self._zf = None
