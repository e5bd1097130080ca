"""The Docker Engine's client: docker-py's, made once per process, that fails with the command that fixes it.

``DOCKER_HOST`` is ``unix://PATH`` (default /var/run/docker.sock) or ``tcp://HOST:PORT`` (TLS from
docker-py's ``kwargs_from_env``); ``ssh://`` and others are refused by name. The API version is the engine's
own (one ``GET /version``), within docker-py's range; an engine older than API 1.40 is refused. docker-py
is imported on the first connect only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hermetic.core.errors import EngineError

if TYPE_CHECKING:
    import docker

DEFAULT_HOST = "unix:///var/run/docker.sock"
MIN_API = (1, 40)  # DeviceRequests (--gpus) and the Mounts, Init and PidsLimit fields: Docker 19.03
START_HINT = "start one with scripts/ensure-docker (Debian: installs docker.io and starts dockerd)"

_client: "docker.DockerClient | None" = None
_version: dict[str, Any] = {}  # the engine's GET /version, asked once when the client was made


def docker_host(environ: dict[str, str] | None = None) -> str:
    """``DOCKER_HOST`` as the client is given it (a bare path as ``unix://PATH``); EngineError naming what
    hermetic does not talk over."""
    env = os.environ if environ is None else environ
    url = env.get("DOCKER_HOST") or DEFAULT_HOST
    if url.startswith("/"):
        return "unix://" + url
    if url.startswith("unix://"):
        return url if url != "unix://" else DEFAULT_HOST
    if url.startswith(("tcp://", "http://", "https://")):
        rest = url.split("://", 1)[1].rstrip("/")
        port = rest.rpartition(":")[2] if ":" in rest.rpartition("]")[2] else ""
        if port and not port.isdigit():
            raise EngineError(f"DOCKER_HOST={url}: the port is not a number")
        return url
    if url.startswith("ssh://"):
        raise EngineError(f"DOCKER_HOST={url}: hermetic does not talk to the engine over ssh",
                          hint="forward its socket and point DOCKER_HOST at the copy: ssh -nNT -L "
                               "/tmp/docker.sock:/var/run/docker.sock HOST, then DOCKER_HOST=unix:///tmp/docker.sock")
    raise EngineError(f"DOCKER_HOST={url}: not unix://PATH or tcp://HOST:PORT")


def engine_client(timeout: int = 600) -> "docker.DockerClient":
    """The Docker Engine's client, made once per process (the engine asked its version, which proves it
    answers and picks the API version of every later call)."""
    global _client
    if _client is None:
        _client = _connect(timeout)
    return _client


def engine_version() -> dict[str, Any]:
    """The engine's ``GET /version`` (``Version``, ``ApiVersion``, ...), as asked when the client was made."""
    engine_client()
    return dict(_version)


def _version_tuple(text: Any) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return (0, 0)


def choose_api(doc: dict[str, Any], newest: tuple[int, int]) -> str:
    """The API version to speak to an engine whose ``GET /version`` is ``doc``: its own, no newer than
    ``newest`` (unless the engine no longer takes that), refused below MIN_API."""
    chosen = min(_version_tuple(doc.get("ApiVersion", "1.40")), newest)
    chosen = max(chosen, _version_tuple(doc.get("MinAPIVersion", "1.12")))
    if chosen < MIN_API:
        raise EngineError(f"the Docker Engine speaks API {chosen[0]}.{chosen[1]} (Docker {doc.get('Version', '?')}); "
                          f"hermetic needs API {MIN_API[0]}.{MIN_API[1]} (Docker 19.03) or newer")
    return f"{chosen[0]}.{chosen[1]}"


def _connect(timeout: float) -> "docker.DockerClient":
    url = docker_host()
    import docker
    from docker.constants import DEFAULT_DOCKER_API_VERSION
    from docker.errors import DockerException

    try:
        kwargs = {**docker.utils.kwargs_from_env(), "base_url": url}
        asker = docker.APIClient(version=f"{MIN_API[0]}.{MIN_API[1]}", timeout=timeout, **kwargs)  # no request yet
    except DockerException as e:
        raise EngineError(f"DOCKER_HOST={url}: {e}") from None
    try:
        doc = asker.version(api_version=False)
    except (DockerException, OSError) as e:  # requests' errors are OSErrors
        raise EngineError(f"no Docker Engine answers at {url} ({_cause(e)})", hint=START_HINT) from None
    finally:
        asker.close()
    client = docker.DockerClient(version=choose_api(doc, _version_tuple(DEFAULT_DOCKER_API_VERSION)),
                                 timeout=timeout, **kwargs)
    _version.clear()
    _version.update(doc)
    return client


def _cause(e: BaseException) -> str:
    """The name of what went wrong under requests' and urllib3's wrappers (FileNotFoundError: no socket;
    ConnectionRefusedError: nothing listens), else the error's own."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        err = todo.pop(0)
        if isinstance(err, OSError) and type(err).__module__.split(".")[0] not in ("requests", "urllib3", "docker"):
            return type(err).__name__
        seen.add(id(err))
        todo += [x for x in (*getattr(err, "args", ()), err.__cause__, err.__context__, getattr(err, "reason", None))
                 if isinstance(x, BaseException) and id(x) not in seen]
    return type(e).__name__


def said(e: Exception) -> str:
    """What the engine said (its message), for an error docker-py raised."""
    return str(getattr(e, "explanation", None) or e)


def containers_labelled(*labels: str) -> list[dict] | None:
    """Every container of the engine (any state) that has all ``labels`` ("KEY" or "KEY=VALUE"), as the
    engine lists them (``Id``, ``Labels``, ``State``, ...); None when no engine can be asked."""
    try:
        # A short timeout when no client is open yet: `hermetic runs` must not wait minutes on an engine
        # that does not answer (a DOCKER_HOST that is gone); a command that runs containers has one already.
        client = _client if _client is not None else _connect(10)
    except EngineError:
        return None
    from docker.errors import DockerException

    try:
        return client.api.containers(all=True, filters={"label": list(labels)})
    except (DockerException, OSError):
        return None
