#!/usr/bin/env python3
"""A strict start with torch: ``enable_determinism("strict")`` vs ``torch.use_deterministic_algorithms(True)``.

The anchor is what a script (or hermetic_runtime before 3 Dec 2026) does by hand: torch's own call, which
imports TorchInductor's config and torch._dynamo with it to set one flag. hermetic_runtime sets that flag when
the config is first imported instead (docs/runtime.md). Cases, in one container of the torch example's image,
N interpreter starts each, interleaved (so the machine's drift falls on both):

- ``import torch`` alone (the floor);
- ``import torch; torch.use_deterministic_algorithms(True)`` (the anchor);
- ``import torch, hermetic_runtime as hr; hr.enable_determinism("strict")`` (hermetic's strict mode:
  every other flag too, and the runtime's report).

Printed: the median wall time of each interpreter (start to exit) and the time above the floor, hermetic
against the anchor; --json for the numbers.

Usage: bench/bench_strict_start.py [-n 15] [--workdir DIR] [--cache DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import base_reference, machine, prepare, sh  # noqa: E402  (one preparation for the example)

CASES = {
    "import torch": "import torch",
    "torch.use_deterministic_algorithms(True)": "import torch; torch.use_deterministic_algorithms(True)",
    "hermetic_runtime.enable_determinism('strict')":
        "import torch, hermetic_runtime as hr; hr.enable_determinism('strict')",
}
TIMER = """import json, statistics, subprocess, sys, time
n, cases = int(sys.argv[1]), json.loads(sys.argv[2])
times = {name: [] for name in cases}
for i in range(n + 1):
    for name, code in cases.items():
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, stderr=subprocess.DEVNULL)
        if i:  # the first round warms the page cache
            times[name].append(time.perf_counter() - t)
print(json.dumps({name: statistics.median(v) * 1000 for name, v in times.items()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=15)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-strict."))
    env = {**os.environ, "HERMETIC_CACHE": str(args.cache or workdir / "cache")}
    _, built, _ = prepare("torch-mlp", workdir, env, base_reference(env))
    out = sh(["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--user", "1000:1000",
              "-e", "OMP_NUM_THREADS=1", built["image_id"], "/opt/venv/bin/python", "-c", TIMER, str(args.n),
              json.dumps(CASES)]).stdout
    ms = json.loads(out.strip().splitlines()[-1])
    floor, anchor, ours = (ms[name] for name in CASES)
    result = {"n": args.n, "image_id": built["image_id"], "median_ms": ms, "anchor_above_floor_ms": anchor - floor,
              "hermetic_above_floor_ms": ours - floor, "hermetic_vs_anchor": ours / anchor, "machine": machine()}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"a strict start in the torch example's image, median of {args.n} interpreters each (interleaved)")
    for name, value in ms.items():
        print(f"  {name:<48} {value:7.0f} ms   (+{value - floor:5.0f} ms over import torch)")
    print(f"  hermetic's strict mode: {ours:.0f} ms against torch's own call {anchor:.0f} ms: "
          f"{ours / anchor:.2f}x the time, {anchor - ours:.0f} ms less per start")


if __name__ == "__main__":
    main()
