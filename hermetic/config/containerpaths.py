"""Where things are inside a run's container (the working directory, each dataset at its project path and
``mount:``, /outputs, the runtime's and probe's directories, the system directories), the rules that keep a
dataset off them, and the glob dialect of ``run.outputs`` (``*`` in a segment, ``**`` across, ``?``)."""

from __future__ import annotations

import posixpath
import re
from functools import lru_cache
from typing import Any

from hermetic.core.paths import inside

OUTPUTS_MOUNT = "/outputs"
RUNTIME_MOUNT = "/run/hermetic"  # the runtime's report (HERMETIC_RUNTIME_REPORT) lives here
PROBE_MOUNT = "/run/hermetic-probe"
GATE_MOUNT = "/run/hermetic-gate"  # the door the command waits at while hermetic finishes its checks (engines.base)
# What the image and hermetic need in place: a dataset may not be mounted there, inside, or over them.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
               "/usr", "/tmp", OUTPUTS_MOUNT, RUNTIME_MOUNT, PROBE_MOUNT, GATE_MOUNT)


def dataset_container_paths(index: int, dataset: Any, *, workdir: str, prefix: str) -> list[tuple[str, str]]:
    """[(config key, container path)] of one dataset; ValueError naming the key when one may not be used."""
    out = []
    if dataset.in_project:
        if dataset.path == ".":
            raise ValueError(f"datasets[{index}].path: a dataset cannot be the whole project")
        out.append((f"datasets[{index}].path", posixpath.join(workdir, dataset.path)))
    elif dataset.mount is None:
        raise ValueError(f"datasets[{index}].mount: required, because path {dataset.path} is outside the project "
                         "(the container sees only the project and what hermetic.yaml mounts)")
    if dataset.mount is not None:
        out.append((f"datasets[{index}].mount", dataset.mount))
    for key, where in out:
        for reserved in SYSTEM_DIRS + (prefix,):
            if inside(where, reserved):
                raise ValueError(f"{key}: {where} is inside {reserved}, which the container needs")
            if inside(reserved, where):
                raise ValueError(f"{key}: {where} would hide {reserved}, which the container needs")
        if inside(workdir, where):
            raise ValueError(f"{key}: {where} would hide the working directory {workdir}")
    return out


_GLOB_TOKEN = re.compile(r"\*\*/|\*\*|\*|\?|[^*?]+")
_GLOB_REGEX = {"**/": "(?:[^/]+/)*", "**": ".*", "*": "[^/]*", "?": "[^/]"}


@lru_cache(maxsize=256)
def glob_regex(glob: str) -> re.Pattern[str]:
    return re.compile("".join(_GLOB_REGEX.get(t) or re.escape(t) for t in _GLOB_TOKEN.findall(glob)) + r"\Z")


def glob_match(glob: str, relpath: str) -> bool:
    """``relpath`` ('/'-separated, relative) matches ``glob``; a glob naming a directory matches what is in it."""
    return bool(glob_regex(glob).match(relpath) or glob_regex(glob.rstrip("/") + "/**").match(relpath))


def glob_matches_dataset(glob: str, dataset_path: str) -> bool:
    """An include glob that can only mean files of the dataset: its fixed part lies inside the dataset."""
    fixed = re.split(r"[*?]", glob, maxsplit=1)[0]
    head = fixed.rstrip("/") if fixed == glob else fixed.rpartition("/")[0]
    return bool(head) and inside("/" + head, "/" + dataset_path)
