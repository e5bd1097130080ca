"""What every engine is given and answers: the container's spec, its outcome, the engine's own facts.

A run's container is described once (``ContainerSpec``) and each engine maps it to its own flags; what an
engine cannot give as Docker does is given another way and said in ``EngineInfo.notes``, or refused before
anything exists (``check_spec``). The rest of hermetic knows an engine through this module: the ``Engine``
protocol's attributes and methods say what differs, never an engine's name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from hermetic.core.errors import EngineError, Unavailable

ENGINES = ("docker", "podman", "charliecloud")
DEFAULT_ENGINE = "docker"

RUN_LABEL = "org.hermetic.run-id"
DRIVER_LABEL = "org.hermetic.driver"  # "HOST:PID:START" of the process that created the container (liveness)
RUN_DIR_LABEL = "org.hermetic.run-dir"  # the run directory whose record the container's end is sealed in
# A host path a container uses (a run's working directory): no sweep of dead writers' temp files removes it
# while an engine has that container, running or not (its driver may have died, the container not).
HOLDS_LABEL = "org.hermetic.holds"
PROBE_LABEL = "org.hermetic.probe"
DEFAULT_PIDS_LIMIT = 4096  # run.pids's default (hermetic.config.RunConfig), also the probe's limit
# The container's host name, the same every run (Docker's default is the container ID, new each time): a
# framework that names files by host (the Trainer's logging_dir, TensorBoard's event files) then writes the
# same names. With --network host the container keeps the host's own name, which a multi-node rendezvous
# resolves.
CONTAINER_HOSTNAME = "hermetic"
LOG_FILES = ("stdout.log", "stderr.log", "combined.log")


@dataclass
class Mount:
    """A host path bound into the container (read-only unless said)."""

    source: Path
    target: str
    read_only: bool = True


@dataclass
class ContainerSpec:
    """The training container as any engine is asked to run it: image, command, mounts, user, limits."""

    image_id: str
    command: list[str]
    mounts: list[Mount]
    env: dict[str, str]
    user: str
    workdir: str = "/workspace"
    network: str = "none"
    gpus: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    shm_size: str = "1g"
    tmpfs_size: str = "4g"
    pids_limit: int | None = DEFAULT_PIDS_LIMIT  # None: no limit (run.pids: null)
    memory: str | None = None  # a Docker size ("16g"); also the swap limit, so it cannot swap around it
    manifest_digest: str | None = None  # the image's manifest (engines that run from hermetic's store need it)
    # "HOST:PID:START" of the process that drives the container (hermetic.record.liveness.driver_token), given
    # by the run: the engine labels the container with it (DRIVER_LABEL), so hermetic.run.orphans can tell when
    # its driver is gone. "": no driver named (a spec only judged by check_spec, never run).
    driver: str = ""

    @property
    def hostname(self) -> str | None:
        return container_hostname(self.network)

    def all_labels(self) -> dict[str, str]:
        """The container's labels: the spec's, and its driver's."""
        return {**self.labels, DRIVER_LABEL: self.driver} if self.driver else dict(self.labels)


def container_hostname(network: str) -> str | None:
    """The host name a container gets (the record's ``invocation.hostname``): CONTAINER_HOSTNAME, or None (the
    host's own) with ``--network host``."""
    return None if network == "host" else CONTAINER_HOSTNAME


@dataclass
class RunOutcome:
    """How the container ended: its exit code, or interrupted, and why hermetic stopped it if it did."""

    exit_code: int | None
    interrupted: bool
    signal_name: str | None = None
    stopped_because: str | None = None  # hermetic stopped the container (e.g. the working directory outgrew its limit)
    oom_reason: str | None = None  # the kernel's OOM killer ended a process of it (State.OOMKilled): why, in words


