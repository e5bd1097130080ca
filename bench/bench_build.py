#!/usr/bin/env python3
"""Image build: ``hermetic build`` vs a conventional Dockerfile through ``docker build``.

One invocation per image, same machine, same lock, same base image, same wheel files. Images:
the CPU torch example (examples/torch-mlp, the default) or, with ``--cuda``, torch 2.13.0's
CUDA 13 build from PyPI with numpy (30 wheels, 2.7 GB; locked here with ``hermetic lock
--no-pip-find-links``; about 25 GB of disk while it runs, all removed at the end; not for CI).

* hermetic: ``hermetic build -C <project> --json`` (a subprocess, so CLI start
  and the load into the Docker Engine are counted), each cold build in a fresh
  HERMETIC_CACHE that holds only the base image and the wheel store (both
  hard-linked from a seed cache: the network is not what is measured).
* docker: ``FROM`` the same base image (loaded from hermetic's OCI store and
  tagged hermetic-bench-base:1), ``COPY`` of the exact wheel files from the
  same store plus a pip wheel, then one ``RUN`` that makes a venv and runs
  ``pip install --no-index --find-links /wheels --require-hashes -r lock``
  (pip's defaults otherwise: it compiles .pyc files).

Cases: (1) cold, three times each, interleaved (docker: ``--no-cache``), also showing
that the docker builds give as many image IDs and hermetic's give one; the same cold build
with ``build.bytecode: none`` (what the .pyc cost at build time); and into the
OCI store only (``--no-load``); (2) the lock with one small package added
(``--add``, locked with ``hermetic lock``), caches warm; (3) no-op rebuild of the
same inputs; then (4) container start + ``import torch``: ``docker run --rm
--read-only --network none IMAGE python -c "import torch"`` of each image,
interleaved (both images ship bytecode: pip's timestamp .pyc, hermetic's PEP 552
unchecked-hash .pyc).

hermetic's own bytecode is compiled first (as pip leaves an installed package),
and the measured processes may use it (PYTHONDONTWRITEBYTECODE is not passed on).

Usage: bench/bench_build.py [--example examples/torch-mlp | --cuda] [--add six==1.17.0]
       [--workdir /work/scratch/bench-build] [--seed-cache DIR] [--keep] [--json]

The base is made once per invocation with ``hermetic base bootstrap`` into a
seed cache under --workdir (about 35 s, not measured) unless --seed-cache names
a cache that already holds it (the bench fetches the locked wheels into that
cache too; preparation, including `hermetic lock` of the added package, needs
the package index once). Everything made under --workdir and every
Docker tag it made (hermetic-bench/*, hermetic-bench-base:1,
hermetic/bench-*:latest) is removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from hermetic.core.reference import parse_base_reference  # noqa: E402
from hermetic.lock.model import Target  # noqa: E402
from hermetic.lock.read import read_lock  # noqa: E402
from hermetic.store.fetch import resolve_from_store  # noqa: E402
from hermetic.store.oci import OciStore  # noqa: E402
from hermetic.store.wheels import WheelStore  # noqa: E402

HERMETIC = [sys.executable, "-m", "hermetic"]
BENCH_NAME = "bench-torch-mlp"  # image name in the copied hermetic.yaml: engine tag hermetic/bench-torch-mlp:latest
CUDA_REQUIREMENTS = "torch==2.13.0\nnumpy==2.4.6\n"  # PyPI's torch 2.13.0 is the CUDA 13 build
BASE_TAG = "hermetic-bench-base:1"
DOCKER_REPO = "hermetic-bench/docker"
HERMETIC_KEEP_TAG = "hermetic-bench/hermetic"
PIP_VERSION = "26.3"
IMPORT_TORCH = "import time;t=time.perf_counter();import torch;print(time.perf_counter()-t)"
LOCK_FLAGS: list[str] = []  # --cuda: ["--no-pip-find-links"]

DOCKERFILE = """\
FROM {base}
COPY {pip_wheel} /tmp/
COPY wheels/ /wheels/
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m venv --without-pip /opt/venv \\
 && /opt/venv/bin/python /tmp/{pip_wheel}/pip install --no-index --find-links /wheels \\
      --require-hashes --no-cache-dir --disable-pip-version-check --root-user-action=ignore \\
      -r /tmp/requirements.lock
