#!/usr/bin/env python3
"""What checking costs (issue 24, items 4 and 10): the dataset identity check after a run, and the outputs'
rehash with and without the per-run stat cache.

- identity: ``check_identity`` (one scan with stats, no hash) of the numpy example's dataset, and of
  synthetic datasets of N small files; what keeping the identity adds to a warm verification.
- outputs: ``check_outputs`` of a run directory holding large files and of one holding many small ones,
  a first look (everything read) and a second (the stat cache vouches).

    .venv/bin/python bench/bench_records.py [--small 10000] [--large-mb 1024] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})"


def small_dataset(root: Path, n: int) -> Path:
    """n files of 1-4 KiB in 100 directories, and their manifest."""
    from hermetic.data.manifest import format_manifest

    entries = {}
    for i in range(n):
        rel = f"d{i % 100:02d}/f{i:06d}.bin"
        data = os.urandom(1024 + (i % 4) * 1024)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        entries[rel] = hashlib.sha256(data).hexdigest()
    manifest = root.parent / f"{root.name}.sha256"
    manifest.write_bytes(format_manifest(entries))
    return manifest


def bench_identity(work: Path, sizes: list[int], repeat: int) -> dict:
    from hermetic.data.identity import check_identity
    from hermetic.data.verify import verify_dataset

    results = {}
    logreg = work / "numpy-logreg"
    subprocess.run(["cp", "-r", str(REPO / "examples" / "numpy-logreg"), str(logreg)], check=True)
    subprocess.run([sys.executable, str(logreg / "make_data.py")], check=True, capture_output=True)
    cases = [("numpy-logreg example", logreg / "data", logreg / "data.sha256")]
    for n in sizes:
        root = work / f"small-{n}"
        cases.append((f"{n} files of 1-4 KiB", root, small_dataset(root, n)))
    time.sleep(0.2)  # out of the racy window
    for label, root, manifest in cases:
        verify_dataset(root, manifest)  # warm the stat cache
        warm = timed(lambda: verify_dataset(root, manifest), repeat)
        report = verify_dataset(root, manifest)
        assert report.ok and report.identity is not None
        check = timed(lambda: check_identity(report.identity, report.manifest_bytes), repeat)
        assert check_identity(report.identity, report.manifest_bytes).ok
        results[label] = {"files": report.file_count, "bytes": report.total_bytes,
                          "warm_verify_s": warm, "identity_check_s": check}
        print(f"identity  {label:<28} {report.file_count:>6} files: check {ms(check)}; warm verify {ms(warm)}")
    return results


def bench_outputs(work: Path, small: int, large_mb: int, repeat: int) -> dict:
    from hermetic.record.outputs import hash_outputs
    from hermetic.record.verify import CACHE_NAME, check_outputs

    results = {}
    for label, files in ((f"4 files, {large_mb} MB", {f"ckpt-{i}.pt": large_mb // 4 << 20 for i in range(4)}),
                         (f"{small} files of 2 KiB", {f"s/{i // 1000}/{i:06d}.bin": 2048 for i in range(small)})):
        run_dir = work / f"run-{len(results)}"
        out = run_dir / "outputs"
        for rel, size in files.items():
            p = out / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as f:
                f.write(os.urandom(min(size, 1 << 20)) * max(1, size >> 20) if size >= 1 << 20 else os.urandom(size))
        record = {"outputs": hash_outputs(out), "data": {}}
        time.sleep(0.2)
        first, second = [], []
        for _ in range(repeat):
            (run_dir / CACHE_NAME).unlink(missing_ok=True)
            subprocess.run(["sh", "-c", "sync"], check=True)
            t = time.perf_counter()
            c1 = check_outputs(run_dir, record)
            first.append(time.perf_counter() - t)
            t = time.perf_counter()
            c2 = check_outputs(run_dir, record)
            second.append(time.perf_counter() - t)
            assert c1.ok and c2.ok and c2.hashed == 0, (c1, c2)
        results[label] = {"files": len(files), "first_look_s": first, "second_look_s": second}
        print(f"outputs   {label:<28}: first look {ms(first)}; second look {ms(second)}")
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=10_000, help="files in the many-small-files cases")
    ap.add_argument("--large-mb", type=int, default=1024, help="MB in the large-outputs case")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        work = Path(tmp)
        os.environ["HERMETIC_CACHE"] = str(work / "cache")
        doc = {"identity": bench_identity(work, [args.small, 10 * args.small], args.repeat),
               "outputs": bench_outputs(work, args.small, args.large_mb, args.repeat)}
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
