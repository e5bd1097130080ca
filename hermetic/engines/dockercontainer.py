"""The Docker Engine's container: created from the Engine API's own document, attached, started, waited for, removed.

Locked down (``host_config``): read-only root with a tmpfs /tmp, no capability, no-new-privileges, no network
unless asked, a pids limit and, when set, a memory limit with no swap around it. Every container names its
driver, a training container its run directory and working directory (labels): the orphan reaper
(hermetic.run.orphans) finds one whose driver died by them. The client and container are docker-py's.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

from hermetic.engines.base import (
    Capture, ContainerSpec, Interrupted, RunOutcome, Watch, close_files, complete_logs, container_home_env,
    interrupt_handlers, oom_reason, open_log_files, remove_container, rewrite_logs, stop_container, tee, watch_beside,
)
from hermetic.engines.dockerclient import said
from hermetic.engines.gpu import NO_GPU_RUNTIME, device_requests
from hermetic.core.errors import EngineError


def host_config(spec: ContainerSpec) -> dict[str, Any]:
    """The container's HostConfig (Engine API): the lock-down every training container gets."""
    from hermetic.config.load import size_bytes

    limits: dict[str, Any] = {}
    if spec.pids_limit is not None:
        limits["PidsLimit"] = spec.pids_limit
    if spec.memory is not None:
        limits.update(Memory=size_bytes(spec.memory), MemorySwap=size_bytes(spec.memory))  # no swap around it
    return {
        **limits,
        "Mounts": [{"Type": "bind", "Source": str(m.source), "Target": m.target, "ReadOnly": m.read_only}
                   for m in spec.mounts],
        "ReadonlyRootfs": True,
        "Tmpfs": {"/tmp": f"rw,nosuid,nodev,exec,size={spec.tmpfs_size},mode=1777"},
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "NetworkMode": spec.network,
        "ShmSize": size_bytes(spec.shm_size),
        "DeviceRequests": device_requests(spec.gpus),
        "Init": True,  # PID 1 forwards signals and reaps DataLoader workers
    }


def create(client, spec: ContainerSpec, name: str | None = None):
    """The container, labelled with this process as its driver; refused (and removed) when the engine
    dropped a limit it was given (a kernel without the pids or memory cgroup, a rootless engine on
    cgroup v1): the limits are the host's protection, never silently off."""
    from docker.errors import APIError, NotFound

    env = container_home_env(spec.env)
    config = {
        "Image": spec.image_id, "Cmd": list(spec.command), "Env": [f"{k}={v}" for k, v in env.items()],
        "User": spec.user, "WorkingDir": spec.workdir or "", "Hostname": spec.hostname or "",
        "Labels": spec.all_labels(),
        "AttachStdin": False, "AttachStdout": True, "AttachStderr": True, "OpenStdin": False, "Tty": False,
        "HostConfig": host_config(spec),
    }
    try:
        created = client.api.create_container_from_config(config, name=name)  # the Engine API's own document
        container = client.containers.get(created["Id"])  # inspected: the HostConfig the engine kept
    except NotFound as e:
        msg = said(e)
        if "image" in msg.lower() or "No such image" in msg:
            raise EngineError(f"the Docker Engine has no image {spec.image_id}; run `hermetic build`") from None
        raise EngineError(f"the Docker Engine refused the container: {msg}") from None
    except APIError as e:
        msg = said(e)
        if "capabilities: [[gpu]]" in msg or "nvidia" in msg.lower():
            raise EngineError(NO_GPU_RUNTIME) from None
        raise EngineError(f"the Docker Engine refused the container: {msg}") from None
    dropped = _dropped_limit(container.attrs.get("HostConfig") or {}, spec)
    if dropped is not None:
        remove_container(container)
        raise EngineError(f"the Docker Engine did not apply the container's {dropped} (its kernel or a rootless "
                          f"engine cannot limit it); set it to null in hermetic.yaml to run without it")
    return container


def _dropped_limit(host_config: dict[str, Any], spec: ContainerSpec) -> str | None:
    if spec.pids_limit is not None and (host_config.get("PidsLimit") or 0) != spec.pids_limit:
        return f"pids limit (run.pids: {spec.pids_limit})"
    if spec.memory is not None and not host_config.get("Memory"):
        return f"memory limit (run.memory: {spec.memory})"
    return None


