"""The engines that run hermetic's containers: Docker, Podman, Charliecloud (docs/architecture.md).

``get_engine(name)`` gives one; each maps a ContainerSpec (hermetic.engines.base)
to its own flags and takes its images straight from hermetic's OCI store.
"""

from __future__ import annotations

from hermetic.engines.base import DEFAULT_ENGINE, ENGINES, Engine, EngineInfo
from hermetic.errors import UsageError

_made: dict[str, Engine] = {}


def get_engine(name: str | None = None) -> Engine:
    """The engine called ``name`` (default: docker); one object per process and name."""
    name = name or DEFAULT_ENGINE
    if name in _made:
        return _made[name]
    if name == "docker":
        from hermetic.engines.docker import DockerEngine

        engine: Engine = DockerEngine()
    elif name == "podman":
        from hermetic.engines.podman import PodmanEngine

        engine = PodmanEngine()
    elif name == "charliecloud":
        from hermetic.engines.charliecloud import CharliecloudEngine

        engine = CharliecloudEngine()
    else:
        raise UsageError(f"engine {name!r}: one of {', '.join(ENGINES)}")
    _made[name] = engine
    return engine


__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "EngineInfo", "get_engine"]
