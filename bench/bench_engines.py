#!/usr/bin/env python3
"""Cold to first step, per engine: ``hermetic build`` + ``hermetic run`` against ``docker build`` + ``docker run``.

One invocation, same machine, same lock, same base image, same wheel files (bench/bench_build.py's
method and its helpers: each hermetic build in a fresh HERMETIC_CACHE holding only the base image and
the wheel store, hard-linked from a seed cache; the conventional Dockerfile of bench_build.py for
docker, built with ``--no-cache``). The CPU example (examples/torch-mlp) under this invocation's
SOURCE_DATE_EPOCH, so no image an engine already holds can lend it layers.

Per engine (docker, podman, charliecloud):

* cold to first step: from the start of ``hermetic build --engine E`` (run.engine: E) to the first
  line the script prints in ``hermetic run train.py --epochs 1`` (its "epoch 0: ..." line: one epoch
  of training, the same work on every side), the engine holding nothing of the image at the start
  (docker: the image and its tags removed; podman: its storage's image removed; charliecloud: a
  fresh cache, so no layer directory);
* one package added (``--add``, locked with ``hermetic lock``), caches warm: build + run to the first
  line again;
* container start: the whole ``hermetic run`` of a script that prints one line and exits (image
  check, data verification, snapshot, probe, container, record), best of 3, against ``docker run``
  of the same line in the docker image, best of 5;
* the engine's own container start: the same line in hermetic's locked-down container (non-root, no
  capabilities, read-only root, no network, the pids limit) started, waited for and removed by
  hermetic's engine layer (``run_capture``, what ``hermetic run`` asks of the engine without the run's
  own steps), in one process after a first, unmeasured one, best of 5, against the same ``docker run``.

docker's side: ``docker build --no-cache`` of the conventional Dockerfile, then ``docker run --rm
--read-only --network none`` of train.py with the project, the data and hermetic_runtime mounted, to
its first line; one package added: ``docker build`` with its cache, then the same run.

Usage: bench/bench_engines.py [--seed-cache DIR] [--workdir /work/scratch/bench-engines]
       [--engines docker,podman,charliecloud] [--add six==1.17.0] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import bench_build as bb  # noqa: E402

from hermetic.core.reference import parse_base_reference  # noqa: E402

EXAMPLE = bb.REPO_ROOT / "examples" / "torch-mlp"
DOCKER_REPO = "hermetic-bench/engines-docker"
FIRST_LINE = re.compile(r"^epoch \d+: ")
HELLO = "print('first step', flush=True)\n"
# The engine's start of hermetic's locked-down container, N times in one process (hermetic.engines).
ENGINE_START = r"""
import json, sys, time
from hermetic.engines.base import ContainerSpec
from hermetic.engines import get_engine
name, image_id, manifest, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
engine = get_engine(name)
spec = ContainerSpec(image_id=image_id, command=["/opt/venv/bin/python", "-c", "print('first step', flush=True)"],
                     mounts=[], env={"HOME": "/tmp"}, user="1000:1000", manifest_digest=manifest)
times = []
for i in range(n + 1):  # the first: the engine's client made, its caches warm; not counted
    t = time.perf_counter()
    code, out, err = engine.run_capture(spec)
    if i:
        times.append(time.perf_counter() - t)
    if code != 0 or out.strip() != b"first step":
        sys.exit(f"{name}: exit {code}: {out[-500:]!r} {err[-1500:]!r}")
print(json.dumps(times))
"""


def set_engine(project: Path, engine: str) -> None:
    import yaml

    cfg = yaml.safe_load((project / "hermetic.yaml").read_text())
    cfg.setdefault("run", {})["engine"] = engine
    (project / "hermetic.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def make_data(project: Path) -> None:
    shutil.copy(EXAMPLE / "make_data.py", project / "make_data.py")
    shutil.copy(EXAMPLE / "data.sha256", project / "data.sha256")
    shutil.copy(EXAMPLE / "train.py", project / "train.py")
    shutil.copy(EXAMPLE / "params.yaml", project / "params.yaml")
    (project / "hello.py").write_text(HELLO)
    bb.run([sys.executable, str(project / "make_data.py"), "--out", str(project / "data")])


def until_line(cmd: list[str], env: dict[str, str] | None, pattern: re.Pattern, started: float,
               cwd: Path | None = None) -> tuple[float, float]:
    """Run ``cmd`` to its end; (seconds from ``started`` to its first line matching ``pattern``, to its end)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if first is None and pattern.search(line):
            first = time.perf_counter() - started
        tail = (tail + [line])[-15:]
    code = proc.wait()
    end = time.perf_counter() - started
    if code != 0 or first is None:
        raise bb.BenchError(f"{' '.join(cmd[:5])} ... exited {code}, first line {'seen' if first else 'never'}:\n  "
                            + "  ".join(tail))
    return first, end


