#!/usr/bin/env python3
"""Wheel fetch: `hermetic fetch` vs `pip download` of the same lock (issue 2).

Cold: empty wheel store vs `pip download --no-cache-dir` into an empty dir.
Warm: the same command again. hermetic answers from its content-addressed
store without touching the network; pip resolves each requirement again.
Both honour this machine's pip configuration (find-links, mirrors).

    python bench/bench_fetch.py [--example examples/torch-mlp] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default=str(REPO / "examples" / "torch-mlp"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    example = Path(a.example).resolve()
    lock = example / "requirements.lock"
    # pip would wait out every timeout on an index that does not answer from
    # here (the torch lock names download.pytorch.org); hermetic skips such an
    # index after one probe. For a fair anchor pip gets the lock without index
    # lines, so both use this machine's pip configuration (find-links, mirrors).
    pip_lock = Path(tempfile.mkdtemp(prefix="bench-fetch-lock.")) / "requirements.lock"
    pip_lock.write_text("".join(line for line in lock.read_text().splitlines(keepends=True)
                                if not line.startswith(("--index-url", "--extra-index-url", "-i "))))
    hermetic = [sys.executable, "-m", "hermetic"]
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--require-hashes", "--no-deps",
           "--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux2014_x86_64", "--platform", "any", "-r", str(pip_lock)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fetch.") as tmp:
        cold_h, warm_h, cold_p, warm_p = [], [], [], []
        for i in range(a.repeat):
            cache = Path(tmp) / f"cache{i}"
            env = {**os.environ, "HERMETIC_CACHE": str(cache)}
            cold_h.append(timed(hermetic + ["fetch", "-C", str(example)], env))
            warm_h.append(timed(hermetic + ["fetch", "-C", str(example)], env))
            dest = Path(tmp) / f"pip{i}"
            cold_p.append(timed(pip + ["--no-cache-dir", "-d", str(dest)], dict(os.environ)))
            warm_p.append(timed(pip + ["-d", str(dest)], dict(os.environ)))
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
        for label, h, p in (("cold (empty store / empty dir)", cold_h, cold_p),
                            ("warm (second fetch)", warm_h, warm_p)):
            mh, mp = statistics.median(h), statistics.median(p)
            rows.append((label, mh, mp, mp / mh))
    shutil.rmtree(pip_lock.parent, ignore_errors=True)
    n_pins = sum(1 for line in lock.read_text().splitlines() if line and line[0].isalpha())
    print(f"lock: {lock.relative_to(REPO)} ({n_pins} pins); median of {a.repeat}")
    print(f"{'case':<34}{'hermetic fetch':>16}{'pip download':>15}{'pip / hermetic':>16}")
    for label, mh, mp, ratio in rows:
        print(f"{label:<34}{mh:>15.2f}s{mp:>14.2f}s{ratio:>15.1f}x")


if __name__ == "__main__":
    main()