def oom_reason(memory: str | None) -> str:
    """The record's reason for a script that failed after the kernel's OOM killer ended a process of it
    (the script itself: exit 137; a DataLoader worker: the script's own error)."""
    if memory is not None:
        return (f"the script ran out of memory: the kernel's OOM killer ended it at the container's limit "
                f"(run.memory: {memory}); raise run.memory in hermetic.yaml, or use less")
    return ("the script ran out of memory: the kernel's OOM killer ended it; run.memory in hermetic.yaml bounds "
            "the container by itself, before the host runs short")


class Watch(Protocol):
    """Something to check while the container runs (hermetic.run.workdir.SizeWatch)."""

    def run_until(self, stop: threading.Event, on_exceeded: Callable[[str], None]) -> None: ...


@dataclass(frozen=True)
class EngineInfo:
    """The engine a run used, as its record says it (``invocation.engine``)."""

    name: str
    version: str
    rootless: bool  # the engine runs as the invoking user, without root anywhere
    notes: tuple[str, ...] = ()  # hardening given another way than Docker gives it, in words
    image: dict[str, Any] | None = None  # what it ran the image from, where not its own store: {form, path, sha256}

    def section(self) -> dict[str, Any]:
        out = {"name": self.name, "version": self.version, "rootless": self.rootless, "notes": list(self.notes)}
        return out if self.image is None else {**out, "image": dict(self.image)}


@dataclass(frozen=True)
class Readiness:
    """Whether an engine can be used here, as ``hermetic doctor`` says it: ok / warn / fail, what it found, and
    what to do about it."""

    status: str  # "ok" | "warn" | "fail"
    detail: str
    hint: str = ""


class BuildFeed(Protocol):
    """The engine's load of an image while the build goes on (``Engine.build_feed``): told of each layer as it
    is in the store, and of the image once its config exists; ``close`` waits for what it started."""

    timeline: list[dict[str, Any]]  # each load: layers, bytes, from/to (time.monotonic())

    def start(self) -> None: ...

    def layer_ready(self, i: int, desc: Any, fresh: bool = False) -> None: ...

    def finish(self, image_id: str, config_bytes: bytes) -> None: ...

    def close(self) -> None: ...

    def remove_partials(self) -> None: ...


class Engine(Protocol):
    """What hermetic asks of the engine that runs its containers (one per run; docs/architecture.md)."""

    name: str
    label: str
    """How ``hermetic doctor`` names the engine's line ("docker engine", "podman", "charliecloud")."""

    image_home: str
    """Where the engine keeps a run's image, in words ("the Docker Engine", "Podman's storage", ...)."""

    outlives_driver: bool
    runs_squashfs: bool  # it can run an image from one SquashFS file (hermetic.engines.squashfs)
    """Whether a container can outlive the process that drives it (a daemon, or a process not tied to the
    driver's): hermetic.run.orphans asks such an engine for orphans, and the cache's sweep for held paths."""

    def connect(self) -> None:
        """Fail now (EngineError / Unavailable, with what to do) when this engine cannot be used here."""

    def readiness(self) -> Readiness:
        """Whether it can run here, and how (``hermetic doctor``'s line for it)."""

    def gpu_readiness(self, gpu_on_host: bool) -> Readiness | None:
        """What ``hermetic doctor`` says of this engine's way to GPUs, where it says anything (None)."""

    def info(self, spec: ContainerSpec | None = None) -> EngineInfo:
        """The engine's name, version and what it gives differently (for ``spec``, when given)."""

    def engine_id(self) -> str:
        """Which engine installation this is (the probe's cache key)."""

    def check_spec(self, spec: ContainerSpec) -> None:
        """Refuse (EngineError / Unavailable naming the key) what this engine cannot give, before anything exists."""

    def check_gpus(self, gpus: str) -> None:
        """Refuse before any container exists when ``--gpus`` cannot work with this engine."""

    def has_image(self, manifest_digest: str, image_id: str) -> bool:
        """Whether the engine holds the image (a replay's, which it may have lost since)."""

    def build_feed(self, store: Any, base_config: dict[str, Any], base_layers: list[Any], total_layers: int,
                   repo_tag: str | None, labels: dict[str, str]) -> BuildFeed | None:
        """What loads the image while it is built (None: it is made runnable at the end only)."""

    def ensure_image(self, store: Any, manifest_digest: str, *, repo_tag: str | None = None,
                     feed: BuildFeed | None = None) -> bool:
        """The image made runnable from hermetic's OCI store, unless the engine has it (``feed``: this build's,
        closed); ``repo_tag`` pointed at it where the engine keeps tags. True when it was imported."""

    def run_streaming(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True, name: str | None = None,
                      watch: Watch | None = None) -> RunOutcome: ...

    starts_early: bool
    """Whether ``launch`` starts the container at once (its command held at a Gate until the run opens it);
    False: the container is started by ``finish``, after the run's last checks."""

    def launch(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True,
               name: str | None = None) -> "Launched":
        """The container on its way (see Launched); ``run_streaming`` is ``launch`` then ``finish``."""

    def run_capture(self, spec: ContainerSpec, timeout: float | None = None) -> tuple[int, bytes, bytes]:
        """Run to completion: (exit code, stdout, stderr); TimeoutError (the container removed) when it has not
        ended after ``timeout`` seconds."""

    def containers_labelled(self, *labels: str) -> list[dict] | None:
        """Every container (any state) with all ``labels``, as Docker lists them; None when it cannot be asked."""

    def container(self, container_id: str) -> Any:
        """A handle (reload, attrs, stop, kill, remove, logs: docker-py's Container's) or None when gone."""