ENV PATH=/opt/venv/bin:$PATH
"""


class BenchError(Exception):
    pass


def run(cmd: list[str], *, env: dict[str, str] | None = None) -> tuple[str, str, float]:
    """Run a command; (stdout, stderr, wall seconds). Fails with the tail of its output."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise BenchError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n  " + "\n  ".join(tail))
    return proc.stdout, proc.stderr, dt


def hermetic_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # hermetic's .pyc are used
    return {**env, "HERMETIC_CACHE": str(cache)}


def compile_hermetic() -> None:
    """hermetic's own bytecode, as pip leaves an installed package."""
    run([sys.executable, "-m", "compileall", "-q", str(REPO_ROOT / "hermetic")])


def cuda_source(workdir: Path, example: Path, seed: Path) -> Path:
    """A project for PyPI's torch 2.13.0 (CUDA 13) + numpy, on the example's base, locked ignoring pip's find-links."""
    import yaml

    src = workdir / "cuda-src"
    src.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((example / "hermetic.yaml").read_text())
    doc = {"name": "bench-cuda", "base": cfg["base"], "python": cfg["python"], "lock": "requirements.lock"}
    (src / "hermetic.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (src / "requirements.in").write_text(CUDA_REQUIREMENTS)
    run(HERMETIC + ["lock", "-C", str(src), "--no-pip-find-links"], env=hermetic_env(seed))
    return src


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# --- preparation (not measured) ----------------------------------------------------------

def seed_cache(workdir: Path, given: Path | None, base_digest: str) -> Path:
    """A cache holding the base image (bootstrapped here unless given) and the wheel store."""
    seed = given or workdir / "seed"
    if not OciStore(seed / "oci").has_image(base_digest):
        if given:
            raise BenchError(f"--seed-cache {given}: has no image {base_digest}")
        print(f"[prep] hermetic base bootstrap into {seed} ...", file=sys.stderr)
        out, _, dt = run(HERMETIC + ["base", "bootstrap", "--json"], env=hermetic_env(seed))
        made = json.loads(out)["reference"]
        if not made.endswith(base_digest):
            raise BenchError(f"bootstrap gave {made}, the example pins {base_digest}")
        print(f"[prep] base bootstrapped in {dt:.1f}s", file=sys.stderr)
    return seed


def fresh_cache(seed: Path, dest: Path, base_digest: str, wheels: list[Path]) -> Path:
    """Cold: the base image's blobs and the locked wheels (hard-linked), no layer or build cache."""
    shutil.rmtree(dest, ignore_errors=True)
    src = OciStore(seed / "oci")
    store = OciStore(dest / "oci").ensure()
    for d in [base_digest] + [b.digest for b in src.image_blobs(base_digest)]:
        link_or_copy(src.blob_path(d), store.blob_path(d))
    for w in wheels:
        link_or_copy(w, dest / w.relative_to(seed))
    return dest


def copy_project(example: Path, dest: Path, extra_requirement: str | None, seed: Path, epoch: int,
                 bytecode: str | None = None) -> Path:
    """The example under our own image name, with this invocation's SOURCE_DATE_EPOCH.

    The epoch makes every layer's bytes unique to this invocation, so no image
    already in the engine (the example built by someone else) can lend its
    layers to a "cold" load.
    """
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((example / "hermetic.yaml").read_text())
    cfg["name"] = BENCH_NAME
    cfg.setdefault("build", {})["source_date_epoch"] = epoch
    if bytecode:
        cfg["build"]["bytecode"] = bytecode
    (dest / "hermetic.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    shutil.copy(example / "requirements.in", dest / "requirements.in")
    shutil.copy(example / "requirements.lock", dest / "requirements.lock")
    env = hermetic_env(seed)
    if extra_requirement:
        with open(dest / "requirements.in", "a") as f:
            f.write(f"{extra_requirement}\n")
        run(HERMETIC + ["lock", "-C", str(dest), *LOCK_FLAGS], env=env)
    run(HERMETIC + ["fetch", "-C", str(dest)], env=env)
    return dest


def locked_wheel_files(project: Path, seed: Path) -> list[Path]:
    lock = read_lock(project / "requirements.lock", Target(python_version="3.11"))
    found, missing = resolve_from_store(lock, WheelStore(seed / "wheels"))
    if missing:
        raise BenchError(f"{project}: wheels missing from the seed store: {[m.name for m in missing]}")
    return [Path(w.url or "") for w in found]


def pip_wheel(workdir: Path, given: Path | None) -> Path:
    if given:
        return given
    dest = workdir / "pip"
    have = sorted(dest.glob(f"pip-{PIP_VERSION}-*.whl"))
    if not have:
        run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), f"pip=={PIP_VERSION}"])
        have = sorted(dest.glob(f"pip-{PIP_VERSION}-*.whl"))
    return have[0]


