"""Build small, valid wheels and PEP 503 indexes for tests (no network)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(dest_dir: Path, name: str, version: str, *, tag: str = "py3-none-any",
               files: dict[str, bytes] | None = None, console_scripts: dict[str, str] | None = None,
               payload_bytes: int = 0) -> Path:
    """A wheel with a module ``<name>/__init__.py`` (plus ``files``); returns its path."""
    dist = name.replace("-", "_")
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{dist}-{version}-{tag}.whl"
    contents: dict[str, bytes] = {f"{dist}/__init__.py": f"__version__ = {version!r}\n".encode()}
    if payload_bytes:
        contents[f"{dist}/payload.bin"] = hashlib.sha256(name.encode()).digest() * (payload_bytes // 32 + 1)
    contents.update(files or {})
    di = f"{dist}-{version}.dist-info"
    contents[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    contents[f"{di}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    if console_scripts:
        contents[f"{di}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in console_scripts.items())).encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in contents.items()) + f"{di}/RECORD,,\n"
    contents[f"{di}/RECORD"] = record.encode()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(contents):
            zi = zipfile.ZipInfo(p, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, contents[p])
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_index(root: Path, files: list[Path]) -> str:
    """A PEP 503 'simple' index on disk; returns its file:// URL."""
    from packaging.utils import canonicalize_name

    by_project: dict[str, list[Path]] = {}
    for f in files:
        stem = f.name
        project = stem.split("-")[0]
        by_project.setdefault(canonicalize_name(project), []).append(f)
    root.mkdir(parents=True, exist_ok=True)
    links = []
    for project, fs in sorted(by_project.items()):
        d = root / project
        d.mkdir(exist_ok=True)
        anchors = []
        for f in fs:
            target = d / f.name
            if target.resolve() != f.resolve():
                target.write_bytes(f.read_bytes())
            anchors.append(f'<a href="{f.name}#sha256={sha256_of(target)}">{f.name}</a>')
        (d / "index.html").write_text("<html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
        links.append(f'<a href="{project}/">{project}</a>')
    (root / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return root.resolve().as_uri()


def requirements_lock(pins: list[tuple[str, str, list[str]]], header: str = "") -> str:
    lines = [header] if header else []
    for name, version, hashes in pins:
        lines.append(f"{name}=={version} \\")
        for i, h in enumerate(hashes):
            lines.append(f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else ""))
    return "\n".join(lines) + "\n"