def forget_image(engine: str, image_id: str | None) -> None:
    """The engine holds nothing of the image (so the cold case loads it)."""
    if not image_id:
        return
    if engine == "docker":
        subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True)
    elif engine == "podman":
        subprocess.run(["podman", "rmi", "-f", image_id], capture_output=True)


def hermetic_cold(engine: str, project: Path, cache: Path) -> dict:
    env = bb.hermetic_env(cache)
    t = time.perf_counter()
    out, _, build_s = bb.run(bb.HERMETIC + ["build", "-C", str(project), "--json"], env=env)
    doc = json.loads(out)
    first, end = until_line(bb.HERMETIC + ["run", "-C", str(project), "train.py", "--epochs", "1"], env,
                            FIRST_LINE, t, cwd=project)
    return {"build_s": build_s, "first_line_s": first, "total_s": end, "image_id": doc["image_id"],
            "manifest_digest": doc["manifest_digest"]}


def engine_start(engine: str, cache: Path, image_id: str, manifest_digest: str, n: int = 5) -> float:
    """Best of ``n``: the engine's start, wait and removal of hermetic's container of one line (ENGINE_START)."""
    out, _, _ = bb.run([sys.executable, "-c", ENGINE_START, engine, image_id, manifest_digest, str(n)],
                       env=bb.hermetic_env(cache))
    return min(json.loads(out))


def hermetic_start(project: Path, cache: Path) -> dict:
    env = bb.hermetic_env(cache)
    _, _, wall = bb.run(bb.HERMETIC + ["run", "-C", str(project), "--json", "hello.py"], env=env)
    return {"hermetic_run_s": wall}


def docker_first_line(image: str, project: Path, t: float) -> tuple[float, float]:
    out = project / "docker-outputs"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    runtime = bb.REPO_ROOT / "hermetic" / "inimage" / "runtime"
    cmd = ["docker", "run", "--rm", "--read-only", "--network", "none", "--tmpfs", "/tmp",
           "-v", f"{project}:/workspace:ro", "-v", f"{project / 'data'}:/data/synth:ro", "-v", f"{out}:/outputs",
           "-v", f"{runtime}:/opt/hr/hermetic_runtime:ro", "-e", "PYTHONPATH=/opt/hr", "-e", "HERMETIC_SEED=1234",
           "-w", "/workspace", image, "/opt/venv/bin/python", "train.py", "--epochs", "1"]
    return until_line(cmd, None, FIRST_LINE, t)


def docker_start(image: str) -> float:
    t = time.perf_counter()
    bb.run(["docker", "run", "--rm", "--read-only", "--network", "none", image, "/opt/venv/bin/python", "-c",
            HELLO.strip()])
    return time.perf_counter() - t


