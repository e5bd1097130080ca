"""The Docker Engine as hermetic.engines.base.Engine, answered by its pieces.

``dockerclient`` (the client), ``dockercontainer`` (the container), ``dockerimages`` (images loaded, tagged,
saved), ``dockerfeed`` (the load while a build goes on), ``gpu`` (the NVIDIA runtime).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermetic.engines import dockerimages as images
from hermetic.engines.base import BuildFeed, ContainerSpec, EngineInfo, Readiness, RunOutcome, Watch
from hermetic.engines.dockerclient import DEFAULT_HOST, containers_labelled, engine_client, engine_version
from hermetic.engines.dockercontainer import DockerLaunch, run_capture
from hermetic.engines.gpu import check_gpu_runtime, docker_gpu_readiness
from hermetic.core.errors import EngineError

START_HINT = "run scripts/ensure-docker"


class DockerEngine:
    """The Docker Engine as hermetic.engines.base.Engine (the client is made on first use)."""

    name = "docker"
    label = "docker engine"
    image_home = "the Docker Engine"
    outlives_driver = True  # a daemon's containers: a SIGKILLed driver leaves them running
    runs_squashfs = False
    starts_early = True

    def __init__(self) -> None:
        self._info: dict[str, Any] | None = None

    @property
    def client(self) -> Any:
        return engine_client()  # "no Docker Engine answers at ..." with its fix

    def connect(self) -> None:
        engine_client()

    def readiness(self) -> Readiness:
        """``hermetic doctor``'s line: the engine's version and API, and where it answers."""
        try:
            v = engine_version()
        except EngineError as e:
            return Readiness("fail", e.message, e.hint or START_HINT)
        except Exception as e:  # noqa: BLE001 - the daemon answered, but not usably
            return Readiness("fail", f"Docker Engine error: {' '.join(str(e).split())}", START_HINT)
        return Readiness("ok", f"Docker Engine {v.get('Version', '?')} (API {v.get('ApiVersion', '?')}) at "
                               f"{os.environ.get('DOCKER_HOST', DEFAULT_HOST)}")

    def gpu_readiness(self, gpu_on_host: bool) -> Readiness:
        """What ``hermetic run --gpus`` checks (hermetic.engines.gpu.gpu_runtime), said with what to do."""
        try:
            client = self.client
        except EngineError:
            return Readiness("warn", "not checked (no Docker Engine)", START_HINT)
        return docker_gpu_readiness(client, gpu_on_host)

    def info(self, spec: ContainerSpec | None = None) -> EngineInfo:
        version = str(engine_version().get("Version") or "?")
        try:
            rootless = any("rootless" in str(o) for o in (self.engine_info().get("SecurityOptions") or []))
        except Exception:
            rootless = False
        return EngineInfo("docker", version, rootless)

    def engine_info(self) -> dict[str, Any]:
        """``GET /info``, asked once per process (the engine's ID and security options do not change
        under a running command)."""
        if self._info is None:
            self._info = self.client.info()
        return self._info

    def engine_id(self) -> str:
        try:
            return str(self.engine_info().get("ID", ""))
        except Exception:
            return ""

    def check_spec(self, spec: ContainerSpec) -> None:
        """Nothing to refuse before: create() refuses a limit the engine dropped (and removes the container)."""

    def check_gpus(self, gpus: str) -> None:
        check_gpu_runtime(self.client)

    def has_image(self, manifest_digest: str, image_id: str) -> bool:
        """By ID."""
        return images.engine_has_image(image_id)

    def build_feed(self, store: Any, base_config: dict[str, Any], base_layers: list[Any], total_layers: int,
                   repo_tag: str | None, labels: dict[str, str]) -> BuildFeed:
        """Prefix images of the layers built so far, loaded while the rest is built (hermetic.engines.dockerfeed)."""
        from hermetic.engines.dockerfeed import EngineFeed

        return EngineFeed(store, base_config, base_layers, total_layers, repo_tag)

    def ensure_image(self, store: Any, manifest_digest: str, *, repo_tag: str | None = None,
                     feed: BuildFeed | None = None) -> bool:
        """Loaded unless the engine has it by ID (after a feed: its own load's answer, else only what the engine
        still lacks, its prefix images the candidates); ``repo_tag`` pointed at it either way."""
        image_id = store.read_json(manifest_digest)["config"]["digest"]
        candidates: list[str] = []
        loaded: bool | None = None
        if feed is not None:
            feed.close()  # waits for the image's own load (EngineFeed.finish), started when its config was made
            loaded = getattr(feed, "final_loaded", None)
            candidates = list(getattr(feed, "partial_images", []))
        if loaded is None:
            loaded = not images.engine_has_image(image_id)
            if loaded:
                images.load_image(store, manifest_digest, repo_tag=repo_tag, candidates=candidates)
        if repo_tag:
            images.ensure_tag(image_id, repo_tag)
        return loaded

    def save_image(self, image_id: str) -> Any:
        """``docker save``: the docker-archive tar as it arrives (a ``docker:ID`` base)."""
        return images.save_image(image_id)

    def run_streaming(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True, name: str | None = None,
                      watch: Watch | None = None) -> RunOutcome:
        """``launch`` finished at once (cancelled when it fails)."""
        launched = self.launch(spec, log_dir, echo=echo, name=name)
        try:
            return launched.finish(watch)
        except BaseException:
            launched.cancel()
            raise
        finally:
            launched.close()

    def launch(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True,
               name: str | None = None) -> DockerLaunch:
        return DockerLaunch(self.client, spec, log_dir, echo=echo, name=name)

    def run_capture(self, spec: ContainerSpec, timeout: float | None = None) -> tuple[int, bytes, bytes]:
        return run_capture(self.client, spec, timeout)

    def containers_labelled(self, *labels: str) -> list[dict] | None:
        return containers_labelled(*labels)

    def container(self, container_id: str) -> Any:
        """docker-py's Container, inspected; None when the engine has none (or cannot be asked)."""
        from docker.errors import DockerException

        try:
            return self.client.containers.get(container_id)
        except (EngineError, DockerException, OSError):
            return None
