"""`hermetic run` on the real engine (issue 5): the complete record, refusals before any
container exists, interruption, secrets, the locked-down container, exit codes, listing
and seed groups. The project is a copy of examples/numpy-logreg, its image built once."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
import yaml

from conftest import assert_clean_error, run_cli
from run_support import (containers_created_since, git_commit_all,
                         hermetic_run, labelled_containers, run_dir_of, run_dirs, sha256_file)

SECRET = "s3cr3t-v4lue-xyz"
NO_GPU_RUNTIME = "this Docker Engine has no NVIDIA runtime: install nvidia-container-toolkit"


def unique() -> str:
    return "t" + uuid.uuid4().hex[:10]


def canonical_sha256(value) -> str:
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def lock_pins(lock: Path) -> dict[str, tuple[str, set[str]]]:
    """requirements.lock -> {name: (version, {sha256, ...})}."""
    pins: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in lock.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" in line and not line.startswith("--"):
            name, _, rest = line.partition("==")
            current = name.strip().lower()
            pins[current] = (rest.split()[0].rstrip("\\").strip(), set())
        if "--hash=sha256:" in line and current:
            for part in line.split("--hash=sha256:")[1:]:
                pins[current][1].add(part.split()[0].rstrip("\\"))
    return pins


def check_complete_record(proj: Path, rec: dict, argv: list[str], docker_client) -> Path:
    """Every section of a numpy-logreg run's record, checked against the files and the engine."""
    rd = run_dir_of(proj, rec)
    on_disk = json.loads((rd / "run.json").read_text())
    assert on_disk == rec  # --json printed what was written

    # record: sealed over its canonical JSON with the digest blank
    meta = rec["record"]
    assert meta["schema_version"] == 1 and meta["run_id"] == rd.name
    assert meta["status"] == "succeeded" and meta["exit_code"] == 0
    assert meta["started_at"] <= meta["finished_at"]
    blank = {**rec, "record": {**meta, "record_sha256": ""}}
    assert meta["record_sha256"] == canonical_sha256(blank)

    # invocation: argv, the resolved config and its digest, the same config beside the record
    inv = rec["invocation"]
    assert inv["argv"] == argv
    assert (rd / "argv.txt").read_text().splitlines() == argv
    assert inv["script"] == "train.py" and inv["args"] == [] and inv["network"] == "none"
    assert inv["gpus"] is None and inv["replay_of"] is None
    assert inv["config_sha256"] == canonical_sha256(inv["config"])
    assert yaml.safe_load((rd / "config.resolved.yaml").read_text()) == inv["config"]
    declared = yaml.safe_load((proj / "hermetic.yaml").read_text())
    assert inv["config"]["base"] == declared["base"]
    assert inv["config"]["datasets"] == declared["datasets"]
    assert inv["config"]["determinism"]["seed"] == declared["determinism"]["seed"] == 1234

    # image: what the engine runs, the lock it came from, no CUDA
    img = rec["image"]
    assert docker_client.images.get(img["id"]).id == img["id"]
    store_blob = Path(os.environ["HERMETIC_CACHE"]) / "oci" / "blobs" / "sha256" / img["manifest_digest"][7:]
    assert "sha256:" + sha256_file(store_blob) == img["manifest_digest"]
    assert img["base"] == declared["base"]
    assert img["lock_sha256"] == sha256_file(proj / "requirements.lock")
    assert (rd / "requirements.lock").read_bytes() == (proj / "requirements.lock").read_bytes()
    pins = lock_pins(proj / "requirements.lock")
    assert {p["name"].lower() for p in img["packages"]} == set(pins)
    for p in img["packages"]:
        version, hashes = pins[p["name"].lower()]
        assert p["version"] == version and p["sha256"] in hashes and p["filename"].endswith(".whl")
    assert set(img["cuda"].values()) == {None}

    # code: a snapshot of exactly the project's source files, hashed
    code = rec["code"]
    snap = code["snapshot"]
    assert snap["file"] == "code/source.tar" and snap["sha256"] == sha256_file(rd / "code" / "source.tar")
    for name in ("train.py", "hermetic.yaml", "requirements.lock", "make_data.py"):
        assert snap["files"][name] == sha256_file(proj / name)
    # the datasets and their manifests are the data section's
    assert "data.sha256" not in snap["files"]
    assert not any(f.startswith(("data/", "runs/", ".git/")) for f in snap["files"])
    with tarfile.open(rd / "code" / "source.tar") as tf:
        members = {m.name: m for m in tf.getmembers() if m.isfile()}
        assert set(members) == set(snap["files"])
        assert {m.mtime for m in members.values()} == {0} and {m.uid for m in members.values()} == {0}
        assert tf.extractfile(members["train.py"]).read() == (proj / "train.py").read_bytes()

    # data: the manifest's digest, bytes.count, and a copy of the manifest
    ds = rec["data"]["logreg"]
    manifest = proj / "data.sha256"
    files = [p for p in (proj / "data").iterdir() if p.is_file()]
    assert ds["manifest_sha256"] == sha256_file(manifest)
    assert ds["count"] == len(files) == 5 and ds["bytes"] == sum(p.stat().st_size for p in files)
    assert ds["verify_mode"] in ("stat-cache", "full") and ds["mount"] == "/data/logreg"
    assert ds["manifest_file"] == "data/logreg.sha256"
    assert (rd / "data" / "logreg.sha256").read_bytes() == manifest.read_bytes()

    # seed: value and policy, and what the runtime inside the image says it seeded
    seed = rec["seed"]
    assert seed["value"] == 1234 and seed["policy"] == "config"
    applied = seed["applied"]
    assert applied["seed"]["value"] == 1234 and applied["seed"]["source"] == "env:HERMETIC_SEED"
    assert {"python", "numpy"} <= set(applied["seed"]["seeded"])
    assert applied["determinism"]["mode"] == "strict" and applied["determinism"]["env_missing"] == []

    # env: the determinism variables in effect
    det = rec["env"]["determinism"]
    assert det["PYTHONHASHSEED"] == "0" and det["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert det["OMP_NUM_THREADS"] == det["MKL_NUM_THREADS"] == det["OPENBLAS_NUM_THREADS"] == "1"
    assert det["HERMETIC_DETERMINISM"] == "strict" and det["TZ"] == "UTC"
    assert rec["env"]["passed"] == {} and rec["env"]["secrets"] == []

    # software and hardware, from the probe in the same image
    sw = rec["software"]
    assert sw["python"]["version"].startswith("3.11.") and sw["python"]["executable"] == "/opt/venv/bin/python"
    assert sw["numpy"]["version"] == pins["numpy"][0] and sw["torch"] is None
    hw = rec["hardware"]
    assert hw["gpu_note"] == "no GPU visible" and hw["gpus"] == []
    assert hw["kernel"]["release"] == os.uname().release and hw["cpu"]["model"]
    assert hw["cpu"]["logical_cores"] >= 1

    # outputs and metrics
    outputs = rec["outputs"]["files"]
    assert set(outputs) == {"checkpoint.ckpt", "metrics.jsonl", "weights.bin", "weights.json"}
    for name, f in outputs.items():
        path = rd / "outputs" / name
        assert f["sha256"] == sha256_file(path) and f["size"] == path.stat().st_size
    lines = [json.loads(x) for x in (rd / "outputs" / "metrics.jsonl").read_text().splitlines()]
    final = rec["metrics"]["final"]
    assert final["epoch"] == 19 and final["test_acc"] == lines[-1]["test_acc"]
    assert final["test_loss"] == lines[-1]["test_loss"] and 0.5 < final["test_acc"] <= 1
    assert rec["metrics"]["file"] == "outputs/metrics.jsonl" and rec["metrics"]["steps"] == 800

    # beside the record: logs, README
    assert "final: test_loss=" in (rd / "logs" / "stderr.log").read_text()
    assert (rd / "logs" / "stdout.log").is_file() and (rd / "logs" / "combined.log").is_file()
    readme = (rd / "README.md").read_text()
    assert rd.name in readme and "hermetic replay" in readme
    assert not (rd / ".runtime").exists()
    return rd


@pytest.mark.docker
def test_complete_record_in_a_git_checkout(project, docker_client):
    head = git_commit_all(project)
    argv = ["hermetic", "run", "--json", "train.py"]
    _, rec = hermetic_run(project, "train.py")
    rd = check_complete_record(project, rec, argv, docker_client)
    git = rec["code"]["git"]
    assert git["commit"] == head and git["branch"] == "main"
    assert git["dirty"] is False and git["diff_sha256"] is None and git["untracked"] == {}
    assert ".gitignore" in rec["code"]["snapshot"]["files"]
    assert not (rd / "code" / "diff.patch").exists()

    # an uncommitted edit and an untracked file: recorded as such, and what ran
    (project / "train.py").write_text((project / "train.py").read_text() + "\n# edited\n")
    (project / "notes.txt").write_text("untracked\n")
    _, dirty = hermetic_run(project, "train.py", "--epochs", "2")
    git = dirty["code"]["git"]
    rd2 = run_dir_of(project, dirty)
    assert git["commit"] == head and git["dirty"] is True
    patch = (rd2 / "code" / "diff.patch").read_bytes()
    assert b"+# edited" in patch and git["diff_sha256"] == sha256_file(rd2 / "code" / "diff.patch")
    assert git["untracked"] == {"notes.txt": sha256_file(project / "notes.txt")}
    assert dirty["code"]["snapshot"]["files"]["train.py"] == sha256_file(project / "train.py")


@pytest.mark.docker
def test_complete_record_outside_git(project, docker_client):
    argv = ["hermetic", "run", "--json", "train.py"]
    _, rec = hermetic_run(project, "train.py")
    check_complete_record(project, rec, argv, docker_client)
    assert rec["code"]["git"] is None


@pytest.mark.docker
def test_changed_dataset_byte_is_refused_before_any_container(project, docker_client):
    data = project / "data" / "train-x.f32"
    raw = bytearray(data.read_bytes())
    raw[1000] ^= 0x01
    data.write_bytes(bytes(raw))
    name, before, t0 = unique(), run_dirs(project), time.time()
    proc = run_cli("run", "--name", name, "train.py", cwd=project)
    assert_clean_error(proc, 65, "logreg", "train-x.f32", "no container was started")
    assert "logreg: changed  train-x.f32" in proc.stderr  # the lines `hermetic data verify` prints
    # how to accept the change, if it was meant, with the paths as this project names them
    assert "hint: if the change is intended, write the manifest again and commit it: hermetic data manifest data " \
           "-o " in proc.stderr, proc.stderr
    assert run_dirs(project) == before  # no run directory
    assert labelled_containers(docker_client, name) == []
    assert containers_created_since(docker_client, t0, name) == []  # none made and removed either


@pytest.mark.docker
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_the_container_and_records_it(project, docker_client, sig, code):
    (project / "sleeper.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    name = unique()
    p = subprocess.Popen([sys.executable, "-m", "hermetic", "run", "--name", name, "sleeper.py"], cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        running = []
        while time.monotonic() < deadline and p.poll() is None:
            try:
                running = [c for c in labelled_containers(docker_client, name) if c.status == "running"]
                if running and b"started" in running[0].logs():
                    break
            except docker.errors.NotFound:  # listed, then gone before we looked (a probe): look again
                running = []
            time.sleep(0.1)
        assert running, f"the run's container never started (hermetic exit {p.poll()})"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert "Traceback" not in err
    assert labelled_containers(docker_client, name) == []
    (rd,) = [project / "runs" / r for r in run_dirs(project) if r.endswith(name)]
    rec = json.loads((rd / "run.json").read_text())
    assert rec["record"]["status"] == "interrupted" and rec["record"]["exit_code"] is None
    assert rec["record"]["finished_at"] is not None
    assert (rd / "logs" / "stdout.log").read_text() == "started\n"
    assert run_cli("runs", "show", rd.name, "--json", cwd=project).returncode == 0  # sealed, valid


PRINT_SECRET_DIGEST = """import hashlib, os
value = os.environ.get("API_TOKEN", "")
print("token sha256", hashlib.sha256(value.encode()).hexdigest())
"""


@pytest.mark.docker
@pytest.mark.parametrize("by_name", [False, True], ids=["NAME=VALUE", "NAME"])
def test_secret_value_is_in_no_file_of_the_run(project, by_name):
    (project / "show_token.py").write_text(PRINT_SECRET_DIGEST)
    if by_name:
        proc, rec = hermetic_run(project, "--env", "API_TOKEN", "--env", "PLAIN=visible", "show_token.py",
                                 env={"API_TOKEN": SECRET})
    else:
        proc, rec = hermetic_run(project, "--env", f"API_TOKEN={SECRET}", "--env=PLAIN=visible", "show_token.py")
    rd = run_dir_of(project, rec)
    # the container got the exact value ...
    stdout = (rd / "logs" / "stdout.log").read_text()
    assert f"token sha256 {hashlib.sha256(SECRET.encode()).hexdigest()}" in stdout
    # ... and no file of the run holds it, nor hermetic's own output
    leaks = [str(p.relative_to(rd)) for p in rd.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []
    assert SECRET not in proc.stdout + proc.stderr
    assert rec["env"]["secrets"] == ["API_TOKEN"] and rec["env"]["passed"] == {"PLAIN": "visible"}
    expected = "API_TOKEN" if by_name else "API_TOKEN=<redacted>"
    assert expected in rec["invocation"]["argv"] or f"--env={expected}" in rec["invocation"]["argv"]
    assert (rd / "argv.txt").read_text().splitlines() == rec["invocation"]["argv"]


@pytest.mark.docker
def test_gpus_without_nvidia_runtime_is_a_clean_refusal(logreg, docker_client):
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime; the refusal is for engines without it")
    name, before, t0 = unique(), run_dirs(logreg), time.time()
    proc = run_cli("run", "--name", name, "--gpus", "all", "train.py", cwd=logreg)
    assert_clean_error(proc, 69, NO_GPU_RUNTIME)
    assert run_dirs(logreg) == before
    assert labelled_containers(docker_client, name) == []
    assert containers_created_since(docker_client, t0, name) == []


LOCKDOWN = """import json, os, socket
result = {}
for path in ("/etc/x", "/usr/x", "/workspace/x", "/workspace/data/x", "/data/logreg/x", "/tmp/x", "/outputs/x"):
    try:
        with open(path, "w") as f:
            f.write("x")
        result[path] = "ok"
    except OSError as e:
        result[path] = e.errno
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
mounts = {line.split()[1]: line.split()[3].split(",") for line in open("/proc/self/mounts")}
result.update(
    uid=os.getuid(), gid=os.getgid(), home=os.environ.get("HOME"),
    caps={k: int(status[k].strip(), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    no_new_privs=status["NoNewPrivs"].strip(),
    interfaces=sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]),
    ro={m: "ro" in mounts.get(m, []) for m in ("/", "/workspace", "/workspace/data", "/data/logreg", "/outputs",
                                               "/tmp")},
    sockets=[p for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock") if os.path.exists(p)],
    hostname=[socket.gethostname(), os.environ.get("HOSTNAME")],
)
# the pids limit: the container's pids cgroup where it has one, else RLIMIT_NPROC (its user namespace's count)
try:
    result["pids"] = open("/sys/fs/cgroup/pids/pids.max").read().strip()
except OSError:
    result["pids"] = "max"
if result["pids"] == "max":
    import resource
    result["pids"] = str(resource.getrlimit(resource.RLIMIT_NPROC)[0])
print(json.dumps(result))
"""


@pytest.mark.docker
@pytest.mark.parametrize("engine", ["docker", pytest.param("podman", marks=pytest.mark.engines),
                                    pytest.param("charliecloud", marks=pytest.mark.engines)])
def test_container_is_locked_down_and_outputs_belong_to_the_caller(project, engine):
    """The same hardening checked from inside the container on every engine (hermetic.engines)."""
    (project / "lockdown.py").write_text(LOCKDOWN)
    _, rec = hermetic_run(project, "--engine", engine, "lockdown.py")
    assert rec["invocation"]["engine"]["name"] == engine
    rd = run_dir_of(project, rec)
    seen = json.loads((rd / "logs" / "stdout.log").read_text())
    for path in ("/etc/x", "/usr/x", "/workspace/data/x", "/data/logreg/x"):
        assert seen[path] == errno.EROFS, (path, seen[path])
    # the working directory is a writable copy of the code; the dataset inside it and at its mount is not
    assert seen["/tmp/x"] == "ok" and seen["/outputs/x"] == "ok" and seen["/workspace/x"] == "ok"
    assert seen["ro"] == {"/": True, "/workspace": False, "/workspace/data": True, "/data/logreg": True,
                          "/outputs": False, "/tmp": False}
    assert seen["uid"] != 0 and seen["gid"] != 0
    assert seen["home"].startswith("/tmp")
    if engine == "charliecloud":  # no capability held; the bounding set is the user namespace's own, and said so
        assert seen["caps"] == {**dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapAmb"), 0),
                                "CapBnd": seen["caps"]["CapBnd"]}
        assert any("bounding set" in n for n in rec["invocation"]["engine"]["notes"])
    else:
        assert seen["caps"] == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0)
    assert seen["no_new_privs"] == "1"
    assert seen["interfaces"] == ["lo"]
    assert seen["sockets"] == []  # no engine's socket inside
    assert seen["pids"] == "4096"  # run.pids's default
    assert seen["hostname"] == ["hermetic", "hermetic"] and rec["invocation"]["hostname"] == "hermetic"
    # what the container wrote is the caller's on the host (root here: uid 0)
    assert (rd / "outputs" / "x").read_text() == "x"
    assert rec["outputs"]["files"]["x"]["size"] == 1
    for p in [rd, *rd.rglob("*")]:
        st = p.lstat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), p


@pytest.mark.docker
def test_run_section_sizes_shm_and_tmp_and_the_record_keeps_them(project):
    cfg_path = project / "hermetic.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["run"] = {"shm_size": "96m", "tmp_size": "80m"}
    cfg_path.write_text(yaml.safe_dump(cfg))
    (project / "sizes.py").write_text(
        "import json, os\n"
        "print(json.dumps({p: os.statvfs(p).f_blocks * os.statvfs(p).f_frsize for p in ('/dev/shm', '/tmp')}))\n")
    _, rec = hermetic_run(project, "sizes.py")
    seen = json.loads((run_dir_of(project, rec) / "logs" / "stdout.log").read_text())
    assert seen == {"/dev/shm": 96 << 20, "/tmp": 80 << 20}
    assert rec["invocation"]["config"]["run"] == {"shm_size": "96m", "tmp_size": "80m", "workdir_size": "4g",
                                                  "outputs": {"include": ["**"], "exclude": [], "stdout": False,
                                                              "volatile": ["**/events.out.tfevents.*"]},
                                                  "pids": 4096, "memory": None, "engine": "docker",
                                                  "metrics": "auto"}


@pytest.mark.docker
def test_exit_code_is_the_containers(project):
    (project / "fail.py").write_text("import sys\nprint('giving up', file=sys.stderr)\nsys.exit(7)\n")
    _, rec = hermetic_run(project, "fail.py", expect=7)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 7
    assert "giving up" in (run_dir_of(project, rec) / "logs" / "stderr.log").read_text()
    plain = run_cli("run", "fail.py", cwd=project)  # the summary form says the same
    assert plain.returncode == 7 and "failed  exit 7" in plain.stdout
    # A script may return a code from hermetic's own range: it is passed through all the same, and the
    # record says it was the script's (failed, no reason, no hermetic_exit_code), not a refusal.
    (project / "fail.py").write_text("raise SystemExit(65)\n")
    _, rec = hermetic_run(project, "fail.py", expect=65)
    assert rec["record"]["status"] == "failed" and rec["record"]["exit_code"] == 65
    assert "reason" not in rec["record"] and "hermetic_exit_code" not in rec["record"]


@pytest.mark.docker
def test_runs_lists_and_shows(project):
    (project / "fail.py").write_text("raise SystemExit(3)\n")
    _, ok = hermetic_run(project, "train.py", "--epochs", "2")
    _, failed = hermetic_run(project, "fail.py", expect=3)
    proc = run_cli("runs", "--json", cwd=project)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [(r["id"], r["status"]) for r in listed] == [(failed["record"]["run_id"], "failed"),
                                                       (ok["record"]["run_id"], "succeeded")]
    assert listed[1]["final"] == ok["metrics"]["final"] and listed[1]["seed"] == 1234
    text = run_cli("runs", cwd=project)
    assert text.returncode == 0 and ok["record"]["run_id"] in text.stdout and "failed" in text.stdout
    for rec in (ok, failed):
        shown = run_cli("runs", "show", rec["record"]["run_id"], "--json", cwd=project)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == rec
    missing = run_cli("runs", "show", "19990101-000000-000000", cwd=project)
    assert_clean_error(missing, 66, "19990101-000000-000000")


T_975_DF2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom


def run_group(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`hermetic run --seeds 0,1,2 ARGS`; (process, the group.json it wrote, read from disk)."""
    proc = run_cli("run", "--seeds", "0,1,2", *args, "train.py", "--epochs", "4", cwd=project)
    assert proc.returncode == 0, proc.stderr
    (gid,) = (re.findall(r"(?m)^group (\S+): 3 of 3 runs succeeded -> ", proc.stdout)
              or re.findall(r'"group_id": "([^"]+)"', proc.stdout))
    return proc, json.loads((project / "runs" / gid / "group.json").read_text())


@pytest.mark.docker
def test_seed_group_statistics_and_group_diff(project):
    _, ga = run_group(project)
    gid = ga["group"]["group_id"]
    assert [m["seed"] for m in ga["members"]] == [0, 1, 2]
    members = [json.loads((project / "runs" / m["run_id"] / "run.json").read_text()) for m in ga["members"]]
    assert [(r["seed"]["value"], r["seed"]["policy"], r["invocation"]["group"]) for r in members] == \
        [(0, "group", gid), (1, "group", gid), (2, "group", gid)]
    assert len({r["outputs"]["files"]["weights.bin"]["sha256"] for r in members}) == 3  # the seed reaches the run
    finals = members[0]["metrics"]["final"]
    assert set(ga["metrics"]) == set(finals)
    for name in finals:
        values = [r["metrics"]["final"][name] for r in members]
        st = ga["metrics"][name]
        assert st["n"] == 3 and st["values"] == values
        assert math.isclose(st["mean"], statistics.fmean(values), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(st["sd"], statistics.stdev(values), rel_tol=1e-9, abs_tol=1e-15)
        half = T_975_DF2 * st["sd"] / math.sqrt(3)
        assert math.isclose(st["ci95"][0], st["mean"] - half, rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(st["ci95"][1], st["mean"] + half, rel_tol=1e-9, abs_tol=1e-12)
    assert statistics.stdev(r["metrics"]["final"]["test_loss"] for r in members) > 0

    _, gb = run_group(project)
    proc = run_cli("diff", gid, gb["group"]["group_id"], "--json", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = json.loads(proc.stdout)
    assert d["kind"] == "groups" and d["verdict"]["kind"] == "within_noise"
    assert {m["status"] for m in d["metrics"]} == {"within_noise"}
    assert not any(s["differs"] for s in d["inputs"])
    text = run_cli("diff", gid, gb["group"]["group_id"], cwd=project)
    assert text.returncode == 0 and text.stdout.startswith("within seed noise")


@pytest.mark.docker
def test_seed_group_prints_its_summary(project):
    proc, group = run_group(project, "--json")
    assert json.loads(proc.stdout) == group
    text, _ = run_group(project)
    assert re.search(r"(?m)^  test_loss: mean [0-9.]+  sd [0-9.e-]+  95% CI \[", text.stdout), text.stdout


def test_redact_argv_hides_secret_values_only():
    from hermetic.run.runner import redact_argv

    argv = ["hermetic", "run", "--env", "API_TOKEN=v1", "--env=DB_PASSWORD=v2", "--env", "PLAIN=ok",
            "--env", "WANDB_API_KEY", "--env", "--env", "train.py", "--lr", "0.1"]
    assert redact_argv(argv) == ["hermetic", "run", "--env", "API_TOKEN=<redacted>", "--env=DB_PASSWORD=<redacted>",
                                 "--env", "PLAIN=ok", "--env", "WANDB_API_KEY", "--env", "--env", "train.py",
                                 "--lr", "0.1"]
