"""Podman: the training container through the ``podman`` command, rootful or rootless, no daemon.

The image is copied from hermetic's OCI store with ``skopeo copy`` (its ID stays Docker's), once. Docker's
hardening maps to Podman's flags; where no cgroup holds the limits (rootless on cgroup v1) the pids limit is
RLIMIT_NPROC of the container's user namespace and a memory limit is refused. Variables go by a file only
the user reads (``--env-file``), never on a command line. Containers carry Docker's labels: the orphan
reaper finds them the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from hermetic.engines.base import (
    BuildFeed, ChildEngine, ContainerSpec, EngineInfo, Readiness, RunOutcome, Watch, close_files,
    complete_logs, container_home_env, last_line, nproc_allowed, oom_reason, open_log_files, rewrite_logs,
    user_name, write_private,
)
from hermetic.engines.gpu import cdi_devices, check_cdi
from hermetic.engines.process import capture_process, stream_process
from hermetic.core.errors import EngineError, HermeticError, IntegrityError, Unavailable

INSTALL_HINT = "install Podman (Debian: apt-get install podman catatonit uidmap skopeo)"
DOCTOR_HINT = "apt-get install podman catatonit uidmap skopeo (docs/scale-out.md, \"Engines\")"
STOP_TIMEOUT = 10  # seconds between SIGTERM and SIGKILL, as docker stop


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768


class PodmanContainer:
    """A Podman container as docker-py's Container looks to hermetic.run.orphans (attrs, reload, stop, ...)."""

    def __init__(self, engine: "PodmanEngine", container_id: str, attrs: dict[str, Any]) -> None:
        self.engine, self.id, self.attrs = engine, container_id, attrs

    def reload(self) -> None:
        found = self.engine.inspect(self.id)
        if found is None:
            raise EngineError(f"Podman has no container {self.id[:12]} any more")
        self.attrs = found

    def stop(self, timeout: int = STOP_TIMEOUT) -> None:
        self.engine.podman("stop", "-t", str(timeout), self.id, timeout=timeout + 60)

    def kill(self) -> None:
        self.engine.podman("kill", self.id, check=False)

    def remove(self, force: bool = False) -> None:
        self.engine.podman("rm", *(["-f"] if force else []), self.id)

    def logs(self, stdout: bool = True, stderr: bool = True, stream: bool = False, follow: bool = False):
        chunks = self.engine.log_chunks(self.id, stdout=stdout, stderr=stderr)
        return chunks if stream else b"".join(chunks)