class DockerLaunch:
    """A container created, attached and started by a thread of its own (the engine's create and start, mostly
    runc's time) while the caller goes on with the run's last steps; its command waits at the
    run's Gate meanwhile (hermetic.engines.base). ``finish`` streams its output until it ends, waits, and
    has a thread remove it (the engine's time, while the caller collects the outputs) that ``close``
    joins; ``cancel`` removes it unfinished."""

    def __init__(self, client, spec: ContainerSpec, log_dir: Path, *, echo: bool = True,
                 name: str | None = None) -> None:
        self.client, self.spec, self.echo = client, spec, echo
        self.files = open_log_files(log_dir)  # before the container exists: what it prints has a file to land in
        self.container = None
        self._stream = None
        self._error: BaseException | None = None
        self._ended = False
        self._removal: threading.Thread | None = None
        self._thread = threading.Thread(target=self._start, args=(name,), name="hermetic-launch", daemon=True)
        self._thread.start()

    def _start(self, name: str | None) -> None:
        try:
            self.container = create(self.client, self.spec, name=name)
            # before start: nothing it prints is missed; (stdout, stderr) pairs, one of them None
            self._stream = self.container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
            self.container.start()
        except BaseException as e:  # raised by finish, in the caller's thread
            self._error = e

    def finish(self, watch: Watch | None = None) -> RunOutcome:
        stopped: list[str] = []
        done = threading.Event()
        out_f, err_f, all_f = self.files
        outcome: RunOutcome
        with interrupt_handlers():
            try:
                self._thread.join()
                if self._error is not None:
                    raise self._error
                container, stream = self.container, self._stream
                watch_beside(watch, done, lambda c=container: stop_container(c), stopped)
                streamed = [0, 0]  # bytes of stdout, stderr read from the attach stream
                for out, err in stream:
                    if out:
                        streamed[0] += len(out)
                        tee(out, out_f, all_f, sys.stdout.buffer if self.echo else None)
                    if err:
                        streamed[1] += len(err)
                        tee(err, err_f, all_f, sys.stderr.buffer if self.echo else None)
                result = container.wait()
                done.set()
                complete_logs(container, self.files, streamed, self.echo)
                code = int(result.get("StatusCode", 1))
                # A script that survived the kill of a process of its own (and exited 0) is not failed for it.
                oom = oom_reason(self.spec.memory) if code != 0 and _oom_killed(container) else None
                outcome = RunOutcome(code, False, None, stopped[0] if stopped else None, oom_reason=oom)
            except (Interrupted, KeyboardInterrupt) as e:
                signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
                self._thread.join()  # a container being made is made: then stopped
                if self.container is not None:
                    stop_container(self.container)
                    rewrite_logs(self.container, self.files)  # what it printed but we had not read yet
                outcome = RunOutcome(None, True, signal.Signals(signum).name)
            finally:
                done.set()
                self._end(beside=True)
        return outcome

    def cancel(self) -> None:
        self._thread.join()
        self._end()

    def close(self) -> None:
        """Return when the container is removed (finish began its removal)."""
        if self._removal is not None:
            self._removal.join()

    def _end(self, *, beside: bool = False) -> None:
        """Close the log files and remove the container (once): ``beside``, by a thread that ``close`` joins
        (not a daemon: the interpreter waits for it should a caller never close)."""
        if self._ended:
            return
        self._ended = True
        close_files(self.files)
        if self._stream is not None:
            self._stream.close()
        if self.container is not None and beside:
            self._removal = threading.Thread(target=remove_container, args=(self.container,),
                                             name="hermetic-remove")
            self._removal.start()
        elif self.container is not None:
            remove_container(self.container)
        elif self._error is not None and self.spec.labels:  # create() failed on the way: made anyway?
            _remove_labelled(self.client, self.spec.all_labels())


def _oom_killed(container) -> bool:
    try:
        container.reload()
        return bool((container.attrs.get("State") or {}).get("OOMKilled"))
    except Exception:  # the engine lost it: nothing to tell
        return False


def _remove_labelled(client, labels: dict[str, str]) -> None:
    try:
        found = client.api.containers(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
    except Exception:
        return
    for row in found:
        try:
            remove_container(client.containers.get(row["Id"]))
        except Exception:  # gone meanwhile
            continue


def run_capture(client, spec: ContainerSpec, timeout: float | None = None) -> tuple[int, bytes, bytes]:
    """Run to completion and return (exit code, stdout, stderr) (the probe, the metrics reader); TimeoutError
    when it has not ended after ``timeout`` seconds (it is removed all the same)."""
    from requests.exceptions import ConnectionError as Broken, ReadTimeout

    container = create(client, spec)
    try:
        container.start()
        try:
            result = container.wait(timeout=timeout)
        except (ReadTimeout, Broken):  # docker-py's request timed out (over a unix socket, urllib3 says either)
            if timeout is None:
                raise
            raise TimeoutError(f"container {container.id[:12]} still running after {timeout} s") from None
        caps = [Capture(f"container {container.id[:12]}", stream) for stream in ("stdout", "stderr")]
        for cap, out in zip(caps, (True, False)):
            chunks = container.logs(stdout=out, stderr=not out, stream=True, follow=False)
            for chunk in chunks:
                if not cap.add(chunk):
                    break
            chunks.close()
        return int(result.get("StatusCode", 1)), caps[0].value(), caps[1].value()
    finally:
        remove_container(container)