class SavesImages(Protocol):
    """An engine whose own images can be taken into hermetic's store (a ``docker:ID`` base)."""

    def save_image(self, image_id: str) -> Iterator[bytes]:
        """The image as a docker-archive tar (``docker save``), as it arrives; NotFound when there is none."""


class Launched(Protocol):
    """A training container launched: ``finish`` streams its output until it ends (it starts it first when
    the engine does not start early), waits and removes it; ``cancel`` removes it unfinished (its command
    never ran: the run failed before opening its gate). One of them, once; then ``close``, which returns
    when the container is gone (an engine may remove it while the caller collects the run's outputs)."""

    def finish(self, watch: Watch | None = None) -> RunOutcome: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class DeferredLaunch:
    """``launch`` of an engine that does not start early: nothing exists until ``finish``."""

    engine: Any
    spec: ContainerSpec
    log_dir: Path
    echo: bool = True
    name: str | None = None

    def finish(self, watch: Watch | None = None) -> RunOutcome:
        return self.engine.run_streaming(self.spec, self.log_dir, echo=self.echo, name=self.name, watch=watch)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass  # run_streaming removed it before it returned


GATE_FIFO = "open"


def gate_program() -> str:
    """The gate's program (hermetic.inimage.gate), given to the image's own interpreter with ``-c``."""
    return (Path(__file__).resolve().parent.parent / "inimage" / "gate.py").read_text()


class Gate:
    """The door a training container's command waits at (hermetic.inimage.gate), and its tie to its driver.

    A FIFO in a directory of hermetic's, mounted read-only at GATE_MOUNT. hermetic holds it open from the
    start to the run's end (O_RDWR, close-on-exec), so the command's open never blocks; ``open`` writes the
    one byte the command reads before it runs the script. If hermetic closes it (``close``) first, the command
    reads end of file and the container ends unrun; if hermetic dies while the script runs, the gate reads
    end of file and stops the script: a container (``Engine.outlives_driver``) ends with its driver."""

    def __init__(self, directory: Path) -> None:
        from hermetic.hostfs.filesystems import unfit_for_runs

        self.directory = directory
        fifo = directory / GATE_FIFO
        try:
            os.mkfifo(fifo, 0o600)
            self._fd: int | None = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            # whatever the umask: the container's user opens it for reading, and nobody else for writing (a
            # writer other than hermetic would keep the container going after hermetic's death)
            os.chmod(fifo, 0o444)
        except OSError as e:  # exFAT answers EIO, FAT EPERM, others ENOSYS or EOPNOTSUPP
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise unfit_for_runs(fifo, "make the run's gate (a FIFO) there", e) from None

    def command(self, python: str, command: list[str]) -> list[str]:
        from hermetic.config.containerpaths import GATE_MOUNT

        return [python, "-I", "-S", "-c", gate_program(), f"{GATE_MOUNT}/{GATE_FIFO}", *command]

    def mount(self) -> Mount:
        from hermetic.config.containerpaths import GATE_MOUNT

        return Mount(self.directory, GATE_MOUNT, True)

    def open(self) -> None:
        if self._fd is not None:
            os.write(self._fd, b"g")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while a container ran (raised by the handler a run installs)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


