"""Charliecloud: the training container through ``ch-run``, unprivileged, no daemon, no image import.

The image is one SquashFS file (hermetic.engines.squashfs) mounted where squashfuse can mount it (by the
kernel's squashfs instead where root runs a file only root can change), else its layers unpacked once as
directories (hermetic.engines.unpack); either way a read-only overlay's lowest layer
(HERMETIC_IMAGE_FORM: auto, squashfs or directory). One process tree, hermetic's child: ``setpriv
--pdeathsig KILL -- unshare [--user] --mount --net --pid --fork --kill-child -- catatonit -- sh -c SETUP;
exec ch-run ...``: mounts made in its own mount
namespace (read-only binds, tmpfs /tmp and /dev/shm, a /dev of a few nodes), no network, catatonit as the
PID namespace's init, RLIMIT_NPROC as the pids limit (no cgroup: a memory limit is refused). Its driver's
death ends it (PR_SET_PDEATHSIG, then the PID namespace's init): it leaves no orphan.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from hermetic.engines.base import (
    BuildFeed, ChildEngine, ContainerSpec, EngineInfo, Readiness, RunOutcome, Watch, close_files, container_home_env,
    find_tool, last_line, nproc_allowed, open_log_files, user_name, write_private,
)
from hermetic.engines import squashfs as sqfs
from hermetic.engines.gpu import charliecloud_gpu_files, driver_version, make_gpu_layer, nvidia_device_nodes
from hermetic.engines.process import capture_process, signal_exit_code, stream_process
from hermetic.hostfs.fsutil import stat_key
from hermetic.core.errors import EngineError, HermeticError, Unavailable

INSTALL_HINT = "install Charliecloud (Debian: apt-get install charliecloud-runtime catatonit)"
DOCTOR_HINT = "apt-get install charliecloud-runtime catatonit (docs/scale-out.md, \"Engines\")"
INITS = ("catatonit", "tini-static", "docker-init", "tini")  # a static init, run as the PID namespace's init
STOP_TIMEOUT = 10
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"))
CAPS_NOTE = ("capability bounding set: the user namespace's own (no capability is held: ch-run maps the user to "
             "itself, no_new_privs)")
PIDS_NOTE = "pids limit as RLIMIT_NPROC of the container's user namespace (no cgroup: Charliecloud is unprivileged)"
DEV_NOTE = "/dev: null, zero, full, random, urandom, tty, a private /dev/shm and /dev/pts (no device cgroup)"


def engine_root() -> Path:
    from hermetic.core.paths import cache_root

    return cache_root() / "charliecloud"


class CharliecloudEngine(ChildEngine):
    """Charliecloud as hermetic.engines.base.Engine."""

    name = "charliecloud"
    label = "charliecloud"
    image_home = "Charliecloud's layers"
    outlives_driver = False  # its container is its driver's child and dies with it (module doc)
    runs_squashfs = True

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        self._version: str | None = None
        self._checked: set[tuple[Any, ...]] = set()  # image files hashed in full by this process (stat keys)

    @property
    def root(self) -> Path:
        """Where the layers and image records are: the cache's (HERMETIC_CACHE may change in a Slurm task)."""
        return self._root or engine_root()

    # -- facts ---------------------------------------------------------------------------------------------

    def ch_run(self) -> str:
        return find_tool("ch-run", INSTALL_HINT)

    def version(self) -> str:
        if self._version is None:
            proc = subprocess.run([self.ch_run(), "--version"], capture_output=True, text=True,
                                  env={**os.environ, "USER": os.environ.get("USER") or user_name()})
            self._version = (proc.stdout.strip() or proc.stderr.strip() or "?").splitlines()[-1]
        return self._version

    def connect(self) -> None:
        self.ch_run()
        self.init()

    def info(self, spec: ContainerSpec | None = None) -> EngineInfo:
        notes = [CAPS_NOTE, DEV_NOTE]
        if spec is None or spec.pids_limit is not None:
            notes.insert(0, PIDS_NOTE)
        rec = self.image_record(spec.manifest_digest) if spec is not None and spec.manifest_digest else None
        image = None
        if rec is not None and rec.get("squashfs"):
            image = {"form": "squashfs", **rec["squashfs"]}
            mounter = "the kernel's squashfs" if sqfs.kernel_mountable(Path(image["path"])) else "squashfuse"
            notes.append(f"image: the SquashFS file {image['path']} (sha256 {image['sha256']}), mounted by {mounter}")
        elif rec is not None:
            image = {"form": "directory", "path": str(self.root / "layers"), "sha256": None}
            notes.append(f"image: its layers as directories under {image['path']} ({self.image_form()[1]})")
        return EngineInfo("charliecloud", self.version(), os.geteuid() != 0, tuple(notes), image)

    def check_spec(self, spec: ContainerSpec) -> None:
        if spec.memory is not None:
            raise Unavailable(f"Charliecloud cannot hold the container to a memory limit (run.memory: {spec.memory}): "
                              "it runs unprivileged, with no cgroup; set run.memory: null in hermetic.yaml to run "
                              "without one, or use --engine podman or docker")
        uid, _gid = _ids(spec.user)
        if uid == 0:
            raise EngineError("Charliecloud runs the script as a non-root user; the container user is root")
        for k, v in spec.env.items():
            if "\n" in v or "\n" in k:
                raise EngineError(f"--env {k}: a value with a line break cannot be given to ch-run")
        self.connect()

    def init(self) -> str:
        for name in INITS:
            found = shutil.which(name)
            if found:
                return found
        raise Unavailable("no static init for the container (catatonit, tini-static): "
                          "apt-get install catatonit")

    def readiness(self) -> Readiness:
        """Whether ``--engine charliecloud`` can run here: ch-run, an init, unprivileged namespaces and overlay."""
        if shutil.which("ch-run") is None:
            return Readiness("warn", "not installed", DOCTOR_HINT)
        try:
            self.connect()
            version = self.version()
        except HermeticError as e:
            return Readiness("warn", e.message, DOCTOR_HINT)
        trial = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--", "sh", "-c",
                                "mkdir -p /tmp && mount -t tmpfs tmpfs /tmp"], capture_output=True, text=True)
        if trial.returncode != 0:
            why = last_line(trial.stderr, "?")
            return Readiness("warn", f"Charliecloud {version}, but an unprivileged user namespace cannot mount "
                                     f"({why})", "allow unprivileged user namespaces (sysctl user.max_user_namespaces, "
                                                 "kernel.unprivileged_userns_clone=1)")
        return Readiness("ok", f"Charliecloud {version} (ch-run {shutil.which('ch-run')}; pids limit as RLIMIT_NPROC, "
                               "no memory limit)")

    def check_gpus(self, gpus: str) -> None:
        charliecloud_gpu_files()  # raises Unavailable with what to install
        nvidia_device_nodes(gpus)

    def gpu_layer(self, rec: dict[str, Any]) -> Path:
        """The image's layer of this host's NVIDIA driver files (ch-fromhost --nvidia), made once per driver."""
        dest = self.root / "gpu" / f"{rec['manifest_digest'].split(':', 1)[1]}-{driver_version()}"
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": user_name()}
        sq = Path(rec["squashfs"]["path"]) if rec.get("squashfs") else None
        return make_gpu_layer([self.root / "layers" / h for h in rec.get("layers", [])], dest, env, sq)

    # -- images ----------------------------------------------------------------------------------------------

    def image_form(self) -> tuple[str, str | None]:
        """("squashfs" | "directory", why not the file): the file where squashfuse can mount it (module doc)."""
        form = sqfs.wanted_form()
        if form == "directory":
            return "directory", f"{sqfs.FORM_VARIABLE}=directory"
        given = os.environ.get(sqfs.FILE_VARIABLE)  # a Slurm task's file: nothing to make here
        why = sqfs.fuse_reason()
        if why is None:
            return "squashfs", None
        if form == "squashfs" or given:
            raise Unavailable(f"the image cannot run from {given or 'a SquashFS file'} "
                              f"here: {why}; nothing was mounted or run",
                              hint=f"install squashfuse and allow FUSE, or set {sqfs.FORM_VARIABLE}=directory "
                                   "(the layers unpacked into the cache)")
        return "directory", why

    def _check_given(self, path: Path, manifest_digest: str, sha256: str | None) -> sqfs.SquashImage:
        """A Slurm task's file hashed in full against the submitted sha256, once per process while its stat
        stays the same (the probe's container and the run's mount it after ensure_image's check)."""
        try:
            seen: tuple[Any, ...] | None = (str(path), *stat_key(path.stat()))
        except OSError:
            seen = None  # check says what is missing
        image = sqfs.check(path, manifest_digest, sha256, full=seen is None or seen not in self._checked)
        if seen is not None:
            self._checked.add(seen)
        return image

    def image_record_path(self, manifest_digest: str, form: str = "directory") -> Path:
        tail = "-squashfs" if form == "squashfs" else ""
        return self.root / "images" / f"{manifest_digest.split(':', 1)[1]}{tail}.json"

    def image_record(self, manifest_digest: str, form: str | None = None) -> dict[str, Any] | None:
        """The image's record in ``form`` (default: the form it runs in here), when what it names is there."""
        form = form or self.image_form()[0]
        try:
            rec = json.loads(self.image_record_path(manifest_digest, form).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict):
            return None
        if form == "squashfs":
            given = os.environ.get(sqfs.FILE_VARIABLE)
            if given:  # a Slurm task's file (its record names it, once checked in ensure_image)
                return rec if rec.get("squashfs", {}).get("path") == given else None
            try:  # the cache's own file, as recorded (a stat where it was hashed since); else made again
                sqfs.check(Path(rec["squashfs"]["path"]), manifest_digest, rec["squashfs"]["sha256"], full=False)
            except (HermeticError, KeyError, TypeError):
                return None
            return rec
        layers = self.root / "layers"
        if not all((layers / h).is_dir() for h in rec.get("layers", [])):
            return None
        return rec

    def has_image(self, manifest_digest: str, image_id: str) -> bool:
        """By its record and layers."""
        return self.image_record(manifest_digest) is not None

    def ensure_image(self, store: Any, manifest_digest: str, *, repo_tag: str | None = None,
                     feed: BuildFeed | None = None) -> bool:
        """The image's SquashFS file made (or a Slurm task's checked), or every layer unpacked, then the image's
        record; True when anything was made."""
        from hermetic.engines.unpack import ensure_layer
        from hermetic.hostfs.fsutil import atomic_write_bytes

        form = self.image_form()[0]
        given = os.environ.get(sqfs.FILE_VARIABLE)
        if self.image_record(manifest_digest, form) is not None and not given:
            return False
        manifest = store.read_json(manifest_digest)
        config = store.read_json(manifest["config"]["digest"])
        made = False
        cc = config.get("config") or {}
        rec = {"manifest_digest": manifest_digest, "image_id": manifest["config"]["digest"],
               "env": list(cc.get("Env") or []), "workdir": cc.get("WorkingDir") or "/"}
        if form == "squashfs":
            if given:  # a Slurm task: the submitted file, its sha256 checked in full before anything mounts it
                image = self._check_given(Path(given), manifest_digest, os.environ.get(sqfs.EXPECT_VARIABLE) or None)
            else:
                from hermetic.core.paths import cache_root

                image = sqfs.make(store, manifest_digest, sqfs.store_path(cache_root(), manifest_digest))
                made = image.made
            rec["squashfs"] = {"path": str(image.path), "sha256": image.sha256}
        else:
            hexes = []
            for layer in manifest["layers"]:
                _path, now = ensure_layer(store, layer["digest"], layer.get("mediaType", ""), self.root / "layers")
                made = made or now
                hexes.append(layer["digest"].split(":", 1)[1])
            rec["layers"] = hexes
        path = self.image_record_path(manifest_digest, form)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(rec, sort_keys=True).encode())
        return True

    # -- containers --------------------------------------------------------------------------------------

    def run_streaming(self, spec: ContainerSpec, log_dir: Path, *, echo: bool = True, name: str | None = None,
                      watch: Watch | None = None) -> RunOutcome:
        self.check_spec(spec)
        files = open_log_files(log_dir)
        try:
            with self._launch(spec) as (argv, env):
                end = stream_process(argv, files, stop=_stop, echo=echo, watch=watch, env=env)
        finally:
            close_files(files)
        if end.interrupted:
            return RunOutcome(None, True, end.signal_name)
        return RunOutcome(signal_exit_code(end.returncode or 0), False, None, end.stopped_because)

    def run_capture(self, spec: ContainerSpec, timeout: float | None = None) -> tuple[int, bytes, bytes]:
        self.check_spec(spec)
        with self._launch(spec) as (argv, env):  # killed, setpriv's process takes its namespace's init along
            code, out, err = capture_process(argv, env, timeout, f"the container of image {spec.image_id[:19]}")
        return signal_exit_code(code), out, err

    def containers_labelled(self, *labels: str) -> list[dict] | None:
        return []  # no container outlives its driver (module doc)

    def container(self, container_id: str) -> None:
        return None

    @contextlib.contextmanager
    def _launch(self, spec: ContainerSpec) -> Iterator[tuple[list[str], dict[str, str]]]:
        """(argv, environment) of one container; its scratch directory goes afterwards."""
        if not spec.manifest_digest:
            raise EngineError("Charliecloud runs an image from hermetic's store: the spec names no manifest")
        rec = self.image_record(spec.manifest_digest)
        if rec is None:
            raise EngineError(f"image {spec.image_id[:19]} is not unpacked for Charliecloud; run `hermetic build`")
        if rec.get("squashfs") and os.environ.get(sqfs.FILE_VARIABLE):  # (the cache's own: image_record checked it)
            self._check_given(Path(rec["squashfs"]["path"]), spec.manifest_digest, rec["squashfs"]["sha256"])
        uid, gid = _ids(spec.user)
        as_root = os.geteuid() == 0
        scratch = Path(tempfile.mkdtemp(prefix="hermetic-ch-"))  # under /tmp: a 0700 home's could not be reached
        try:
            os.chmod(scratch, 0o711)  # by the container's user
            for m in spec.mounts:  # a mount point inside another mount's source: made there (as docker does)
                for other in spec.mounts:
                    if other is not m and _inside(m.target, other.target):
                        _mkdirs_beneath(Path(other.source), m.target[len(other.target):].strip("/"), uid, gid, as_root)
            env_file = scratch / "env"  # the variables by file: a secret's value never on a command line
            image_env = dict(e.split("=", 1) for e in rec["env"] if "=" in e and not e.startswith("="))
            env = {**image_env, **container_home_env(spec.env)}
            if spec.hostname:  # as Docker and Podman set it
                env.setdefault("HOSTNAME", spec.hostname)
            # ch-run strips the outer quotes only
            write_private(env_file, "".join(f"{k}='{v}'\n" for k, v in env.items()))
            if as_root:
                os.chown(env_file, uid, gid)
            argv = self._argv(spec, rec, scratch, uid, gid, as_root, env_file)
            yield argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": user_name(uid), "LANG": "C.UTF-8",
                         "HOME": "/tmp"}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _argv(self, spec: ContainerSpec, rec: dict[str, Any], scratch: Path, uid: int, gid: int, as_root: bool,
              env_file: Path) -> list[str]:
        tools = ("setpriv", "unshare", "prlimit", "mount", "mkdir", "ln", "touch")
        setpriv, unshare, prlimit, mount, mkdir, ln, touch = (find_tool(t, "install util-linux") for t in tools)
        q = shlex.quote
        stage = str(scratch / "s")
        os.mkdir(stage, 0o711)
        if as_root:
            os.chown(stage, uid, gid)
        lines = ["set -eu", f"S={q(stage)}"]
        if spec.hostname:  # in the container's own UTS namespace (unshare --uts), seen by nothing else
            lines.append(f"{find_tool('hostname', 'install hostname')} {q(spec.hostname)}")
        lines += [f'{mount} -t tmpfs -o mode=0711,size=16m,nosuid,nodev tmpfs "$S"',
                  f'{mkdir} "$S/root" "$S/mp" "$S/l" "$S/tmp" "$S/dev"']
        # the top layer: the mount points (made here, in a tmpfs that holds no link)
        lines += [f'{mkdir} -p "$S/mp"{q(t)}' for t in sorted({m.target for m in spec.mounts} | {"/tmp", spec.workdir})]
        layer_paths = [self.root / "layers" / h for h in rec.get("layers", [])]
        if spec.gpus:
            layer_paths.append(self.gpu_layer(rec))
        # short names: lowerdir must fit in one page
        lines += [f'{ln} -s {q(str(path))} "$S/l/{i}"' for i, path in enumerate(reversed(layer_paths))]
        lowers = ":".join(["../mp"] + [str(i) for i in range(len(layer_paths))])
        if rec.get("squashfs"):  # the image's one file, the lowest layer (allow_other: root mounts, the user reads)
            image = q(rec["squashfs"]["path"])
            if sqfs.kernel_mountable(Path(rec["squashfs"]["path"])):
                mounted = f'{mount} -t squashfs -o loop,ro,nosuid,nodev {image} "$S/sq"'
            else:
                squashfuse = find_tool(sqfs.MOUNTER, "apt-get install squashfuse")
                mounted = f'{squashfuse} -o ro{",allow_other" if as_root else ""} {image} "$S/sq"'
            lines += [f'{mkdir} "$S/sq"', mounted]
            lowers += ":../sq"
        lines += ['cd "$S/l"', f'{mount} -t overlay overlay -o ro,userxattr,lowerdir={lowers} "$S/root"', "cd /"]
        binds = []
        for i, m in enumerate(spec.mounts):
            lines += [f'{mkdir} "$S/b{i}"', f'{mount} --bind {q(str(m.source))} "$S/b{i}"']
            if m.read_only:
                lines.append(f'{mount} -o remount,bind,ro "$S/b{i}"')
            binds += ["-b", f"{stage}/b{i}:{m.target}"]
        lines.append(f'{mount} -t tmpfs -o size={q(spec.tmpfs_size)},mode=1777,nosuid,nodev tmpfs "$S/tmp"')
        # A /dev of a few nodes in place of the host's (ch-run binds this namespace's /dev into the image).
        lines.append(f'{mount} -t tmpfs -o mode=0755,size=1m,nosuid tmpfs "$S/dev"')
        gpu_nodes = nvidia_device_nodes(spec.gpus) if spec.gpus else []
        lines += [f'{touch} "$S/dev/{n}" && {mount} --bind /dev/{n} "$S/dev/{n}"' for n in (*DEV_NODES, *gpu_nodes)]
        lines += [f'{mkdir} "$S/dev/shm" "$S/dev/pts"',
                  f'{mount} -t tmpfs -o size={q(spec.shm_size)},mode=1777,nosuid,nodev,noexec tmpfs "$S/dev/shm"',
                  f'{mount} -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$S/dev/pts"']
        lines += [f'{ln} -s {target} "$S/dev/{n}"' for n, target in DEV_LINKS]
        lines.append(f'{mount} --rbind "$S/dev" /dev')
        ch = [self.ch_run(), "--uid", str(uid), "--gid", str(gid), "-c", spec.workdir, "--unset-env=*",
              f"--set-env={env_file}", "--env-no-expand", *binds, "-b", f"{stage}/tmp:/tmp", f"{stage}/root", "--",
              *spec.command]
        nproc = nproc_allowed(spec.pids_limit) if spec.pids_limit else None
        inner = ([prlimit, f"--nproc={nproc}:{nproc}", "--"] if nproc else []) + ch
        if as_root:  # the namespaces and mounts as root; the container as the spec's user, in a namespace of its own
            inner = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
                     unshare, "--user", "--map-root-user", "--", *inner]
        lines.append("exec " + " ".join(q(a) for a in inner))
        return [setpriv, "--pdeathsig", "KILL", "--", unshare, *([] if as_root else ["--user", "--map-root-user"]),
                "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", *(["--uts"] if spec.hostname else []),
                *(["--net"] if spec.network == "none" else []), "--", self.init(), "--", "/bin/sh", "-c",
                "\n".join(lines)]

def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the container's init (it forwards it to the script); after STOP_TIMEOUT, SIGKILL to the
    namespace (unshare's --kill-child takes its init with it, and the kernel the rest)."""
    init = _child_of(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(init if init is not None else proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()


def _child_of(pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _ids(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def _inside(path: str, parent: str) -> bool:
    return path != parent and path.startswith(parent.rstrip("/") + "/")


def _mkdirs_beneath(root: Path, rel: str, uid: int, gid: int, as_root: bool) -> None:
    """``rel``'s directories beneath ``root``, no link followed (the mount point of a nested mount)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in [p for p in rel.split("/") if p]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                if as_root:
                    os.chown(part, uid, gid, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)

