"""Can the container's user read a dataset? Decided from the stats the verification already took.

The script runs as a non-root user with no capabilities, so the plain permission bits apply (owner's, else
group's, else others'): a file needs r, a directory r and x. Supplementary groups and ACLs are not consulted.
"""

from __future__ import annotations

import stat as statmod
from typing import Iterable

Restricted = tuple[str, int, int, int]  # (path, st_mode, st_uid, st_gid), as scan.Tree.restricted holds them


def can_read(mode: int, owner: int, group: int, uid: int, gid: int) -> bool:
    """Whether (uid, gid) may read a file, or list and enter a directory, with these bits."""
    need = 0o5 if statmod.S_ISDIR(mode) else 0o4
    if owner == uid:
        bits = (mode >> 6) & 0o7
    elif group == gid:
        bits = (mode >> 3) & 0o7
    else:
        bits = mode & 0o7
    return bits & need == need


def unreadable(restricted: Iterable[Restricted], uid: int, gid: int) -> list[str]:
    """The paths of ``restricted`` that (uid, gid) cannot read, sorted; directories end with ``/``
    (the dataset's root itself is ``./``)."""
    return sorted((path or "./") for path, mode, owner, group in restricted
                  if not can_read(mode, owner, group, uid, gid))