def docker_context(project: Path, seed: Path, pip_whl: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    for w in locked_wheel_files(project, seed):
        link_or_copy(w, dest / "wheels" / w.name)
    link_or_copy(pip_whl, dest / pip_whl.name)
    shutil.copy(project / "requirements.lock", dest / "requirements.lock")
    (dest / "Dockerfile").write_text(DOCKERFILE.format(base=BASE_TAG, pip_wheel=pip_whl.name))
    return dest


def load_base(seed: Path, base_digest: str) -> None:
    from hermetic.engines.dockerimages import load_image

    load_image(OciStore(seed / "oci"), base_digest, repo_tag=BASE_TAG)


def warm_page_cache(paths: list[Path]) -> None:
    """Both tools read the same (hard-linked) wheel files: read them once so neither pays the first read."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


# --- measured steps -------------------------------------------------------------------

@dataclass
class Build:
    seconds: float
    image_id: str
    detail: dict = field(default_factory=dict)


def hermetic_build(project: Path, cache: Path, *, load: bool = True) -> Build:
    cmd = HERMETIC + ["build", "-C", str(project), "--json"] + ([] if load else ["--no-load"])
    out, _, dt = run(cmd, env=hermetic_env(cache))
    doc = json.loads(out)
    layers = [{"contents": layer["contents"], "size": layer["size"], "cached": layer["cached"],
               "seconds": layer["seconds"]} for layer in doc["layers"] if not layer["contents"].startswith("base")]
    return Build(dt, doc["image_id"], {"internal_seconds": doc["seconds"], "noop": doc["noop"],
                                       "loaded": doc["loaded"], "layers": layers,
                                       "manifest_digest": doc["manifest_digest"],
                                       "engine_loads": doc.get("engine_loads", [])})


def docker_build(context: Path, tag: str, *, no_cache: bool) -> Build:
    iid = context.parent / f".iid-{tag.replace('/', '_').replace(':', '_')}"
    iid.unlink(missing_ok=True)
    cmd = ["docker", "build", "--iidfile", str(iid), "-t", tag] + (["--no-cache"] if no_cache else []) + [str(context)]
    out, err, dt = run(cmd)
    out += err
    builder = "legacy" if "Sending build context" in out or re.search(r"(?m)^Step \d+/\d+", out) else "buildkit"
    sent = re.findall(r"Sending build context to Docker daemon\s+(\S+)", out)
    return Build(dt, iid.read_text().strip(), {"builder": builder, "cached_steps": out.count("Using cache"),
                                                "context": sent[-1] if sent else None})


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BenchError(f"docker {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def untag(tag: str) -> None:
    """Remove one of our own tags (the image goes only if no other tag holds it)."""
    subprocess.run(["docker", "rmi", tag], capture_output=True)


def import_torch_seconds(image: str) -> tuple[float, float]:
    """(import torch inside the container, the whole `docker run`: container start + import) in seconds."""
    t = time.perf_counter()
    out, _, _ = run(["docker", "run", "--rm", "--read-only", "--network", "none", image,
                     "/opt/venv/bin/python", "-c", IMPORT_TORCH])
    wall = time.perf_counter() - t
    return float(out.strip().splitlines()[-1]), wall


def pyc_count(image: str) -> int:
    out, _, _ = run(["docker", "run", "--rm", "--read-only", "--network", "none", "--entrypoint", "sh", image,
                     "-c", "find /opt/venv -name '*.pyc' | wc -l"])
    return int(out.strip())


def machine(workdir: Path) -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    engine = docker("version", "-f", "{{.Server.Version}}", check=False)
    client = docker("version", "-f", "{{.Client.Version}}", check=False)
    driver = docker("info", "-f", "{{.Driver}}", check=False)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    root = docker("info", "-f", "{{.DockerRootDir}}", check=False) or "/var/lib/docker"
    disks = []
    for label, path in (("workdir", str(workdir)), ("docker", root)):
        src = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "-T", path],
                             capture_output=True, text=True).stdout.split()
        disks.append(f"{label} on {' '.join(src) or '?'}")
    return {"cpu": f"{os.cpu_count()} cores, {cpu}", "memory": f"{mem:.0f} GiB", "kernel": platform.release(),
            "docker": f"engine {engine}, client {client}, storage driver {driver}", "disk": "; ".join(disks)}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# --- the bench -------------------------------------------------------------------------

def bench(args: argparse.Namespace, workdir: Path, made_tags: list[str]) -> dict:
    example = args.example.resolve()
    cfg_text = (example / "hermetic.yaml").read_text()
    base_ref = re.search(r"(?m)^base:\s*(\S+)", cfg_text)
    if not base_ref:
        raise BenchError(f"{example / 'hermetic.yaml'}: no base: line")
    base_digest = parse_base_reference(base_ref.group(1)).digest
    compile_hermetic()
    seed = seed_cache(workdir, args.seed_cache, base_digest)
    if args.cuda:
        LOCK_FLAGS.append("--no-pip-find-links")
        print("[prep] locking torch==2.13.0 (CUDA 13) + numpy from PyPI ...", file=sys.stderr)
        example = cuda_source(workdir, example, seed)
    print("[prep] projects, lock with the added package, wheel store, docker contexts ...", file=sys.stderr)
    epoch = int(time.time())
    proj_a = copy_project(example, workdir / "proj-a", None, seed, epoch)
    proj_b = copy_project(example, workdir / "proj-b", args.add, seed, epoch)
    proj_n = copy_project(example, workdir / "proj-n", None, seed, epoch, bytecode="none")
    pip_whl = pip_wheel(workdir, args.pip_wheel)
    ctx_a = docker_context(proj_a, seed, pip_whl, workdir / "ctx-a")
    ctx_b = docker_context(proj_b, seed, pip_whl, workdir / "ctx-b")
    made_tags.append(BASE_TAG)
    load_base(seed, base_digest)
    all_wheels = locked_wheel_files(proj_b, seed)
    warm_page_cache(all_wheels + [pip_whl])
    hermetic_tag = f"hermetic/{BENCH_NAME}:latest"
    made_tags.append(hermetic_tag)
    untag(hermetic_tag)

    res: dict = {"machine": machine(workdir), "load_average_start": os.getloadavg(),
                 "example": "torch 2.13.0 CUDA 13 + numpy (PyPI)" if args.cuda else str(example),
                 "added": args.add,
                 "wheels": {"a": len(locked_wheel_files(proj_a, seed)), "b": len(locked_wheel_files(proj_b, seed))},
                 "wheel_bytes": sum(w.stat().st_size for w in locked_wheel_files(proj_a, seed))}
    # (1) cold, interleaved: hermetic, docker, hermetic, docker.
    h_cold, d_cold = [], []
    for i in range(1, args.cold_runs + 1):
        print(f"[cold {i}] hermetic build ...", file=sys.stderr)
        untag(hermetic_tag)  # the engine must not hold the image, so the load is counted each time
        if h_cold:
            subprocess.run(["docker", "rmi", h_cold[-1].image_id], capture_output=True)
        h_cold.append(hermetic_build(proj_a, fresh_cache(seed, workdir / "cache-1", base_digest, all_wheels)))
        tag = f"{DOCKER_REPO}:cold{i}"
        made_tags.append(tag)
        if i > 1:
            untag(f"{DOCKER_REPO}:cold{i - 1}")  # disk: only the last cold image is kept (measured below)
        print(f"[cold {i}] docker build --no-cache ...", file=sys.stderr)
        d_cold.append(docker_build(ctx_a, tag, no_cache=True))
        if i < args.cold_runs:
            shutil.rmtree(workdir / "cache-1")  # the last one stays as the warm cache
    (workdir / "cache-1").rename(workdir / "cache-2")
    # Keep image A in the engine under our own tag while the name's tag moves on.
    keep_a = f"{HERMETIC_KEEP_TAG}:a"
    made_tags.append(keep_a)
    docker("tag", h_cold[-1].image_id, keep_a)
    # Cold into the OCI store only (no engine load: what a CI job that pushes needs).
    print("[cold] hermetic build --no-load ...", file=sys.stderr)
    h_store = hermetic_build(proj_a, fresh_cache(seed, workdir / "cache-3", base_digest, all_wheels), load=False)
    shutil.rmtree(workdir / "cache-3")
    # Cold without bytecode: what compiling the .pyc costs the build.
    h_nobc = None
    if not args.skip_no_bytecode:
        print("[cold] hermetic build, build.bytecode: none ...", file=sys.stderr)
        h_nobc = hermetic_build(proj_n, fresh_cache(seed, workdir / "cache-3", base_digest, all_wheels))
        shutil.rmtree(workdir / "cache-3")
        untag(hermetic_tag)
        subprocess.run(["docker", "rmi", h_nobc.image_id], capture_output=True)
    warm = workdir / "cache-2"
    # (2) one package added, caches warm.
    print(f"[change] + {args.add} ...", file=sys.stderr)
    h_change = hermetic_build(proj_b, warm)
    made_tags.append(f"{DOCKER_REPO}:b")
    d_change = docker_build(ctx_b, f"{DOCKER_REPO}:b", no_cache=False)
    # (3) no-op: the same inputs again.
    print("[no-op] x5 each ...", file=sys.stderr)
    h_noop = [hermetic_build(proj_b, warm) for _ in range(5)]
    d_noop = [docker_build(ctx_b, f"{DOCKER_REPO}:b", no_cache=False) for _ in range(5)]
    untag(f"{DOCKER_REPO}:b")
    # (4) container start + import torch in a container of each image (A), interleaved; one warm-up each.
    print(f"[import torch] x{args.import_runs} each ...", file=sys.stderr)
    imp: dict[str, list[tuple[float, float]]] = {"hermetic": [], "docker": []}
    for i in range(args.import_runs + 1):
        h, d = import_torch_seconds(h_cold[-1].image_id), import_torch_seconds(d_cold[-1].image_id)
        if i:
            imp["hermetic"].append(h)
            imp["docker"].append(d)
    sizes = {"hermetic": int(docker("image", "inspect", "-f", "{{.Size}}", h_cold[-1].image_id)),
             "docker": int(docker("image", "inspect", "-f", "{{.Size}}", d_cold[-1].image_id))}
    pycs = {"hermetic": pyc_count(h_cold[-1].image_id), "docker": pyc_count(d_cold[-1].image_id)}

    def pair(h: list[Build], d: list[Build]) -> dict:
        hs, ds = [b.seconds for b in h], [b.seconds for b in d]
        return {"hermetic_s": hs, "docker_s": ds, "ratio": median(ds) / median(hs),
                "hermetic_detail": [b.detail for b in h], "docker_detail": [b.detail for b in d]}

    res["cases"] = {"cold": pair(h_cold, d_cold), "cold_no_load": pair([h_store], d_cold),
                    "change": pair([h_change], [d_change]), "noop": pair(h_noop, d_noop)}
    if h_nobc is not None:
        res["cases"]["cold_no_bytecode"] = pair([h_nobc], d_cold)
    res["reproducible"] = {"hermetic_image_ids": [b.image_id for b in h_cold],
                           "docker_image_ids": [b.image_id for b in d_cold],
                           "hermetic_manifest_digests": [b.detail["manifest_digest"] for b in h_cold]}
    res["import_torch"] = {k: {"import_s": [a for a, _ in v], "docker_run_s": [b for _, b in v]}
                           for k, v in imp.items()}
    res["image_size_bytes"] = sizes
    res["pyc_files"] = pycs
    res["layers"] = len(h_cold[-1].detail["layers"])
    res["docker_builder"] = d_cold[0].detail["builder"]
    res["load_average_end"] = os.getloadavg()
    return res


def need_free(path: Path, gb: float) -> None:
    """Stop (cleanly: the caller removes what was made) before a step that could fill a shared disk."""
    free = shutil.disk_usage(path).free / 1e9
    if free < gb:
        raise BenchError(f"only {free:.1f} GB free on the disk of {path}; the next step needs about {gb:.0f} GB")


def bench_lean(args: argparse.Namespace, workdir: Path, made_tags: list[str]) -> dict:
    """--cuda: the same rows with at most one big image of each tool on disk at a time (~21 GB at the peak).

    docker's legacy builder holds the 2.7 GB context, the wheels' COPY layer, the RUN container's 5.5 GB and
    the 5.5 GB layer committed from it at once, so the builds are not interleaved: hermetic's cases first,
    then docker's, each image removed when the next needs the room (docker's one-package build then starts
    without its cold image: it reruns pip over every wheel either way, since the wheels' COPY changed).
    """
    example = args.example.resolve()
    base_digest = parse_base_reference(re.search(r"(?m)^base:\s*(\S+)", (example / "hermetic.yaml").read_text())
                                       .group(1)).digest  # type: ignore[union-attr]
    compile_hermetic()
    seed = seed_cache(workdir, args.seed_cache, base_digest)
    LOCK_FLAGS.append("--no-pip-find-links")
    print("[prep] locking torch==2.13.0 (CUDA 13) + numpy from PyPI ...", file=sys.stderr)
    src = cuda_source(workdir, example, seed)
    epoch = int(time.time())
    proj_a = copy_project(src, workdir / "proj-a", None, seed, epoch)
    proj_b = copy_project(src, workdir / "proj-b", args.add, seed, epoch)
    pip_whl = pip_wheel(workdir, args.pip_wheel)
    made_tags.append(BASE_TAG)
    load_base(seed, base_digest)
    all_wheels = locked_wheel_files(proj_b, seed)
    warm_page_cache(all_wheels + [pip_whl])
    hermetic_tag = f"hermetic/{BENCH_NAME}:latest"
    made_tags.append(hermetic_tag)
    untag(hermetic_tag)
    res: dict = {"machine": machine(workdir), "load_average_start": os.getloadavg(),
                 "example": "torch 2.13.0 CUDA 13 + numpy (PyPI)", "added": args.add, "lean": True,
                 "wheels": {"a": len(locked_wheel_files(proj_a, seed)), "b": len(all_wheels)},
                 "wheel_bytes": sum(w.stat().st_size for w in locked_wheel_files(proj_a, seed))}
    h_cold: list[Build] = []
    for i in range(1, args.cold_runs + 1):
        need_free(workdir, 16)
        print(f"[cold {i}] hermetic build ...", file=sys.stderr)
        untag(hermetic_tag)
        if h_cold:
            subprocess.run(["docker", "rmi", h_cold[-1].image_id], capture_output=True)
        h_cold.append(hermetic_build(proj_a, fresh_cache(seed, workdir / "cache-1", base_digest, all_wheels)))
        if i < args.cold_runs:
            shutil.rmtree(workdir / "cache-1")
    keep_a = f"{HERMETIC_KEEP_TAG}:a"
    made_tags.append(keep_a)
    docker("tag", h_cold[-1].image_id, keep_a)
    warm = workdir / "cache-1"
    print(f"[change] hermetic + {args.add} ...", file=sys.stderr)
    h_change = hermetic_build(proj_b, warm)
    print("[no-op] hermetic x5 ...", file=sys.stderr)
    h_noop = [hermetic_build(proj_b, warm) for _ in range(5)]
    untag(hermetic_tag)
    subprocess.run(["docker", "rmi", h_change.image_id], capture_output=True)
    shutil.rmtree(warm)  # disk: the engine keeps image A for the import test
    ctx_a = docker_context(proj_a, seed, pip_whl, workdir / "ctx-a")
    d_cold: list[Build] = []
    imp: dict[str, list[tuple[float, float]]] = {"hermetic": [], "docker": []}
    for i in range(1, args.cold_runs + 1):
        need_free(workdir, 20)
        tag = f"{DOCKER_REPO}:cold{i}"
        made_tags.append(tag)
        print(f"[cold {i}] docker build --no-cache ...", file=sys.stderr)
        d_cold.append(docker_build(ctx_a, tag, no_cache=True))
        if i == 1:
            print(f"[import torch] x{args.import_runs} each ...", file=sys.stderr)
            for k in range(args.import_runs + 1):
                h, d = import_torch_seconds(h_cold[-1].image_id), import_torch_seconds(d_cold[-1].image_id)
                if k:
                    imp["hermetic"].append(h)
                    imp["docker"].append(d)
            res["image_size_bytes"] = {"hermetic": int(docker("image", "inspect", "-f", "{{.Size}}", h_cold[-1].image_id)),
                                       "docker": int(docker("image", "inspect", "-f", "{{.Size}}", d_cold[-1].image_id))}
            res["pyc_files"] = {"hermetic": pyc_count(h_cold[-1].image_id), "docker": pyc_count(d_cold[-1].image_id)}
            untag(keep_a)
            subprocess.run(["docker", "rmi", h_cold[-1].image_id], capture_output=True)
        untag(tag)  # disk: one docker image at a time
    shutil.rmtree(ctx_a)
    ctx_b = docker_context(proj_b, seed, pip_whl, workdir / "ctx-b")
    need_free(workdir, 20)
    made_tags.append(f"{DOCKER_REPO}:b")
    print(f"[change] docker + {args.add} ...", file=sys.stderr)
    d_change = docker_build(ctx_b, f"{DOCKER_REPO}:b", no_cache=False)
    print("[no-op] docker x5 ...", file=sys.stderr)
    d_noop = [docker_build(ctx_b, f"{DOCKER_REPO}:b", no_cache=False) for _ in range(5)]
    untag(f"{DOCKER_REPO}:b")

    def pair(h: list[Build], d: list[Build]) -> dict:
        hs, ds = [b.seconds for b in h], [b.seconds for b in d]
        return {"hermetic_s": hs, "docker_s": ds, "ratio": median(ds) / median(hs),
                "hermetic_detail": [b.detail for b in h], "docker_detail": [b.detail for b in d]}

    res["cases"] = {"cold": pair(h_cold, d_cold), "change": pair([h_change], [d_change]), "noop": pair(h_noop, d_noop)}
    res["reproducible"] = {"hermetic_image_ids": [b.image_id for b in h_cold],
                           "docker_image_ids": [b.image_id for b in d_cold],
                           "hermetic_manifest_digests": [b.detail["manifest_digest"] for b in h_cold]}
    res["import_torch"] = {k: {"import_s": [a for a, _ in v], "docker_run_s": [b for _, b in v]}
                           for k, v in imp.items()}
    res["layers"] = len(h_cold[-1].detail["layers"])
    res["docker_builder"] = d_cold[0].detail["builder"]
    res["load_average_end"] = os.getloadavg()
    return res


def report(res: dict) -> str:
    c = res["cases"]
    rows = [
        ("cold (base present)", c["cold"]),
        ("cold, hermetic `build.bytecode: none`", c.get("cold_no_bytecode")),
        ("cold, hermetic --no-load (OCI store only)", c.get("cold_no_load")),
        (f"+ {res['added']} (caches warm)", c["change"]),
        ("no-op (same inputs)", c["noop"]),
    ]
    m = res["machine"]
    load = f"load average {res['load_average_start'][0]:.1f} at start, {res['load_average_end'][0]:.1f} at end"
    lines = [f"image: {res['example']}: {res['wheels']['a']} wheels, {res['wheel_bytes'] / 1e9:.2f} GB; "
             f"{res['layers']} layers",
             f"machine: {m['cpu']}; {m['memory']}; kernel {m['kernel']}; {m['disk']}; {load}",
             f"docker: {m['docker']} ({res['docker_builder']} builder, build context "
             f"{c['cold']['docker_detail'][0]['context']})",
             "",
             "| case | hermetic build | docker build | ratio (docker / hermetic) |",
             "| --- | --- | --- | --- |"]
    for name, r in rows:
        if r is None:
            continue

        def cell(xs: list[float]) -> str:
            return f"{median(xs):.2f} s" + (f" ({', '.join(f'{x:.2f}' for x in xs)})" if len(xs) > 1 else "")
        lines.append(f"| {name} | {cell(r['hermetic_s'])} | {cell(r['docker_s'])} | {r['ratio']:.1f}x |")
    it = res["import_torch"]
    hw, dw = median(it["hermetic"]["docker_run_s"]), median(it["docker"]["docker_run_s"])
    hi, di = median(it["hermetic"]["import_s"]), median(it["docker"]["import_s"])
    n = len(it["hermetic"]["import_s"])
    lines.append(f"| container start + `import torch` (`docker run`, median of {n}) | {hw:.2f} s "
                 f"(import {hi:.2f} s) | {dw:.2f} s (import {di:.2f} s) | hermetic / pip image {hw / dw:.2f}x |")
    rep = res["reproducible"]
    lines += ["",
              f"image IDs, two cold builds: hermetic {' '.join(i[7:19] for i in rep['hermetic_image_ids'])} "
              f"({'identical' if len(set(rep['hermetic_image_ids'])) == 1 else 'DIFFERENT'}); "
              f"docker {' '.join(i[7:19] for i in rep['docker_image_ids'])} "
              f"({'identical' if len(set(rep['docker_image_ids'])) == 1 else 'different'})"]
    sz, pc = res["image_size_bytes"], res["pyc_files"]
    lines.append(f"image size: hermetic {sz['hermetic'] / 1e6:.0f} MB, docker {sz['docker'] / 1e6:.0f} MB; "
                 f".pyc under /opt/venv: hermetic {pc['hermetic']}, docker {pc['docker']}")
    for name, r in rows:
        if r is None:
            continue
        for d in r["hermetic_detail"]:
            built = ", ".join(f"{layer['contents']} {layer['seconds']:.1f}s"
                              for layer in d["layers"] if not layer["cached"])
            loads = "; ".join(f"{x['load']} {x['layers']} layers {x['bytes'] / 1e6:.0f} MB {x['from']:.1f}-{x['to']:.1f}s"
                              for x in d.get("engine_loads", []))
            lines.append(f"  hermetic {name}: internal {d['internal_seconds']:.2f}s, loaded={d['loaded']}, "
                         f"noop={d['noop']}; built: {built or 'nothing'}" + (f"; engine: {loads}" if loads else ""))
    return "\n".join(lines)


MADE_IN_WORKDIR = ("seed", "proj-a", "proj-b", "proj-n", "pip", "ctx-a", "ctx-b", "cache-1", "cache-2", "cache-3",
                   "cuda-src")


def clean_up(workdir: Path, existed: bool, made_tags: list[str], keep: Path | None) -> None:
    """Our Docker tags, then what we made under the workdir (all of it if we made the workdir)."""
    for tag in reversed(made_tags):
        untag(tag)
    if not existed:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for p in workdir.iterdir():
        if p == keep:
            continue
        if p.name in MADE_IN_WORKDIR or p.name.startswith(".iid-"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", type=Path, default=REPO_ROOT / "examples" / "torch-mlp",
                    help="project with hermetic.yaml, requirements.in and requirements.lock")
    ap.add_argument("--cuda", action="store_true",
                    help="PyPI's torch 2.13.0 (CUDA 13) + numpy instead of the example (2.7 GB of wheels, ~25 GB of disk)")
    ap.add_argument("--add", default="six==1.17.0", help="the one small package added to requirements.in")
    ap.add_argument("--skip-no-bytecode", action="store_true", help="skip the cold build with build.bytecode: none")
    ap.add_argument("--workdir", type=Path, default=Path("/work/scratch/bench-build"),
                    help="scratch directory (made and removed by the bench; default /work/scratch/bench-build)")
    ap.add_argument("--seed-cache", type=Path, help="a HERMETIC_CACHE already holding the base (skip bootstrap)")
    ap.add_argument("--pip-wheel", type=Path,
                    help=f"pip wheel for the Dockerfile (default: download pip=={PIP_VERSION})")
    ap.add_argument("--import-runs", type=int, default=5, help="container `import torch` runs per image (default 5)")
    ap.add_argument("--cold-runs", type=int, default=3, help="interleaved cold builds of each (default 3)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir and the Docker tags")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if shutil.which("docker") is None:
        print("bench_build: needs the docker CLI and a running engine", file=sys.stderr)
        return 2
    workdir = args.workdir.resolve()
    if args.seed_cache:
        args.seed_cache = args.seed_cache.resolve()
    existed = workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    made_tags: list[str] = []
    t0 = time.perf_counter()
    try:
        res = bench_lean(args, workdir, made_tags) if args.cuda else bench(args, workdir, made_tags)
    except BenchError as e:
        print(f"bench_build: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            clean_up(workdir, existed, made_tags, keep=args.seed_cache)
    res["total_bench_seconds"] = time.perf_counter() - t0
    print(json.dumps(res, indent=2) if args.json else report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