class PodmanEngine(ChildEngine):
    """Podman as hermetic.engines.base.Engine."""

    name = "podman"
    label = "podman"
    image_home = "Podman's storage"
    outlives_driver = True  # conmon keeps a container going after the `podman run` that started it is killed
    runs_squashfs = False

    def __init__(self) -> None:
        self._version: str | None = None
        self.rootless = os.geteuid() != 0
        # Rootless Podman on cgroup v1 has no cgroup it may write: the limits cannot be cgroup limits.
        self.cgroup_limits = not self.rootless or Path("/sys/fs/cgroup/cgroup.controllers").exists()  # cgroup v2

    # -- the command -------------------------------------------------------------------------------------

    def binary(self) -> str:
        found = shutil.which("podman")
        if found is None:
            raise Unavailable("Podman is not installed (no `podman` on PATH); " + INSTALL_HINT)
        return found

    def podman(self, *args: str, check: bool = True, timeout: float = 600, env: dict[str, str] | None = None,
               text: bool = True) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run([self.binary(), *args], capture_output=True, text=text, timeout=timeout, env=env,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise EngineError(f"`podman {args[0]}` did not answer within {timeout:.0f} s") from None
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode("utf-8", "replace")
            raise EngineError(f"`podman {' '.join(args[:2])}` failed (exit {proc.returncode}): {last_line(err)}")
        return proc

    # -- facts ----------------------------------------------------------------------------------------------

    def version(self) -> str:
        if self._version is None:
            self._version = self.podman("version", "--format", "{{.Client.Version}}").stdout.strip() or "?"
        return self._version

    def connect(self) -> None:
        self.version()

    def info(self, spec: ContainerSpec | None = None) -> EngineInfo:
        notes = []
        if not self.cgroup_limits and (spec is None or spec.pids_limit is not None):
            notes.append("pids limit as RLIMIT_NPROC of the container's user namespace (--ulimit nproc): rootless "
                         "Podman on cgroup v1 has no cgroup to hold it")
        return EngineInfo("podman", self.version(), self.rootless, tuple(notes))

    def check_spec(self, spec: ContainerSpec) -> None:
        if spec.memory is not None and not self.cgroup_limits:
            raise Unavailable(f"rootless Podman on cgroup v1 cannot hold the container to a memory limit (run.memory: "
                              f"{spec.memory}): no cgroup is delegated to this user; set run.memory: null in "
                              f"hermetic.yaml to run without one, or run where cgroup v2 is delegated")
        for k, v in spec.env.items():
            if "\n" in v or "\n" in k or "=" in k:
                raise EngineError(f"--env {k.split(chr(10))[0]}: a name with '=' or a line break, or a value with a "
                                  "line break, cannot be given to Podman")
        for m in spec.mounts:
            for what in (str(m.source), m.target):
                if "," in what:
                    raise EngineError(f"{what}: Podman's --mount cannot name a path with a comma; rename it or "
                                      "use another engine")
        self.binary()

    def readiness(self) -> Readiness:
        """Whether ``--engine podman`` can run here, and how it holds the limits."""
        if shutil.which("podman") is None:
            return Readiness("warn", "not installed", DOCTOR_HINT)
        try:
            version = self.version()
        except HermeticError as e:
            return Readiness("warn", e.message, DOCTOR_HINT)
        missing = [t for t in ("skopeo",) if shutil.which(t) is None]
        if not any(shutil.which(i) or Path("/usr/libexec/podman", i).exists() for i in ("catatonit", "tini")):
            missing.append("catatonit")
        if self.rootless:
            missing += [t for t in ("newuidmap", "newgidmap") if shutil.which(t) is None]
            if not _has_subid_range():
                return Readiness("warn", f"Podman {version}, rootless, but /etc/subuid gives this user no range",
                                 "add one: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER")
        if missing:
            return Readiness("warn", f"Podman {version}, but {', '.join(missing)} missing", DOCTOR_HINT)
        limits = "cgroup limits" if self.cgroup_limits else "pids limit as RLIMIT_NPROC, no memory limit (cgroup v1)"
        how = f"{'rootless' if self.rootless else 'rootful'}, {limits}"
        return Readiness("ok", f"Podman {version} ({how})")

    def check_gpus(self, gpus: str) -> None:
        check_cdi(gpus)

    # -- images ---------------------------------------------------------------------------------------------

    def has_image(self, manifest_digest: str, image_id: str) -> bool:
        """By ID."""
        return self.podman("image", "exists", image_id, check=False).returncode == 0

    def ensure_image(self, store: Any, manifest_digest: str, *, repo_tag: str | None = None,
                     feed: BuildFeed | None = None) -> bool:
        """Copy the image into containers-storage unless Podman has it (by ID); True when it was copied."""
        manifest_bytes = store.read_blob(manifest_digest)
        image_id = json.loads(manifest_bytes)["config"]["digest"]
        if self.has_image(manifest_digest, image_id):
            if repo_tag:
                self.point_tag(image_id, repo_tag)
            return False
        if shutil.which("skopeo") is None:
            raise Unavailable("skopeo is not installed: Podman's images come from hermetic's store through it "
                              "(Debian: apt-get install skopeo)")
        dest = podman_tag(repo_tag) if repo_tag else f"localhost/hermetic/by-digest:{manifest_digest[7:27]}"
        with tempfile.TemporaryDirectory(prefix="hermetic-oci-") as layout:
            # A layout of one image whose blobs are the store's own: skopeo reads them in place.
            root = Path(layout)
            (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
            desc = {"mediaType": json.loads(manifest_bytes).get("mediaType")
                    or "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest, "size": len(manifest_bytes),
                    "annotations": {"org.opencontainers.image.ref.name": "image"}}
            (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
            os.symlink(os.path.realpath(store.root / "blobs"), root / "blobs")
            proc = subprocess.run(["skopeo", "copy", "--quiet", f"oci:{root}:image", f"containers-storage:{dest}"],
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            err = last_line(proc.stderr)
            if "digest" in err.lower() and "match" in err.lower():
                from hermetic.store.intact import REPAIR

                raise IntegrityError(f"image {manifest_digest}: a blob in the store does not match its digest "
                                     f"({err}); nothing was copied into Podman; run `{REPAIR}`, then build or pull "
                                     "the image again")
            raise EngineError(f"copying image {image_id[:19]} into Podman's storage failed: {err}")
        if not self.has_image(manifest_digest, image_id):
            raise EngineError(f"Podman did not keep image {image_id} after it was copied (it holds another ID)")
        return True

    def point_tag(self, image_id: str, repo_tag: str) -> None:
        self.podman("tag", image_id, podman_tag(repo_tag), check=False)

    # -- containers ---------------------------------------------------------------------------------------

    def create_args(self, spec: ContainerSpec, name: str | None = None,
                    env_file: Path | None = None) -> tuple[list[str], dict[str, str]]:
        """(``podman run`` arguments, the podman process's own environment). The container's variables are in
        ``env_file`` (``container_env_file``), never on a command line nor in podman's environment, where the
        container's HOME would move rootless Podman's storage."""
        args = ["run", "--log-driver", "k8s-file", "--init", "--read-only", "--read-only-tmpfs=false",
                "--tmpfs", f"/tmp:rw,nosuid,nodev,exec,size={spec.tmpfs_size},mode=1777",
                "--cap-drop", "all", "--security-opt", "no-new-privileges", "--network", spec.network,
                "--shm-size", spec.shm_size, "--user", spec.user, "--workdir", _workdir(spec),
                "--stop-timeout", str(STOP_TIMEOUT)]
        if spec.hostname:
            args += ["--hostname", spec.hostname]
        if self.rootless:
            args += ["--userns", "keep-id"]  # the script is the invoking user: what it writes is theirs
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        nproc = nproc_allowed(_pid_max())
        if spec.pids_limit is not None:
            if self.cgroup_limits:
                args += ["--pids-limit", str(spec.pids_limit)]
            else:
                nproc = min(nproc, spec.pids_limit)
        elif self.cgroup_limits:
            args += ["--pids-limit", "-1"]
        args += ["--ulimit", f"nofile={_rlim(nofile[0])}:{_rlim(nofile[1])}", "--ulimit", f"nproc={nproc}:{nproc}"]
        if spec.memory is not None:
            args += ["--memory", spec.memory, "--memory-swap", spec.memory]
        for k, v in spec.all_labels().items():
            args += ["--label", f"{k}={v}"]
        for m in spec.mounts:
            args += ["--mount", f"type=bind,src={m.source},dst={m.target}" + (",ro=true" if m.read_only else "")]
        for device in cdi_devices(spec.gpus):
            args += ["--device", device]
        if env_file is not None:
            args += ["--env-file", str(env_file)]
        if name:
            args += ["--name", name]
        args += [spec.image_id, *spec.command]
        proc_env = {k: v for k, v in os.environ.items() if k in _PODMAN_ENV or k.startswith(("CONTAINERS_", "XDG_"))}
        return args, proc_env

    def run_streaming(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True, name: str | None = None,
                      watch: Watch | None = None) -> RunOutcome:
        self.check_spec(spec)
        name = name or _unique_name()
        files = open_log_files(log_dir)
        try:
            with container_env_file(spec) as env_file:
                args, env = self.create_args(spec, name, env_file)
                end = stream_process([self.binary(), *args], files, stop=lambda _p: self._stop(name), echo=echo,
                                     watch=watch, env=env)
            if end.interrupted:
                rewrite_logs(PodmanContainer(self, name, {}), files)
                return RunOutcome(None, True, end.signal_name)
            # `podman run` exits with the container's status; Podman's record of it is read only when the
            # script did not exit 0 (an OOM kill, a start that failed): it costs a podman process
            state = {} if end.returncode == 0 else (self.inspect(name) or {}).get("State") or {}
            if end.returncode != 0 and not state:
                raise EngineError(f"Podman could not run the container: {last_line(_tail(log_dir))}")
            if state.get("Error") and not state.get("StartedAt", "").startswith(("2", "1")):
                raise EngineError(f"Podman could not start the container: {state['Error']}")
            complete_logs(PodmanContainer(self, name, {}), files, end.streamed, echo)
            code = int(state.get("ExitCode", end.returncode if end.returncode is not None else 1))
            oom = oom_reason(spec.memory) if code != 0 and state.get("OOMKilled") else None
            return RunOutcome(code, False, None, end.stopped_because, oom_reason=oom)
        finally:
            close_files(files)
            with contextlib.suppress(EngineError):  # did not answer: the orphan sweep removes it later
                self.remove(name)

    def remove(self, name: str) -> None:
        """Remove a container of this process's by name (gone already: nothing to do)."""
        self.podman("rm", "-f", name, check=False)

    def run_capture(self, spec: ContainerSpec, timeout: float | None = None) -> tuple[int, bytes, bytes]:
        self.check_spec(spec)
        name = _unique_name()
        try:
            with container_env_file(spec) as env_file:
                args, env = self.create_args(spec, name, env_file)
                return capture_process([self.binary(), args[0], "--rm", *args[1:]], env, timeout, f"container {name}")
        finally:
            self.remove(name)

    def _stop(self, name: str) -> None:
        self.podman("stop", "-t", str(STOP_TIMEOUT), name, check=False, timeout=STOP_TIMEOUT + 60)

    def inspect(self, container: str) -> dict[str, Any] | None:
        proc = self.podman("container", "inspect", container, check=False)
        if proc.returncode != 0:
            return None
        try:
            found = json.loads(proc.stdout)
        except ValueError:
            return None
        return found[0] if isinstance(found, list) and found else None

    def log_chunks(self, container: str, stdout: bool = True, stderr: bool = True) -> Iterator[bytes]:
        """What the container printed, from Podman's log, as it is read (both streams: in the order printed)."""
        out = subprocess.PIPE if stdout else subprocess.DEVNULL
        err = (subprocess.STDOUT if stdout else subprocess.PIPE) if stderr else subprocess.DEVNULL
        with subprocess.Popen([self.binary(), "logs", container], stdout=out, stderr=err,
                              stdin=subprocess.DEVNULL) as proc:
            pipe = proc.stdout if stdout else proc.stderr
            yield from iter(lambda: pipe.read1(1 << 16), b"")  # type: ignore[union-attr]

    # -- orphans ---------------------------------------------------------------------------------------------

    def containers_labelled(self, *labels: str) -> list[dict] | None:
        """Podman's containers (any state) with all ``labels``, as Docker's rows (``Id``, ``Labels``, ``State``):
        [] when Podman is not installed or this user's Podman never stored anything (it has no container, and
        no question is asked: that costs a process start), None when it cannot be asked."""
        podman = shutil.which("podman")
        if podman is None:
            return []
        if os.geteuid() == 0:
            storage = Path("/var/lib/containers/storage")
        else:
            data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
            storage = Path(data, "containers", "storage")
        if not storage.is_dir():
            return []
        args = [podman, "ps", "-a", "--format", "json"]
        for label in labels:
            args += ["--filter", f"label={label}"]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            rows = json.loads(proc.stdout or "[]") if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
        if not isinstance(rows, list):
            return None
        return [{"Id": r.get("Id", ""), "Labels": r.get("Labels") or {}, "State": r.get("State", "")} for r in rows]

    def container(self, container_id: str) -> PodmanContainer | None:
        attrs = self.inspect(container_id)
        return None if attrs is None else PodmanContainer(self, container_id, attrs)


_PODMAN_ENV = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL")


@contextlib.contextmanager
def container_env_file(spec: ContainerSpec):
    """The container's variables (``NAME=VALUE`` lines, podman's --env-file) in a file only this user can read,
    in a directory of its own, removed afterwards: a secret's value is on no command line."""
    d = tempfile.mkdtemp(prefix="hermetic-podman-env-")
    try:
        path = Path(d) / "env"
        write_private(path, "".join(f"{k}={v}\n" for k, v in container_home_env(spec.env).items()))
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)


def podman_tag(repo_tag: str) -> str:
    """Docker's ``hermetic/NAME:latest`` as Podman names a local image (not docker.io's)."""
    host = repo_tag.split("/", 1)[0]
    return repo_tag if host == "localhost" or "." in host else f"localhost/{repo_tag}"


def _workdir(spec: ContainerSpec) -> str:
    """The working directory; "/" when nothing is mounted there (the probe's): Podman, unlike Docker, does not
    make a missing working directory in a read-only root."""
    return spec.workdir if any(m.target == spec.workdir for m in spec.mounts) else "/"


def _rlim(v: int) -> str:
    return "-1" if v == resource.RLIM_INFINITY else str(v)


def _unique_name() -> str:
    return f"hermetic-{os.getpid()}-{time.monotonic_ns() % 10**12}"


def _tail(log_dir: Path) -> str:
    try:
        return (log_dir / "stderr.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def _has_subid_range() -> bool:
    """Whether /etc/subuid gives this user a range (rootless Podman's user namespace needs one)."""
    try:
        lines = Path("/etc/subuid").read_text().splitlines()
    except OSError:
        return False
    return any(ln.split(":")[0] in (user_name(), str(os.geteuid())) for ln in lines if ln.count(":") == 2)
