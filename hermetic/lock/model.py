"""The normalized lock: what every reader produces and everything else consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """The platform wheels must run on: the image, not the host."""

    python_version: str = "3.11"  # MAJOR.MINOR
    platform: str = "x86_64-manylinux_2_28"  # uv's --python-platform spelling
    implementation: str = "cp"
    glibc: tuple[int, int] = (2, 28)  # newest manylinux level accepted
    machine: str = "x86_64"

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 environment of the image (for evaluating markers)."""
        full = self.python_version + ".0"
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": full,
            "python_version": self.python_version,
            "sys_platform": "linux",
        }


@dataclass(frozen=True)
class LockedWheel:
    """One pinned distribution: ``name==version``, every file hash the lock allows (the fetcher picks the
    target's file among them), and ``source``, the lock's file:line that pinned it."""

    name: str  # canonical (PEP 503) name
    version: str
    sha256s: frozenset[str]
    source: str = ""  # "path:line"
    urls: tuple[str, ...] = ()  # direct file URLs when the lock has them (uv.lock, pylock.toml)
    index: str | None = None  # index URL the lock names for this package, if any
    filenames: tuple[str, ...] = ()  # wheel filenames when the lock names them

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


@dataclass(frozen=True)
class Lock:
    path: str
    format: str  # "requirements" | "uv.lock" | "pylock.toml"
    target: Target
    wheels: tuple[LockedWheel, ...]
    index_urls: tuple[str, ...] = ()  # --index-url / --extra-index-url lines, in order
    find_links: tuple[str, ...] = ()
    sha256: str = ""  # of the lock file's bytes

    def by_name(self) -> dict[str, LockedWheel]:
        return {w.name: w for w in self.wheels}

    def normalized(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """Comparable form: (name, version, sorted hashes), sorted by name."""
        return sorted((w.name, w.version, tuple(sorted(w.sha256s))) for w in self.wheels)


@dataclass
class ResolvedWheel:
    """A LockedWheel matched to the one wheel file chosen for the target."""

    locked: LockedWheel
    filename: str
    sha256: str
    size: int | None = None
    url: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