def watch_beside(watch: Watch | None, done: threading.Event, stop: Callable[[], None], stopped: list[str]) -> None:
    """Run ``watch`` in a thread while the container runs (until ``done``): a reason it reports is appended to
    ``stopped`` and ``stop`` ends the container (the outcome then names the reason)."""
    if watch is None:
        return

    def on_exceeded(reason: str) -> None:
        stopped.append(reason)
        stop()

    threading.Thread(target=watch.run_until, args=(done, on_exceeded), daemon=True, name="hermetic-watch").start()


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_handlers(handler: Any = _raise_interrupted) -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted while inside (main thread only), installed before the container
    exists: a signal while it is created must not leave behind a container this process never heard of.
    (``signal.SIG_IGN``: a second Ctrl-C while the container is being stopped does not leave it half-stopped.)"""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def container_home_env(env: dict[str, str]) -> dict[str, str]:
    """The container's variables: HOME on the /tmp tmpfs (the root filesystem is read-only) unless given."""
    return {"HOME": "/tmp", **env}


def write_private(path: Path, text: str) -> None:
    """A new file only this user reads (no link followed): the container's variables, never on a command line."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def open_log_files(log_dir: Path) -> list[Any]:
    """stdout.log, stderr.log, combined.log, opened (truncated) before the container exists."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return [open(log_dir / n, "wb") for n in LOG_FILES]


def close_files(files: list[Any]) -> None:
    for f in files:
        with contextlib.suppress(OSError):  # a full disk: what could not be flushed is lost, not the run
            f.close()


def tee(data: bytes, own: Any, combined: Any, term: Any) -> None:
    """One chunk of a stream into its log and combined.log (flushed: ``hermetic logs -f`` reads them as the run
    goes on) and the terminal (``term``, when echoed); a full disk or a closed terminal does not stop the run."""
    with contextlib.suppress(OSError):
        own.write(data)
        combined.write(data)
        own.flush()
        combined.flush()
    if term is not None:
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (EPIPE), a hung-up terminal (EIO)
            term.write(data)
            term.flush()


