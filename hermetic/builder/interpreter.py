"""The base image's own Python, runnable on the build host: the compiler of the image's bytecode.

Its binary, ELF loader, DT_NEEDED closure (searched as ld.so searches the base) and start-up stdlib are
copied out of the base's layers once per base (``$HERMETIC_CACHE/bases/<digest>.python/``) and started
through that loader with a fixed environment; a mapped file from outside the copy refuses the build.
Its identity (sha256 of the copy and its version) is in every layer key that holds bytecode.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import posixpath
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

from hermetic.builder.base import BaseFacts, BaseImage, member_path
from hermetic.builder.bytecode import (_LIBDIR, INTERPRETER_FORMAT, NO_BYTECODE_HINT, BaseInterpreter, BytecodeError,
                                       Compiler)
from hermetic.core.errors import ConfigError
from hermetic.hostfs.filesystems import naming_unwritable, not_one_filesystem
from hermetic.hostfs.fsutil import atomic_write_bytes, owned_temp_dir, set_mode
from hermetic.store.oci import OciStore

_DEFAULT_LIB_DIRS = ("lib64", "usr/lib64", "lib", "usr/lib", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")


# -- ELF (x86-64 and aarch64 little-endian, 64-bit: what manylinux bases are) ---------------------

@dataclass(frozen=True)
class ElfInfo:
    interpreter: str | None  # PT_INTERP: the loader's path in the image (None: static)
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]


def read_elf(data: bytes, name: str) -> ElfInfo:
    if data[:4] != b"\x7fELF":
        raise BytecodeError(f"{name} is not an ELF executable", hint=NO_BYTECODE_HINT)
    if data[4] != 2 or data[5] != 1:
        raise BytecodeError(f"{name}: only 64-bit little-endian ELF is supported", hint=NO_BYTECODE_HINT)
    try:
        phoff = struct.unpack_from("<Q", data, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads: list[tuple[int, int, int]] = []
        dynamic = None
        interp = None
        for i in range(phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
            elif p_type == 3:  # PT_INTERP
                interp = data[p_offset:p_offset + p_filesz].split(b"\0")[0].decode()
        tags: list[tuple[int, int]] = []
        if dynamic:
            off, size = dynamic
            for j in range(off, off + size, 16):
                tag, val = struct.unpack_from("<qQ", data, j)
                if tag == 0:
                    break
                tags.append((tag, val))
        strtab_vaddr = next((v for t, v in tags if t == 5), None)  # DT_STRTAB
        strtab = None
        if strtab_vaddr is not None:
            strtab = next((strtab_vaddr - va + off for va, off, sz in loads if va <= strtab_vaddr < va + sz), None)

        def string(offset: int) -> str:
            assert strtab is not None
            start = strtab + offset
            return data[start:data.index(b"\0", start)].decode()

        def strings(tag: int) -> tuple[str, ...]:
            if strtab is None:
                return ()
            out: list[str] = []
            for t, v in tags:
                if t == tag:
                    out += [s for s in string(v).split(":") if s] if tag in (15, 29) else [string(v)]
            return tuple(out)

        return ElfInfo(interp, strings(1), strings(15), strings(29))  # DT_NEEDED, DT_RPATH, DT_RUNPATH
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise BytecodeError(f"{name}: unreadable ELF headers ({e})", hint=NO_BYTECODE_HINT) from None


# -- which files, found through the base's facts (its final filesystem) ----------------------------

def _ld_conf_dirs(facts: BaseFacts, read) -> list[str]:
    """Directories from the base's /etc/ld.so.conf (with its includes), as relative paths."""
    out: list[str] = []

    def parse(path: str, depth: int = 0) -> None:
        text = read(path)
        if text is None or depth > 8:
            return
        for line in text.decode("utf-8", "replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                for pattern in line.split()[1:]:
                    pattern = posixpath.normpath(posixpath.join("/etc", pattern)).lstrip("/")
                    for f in sorted(f for f in facts.files if fnmatch.fnmatch(f, pattern)):
                        parse(f, depth + 1)
            else:
                out.append(line.strip("/"))

    parse("etc/ld.so.conf")
    return out


def _search(facts: BaseFacts, soname: str, origin: str, rpath: tuple[str, ...], runpath: tuple[str, ...],
            conf_dirs: list[str]) -> str | None:
    dirs = list(rpath if not runpath else ()) + list(runpath) + conf_dirs + list(_DEFAULT_LIB_DIRS)
    for d in dirs:
        d = d.replace("$ORIGIN", "/" + origin).replace("${ORIGIN}", "/" + origin)
        d = d.replace("$LIB", "lib64").replace("${LIB}", "lib64").replace("$PLATFORM", "x86_64")
        real = facts.resolve(posixpath.normpath(posixpath.join("/", d, soname)).lstrip("/"))
        if real is not None and real in facts.files:
            return real
    return None


# -- copying out of the layers --------------------------------------------------------------------

def _write(dest: Path, data: bytes, m: tarfile.TarInfo) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    set_mode(dest, 0o755 if m.mode & 0o111 else 0o644)
    os.utime(dest, (int(m.mtime), int(m.mtime)))  # the base's .pyc of a module names its source's mtime


class _Layers:
    """The base's files by path, from one read of its layers' headers (the last layer's copy of a path
    wins); a file is then read by seeking, in each layer's order (a gzip layer only seeks forward cheaply)."""

    def __init__(self, store: OciStore, base: BaseImage) -> None:
        self._base = base
        self._tars: list[tarfile.TarFile] = []
        self._index: dict[str, tuple[int, tarfile.TarInfo]] = {}
        try:
            for i, layer in enumerate(base.layers):
                self._tars.append(tarfile.open(store.blob_path(layer.digest), mode="r:*"))
                for m in self._tars[i]:
                    self._index[member_path(m.name)] = (i, m)
        except (OSError, tarfile.TarError) as e:
            self.close()
            raise BytecodeError(f"base {base.ref.raw}: cannot read its layer {layer.digest} ({e})") from None

    def copy_out(self, wanted: dict[str, list[Path]]) -> None:
        """Copy each wanted base file (its final content) to its destinations, following hardlinks."""
        hits = sorted((hit[0], hit[1].offset_data, name, hit[1]) for name in wanted
                      if (hit := self._index.get(name)) is not None and (hit[1].isreg() or hit[1].islnk()))
        for layer, _offset, name, m in hits:
            f = self._tars[layer].extractfile(m)
            data = f.read() if f is not None else b""
            for dest in wanted[name]:
                _write(dest, data, m)
        missing = [name for name, dests in wanted.items() if not all(p.is_file() for p in dests)]
        if missing:
            raise BytecodeError(f"base {self._base.ref.raw}: could not copy /{missing[0]} out of its layers",
                                hint=NO_BYTECODE_HINT)

    def close(self) -> None:
        for tf in self._tars:
            tf.close()


def _tree_sha256(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def base_interpreter(store: OciStore, base: BaseImage, facts: BaseFacts, python_path: str, python_version: str,
                     cache_dir: Path, tmp_dir: Path) -> BaseInterpreter:
    """The base's interpreter, copied out once per base (cached by manifest digest) and checked to run."""
    final = cache_dir / f"{base.manifest_digest.split(':')[1]}.python"
    cached = _current(final)
    if cached is not None:
        return cached
    real = facts.resolve(python_path)
    if real is None or real not in facts.files:
        raise ConfigError(f"base {base.ref.raw}: python.path {python_path} is not a file in the image",
                          hint="set python.path in hermetic.yaml to the base's interpreter (the bootstrapped Debian base's is /usr/bin/python3)")
    home = posixpath.dirname(posixpath.dirname(real))
    stdlib = posixpath.join(home, "lib", f"python{python_version}")
    if facts.resolve(f"{stdlib}/os.py") is None:
        others = sorted({f.split("/")[-2] for f in facts.files
                         if f.startswith(f"{home}/lib/python") and f.endswith("/os.py") and f.count("/") == home.count("/") + 3})
        has = f"it has {', '.join(f'/{home}/lib/{o}' for o in others)}" if others else "it has none beside it"
        raise ConfigError(f"base {base.ref.raw}: hermetic.yaml says python.version {python_version}, but there is "
                          f"no /{stdlib} for python.path {python_path} ({has})",
                          hint="set python.version to the base's Python")
    # The modules it reads at start-up, with the base's own .pyc of them: the compiler's state (which
    # strings are interned, so how marshal writes them) must be what it is in the image.
    startup = {f for f in facts.files if posixpath.dirname(f) in (stdlib, f"{stdlib}/__pycache__")}
    startup |= {f for f in facts.files if f.startswith(f"{stdlib}/encodings/")}
    with naming_unwritable(cache_dir):
        cache_dir.mkdir(parents=True, exist_ok=True)
    layers = _Layers(store, base)
    try:
        with owned_temp_dir(tmp_dir, "interpreter.") as tmp:
            root = Path(tmp) / "root"

            def at(rel: str) -> Path:
                return root / rel

            # The binary, the start-up modules, ld.so.conf.
            first: dict[str, list[Path]] = {real: [at(real)]}
            ld_conf = {f for f in facts.files if f == "etc/ld.so.conf" or f.startswith("etc/ld.so.conf.d/")}
            for f in startup | ld_conf:
                first.setdefault(f, []).append(at(f))
            layers.copy_out(first)
            (root / stdlib / "lib-dynload").mkdir(parents=True, exist_ok=True)  # the prefix landmark; nothing is loaded from it

            def read(rel: str) -> bytes | None:
                p = at(rel)
                return p.read_bytes() if p.is_file() else None

            conf_dirs = _ld_conf_dirs(facts, read)
            elf = read_elf(read(real) or b"", f"/{real}")
            loader = None
            if elf.interpreter:
                loader = facts.resolve(elf.interpreter)
                if loader is None or loader not in facts.files:
                    raise BytecodeError(f"base {base.ref.raw}: /{real} needs the loader {elf.interpreter}, "
                                        "which the image lacks", hint=NO_BYTECODE_HINT)
                layers.copy_out({loader: [at(loader)]})
            # Then the libraries, level by level, until DT_NEEDED's closure is complete.
            found: dict[str, str] = {}  # soname -> its file in the base
            todo = [(real, elf)]
            while todo:
                level: dict[str, list[Path]] = {}
                for obj, info in todo:
                    for soname in info.needed:
                        if soname in found:
                            continue
                        lib = _search(facts, soname, posixpath.dirname(obj), info.rpath, info.runpath, conf_dirs)
                        if lib is None:
                            raise BytecodeError(f"base {base.ref.raw}: /{obj} needs {soname}, which is not in the image",
                                                hint=NO_BYTECODE_HINT)
                        found[soname] = lib
                        level.setdefault(lib, []).append(root / _LIBDIR / soname)
                layers.copy_out(level)
                todo = [(lib, read_elf(dests[0].read_bytes(), f"/{lib}")) for lib, dests in level.items()]
            probe = BaseInterpreter(root, loader, real, home, "", "", "", (0, 0, 0))  # run once where it is now
            with Compiler.start(probe, "unchecked-hash") as c:
                hello = c.hello
            version = tuple(hello["version"][:3])
            if f"{version[0]}.{version[1]}" != python_version:
                raise ConfigError(f"base {base.ref.raw}: python.path {python_path} is Python "
                                  f"{'.'.join(map(str, version))}, but hermetic.yaml says python.version {python_version}",
                                  hint="set python.version to the base's Python")
            identity = hashlib.sha256(json.dumps({"files": _tree_sha256(root), "version": hello["version"],
                                                  "magic": hello["magic"]}, sort_keys=True).encode()).hexdigest()
            interp = BaseInterpreter(final, loader, real, home, identity, hello["magic"], hello["cache_tag"], version)  # type: ignore[arg-type]
            atomic_write_bytes(root / "interpreter.json", json.dumps(interp.to_json(), sort_keys=True).encode(), fsync=False)
            try:
                os.rename(root, final)
            except OSError as e:
                if e.errno == errno.EXDEV:  # bases/ mounted or symlinked apart from the cache's tmp/
                    raise not_one_filesystem(root, final) from None
                if _current(final) is None:  # a stale copy (an older format): ours replaces it
                    os.rename(final, Path(tmp) / "stale")
                    os.rename(root, final)
                # else another build finished the same copy first: use it
    finally:
        layers.close()
    done = _current(final)
    if done is None:
        raise BytecodeError(f"base {base.ref.raw}: the copy of its interpreter at {final} is unreadable")
    return done


def _current(final: Path) -> BaseInterpreter | None:
    """The copy at ``final`` if it is complete and of this format."""
    try:
        d = json.loads((final / "interpreter.json").read_text())
        return BaseInterpreter.from_json(final, d) if d.get("format") == INTERPRETER_FORMAT else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
