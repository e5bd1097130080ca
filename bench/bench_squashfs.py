#!/usr/bin/env python3
"""The image as one SquashFS file against its layers unpacked as directories, and against Docker.

One invocation, same machine, the CPU torch example (examples/torch-mlp) built under this invocation's
SOURCE_DATE_EPOCH (bench_build.copy_project: no engine holds its layers already) into a cache holding the base
and the wheels (bench_build.fresh_cache, from --seed-cache), with run.engine: charliecloud:

* placed on the shared filesystem: files and bytes of the unpacked tree (the layer directories Charliecloud
  runs from) against the one .sqfs file;
* made from a warm store: ``hermetic export --squashfs`` (the file removed before each) against
  ``docker load`` of the same image (a docker-archive made by skopeo from hermetic's OCI layout, the image
  removed from the engine before each);
* start: from the start of ``hermetic run --engine charliecloud`` to the script's first line, a script that
  imports torch and prints (every run reads torch's files through the image), from the file
  (HERMETIC_IMAGE_FORM=squashfs) against from the directories (=directory), and ``docker run`` of the same
  script in the loaded image; interleaved, after one unmeasured run of each (page cache warm). The file is
  started both ways it is mounted: by the kernel's squashfs (what root gets for a file no user can change)
  and by squashfuse (a user's way; here forced by making the store's squashfs/ directory group-writable for
  those runs, as a shared store can be).

Goals (issue 41): one file; made in at most docker load's time; start within 1.2x of the directories'.

Usage: bench/bench_squashfs.py --seed-cache DIR [-n 5] [--workdir /work/scratch/bench-squashfs] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches, whose helpers this one uses

import bench_build as bb  # noqa: E402
import bench_engines as be  # noqa: E402

from hermetic.core.reference import parse_base_reference  # noqa: E402
from hermetic.store.oci import OciStore  # noqa: E402

EXAMPLE = be.EXAMPLE
SCRIPT = "import torch\nprint('first line', torch.__version__, flush=True)\n"
FIRST = re.compile(r"^first line ")
DOCKER_TAG = "hermetic-bench/squashfs:latest"


def tree_size(paths: list[Path]) -> tuple[int, int]:
    """(entries, bytes of regular files) under ``paths``."""
    entries = size = 0
    for root in paths:
        for dirpath, dirs, files in os.walk(root):
            entries += len(dirs) + len(files)
            for f in files:
                st = os.lstat(os.path.join(dirpath, f))
                size += st.st_size if not os.path.islink(os.path.join(dirpath, f)) else 0
    return entries, size


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    return bb.run(cmd, env=env)[2]


def bench(args: argparse.Namespace, workdir: Path) -> dict:
    base_ref = re.search(r"(?m)^base:\s*(\S+)", (EXAMPLE / "hermetic.yaml").read_text())
    base_digest = parse_base_reference(base_ref.group(1)).digest  # type: ignore[union-attr]
    seed = bb.seed_cache(workdir, args.seed_cache, base_digest)
    print("[prep] project, cache, build (directory form) ...", file=sys.stderr)
    project = bb.copy_project(EXAMPLE, workdir / "proj", None, seed, epoch=int(time.time()))
    be.set_engine(project, "charliecloud")
    be.make_data(project)
    (project / "first.py").write_text(SCRIPT)
    cache = bb.fresh_cache(seed, workdir / "cache", base_digest, bb.locked_wheel_files(project, seed))
    env = bb.hermetic_env(cache)
    env_dir = {**env, "HERMETIC_IMAGE_FORM": "directory", "USER": os.environ.get("USER", "root")}
    env_file = {**env, "HERMETIC_IMAGE_FORM": "squashfs", "USER": os.environ.get("USER", "root")}
    built = json.loads(bb.run(bb.HERMETIC + ["build", "-C", str(project), "--json"], env=env_dir)[0])
    digest = built["manifest_digest"]
    store = OciStore(cache / "oci")
    layers = [cache / "charliecloud" / "layers" / d["digest"].split(":", 1)[1]
              for d in store.read_json(digest)["layers"]]
    entries, tree_bytes = tree_size(layers)

    print("[make] hermetic export --squashfs, docker load, interleaved ...", file=sys.stderr)
    archive = workdir / "image.tar"
    ref = next(n for n, d in store.refs().items() if d.digest == digest)
    bb.run(["skopeo", "copy", "-q", f"oci:{cache / 'oci'}:{ref}", f"docker-archive:{archive}:{DOCKER_TAG}"])
    made, loads = [], []
    sqfs_path = cache / "squashfs" / f"sha256-{digest.split(':', 1)[1]}.sqfs"
    for _ in range(args.make_runs):
        sqfs_path.unlink(missing_ok=True)
        made.append(timed(bb.HERMETIC + ["export", digest, "--squashfs", "--json"], env=env))
        subprocess.run(["docker", "rmi", "-f", built["image_id"]], capture_output=True)
        loads.append(timed(["docker", "load", "-q", "-i", str(archive)]))
    sqfs_size = sqfs_path.stat().st_size

    print(f"[start] first line: from the file, from the directories, docker run (x{args.n}) ...", file=sys.stderr)
    run = bb.HERMETIC + ["run", "-C", str(project), "first.py"]
    docker = ["docker", "run", "--rm", "--read-only", "--network", "none", DOCKER_TAG,
              "/opt/venv/bin/python", "-c", SCRIPT]
    starts: dict[str, list[float]] = {"file": [], "file_fuse": [], "directory": [], "docker": []}
    shared = sqfs_path.parent

    @contextlib.contextmanager
    def mounter(name: str) -> Iterator[None]:
        """squashfuse for "file_fuse": the store's squashfs/ made group-writable for the while (the kernel's
        squashfs mounts only a file no user can change); as it was for the rest."""
        mode = shared.stat().st_mode & 0o7777
        shared.chmod(mode | 0o020 if name == "file_fuse" else mode)
        try:
            yield
        finally:
            shared.chmod(mode)

    for i in range(args.n + 1):
        for name, cmd, e in (("file", run, env_file), ("file_fuse", run, env_file), ("directory", run, env_dir),
                             ("docker", docker, None)):
            with mounter(name):
                first, _ = be.until_line(cmd, e, FIRST, time.perf_counter(), cwd=project)
            if i:  # the first of each: page cache warm, the image's record made
                starts[name].append(first)
    forms = {}
    for name, form in (("file", "squashfs"), ("file_fuse", "squashfs"), ("directory", "directory")):
        with mounter(name):
            rec = json.loads(bb.run(bb.HERMETIC + ["run", "-C", str(project), "--json", "first.py"],
                                    env={**env, "HERMETIC_IMAGE_FORM": form})[0])
        engine = rec["invocation"]["engine"]
        forms[name] = engine["image"]["form"] + "".join(
            f", {n.rpartition('mounted by ')[2]}" for n in engine["notes"] if "mounted by" in n)
    subprocess.run(["docker", "rmi", "-f", DOCKER_TAG], capture_output=True)
    return {
        "machine": bb.machine(workdir), "load_average": os.getloadavg(), "image": digest,
        "placed": {"directory": {"files": entries, "bytes": tree_bytes, "layers": len(layers)},
                   "squashfs": {"files": 1, "bytes": sqfs_size}},
        "make_s": made, "docker_load_s": loads, "start_s": starts, "forms_recorded": forms,
    }


def report(res: dict) -> str:
    med = bb.median
    p, s = res["placed"], res["start_s"]
    make, load = med(res["make_s"]), med(res["docker_load_s"])
    f, u, d, k = med(s["file"]), med(s["file_fuse"]), med(s["directory"]), med(s["docker"])
    m = res["machine"]
    lines = [
        f"image {res['image']} (examples/torch-mlp, this invocation's epoch); machine: {m['cpu']}; {m['memory']}; "
        f"kernel {m['kernel']}; {m['disk']}; load average {res['load_average'][0]:.1f}",
        "",
        "| | one SquashFS file | layer directories (or anchor) | ratio |",
        "| --- | --- | --- | --- |",
        f"| placed on the shared filesystem | 1 file, {p['squashfs']['bytes'] / 1e6:.0f} MB | "
        f"{p['directory']['files']:,} files and directories, {p['directory']['bytes'] / 1e6:.0f} MB in "
        f"{p['directory']['layers']} layers | {p['directory']['files']:,}x fewer files |",
        f"| made from a warm store (median of {len(res['make_s'])}) | {make:.2f} s "
        f"({', '.join(f'{x:.2f}' for x in res['make_s'])}) | `docker load` {load:.2f} s "
        f"({', '.join(f'{x:.2f}' for x in res['docker_load_s'])}) | {make / load:.2f}x docker load |",
        f"| `hermetic run` to the script's first line, the file mounted by the kernel (median of {len(s['file'])}) "
        f"| {f:.2f} s | directories {d:.2f} s; `docker run` {k:.2f} s | {f / d:.2f}x the directories', "
        f"{f / k:.2f}x docker run |",
        f"| the same, the file mounted by squashfuse | {u:.2f} s | directories {d:.2f} s | {u / d:.2f}x the "
        f"directories', {u / k:.2f}x docker run |",
        "",
        f"recorded forms: {res['forms_recorded']}",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed-cache", type=Path, default=None, help="a HERMETIC_CACHE holding the base (and wheels)")
    ap.add_argument("--workdir", type=Path, default=Path("/work/scratch/bench-squashfs"))
    ap.add_argument("-n", type=int, default=5, help="measured starts of each kind (after one unmeasured)")
    ap.add_argument("--make-runs", type=int, default=3, help="file makes and docker loads, interleaved")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("squashfuse_ll") is None or shutil.which("skopeo") is None:
        sys.exit("bench_squashfs: needs squashfuse and skopeo (scripts/ensure-test-deps)")
    existed = args.workdir.exists()
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        res = bench(args, args.workdir)
    except bb.BenchError as e:
        print(f"bench_squashfs: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep and not existed:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print(json.dumps(res, indent=1) if args.json else report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
