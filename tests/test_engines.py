"""The engines that are not Docker (hermetic.engines): Podman and Charliecloud, for real, on the numpy example.

The same run on each engine is the same record but for the engine (diff names it, the outputs are the
same bits); the image goes into each engine straight from the store, once; a fork bomb fills the pids
limit, not the host; Ctrl-C and SIGTERM stop the container and the record says interrupted; a Podman
container whose gate was stopped outlives its SIGKILLed driver and `hermetic runs` reaps it (a driver's
death on each engine: test_driver_death.py); what an engine cannot give (a memory limit without a cgroup, GPUs without a
CDI spec or driver libraries) is refused before anything is made. The hardening itself is checked from
inside the container by test_run's lockdown test, parametrized by engine.

Then the layer unpacker (hermetic.engines.unpack), without any engine: it refuses what climbs out of the
image or writes through a link, device nodes, a corrupt blob; it strips setuid; whiteouts become overlay's.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from kill_support import processes_running, sigkill, start_hermetic, wait_for
from run_support import diff_json, hermetic_run, run_dir_of, run_dirs

ENGINES = ("podman", "charliecloud")


def unique() -> str:
    return "e" + uuid.uuid4().hex[:10]


def set_run_keys(project: Path, **keys) -> None:
    cfg = project / "hermetic.yaml"
    text = cfg.read_text()
    assert "\nrun:" not in text
    cfg.write_text(text + "run:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items()))


# ---------------------------------------------------------------- the same run on every engine


@pytest.mark.docker
@pytest.mark.engines
def test_the_same_run_on_each_engine_differs_only_by_the_engine(logreg):
    _, docker_rec = hermetic_run(logreg, "--engine", "docker", "train.py", "--epochs", "2")
    for engine in ENGINES:
        proc, rec = hermetic_run(logreg, "--engine", engine, "train.py", "--epochs", "2")
        e = rec["invocation"]["engine"]
        assert e["name"] == engine and e["version"] and isinstance(e["notes"], list)
        assert rec["image"]["id"] == docker_rec["image"]["id"]  # the image's identity is its digest everywhere
        code, diff = diff_json(run_dir_of(logreg, docker_rec), run_dir_of(logreg, rec))
        # the same bits; the engine is named as a difference of the host (the machine), not of the inputs
        assert code == 0 and diff["verdict"]["kind"] == "identical", diff["verdict"]
        assert any(f"engine docker " in n and f"-> {engine} " in n for n in diff["verdict"]["notes"]), diff["verdict"]
        (host,) = [sec for sec in diff["sections"] if sec["name"] == "cpu"]
        assert [c["key"] for c in host["changes"] if c["material"]] == ["engine"]


@pytest.mark.docker
@pytest.mark.engines
def test_podman_gets_the_image_from_the_store_once_with_dockers_image_id(logreg, module_cache):
    from hermetic.engines import get_engine
    from hermetic.store.oci import OciStore

    store = OciStore(module_cache / "oci")
    md = store.resolve("numpy-logreg:latest").digest
    image_id = store.read_json(md)["config"]["digest"]
    podman = get_engine("podman")
    podman.ensure_image(store, md)
    assert podman.has_image(md, image_id)
    assert podman.ensure_image(store, md) is False  # never copied again
    shown = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image_id], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert "sha256:" + shown == image_id or shown == image_id


@pytest.mark.docker
@pytest.mark.engines
def test_charliecloud_unpacks_each_layer_once_and_shares_it(logreg, module_cache, monkeypatch):
    from hermetic.engines import get_engine
    from hermetic.store.oci import OciStore

    monkeypatch.setenv("HERMETIC_IMAGE_FORM", "directory")  # the form where squashfuse cannot mount a file

    store = OciStore(module_cache / "oci")
    md = store.resolve("numpy-logreg:latest").digest
    ch = get_engine("charliecloud")
    ch.ensure_image(store, md)
    rec = ch.image_record(md)
    assert rec is not None and rec["image_id"] == store.read_json(md)["config"]["digest"]
    layers = [ch.root / "layers" / h for h in rec["layers"]]
    inodes = {p: p.stat().st_ino for p in layers}
    assert ch.ensure_image(store, md) is False
    assert {p: p.stat().st_ino for p in layers} == inodes  # nothing unpacked again


# ---------------------------------------------------------------- limits, refusals


# Children that stay until the limit is reached, then the error that says so (a bomb that forks on forever
# fills the limit as well, but takes its time to end).
BOMB = """import os, signal, time
children = []
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        children.append(pid)
except BlockingIOError:
    print("forked", len(children), flush=True)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    raise
