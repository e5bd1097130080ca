"""Can the container's user read a dataset? Decided from the stats the verification already took.

hermetic runs the script as a non-root user (hermetic.run.plan.container_user:
the image's user, 1000:1000 by default, when hermetic itself runs as root),
with every capability dropped, so the kernel applies the plain permission
bits to it: the owner's when the file's uid is the user's, else the group's
when the file's gid is the user's group, else everyone else's. hermetic as
root verifies a file mode 0600 owned by root without trouble, and the script
then fails on it with PermissionError. The scan (hermetic.data.scan) keeps
the few entries that not everyone may read (``Tree.restricted``); this module
tells which of them the user cannot read. A file needs r; a directory needs r
and x (x to reach what is inside, r to list it: glob() in a directory without
r finds nothing, silently). Supplementary groups and ACLs are not consulted:
the user's own gid is the group the check trusts.
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
