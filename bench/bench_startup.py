#!/usr/bin/env python3
"""Interpreter start-up with hermetic's seeding hook vs the same image without it (target: within +20 ms).

hermetic-runtime.pth makes every interpreter in the image import
_hermetic_startup, which installs an import hook when $HERMETIC_SEED is set
(docs/your-script.md). The anchor is the same image with that .pth masked
(an empty file bind-mounted over it): what a pip-installed image's Python
does. One container per case, N interpreter starts timed inside it, so
container start-up does not drown the milliseconds. Cases, in one invocation:

- ``python -c pass`` with the hook active (HERMETIC_SEED set) vs masked;
- ``python -c "import random, numpy"`` likewise: the hook's wrapping of the
  loaders on the numpy example's image (numpy 2 imports numpy.random lazily,
  and the hook seeds it only when it is imported);
- ``python -c "import random, numpy; numpy.random.rand()"``: the seeding
  itself, when the script draws from numpy's global generator.

Printed: median per case, the difference (ms) and the ratio; --json for
the numbers.

Usage: bench/bench_startup.py [-n 40] [--workdir DIR] [--cache DIR] [--json]
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

TARGET_MS = 20.0
TIMER = """import statistics, subprocess, sys, time
n, code = int(sys.argv[1]), sys.argv[2]
times = []
for _ in range(n + 2):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    times.append(time.perf_counter() - t)
print(statistics.median(times[2:]) * 1000)
"""


def inside(image_id: str, n: int, code: str, *, hook: bool, site: str) -> float:
    """Median ms of n interpreter starts in one container of the image."""
    args = ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp"]
    if hook:
        args += ["-e", "HERMETIC_SEED=1234"]
    else:
        args += ["-v", f"{EMPTY}:{site}/hermetic-runtime.pth:ro"]
    out = sh(args + [image_id, "/opt/venv/bin/python", "-c", TIMER, str(n), code]).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    global EMPTY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-startup."))
    env = {**os.environ, "HERMETIC_CACHE": str(args.cache or workdir / "cache")}
    proj, built, _ = prepare("numpy-logreg", workdir, env, base_reference(env))
    empty = workdir / "empty.pth"
    empty.write_text("")
    EMPTY = str(empty)
    site = "/opt/venv/lib/python3.11/site-packages"
    rows = []
    for label, code in (("python -c pass", "pass"), ("python -c 'import random, numpy'", "import random, numpy"),
                        ("... numpy.random.rand()", "import random, numpy; numpy.random.rand()")):
        with_hook = inside(built["image_id"], args.n, code, hook=True, site=site)
        without = inside(built["image_id"], args.n, code, hook=False, site=site)
        rows.append({"case": label, "with_hook_ms": with_hook, "without_ms": without,
                     "extra_ms": with_hook - without, "ratio": with_hook / without,
                     "within_target": with_hook - without <= TARGET_MS})
    result = {"n": args.n, "image_id": built["image_id"], "target_ms": TARGET_MS, "rows": rows, "machine": machine()}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"interpreter start-up in the numpy example's image, median of {args.n} (target: within +{TARGET_MS:.0f} ms)")
    for r in rows:
        print(f"  {r['case']:<36} hook {r['with_hook_ms']:7.1f} ms   masked {r['without_ms']:7.1f} ms   "
              f"+{r['extra_ms']:5.1f} ms  ({r['ratio']:.2f}x)  {'ok' if r['within_target'] else 'OVER'}")


EMPTY = ""

if __name__ == "__main__":
    main()