def last_line(text: str | None, default: str = "(no message)") -> str:
    """The last line of a tool's error output that says something (at most 400 characters)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip() and "not a shared mount" not in ln]
    return lines[-1][:400] if lines else default


def find_tool(name: str, hint: str) -> str:
    """A tool's path, from PATH or the system's own directories; Unavailable saying ``hint`` when it has none."""
    found = shutil.which(name) or next((p for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
                                        if os.access(p := os.path.join(d, name), os.X_OK)), None)
    if found is None:
        raise Unavailable(f"`{name}` is not installed; {hint}")
    return found


def user_name(uid: int | None = None) -> str:
    import pwd

    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"u{uid}"


class ChildEngine:
    """What the engines whose container is a child process of hermetic's (Podman, Charliecloud) share: nothing
    exists until ``finish`` (DeferredLaunch), and ``run --gpus``, not ``doctor``, checks their way to GPUs."""

    name: str
    starts_early = False

    def engine_id(self) -> str:
        return f"{self.name} {self.version()} uid {os.geteuid()}"  # type: ignore[attr-defined]

    def gpu_readiness(self, gpu_on_host: bool) -> None:
        return None

    def build_feed(self, store: Any, base_config: dict[str, Any], base_layers: list[Any], total_layers: int,
                   repo_tag: str | None, labels: dict[str, str]) -> None:
        return None  # the image is made runnable at the end (ensure_image)

    def launch(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True,
               name: str | None = None) -> DeferredLaunch:
        return DeferredLaunch(self, spec, log_dir, echo=echo, name=name)


# -- a container's handle (docker-py's Container, or one that behaves so: Engine.container) ----------------

def stop_container(container: Any) -> None:
    """Stopped as ``docker stop`` does (SIGTERM, SIGKILL after 10 s), else killed; quietly."""
    try:
        container.stop(timeout=10)
    except Exception:
        try:
            container.kill()
        except Exception:
            pass


def remove_container(container: Any) -> None:
    """Removed (forced), tried three times; quietly (a container left behind is an orphan's sweep's)."""
    for _ in range(3):
        try:
            container.remove(force=True)
            return
        except Exception:
            continue


def rewrite_logs(container: Any, files: list[Any]) -> None:
    """The log files (stdout, stderr, combined) from the engine's own copy of the (stopped) container's
    output, complete; each streamed from the engine (a long run's log need not fit in memory)."""
    for f, (out, err) in zip(files, ((True, False), (False, True), (True, True))):
        try:
            chunks = container.logs(stdout=out, stderr=err, stream=True, follow=False)
            first = next(chunks, b"")
        except Exception:  # the engine lost it: keep what was streamed
            continue
        try:
            f.seek(0)
            f.truncate()
            f.write(first)
            for chunk in chunks:
                f.write(chunk)
            f.flush()
        except Exception:  # the engine lost it mid-way, or a full disk: keep what fits
            pass


def complete_logs(container: Any, files: list[Any], streamed: Any, echo: bool) -> None:
    """The attach stream (or the child's pipe) can end before the engine delivered all of a container's output
    when it exits quickly under load (moby#29285); the engine's own log has it all. Each stream's log is
    counted as it is read (never held); when it holds more than was ``streamed``, the files are rewritten
    from it and the rest is echoed."""
    import sys

    try:
        sizes = [sum(map(len, container.logs(stdout=out, stderr=not out, stream=True, follow=False)))
                 for out in (True, False)]
    except Exception:  # the engine lost it: keep what was streamed
        return
    if sizes[0] <= streamed[0] and sizes[1] <= streamed[1]:
        return
    rewrite_logs(container, files)
    for f, n, term in zip(files, streamed, (sys.stdout.buffer, sys.stderr.buffer) if echo else ()):
        with contextlib.suppress(OSError, ValueError), open(f.name, "rb") as src:
            src.seek(n)
            shutil.copyfileobj(src, term)
            term.flush()


CAPTURE_LIMIT = 16 << 20  # bytes of each stream a probe or reader container may print: their answers are small


class Capture:
    """One stream of ``run_capture``, as it is read: its bytes up to ``limit`` (past it ``add`` says stop and
    ``value`` fails, naming the container and the cap)."""

    def __init__(self, what: str, stream: str, limit: int = CAPTURE_LIMIT) -> None:
        self.what, self.stream, self.limit = what, stream, limit
        self.data, self.over = bytearray(), False

    def add(self, chunk: bytes) -> bool:
        self.over = self.over or len(self.data) + len(chunk) > self.limit
        if not self.over:
            self.data += chunk
        return not self.over

    def value(self) -> bytes:
        if self.over:
            raise EngineError(f"{self.what} printed more than {self.limit >> 20} MiB on {self.stream} (the most a "
                              f"probe or reader container may print); it was stopped there")
        return bytes(self.data)


def nproc_allowed(wanted: int) -> int:
    """``wanted`` processes as an RLIMIT_NPROC a container may be given: no higher than this account's hard limit,
    which no child of it may raise (Podman's --ulimit, Charliecloud's prlimit)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
