"""Wheels become layer entries straight from the zip; the bytes equal a real installer run."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from hermetic.builder.install import VenvLayout, wheel_files
from hermetic.builder.layers import LayerSpec, build_layer
from hermetic.builder.tarlayer import DIR_MODE, Entry, complete_parents, normalized_mode, write_layer
from hermetic.core.errors import DataError, HermeticError
from hermetic.lock.model import LockedWheel, ResolvedWheel
from hermetic.store.oci import OciStore
from wheelfactory import make_wheel, sha256_of

LAYOUT = VenvLayout("/opt/venv", "3.11", "/usr/bin/python3")


def resolved(path: Path, name: str, version: str) -> ResolvedWheel:
    sha = sha256_of(path)
    return ResolvedWheel(LockedWheel(name, version, frozenset([sha])), path.name, sha, path.stat().st_size, str(path))


def rich_wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path, "gamma", "1.0", console_scripts={"gamma-cli": "gamma:main"}, files={
        "gamma/tool.sh": b"#!/bin/sh\necho hi\n",
        "gamma-1.0.data/scripts/gamma-raw": b"#!python\nprint('raw')\n",
        "gamma-1.0.data/headers/gamma.h": b"int gamma(void);\n",
        "gamma-1.0.data/data/share/gamma/notes.txt": b"notes\n",
        "gamma/sub/deep.py": b"X = 1\n",
    })


def entries_from_dir(root: Path, prefix: str = "") -> list[Entry]:
    """Files, dirs and symlinks under ``root`` as normalized entries at ``prefix``/...

    Ownership and times are dropped; modes collapse to 0644/0755; a symlink
    keeps its target text. Sockets, FIFOs and devices are refused.
    """
    out: list[Entry] = []
    root = Path(root)
    base = prefix.strip("/")
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = f"{base}/{rel}" if base else rel
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out.append(Entry(path, "symlink", 0o777, linkname=os.readlink(full)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(Entry(path, "dir", DIR_MODE))
            elif stat.S_ISREG(st.st_mode):
                out.append(Entry(path, "file", normalized_mode(st.st_mode), size=st.st_size,
                                 open=(lambda f=full: open(f, "rb"))))
            else:
                raise DataError(f"{full}: not a regular file, directory or symlink; refusing to put it in a layer")
    return out


def _digest_of_installer_tree(wheel: Path, tmp: Path) -> str:
    """Reference: pypa/installer writing a real directory, then the same normalized tar."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    staging = tmp / "staging"
    with WheelFile.open(wheel) as source:
        dest = SchemeDictionaryDestination(LAYOUT.scheme(source.distribution), interpreter=LAYOUT.interpreter,
                                           script_kind="posix", destdir=str(staging))
        install(source, dest, additional_metadata={"INSTALLER": b"hermetic\n"})
    h = hashlib.sha256()

    class Sink:
        def write(self, b):
            h.update(b)
            return len(b)

    write_layer(complete_parents(entries_from_dir(staging)), Sink(), mtime=0)
    return "sha256:" + h.hexdigest()


def test_layer_equals_installer_on_disk(tmp_path):
    wheel = rich_wheel(tmp_path / "w")
    desc = build_layer(LayerSpec("wheel", [resolved(wheel, "gamma", "1.0")], "gamma"), LAYOUT, {}, 0,
                       OciStore(tmp_path / "store").ensure())
    assert desc.digest == _digest_of_installer_tree(wheel, tmp_path)


def test_paths_scripts_and_metadata(tmp_path):
    wheel = rich_wheel(tmp_path / "w")
    zf, files = wheel_files(wheel, LAYOUT)
    zf.close()
    sp = LAYOUT.site_packages
    assert files[f"{sp}/gamma/sub/deep.py"].member == "gamma/sub/deep.py"
    raw = files["/opt/venv/bin/gamma-raw"]
    assert raw.data is not None and raw.data.startswith(b"#!/opt/venv/bin/python\n")
    cli = files["/opt/venv/bin/gamma-cli"]
    assert cli.executable and cli.data.startswith(b"#!/opt/venv/bin/python\n")
    assert "/opt/venv/include/site/python3.11/gamma/gamma.h" in files
    assert "/opt/venv/share/gamma/notes.txt" in files
    assert files[f"{sp}/gamma-1.0.dist-info/INSTALLER"].data == b"hermetic\n"
    record = files[f"{sp}/gamma-1.0.dist-info/RECORD"].data.decode()
    assert "../../../bin/gamma-cli,sha256=" in record and "direct_url.json" not in record
    assert not any("direct_url.json" in p for p in files)


def test_a_wheel_escaping_its_scheme_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "w", "evil", "1.0", files={"evil-1.0.data/scripts/../../../../etc/x": b"x"})
    with pytest.raises(HermeticError, match="evil"):
        zf, _ = wheel_files(wheel, LAYOUT)
        zf.close()
