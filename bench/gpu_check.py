#!/usr/bin/env python3
"""The GPU proof (issue 17), as one prepared script for a lent GPU machine (no Docker there).

A session that is lent a GPU machine runs it there through the device tool,
with that machine's own PyTorch, well inside one command's 10 minutes:

    python3 bench/gpu_check.py --out "$OUT" --budget 330

Everything it measures goes under --out (at most 7 files, one folder: what
the device tool brings back), and a summary is printed at the end:

- probe.json: hermetic/inimage/probe/probe.py run on the machine, with a "_source"
  line saying where and when (it becomes tests/fixtures/probes/<gpu>.json,
  the fixture the run-check tests use); probe-<source>.json for each GPU
  source the probe knows (pynvml, nvml over ctypes, nvidia-smi, cuda);
- gpu_check.json: the knobs strict mode set, as read back from torch; a
  nondeterministic op (index_add_ and scatter_add_ in float32 with repeated
  indices, atomics on CUDA) run 5 times with determinism off and 5 times in
  strict mode, with the number of distinct results; the torch example's
  training loop on CUDA twice in strict mode and twice with determinism off,
  the sha256 of its weights each time and the wall time (strict / off cost);
  the GPU as torch sees it.

Each section is timed and skipped, with a note, when the budget is spent, and
a section that fails is recorded as failed without stopping the others.
Standard library + torch + numpy + pyyaml (what the machine has); hermetic's
in-image runtime is imported from this checkout (it is stdlib-only by design).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "torch-mlp"
PROBE = REPO / "hermetic" / "inimage" / "probe" / "probe.py"
SOURCES = ("pynvml", "nvml", "nvidia-smi", "cuda")
REPEATS = 5
DEVICE = "cuda"  # --rehearse-on-cpu: "cpu", to try every section here before the GPU machine's few minutes
OPS_SIZE = 1 << 22  # elements added by index_add_/scatter_add_ (a rehearsal: fewer; it proves the code, not the GPU)
TRAIN_ARGS: list[str] = []  # a rehearsal: one epoch of the example, which shows the same things
# The image's strict-mode environment (hermetic.config.determinism.knob_env("strict", 1, 0, {})), as a
# `hermetic run` container would have it; the runtime reads these as the process sees them.
STRICT_ENV = {
    "HERMETIC_DETERMINISM": "strict", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE",
    "NVIDIA_TF32_OVERRIDE": "0", "NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0",
    "XLA_FLAGS": "--xla_gpu_deterministic_ops=true", "TF_DETERMINISTIC_OPS": "1", "TZ": "UTC", "LC_ALL": "C.UTF-8",
    "SOURCE_DATE_EPOCH": "0",
}
OFF_ENV = {"HERMETIC_DETERMINISM": "off", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def section(report: dict, name: str, budget: Budget, need_s: float, fn: Callable[[], Any]) -> None:
    """Run one section into report[name], timed; skipped when less than need_s seconds are left."""
    if budget.left() < need_s:
        report[name] = {"skipped": f"budget: {budget.left():.0f} s left, this section needs ~{need_s:.0f} s"}
        return
    t = time.monotonic()
    try:
        report[name] = {"result": fn()}
    except Exception as e:  # recorded, and the other sections still run
        report[name] = {"failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    report[name]["seconds"] = round(time.monotonic() - t, 2)


def run_probes(out: Path, gpu_name: str | None) -> dict:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = {}
    for source in ("",) + SOURCES:
        env = {k: v for k, v in os.environ.items() if k != "HERMETIC_PROBE_GPU_SOURCE"}
        if source:
            env["HERMETIC_PROBE_GPU_SOURCE"] = source
        p = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=240)
        name = f"probe-{source}.json" if source else "probe.json"
        try:
            doc = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            (out / name).write_text(p.stdout)
            results[source or "default"] = {"exit": p.returncode, "stderr": p.stderr[-500:], "json": False}
            continue
        doc["_source"] = (f"recorded on a lent GPU machine ({gpu_name or 'no GPU seen by torch'}) by "
                          f"bench/gpu_check.py at {stamp}" + (f", HERMETIC_PROBE_GPU_SOURCE={source}" if source else ""))
        (out / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        gpus = (doc.get("hardware") or {}).get("gpus") or []
        results[source or "default"] = {
            "exit": p.returncode, "gpu_source": (doc.get("hardware") or {}).get("gpu_source"), "errors": doc.get("errors"),
            "gpus": [{k: g.get(k) for k in ("name", "uuid", "sm_count", "sm_count_source", "memory_bytes",
                                            "compute_capability", "driver_version", "cuda_driver_version",
                                            "mig_mode", "ecc_enabled")} for g in gpus],
        }
    return results


def strict_knobs() -> dict:
    """enable_determinism('strict') in this process (with the image's env), read back from torch."""
    sys.path.insert(0, str(_runtime_dir()))
    os.environ.update(STRICT_ENV)
    import hermetic_runtime as hr
    import torch

    result = hr.enable_determinism("strict")
    deterministic = getattr(getattr(torch, "utils", None), "deterministic", None)
    return {"torch_flags": result.torch, "warnings": list(result.warnings),
            "fill_uninitialized_memory": getattr(deterministic, "fill_uninitialized_memory", None),
            "env": {k: os.environ.get(k) for k in sorted(STRICT_ENV)}}


def _runtime_dir() -> Path:
    rt = Path(tempfile.gettempdir()) / "hermetic-gpu-check-runtime"
    rt.mkdir(exist_ok=True)
    link = rt / "hermetic_runtime"
    if not link.exists():
        link.symlink_to(REPO / "hermetic" / "inimage" / "runtime")
    return rt


def nondeterministic_ops() -> dict:
    """index_add_ and scatter_add_ over repeated indices: CUDA atomics add in a varying order."""
    import torch

    def once(op: str, strict: bool) -> str:
        torch.use_deterministic_algorithms(strict)
        g = torch.Generator(device=DEVICE).manual_seed(0)
        src = torch.randn(OPS_SIZE, device=DEVICE, generator=g)
        index = torch.randint(0, 1 << 10, (OPS_SIZE,), device=DEVICE, generator=g)
        if op == "index_add_":
            out = torch.zeros(1 << 10, device=DEVICE).index_add_(0, index, src)
        else:
            out = torch.zeros(1 << 10, device=DEVICE).scatter_add_(0, index, src)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()

    out: dict = {}
    for op in ("index_add_", "scatter_add_"):
        for mode, strict in (("off", False), ("strict", True)):
            hashes = [once(op, strict) for _ in range(REPEATS)]
            out[f"{op} {mode}"] = {"runs": REPEATS, "distinct": len(set(hashes)), "sha256": hashes}
    torch.use_deterministic_algorithms(False)
    return out


def train_loops(tmp: Path) -> dict:
    """The torch example's loop on CUDA: twice in strict mode, twice with determinism off."""
    data = tmp / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(data)], check=True,
                   capture_output=True, timeout=120)
    runs: dict = {}
    for mode, knobs in (("strict", STRICT_ENV), ("off", OFF_ENV)):
        runs[mode] = []
        for i in range(2):
            outputs = tmp / f"{mode}{i}"
            env = {**{k: v for k, v in os.environ.items() if k not in STRICT_ENV}, **knobs,
                   "PYTHONPATH": str(_runtime_dir()), "HERMETIC_OUTPUTS": str(outputs), "HERMETIC_SEED": "1234"}
            t = time.monotonic()
            p = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--data", str(data), "--device", DEVICE,
                                *TRAIN_ARGS],
                               env=env, capture_output=True, text=True, timeout=240)
            seconds = time.monotonic() - t
            files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                     for f in sorted(outputs.glob("*")) if f.is_file()} if outputs.is_dir() else {}
            runs[mode].append({"exit": p.returncode, "seconds": round(seconds, 2), "outputs": files,
                               "stderr": p.stderr[-1500:] if p.returncode else ""})
    summary = {}
    for mode, rs in runs.items():
        weights = [r["outputs"].get("weights.bin") for r in rs]
        summary[mode] = {"all_exit_0": all(r["exit"] == 0 for r in rs), "weights_sha256": weights,
                         "weights_bitwise_equal": weights[0] is not None and weights[0] == weights[1],
                         "outputs_bitwise_equal": rs[0]["outputs"] == rs[1]["outputs"] and bool(rs[0]["outputs"]),
                         "seconds": [r["seconds"] for r in rs]}
    off_t = min(summary["off"]["seconds"])
    summary["strict_over_off_time"] = round(min(summary["strict"]["seconds"]) / off_t, 3) if off_t else None
    return {"runs": runs, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"), help="folder for everything measured")
    ap.add_argument("--budget", type=float, default=330, help="seconds for the whole check (default 330)")
    ap.add_argument("--rehearse-on-cpu", action="store_true",
                    help="run every section on the CPU (in the torch example's image, say): proves the script "
                         "works before it spends GPU time; its figures say nothing about a GPU")
    args = ap.parse_args()
    global DEVICE, OPS_SIZE
    if args.rehearse_on_cpu:
        DEVICE, OPS_SIZE = "cpu", 1 << 18
        TRAIN_ARGS[:] = ["--epochs", "1"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not importable by this Python (the GPU machine's python3 has it; here, "
              "rehearse inside the torch example's image)", file=sys.stderr)
        return 69

    cuda = torch.cuda.is_available()
    report: dict = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                    "cudnn": torch.backends.cudnn.version(), "cuda_available": cuda,
                    "gpu": torch.cuda.get_device_name(0) if cuda else None,
                    "device": DEVICE, "rehearsal": args.rehearse_on_cpu}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        report["gpu_properties"] = {"sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
                                    "compute_capability": f"{props.major}.{props.minor}"}
    section(report, "probe", budget, 30, lambda: run_probes(out, report["gpu"]))
    if cuda or args.rehearse_on_cpu:
        section(report, "nondeterministic_ops", budget, 20, nondeterministic_ops)
        with tempfile.TemporaryDirectory() as tmp:
            section(report, "torch_mlp_cuda", budget, 120, lambda: train_loops(Path(tmp)))
        section(report, "strict_knobs", budget, 10, strict_knobs)
    else:
        report["note"] = "torch sees no CUDA device: only the probe ran"
    report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print(summary(report))
    return 0


def summary(report: dict) -> str:
    lines = [f"torch {report['torch']} (CUDA {report['torch_cuda']}, cuDNN {report['cudnn']}) on {report['gpu']}"
             + (" -- a CPU rehearsal: no figure here is about a GPU" if report.get("rehearsal") else "")]
    probe = (report.get("probe") or {}).get("result") or {}
    for source, r in probe.items():
        gpus = ", ".join(f"{g['name']} sm={g['sm_count']} cc={g['compute_capability']} driver={g['driver_version']} "
                         f"cuda={g['cuda_driver_version']} mig={g['mig_mode']}" for g in r.get("gpus") or [])
        lines.append(f"probe[{source}]: exit {r['exit']}, source {r.get('gpu_source')}: {gpus or 'no GPU'}")
    ops = (report.get("nondeterministic_ops") or {}).get("result") or {}
    for name, r in ops.items():
        lines.append(f"{name}: {r['distinct']} distinct results in {r['runs']} runs")
    train = ((report.get("torch_mlp_cuda") or {}).get("result") or {}).get("summary") or {}
    for mode in ("strict", "off"):
        if mode in train:
            t = train[mode]
            lines.append(f"torch-mlp on {report.get('device', 'cuda')}, {mode}: weights bitwise equal: {t['weights_bitwise_equal']} "
                         f"(exit 0: {t['all_exit_0']}), {t['seconds']} s")
    if train.get("strict_over_off_time") is not None:
        lines.append(f"strict / off wall time: {train['strict_over_off_time']}x")
    knobs = (report.get("strict_knobs") or {}).get("result") or {}
    if knobs:
        lines.append(f"strict knobs read back: fill_uninitialized_memory={knobs.get('fill_uninitialized_memory')}, "
                     f"NCCL_NVLS_ENABLE={knobs['env'].get('NCCL_NVLS_ENABLE')}, "
                     f"deterministic={knobs['torch_flags'].get('use_deterministic_algorithms')}")
    for name in ("probe", "nondeterministic_ops", "torch_mlp_cuda", "strict_knobs"):
        s = report.get(name) or {}
        if "failed" in s or "skipped" in s:
            lines.append(f"{name}: {s.get('failed') or s.get('skipped')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