"""


@pytest.mark.docker
@pytest.mark.engines
@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_fork_bomb_fills_the_pids_limit_on_each_engine(project, engine):
    set_run_keys(project, pids=64)
    (project / "bomb.py").write_text(BOMB)
    name = unique()
    _, rec = hermetic_run(project, "--engine", engine, "--name", name, "bomb.py", expect=1, timeout=240)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 1, rec["record"]
    assert rec["invocation"]["limits"] == {"pids": 64, "memory": None}
    err = (run_dir_of(project, rec) / "logs" / "stderr.log").read_text(errors="replace")
    assert "Resource temporarily unavailable" in err
    forked = int((run_dir_of(project, rec) / "logs" / "stdout.log").read_text().split()[-1])
    assert 32 < forked < 64, forked  # the limit held them (the init, the script and its threads count too)
    assert processes_running("bomb.py") == []


@pytest.mark.docker
@pytest.mark.engines
def test_a_memory_limit_charliecloud_cannot_hold_is_refused_before_anything_is_made(project):
    set_run_keys(project, memory="256m")
    before = run_dirs(project)
    proc = run_cli("run", "--engine", "charliecloud", "train.py", cwd=project)
    assert_clean_error(proc, 69, "run.memory: 256m", "set run.memory: null")
    assert run_dirs(project) == before


@pytest.mark.docker
@pytest.mark.engines
def test_gpus_without_a_cdi_spec_or_driver_libraries_are_refused(logreg):
    from hermetic.engines.gpu import CDI_DIRS, CLI

    if any(d.is_dir() and any(d.iterdir()) for d in CDI_DIRS):
        pytest.skip("this host has a CDI spec; the refusal is for hosts without one")
    before = run_dirs(logreg)
    proc = run_cli("run", "--engine", "podman", "--gpus", "all", "train.py", cwd=logreg)
    assert_clean_error(proc, 69, "no CDI spec for nvidia.com/gpu", "nvidia-ctk cdi generate")
    proc = run_cli("run", "--engine", "charliecloud", "--gpus", "all", "train.py", cwd=logreg)
    assert_clean_error(proc, 69, "ch-fromhost --nvidia")
    assert CLI in proc.stderr or "driver" in proc.stderr
    assert run_dirs(logreg) == before


def test_gpu_requests_map_to_cdi_names_and_device_nodes():
    from hermetic.engines.gpu import cdi_devices

    assert cdi_devices(None) == []
    assert cdi_devices("all") == ["nvidia.com/gpu=all"]
    assert cdi_devices("2") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert cdi_devices("device=1,GPU-3b5c1f42") == ["nvidia.com/gpu=1", "nvidia.com/gpu=GPU-3b5c1f42"]


def test_a_cdi_spec_is_read_and_a_device_it_lacks_is_refused(tmp_path, monkeypatch):
    from hermetic.engines import gpu, podman
    from hermetic.core.errors import Unavailable

    spec = tmp_path / "nvidia.yaml"
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: GPU-aa\n")
    monkeypatch.setattr(gpu, "CDI_DIRS", (tmp_path,))
    assert gpu.cdi_device_names() == {"0", "GPU-aa", "all"}
    engine = podman.PodmanEngine()
    engine.check_gpus("all")
    engine.check_gpus("device=GPU-aa")
    with pytest.raises(Unavailable, match="has no device nvidia.com/gpu=1"):
        engine.check_gpus("device=1")


def test_podman_flags_carry_dockers_hardening_and_rootless_limits_say_how():
    from hermetic.engines.base import ContainerSpec, Mount
    from hermetic.engines.podman import PodmanEngine, container_env_file
    from hermetic.core.errors import Unavailable

    spec = ContainerSpec(image_id="sha256:" + "0" * 64, command=["python", "x.py"], user="1000:1000",
                         mounts=[Mount(Path("/d"), "/data", True), Mount(Path("/w"), "/workspace", False)],
                         env={"API_TOKEN": "s3cret"}, pids_limit=64, memory="1g", driver="host-a:123:456",
                         labels={"org.hermetic.run-id": "r1"})
    rootful = PodmanEngine()
    rootful.rootless, rootful.cgroup_limits = False, True
    with container_env_file(spec) as env_file:
        args, env = rootful.create_args(spec, "n", env_file)
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert "API_TOKEN=s3cret\n" in env_file.read_text() and "HOME=/tmp\n" in env_file.read_text()
    assert not env_file.parent.exists()
    joined = " ".join(args)
    for flag in ("--read-only", "--read-only-tmpfs=false", "--cap-drop all", "--security-opt no-new-privileges",
                 "--network none", "--init", "--pids-limit 64", "--memory 1g", "--memory-swap 1g",
                 "type=bind,src=/d,dst=/data,ro=true", "type=bind,src=/w,dst=/workspace", "--user 1000:1000",
                 "--label org.hermetic.run-id=r1", "--label org.hermetic.driver=host-a:123:456"):
        assert flag in joined, flag
    assert "s3cret" not in joined and "API_TOKEN" not in env  # in the file only
    assert env.get("HOME") == os.environ.get("HOME")  # podman's own HOME: rootless storage stays where it is
    rootless = PodmanEngine()
    rootless.rootless, rootless.cgroup_limits = True, False
    with pytest.raises(Unavailable, match="run.memory: 1g"):
        rootless.check_spec(spec)
    spec.memory = None
    spec.driver = ""  # a spec that names no driver: no driver label (the run names itself: engines.base)
    args, _ = rootless.create_args(spec, "n")
    joined = " ".join(args)
    assert "org.hermetic.driver" not in joined
    assert "--userns keep-id" in joined and "nproc=64:64" in joined and "--pids-limit" not in joined
    assert any("RLIMIT_NPROC" in n for n in rootless.info(spec).notes)


# ---------------------------------------------------------------- interruption, orphans, a driver's death


WRITER = ("import time\nprint('started', flush=True)\ni = 0\nwhile True:\n    i += 1\n"
          "    open(f'/outputs/tick-{i:05d}.txt', 'w').write(str(i))\n    time.sleep(0.2)\n")


def _started(project: Path, name: str, p) -> Path:
    found: list[Path] = []

    def writing() -> bool:
        rd = next((project / "runs" / r for r in run_dirs(project) if r.endswith(name)), None)
        if rd is not None and len(list((rd / "outputs").glob("tick-*"))) >= 3:
            found.append(rd)
            return True
        return False

    wait_for(p, writing, "the script's third file", timeout=240)
    return found[0]


@pytest.mark.docker
@pytest.mark.engines
@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine,sig,code", [("podman", signal.SIGINT, 130), ("charliecloud", signal.SIGTERM, 143)])
def test_an_interrupt_stops_the_container_and_the_record_says_so(project, engine, sig, code):
    script = f"writer_{unique()}.py"
    (project / script).write_text(WRITER)
    name = unique()
    p = subprocess.Popen([sys.executable, "-m", "hermetic", "run", "--engine", engine, "--name", name, script],
                         cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rd = _started(project, name, p)
        p.send_signal(sig)
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert "Traceback" not in err
    rec = json.loads((rd / "run.json").read_text())
    assert rec["record"]["status"] == "interrupted" and rec["record"]["finished_at"] is not None
    assert (rd / "logs" / "stdout.log").read_text() == "started\n"
    assert processes_running(script) == []
    if engine == "podman":
        left = subprocess.run(["podman", "ps", "-a", "-q", "--filter", f"label=org.hermetic.run-id={rd.name}"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert left == []


@pytest.mark.docker
@pytest.mark.engines
@pytest.mark.timeout(400)
def test_a_killed_drivers_podman_container_is_reaped_by_hermetic_runs(project):
    """One whose gate cannot end it (the script stopped it: as test_orphans' for Docker) is the reaper's."""
    script = f"writer_{unique()}.py"
    (project / script).write_text("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n" + WRITER)
    name = unique()
    p = start_hermetic("run", "--engine", "podman", "--name", name, script, cwd=project)
    rd = _started(project, name, p)
    pid = sigkill(p)
    time.sleep(0.5)
    assert processes_running(script), "the container went on (its gate stopped)"
    proc = run_cli("runs", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert f"run {rd.name}: its driver (hermetic, pid {pid}) died while the container ran" in proc.stderr
    rec = json.loads((rd / "run.json").read_text())
    assert rec["record"]["status"] == "interrupted" and rec["record"]["finished_at"]
    left = subprocess.run(["podman", "ps", "-a", "-q", "--filter", f"label=org.hermetic.run-id={rd.name}"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == [] and processes_running(script) == []


@pytest.mark.docker
@pytest.mark.engines
def test_a_replay_runs_on_the_engine_the_run_used(logreg):
    _, rec = hermetic_run(logreg, "--engine", "charliecloud", "train.py", "--epochs", "1")
    proc = run_cli("replay", "--json", str(run_dir_of(logreg, rec)), cwd=logreg)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    again = json.loads((logreg / "runs" / doc["replay"] / "run.json").read_text())
    assert again["invocation"]["engine"]["name"] == "charliecloud"
    assert doc["diff"]["verdict"]["kind"] == "identical", doc["diff"]["verdict"]


# ---------------------------------------------------------------- the layer unpacker, alone


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, link: str = "", data: bytes | None = None):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info, (data if data is not None else (b"x" if kind == tarfile.REGTYPE else None))


def _unpack(tmp_path: Path, entries) -> Path:
    from hermetic.engines.unpack import unpack_tar

    blob = tmp_path / "layer.tar"
    blob.write_bytes(_tar(entries))
    dest = tmp_path / "out"
    dest.mkdir()
    with open(blob, "rb") as f:
        unpack_tar(f, dest, what="test layer")
    return dest


@pytest.mark.parametrize("entries,needle", [
    ([_entry("../escape")], "climbs out"),
    ([_entry("a/../../escape")], "climbs out"),
    ([_entry("link", tarfile.SYMTYPE, link="/etc"), _entry("link/passwd")], "not a directory in the layer"),
    ([_entry("etc/null", tarfile.CHRTYPE)], "device node"),
    ([_entry("run/fifo", tarfile.FIFOTYPE)], "FIFO"),
    ([_entry("hard", tarfile.LNKTYPE, link="nowhere")], "no such file"),
], ids=["dotdot", "dotdot-inside", "through-a-link", "device", "fifo", "hardlink-to-nothing"])
def test_the_unpacker_refuses_what_climbs_out_or_is_no_plain_file(tmp_path, entries, needle):
    from hermetic.engines.unpack import LayerRefused

    with pytest.raises(LayerRefused, match=needle):
        _unpack(tmp_path, entries)
    assert not (tmp_path / "escape").exists()


def test_the_unpacker_strips_setuid_keeps_links_and_makes_overlay_whiteouts(tmp_path):
    dest = _unpack(tmp_path, [
        _entry("usr/bin/su", mode=0o4755),
        _entry("usr/bin/sg", mode=0o2755),
        _entry("bin", tarfile.SYMTYPE, link="usr/bin"),
        _entry("etc/alt", tarfile.SYMTYPE, link="/usr/bin/su"),  # absolute: resolved in the container, not here
        _entry("usr/bin/su2", tarfile.LNKTYPE, link="usr/bin/su"),
        _entry("dev/null", tarfile.CHRTYPE),  # under dev/: skipped (the container's /dev is made at start)
        _entry("opt", tarfile.DIRTYPE, mode=0o555),
        _entry("opt/.wh..wh..opq"),
        _entry("var/.wh.cache"),
    ])
    assert stat.S_IMODE((dest / "usr/bin/su").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "usr/bin/sg").stat().st_mode) == 0o755
    assert os.readlink(dest / "bin") == "usr/bin" and os.readlink(dest / "etc/alt") == "/usr/bin/su"
    assert (dest / "usr/bin/su2").stat().st_ino == (dest / "usr/bin/su").stat().st_ino
    assert not (dest / "dev/null").exists()
    assert stat.S_IMODE((dest / "opt").stat().st_mode) == 0o555
    assert os.getxattr(dest / "opt", "user.overlay.opaque") == b"y"
    wh = (dest / "var/cache").lstat()
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == os.makedev(0, 0)
    assert not (dest / "opt/.wh..wh..opq").exists()


@pytest.mark.parametrize("later", [_entry("a", data=b"a file now"), _entry(".wh.a", data=b"")], ids=["file", "whiteout"])
def test_a_directory_a_later_entry_replaces_goes_with_its_mode(tmp_path, later):
    """A tar may name a path twice and the last entry wins: the directory it replaces goes, and its mode (set
    once everything is in) with it. It was refused, as if the new entry were a link in the way."""
    dest = _unpack(tmp_path, [_entry("a", tarfile.DIRTYPE, mode=0o500), _entry("a/b", tarfile.DIRTYPE, mode=0o500),
                              _entry("a/b/f"), later])
    st = (dest / "a").lstat()
    if later[0].name == "a":
        assert stat.S_ISREG(st.st_mode) and (dest / "a").read_bytes() == b"a file now"
    else:
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)


def test_a_corrupt_blob_is_never_unpacked(tmp_path):
    from hermetic.engines.unpack import ensure_layer
    from hermetic.core.errors import IntegrityError
    from hermetic.store.oci import OciStore

    store = OciStore(tmp_path / "oci").ensure()
    digest = store.put_bytes(_tar([_entry("hello.txt", data=b"hello")]))
    blob = store.blob_path(digest)
    data = bytearray(blob.read_bytes())
    data[600] ^= 1  # inside hello.txt's bytes
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="corrupt in the store"):
        ensure_layer(store, digest, "application/vnd.oci.image.layer.v1.tar", tmp_path / "layers")
    assert not (tmp_path / "layers" / digest.split(":")[1]).exists()