def bench(args: argparse.Namespace, workdir: Path, made_tags: list[str]) -> dict:
    base_ref = re.search(r"(?m)^base:\s*(\S+)", (EXAMPLE / "hermetic.yaml").read_text())
    base_digest = parse_base_reference(base_ref.group(1)).digest  # type: ignore[union-attr]
    bb.compile_hermetic()
    seed = bb.seed_cache(workdir, args.seed_cache, base_digest)
    print("[prep] projects, the added package's lock, data, docker contexts ...", file=sys.stderr)
    epoch = int(time.time())
    projects = {}
    for engine in args.engines:
        for kind, extra in (("a", None), ("b", args.add)):
            p = bb.copy_project(EXAMPLE, workdir / f"proj-{engine}-{kind}", extra, seed, epoch)
            set_engine(p, engine)
            make_data(p)
            projects[engine, kind] = p
    pip_whl = bb.pip_wheel(workdir, args.pip_wheel)
    pa, pb = projects[args.engines[0], "a"], projects[args.engines[0], "b"]
    ctx_a = bb.docker_context(pa, seed, pip_whl, workdir / "ctx-a")
    ctx_b = bb.docker_context(pb, seed, pip_whl, workdir / "ctx-b")
    made_tags.append(bb.BASE_TAG)
    bb.load_base(seed, base_digest)
    wheels = bb.locked_wheel_files(pb, seed)
    bb.warm_page_cache(wheels + [pip_whl])
    made_tags.append(f"hermetic/{bb.BENCH_NAME}:latest")
    res: dict = {"machine": bb.machine(workdir), "load_average_start": os.getloadavg(), "added": args.add,
                 "engines": {}}
    # docker build + docker run, cold (no cache), then with the package added (its cache warm)
    print("[docker] docker build --no-cache + docker run to the first line ...", file=sys.stderr)
    made_tags += [f"{DOCKER_REPO}:a", f"{DOCKER_REPO}:b"]
    t = time.perf_counter()
    d_a = bb.docker_build(ctx_a, f"{DOCKER_REPO}:a", no_cache=True)
    d_first, d_end = docker_first_line(f"{DOCKER_REPO}:a", pa, t)
    t = time.perf_counter()
    d_b = bb.docker_build(ctx_b, f"{DOCKER_REPO}:b", no_cache=False)
    d_first_b, _ = docker_first_line(f"{DOCKER_REPO}:b", pb, t)
    d_start = min(docker_start(f"{DOCKER_REPO}:a") for _ in range(5))
    res["docker"] = {"cold": {"build_s": d_a.seconds, "first_line_s": d_first, "total_s": d_end},
                     "added": {"build_s": d_b.seconds, "first_line_s": d_first_b},
                     "start_s": d_start}
    for engine in args.engines:
        print(f"[{engine}] hermetic build + run, cold ...", file=sys.stderr)
        cache = bb.fresh_cache(seed, workdir / f"cache-{engine}", base_digest, wheels)
        cold = hermetic_cold(engine, projects[engine, "a"], cache)
        print(f"[{engine}] one package added ...", file=sys.stderr)
        added = hermetic_cold(engine, projects[engine, "b"], cache)
        starts = [hermetic_start(projects[engine, "a"], cache) for _ in range(3)]
        print(f"[{engine}] the engine's own container start ...", file=sys.stderr)
        engine_s = engine_start(engine, cache, cold["image_id"], cold["manifest_digest"])
        res["engines"][engine] = {"cold": cold, "added": added,
                                  "start": {**min(starts, key=lambda s: s["hermetic_run_s"]),
                                            "engine_start_s": engine_s}}
        forget_image(engine, cold["image_id"])
        forget_image(engine, added["image_id"])
        shutil.rmtree(cache, ignore_errors=True)
    return res


def report(res: dict) -> str:
    d = res["docker"]
    lines = [f"machine: {res['machine']}", f"load average at start: {res['load_average_start']}",
             "", "| | cold to first step | of it: build | one package added, to first step | hermetic run "
             "of one print (whole command) | the engine's container start (one print) |",
             "| --- | --- | --- | --- | --- | --- |",
             f"| docker build + docker run | {d['cold']['first_line_s']:.1f} s | {d['cold']['build_s']:.1f} s | "
             f"{d['added']['first_line_s']:.1f} s | docker run: {d['start_s']:.2f} s | docker run: {d['start_s']:.2f} s |"]
    for engine, e in res["engines"].items():
        es = e["start"]["engine_start_s"]
        lines.append(f"| hermetic, {engine} | {e['cold']['first_line_s']:.1f} s "
                     f"({d['cold']['first_line_s'] / e['cold']['first_line_s']:.1f}x) | {e['cold']['build_s']:.1f} s | "
                     f"{e['added']['first_line_s']:.1f} s ({d['added']['first_line_s'] / e['added']['first_line_s']:.1f}x)"
                     f" | {e['start']['hermetic_run_s']:.2f} s | {es:.2f} s ({es / d['start_s']:.2f}x docker run's) |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="docker,podman,charliecloud")
    ap.add_argument("--add", default="six==1.17.0", help="the one small package added to requirements.in")
    ap.add_argument("--workdir", type=Path, default=Path("/work/scratch/bench-engines"))
    ap.add_argument("--seed-cache", type=Path, help="a HERMETIC_CACHE already holding the base (skip bootstrap)")
    ap.add_argument("--pip-wheel", type=Path, help=f"pip wheel for the Dockerfile (default: pip=={bb.PIP_VERSION})")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.engines = [e for e in args.engines.split(",") if e]
    workdir = args.workdir.resolve()
    existed = workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    made_tags: list[str] = []
    t0 = time.perf_counter()
    try:
        res = bench(args, workdir, made_tags)
    except bb.BenchError as e:
        print(f"bench_engines: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            for tag in reversed(made_tags):
                bb.untag(tag)
            if not existed:
                shutil.rmtree(workdir, ignore_errors=True)
    res["total_bench_seconds"] = time.perf_counter() - t0
    print(json.dumps(res, indent=2) if args.json else report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
