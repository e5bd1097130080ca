"""The bytecode compiler the base image's own interpreter runs (``-S -s -c``; never imported by hermetic).

Builtins only (no site, no stdlib imports; any CPython >= 3.7), so the compiler's state, and so every byte it
writes, depends on the interpreter alone. Over stdin/stdout, lengths as little-endian u32: hello <- JSON {magic,
cache_tag, version, maps}; request -> path (the file's final in-image path), source; answer <- 0 and a PEP 552
hash-based .pyc (co_filename = path, as py_compile writes it), or 1 and why the source does not compile. EOF ends it.
"""

import _imp
import sys

_external = sys.modules["_frozen_importlib_external"]
_stdin = sys.stdin.buffer
_stdout = sys.stdout.buffer


def _read_exact(n):
    chunks = []
    while n:
        b = _stdin.read(n)
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _u32(n):
    return n.to_bytes(4, "little")


def _send(status, data):
    _stdout.write(bytes((status,)) + _u32(len(data)) + data)


def _maps():
    """The files mapped into this process (the interpreter, its loader and libraries)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in out:
            out.append(parts[5])
    return out


def _hello():
    v = sys.version_info
    doc = ('{"magic": "%s", "cache_tag": "%s", "version": [%d, %d, %d, "%s", %d], "maps": [%s]}' % (
        _external.MAGIC_NUMBER.hex(), sys.implementation.cache_tag, v[0], v[1], v[2], v[3], v[4],
        ", ".join('"%s"' % p.replace("\\", "\\\\").replace('"', '\\"') for p in _maps())))
    data = doc.encode("utf-8", "surrogateescape")
    _stdout.write(_u32(len(data)) + data)
    _stdout.flush()


def main():
    checked = sys.argv[1] == "checked-hash"
    _hello()
    while True:
        head = _read_exact(4)
        if head is None:
            break
        path = _read_exact(int.from_bytes(head, "little")).decode("utf-8", "surrogateescape")
        source = _read_exact(int.from_bytes(_read_exact(4), "little"))
        try:
            code = compile(source, path, "exec", dont_inherit=True)
        except Exception as e:  # SyntaxError, ValueError (null bytes), ...: pip skips such files too
            _send(1, ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace"))
        else:
            data = _external._code_to_hash_pyc(code, _imp.source_hash(_external._RAW_MAGIC_NUMBER, source), checked)
            del code  # freed before the next file: each file is compiled from the same state
            _send(0, bytes(data))
        _stdout.flush()


if __name__ == "__main__":
    main()
