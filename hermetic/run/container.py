"""One training container, locked down, its logs streamed, its end always recorded: on the run's engine.

The container is described once (ContainerSpec: the snapshot's working
copy, datasets read-only, /outputs, a non-root user, a read-only root, no
capabilities, no network unless asked, the pids and memory limits) and run by
the engine hermetic.yaml's ``run.engine`` (or ``--engine``) names: Docker
(hermetic.engines.docker), Podman (.podman) or Charliecloud (.charliecloud);
``engine_for`` picks it. What a run's container is and what its record says
about it is the same whichever engine runs it (docs/architecture.md).

Every container hermetic creates names its driver (DRIVER_LABEL: host, pid,
start time) and a training container its run directory and the working
directory it writes (RUN_DIR_LABEL, engine.HOLDS_LABEL): a driver killed
with SIGKILL cannot remove its container, so hermetic.run.orphans finds it
by these labels, stops it and seals the run's record (a Charliecloud
container has no daemon to outlive its driver: it dies with it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermetic.engine import HOLDS_LABEL
from hermetic.engines import get_engine
from hermetic.engines.base import (  # noqa: F401 - the names the run's modules and tests use
    CONTAINER_HOSTNAME, DEFAULT_PIDS_LIMIT, DRIVER_LABEL, RUN_DIR_LABEL, RUN_LABEL, ContainerSpec, Engine, Gate,
    Mount, RunOutcome, Watch, container_hostname,
)
from hermetic.engines.docker import (  # noqa: F401 - Docker's own, named here as before
    NO_GPU_RUNTIME, _dropped_limit, check_gpu_runtime, create, device_requests, host_config, oom_reason,
    remove_container, rewrite_logs, run_capture, run_streaming, stop_container,
)


def engine_for(name: str) -> Engine:
    """The engine a run uses (hermetic.yaml ``run.engine``, or ``--engine``)."""
    return get_engine(name)


def run_labels(run_id: str, run_dir: Path, workspace: Path) -> dict[str, str]:
    """A training container's labels (its driver's is added by the engine when it creates it)."""
    return {RUN_LABEL: run_id, RUN_DIR_LABEL: os.path.realpath(run_dir), HOLDS_LABEL: os.path.realpath(workspace)}


def limits_section(pids: int | None, memory: str | None) -> dict[str, Any]:
    """The record's ``invocation.limits``: what the container is held to (None: no limit)."""
    return {"pids": pids, "memory": memory}
