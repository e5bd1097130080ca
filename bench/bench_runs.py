#!/usr/bin/env python3
"""Listing 10,000 runs: `hermetic runs` (index) against what people would do without it.

Creates N synthetic runs (complete, sealed run.json files of realistic size)
in a temporary directory, then times, in this one invocation:

  hermetic runs            first call: no index yet, reads every run.json once and writes the index
  hermetic runs            later calls: the index (median of --repeat)
  hermetic runs --json     the same, as JSON
  ls runs | wc -l          counts runs, says nothing about them (a floor, not an alternative)
  jq over every run.json   id, time, status, image, sorted newest first
  python loop              json.load of every run.json, same columns, sorted

and prints seconds and ratios. Page cache is warm for all of them (every
alternative is run after the files were just written). Usage:

  .venv/bin/python bench/bench_runs.py [--runs 10000] [--source-files 100] [--repeat 5] [--keep DIR]
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

from hermetic.core.canonical import pretty_json
from hermetic.record.ids import iso_utc
from hermetic.record.seal import seal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' synthetic records
from synthetic_records import T0, synthetic_record  # noqa: E402

PY_LOOP = r"""
import json, os, sys
root = sys.argv[1]
rows = []
for name in os.listdir(root):
    p = os.path.join(root, name, "run.json")
    if os.path.isfile(p):
        with open(p) as f:
            r = json.load(f)
        rows.append((r["record"]["started_at"], name, r["record"]["status"], r["image"]["id"][7:19],
                     ",".join(k + ":" + v["manifest_sha256"][:8] for k, v in r["data"].items()),
                     str(r["metrics"]["final"].get("loss"))))
rows.sort(reverse=True)
sys.stdout.write("".join("  ".join(row) + "\n" for row in rows))
"""

JQ_FILTER = '[.record.started_at, .record.run_id, .record.status, .image.id[7:19], ' \
            '(.data | to_entries | map(.key + ":" + .value.manifest_sha256[0:8]) | join(",")), ' \
            '(.metrics.final.loss | tostring)] | @tsv'


def make_runs(root: Path, n: int, source_files: int) -> int:
    """Write n sealed run.json files (no fsync: setup speed only). Returns total bytes."""
    from datetime import timedelta

    root.mkdir(parents=True)
    template = synthetic_record(n_source_files=source_files)
    total = 0
    for i in range(n):
        t = T0 + timedelta(minutes=i)
        rid = t.strftime("%Y%m%d-%H%M%S-") + f"{i:06x}"
        rec = {**template, "record": {**template["record"], "run_id": rid, "started_at": iso_utc(t),
                                      "finished_at": iso_utc(t + timedelta(minutes=3))},
               "seed": {**template["seed"], "value": i % 5},
               "metrics": {**template["metrics"], "final": {"accuracy": 0.98, "loss": round(0.5 / (1 + i), 6)}}}
        text = pretty_json(seal(rec)).encode()
        d = root / rid
        for sub in ("", "outputs", "logs", "code", "data"):
            (d / sub).mkdir(exist_ok=True)
        (d / "run.json").write_bytes(text)
        total += len(text)
    return total


def timed(cmd: list[str] | str, *, shell: bool = False) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--source-files", type=int, default=100, help="files in each record's code snapshot")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", metavar="DIR", help="create the runs here and keep them")
    args = ap.parse_args()

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-runs-"))
    root = base / "runs"
    try:
        t0 = time.perf_counter()
        size = make_runs(root, args.runs, args.source_files)
        print(f"setup: {args.runs} runs, run.json {size / args.runs / 1024:.1f} KiB each, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        hermetic = [sys.executable, "-m", "hermetic", "runs", "--runs-dir", str(root)]

        results: dict[str, float] = {}
        results["hermetic runs (first call: builds index)"], out = timed(hermetic)
        assert out.count(b"\n") == args.runs + 1, "listing is incomplete"
        warm = [timed(hermetic)[0] for _ in range(args.repeat)]
        results["hermetic runs (index)"] = statistics.median(warm)
        results["hermetic runs --json (index)"] = statistics.median(
            [timed([*hermetic, "--json"])[0] for _ in range(args.repeat)])
        results["python -c pass (interpreter start)"] = statistics.median(
            [timed([sys.executable, "-c", "pass"])[0] for _ in range(args.repeat)])
        results["ls runs | wc -l (count only)"] = statistics.median(
            [timed(f"ls {root} | wc -l", shell=True)[0] for _ in range(args.repeat)])
        if shutil.which("jq"):
            results["jq over every run.json | sort"] = timed(
                f"jq -r '{JQ_FILTER}' {root}/*/run.json | sort -r", shell=True)[0]
        results["python loop: json.load every run.json"] = timed([sys.executable, "-c", PY_LOOP, str(root)])[0]

        ref = results["hermetic runs (index)"]
        print(f"\n{'command':<42} {'seconds':>8} {'vs hermetic runs':>17}")
        for name, secs in results.items():
            print(f"{name:<42} {secs:>8.3f} {secs / ref:>16.1f}x")
        index_kib = (root / ".index.jsonl").stat().st_size / 1024
        print(f"\nindex: {index_kib:.0f} KiB for {args.runs} runs; interpreter: {sys.version.split()[0]}; "
              f"cores: {os.cpu_count()}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
