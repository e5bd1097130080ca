"""Extracting a tar whose members are not trusted, on every Python hermetic admits.

PEP 706's ``filter="data"`` where Python has it; on older patch releases (Debian 12's 3.11.2) each member goes
through the same checks, with the same messages, just before it is extracted: nothing outside the destination, no
absolute link, files, directories and links only, no setuid, setgid, sticky or group/other write bit."""

from __future__ import annotations

import copy
import os
import tarfile

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


class UnsafeMember(tarfile.TarError):
    """A member the data filter refuses (the fallback's twin of tarfile.FilterError)."""


def extract_all(tf: tarfile.TarFile, dest: str | os.PathLike[str], *, use_filter: bool | None = None) -> None:
    """Extract every member of ``tf`` beneath ``dest``; raises a tarfile.TarError naming a refused member.

    ``use_filter`` picks the path (None: the standard library's filter where it exists); the tests run both."""
    if HAS_DATA_FILTER if use_filter is None else use_filter:
        tf.extractall(dest, filter="data")  # type: ignore[call-arg]
        return
    dest_path = os.path.realpath(dest)
    directories: list[tarfile.TarInfo] = []
    for member in tf:
        safe = copy.copy(member)
        for key, value in _checked_attrs(member, dest_path).items():
            setattr(safe, key, value)
        # the checks are made: where tarfile has filters (the tests run this path there too), say so, or it warns
        trusted = {"filter": "fully_trusted"} if HAS_DATA_FILTER else {}
        if safe.isdir():
            directories.append(safe)
            tf.extract(safe, dest_path, set_attrs=False, **trusted)  # 0700 now; mode and time once its contents are in
        else:
            tf.extract(safe, dest_path, set_attrs=True, numeric_owner=True, **trusted)
    umask = os.umask(0)
    os.umask(umask)
    for d in sorted(directories, key=lambda m: m.name, reverse=True):  # the deepest first, as extractall does
        path = os.path.join(dest_path, d.name)
        os.chmod(path, 0o777 & ~umask, follow_symlinks=False)
        os.utime(path, (d.mtime, d.mtime), follow_symlinks=False)


def _checked_attrs(member: tarfile.TarInfo, dest_path: str) -> dict[str, object]:
    """The attributes the data filter would change, or UnsafeMember with its message."""
    attrs: dict[str, object] = {}
    name = member.name
    if name.startswith("/"):
        name = attrs["name"] = name.lstrip("/")
    if os.path.isabs(name):
        raise UnsafeMember(f"member {member.name!r} has an absolute path")
    target = os.path.realpath(os.path.join(dest_path, name))
    if os.path.commonpath([target, dest_path]) != dest_path:
        raise UnsafeMember(f"{member.name!r} would be extracted to {target!r}, which is outside the destination")
    if member.isreg() or member.islnk():
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        attrs["mode"] = mode | 0o600
    elif member.issym():
        attrs["mode"] = 0o777  # a link's own mode is never applied
    elif not member.isdir():
        raise UnsafeMember(f"{member.name!r} is a special file")
    # ownership is whoever extracts (the filter's None: no chown); numeric, so no name is looked up
    attrs.update(uid=os.geteuid(), gid=os.getegid(), uname="", gname="")
    if member.islnk() or member.issym():
        if os.path.isabs(member.linkname):
            raise UnsafeMember(f"{member.name!r} is a link to an absolute path")
        base = os.path.join(dest_path, os.path.dirname(name)) if member.issym() else dest_path
        target = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.commonpath([target, dest_path]) != dest_path:
            raise UnsafeMember(f"{member.name!r} would link to {target!r}, which is outside the destination")
    return attrs
