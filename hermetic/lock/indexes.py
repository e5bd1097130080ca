"""Where wheels come from: pip's configured indexes and find-links, read the way pip reads them, for
``hermetic lock`` and ``hermetic fetch`` alike (the lock's hashes make every source equally trustworthy)."""

from __future__ import annotations

import configparser
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class PipSources:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    files: tuple[str, ...] = field(default=(), compare=False)  # config files read, for messages

    def indexes(self) -> list[str]:
        if self.no_index:
            return []
        return [self.index_url or PYPI_SIMPLE, *self.extra_index_urls]


def _config_files() -> list[Path]:
    """pip's order (later overrides earlier): global, user, site, then PIP_CONFIG_FILE."""
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []
    files: list[Path] = []
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    files.append(Path("/etc/pip.conf"))
    home = Path.home()
    files.append(home / ".pip" / "pip.conf")
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    files.append(xdg_home / "pip" / "pip.conf")
    if sys.prefix != sys.base_prefix:
        files.append(Path(sys.prefix) / "pip.conf")
    if env_file:
        files.append(Path(env_file))
    return files


def _split(value: str) -> list[str]:
    return [v for v in value.replace("\n", " ").split() if v]


def read_pip_sources() -> PipSources:
    values: dict[str, str] = {}
    read: list[str] = []
    for f in _config_files():
        if not f.is_file():
            continue
        cp = configparser.RawConfigParser()
        try:
            cp.read(f, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        read.append(str(f))
        for section in ("global", "download", "install"):
            if cp.has_section(section):
                for k, v in cp.items(section):
                    values[k.replace("_", "-")] = v
    for env, key in (("PIP_INDEX_URL", "index-url"), ("PIP_EXTRA_INDEX_URL", "extra-index-url"),
                     ("PIP_FIND_LINKS", "find-links"), ("PIP_NO_INDEX", "no-index")):
        if os.environ.get(env):
            values[key] = os.environ[env]
    index = _split(values.get("index-url", ""))
    return PipSources(
        index_url=index[0] if index else None,
        extra_index_urls=tuple(_split(values.get("extra-index-url", ""))),
        find_links=tuple(_split(values.get("find-links", ""))),
        no_index=values.get("no-index", "").lower() in ("1", "true", "yes", "on"),
        files=tuple(read),
    )


def reachable(url: str, timeout: float = 4.0) -> bool:
    """Whether an index answers at all (any HTTP status); file:// URLs must exist."""
    if url.startswith("file://"):
        return Path(url[len("file://"):]).exists()
    if "://" not in url:
        return Path(url).exists()
    import requests

    try:
        requests.head(url, timeout=timeout, allow_redirects=False)
        return True
    except requests.RequestException:
        return False
