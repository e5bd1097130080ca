#!/usr/bin/env python3
"""The GPU checks of issues 6 and 9, as one prepared script for a lent GPU machine.

No GPU machine was lent to the session that wrote this; a session that gets
one runs it there (through the device tool) with the machine's own PyTorch:

    python3 bench/gpu_check.py --out "$OUT"

It writes, under --out:
- probe.json: hermetic/probe/probe.py run directly on the machine (becomes a
  recorded fixture in tests/fixtures/probes/, for the run checks of issue 9),
  plus probe-<source>.json for each GPU source the probe knows;
- gpu_check.json: an op that is nondeterministic on CUDA (index_add_ in
  float32 with repeated indices) run twice with determinism off and twice in
  strict mode, and the torch example's training loop twice in strict mode on
  CUDA, each with whether the outputs matched bitwise, and the GPU and driver.

Standard library + torch + numpy only (what the machine has); hermetic's
runtime is imported from this checkout (it is stdlib-only by design).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "torch-mlp"


def run_probe(out: Path) -> dict:
    results = {}
    for source in ("", "pynvml", "nvml", "nvidia-smi", "cuda"):
        env = {**os.environ, "HERMETIC_PROBE_GPU_SOURCE": source} if source else dict(os.environ)
        p = subprocess.run([sys.executable, str(REPO / "hermetic" / "probe" / "probe.py")], env=env,
                           capture_output=True, text=True, timeout=300)
        name = f"probe-{source}.json" if source else "probe.json"
        (out / name).write_text(p.stdout)
        results[source or "default"] = {"exit": p.returncode, "stderr": p.stderr[-500:]}
    return results


def nondeterministic_op(strict: bool) -> str:
    """sha256 of index_add_ over repeated indices (atomicAdd order varies on CUDA)."""
    import torch

    torch.use_deterministic_algorithms(strict)
    g = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(1 << 22, device="cuda", generator=g)
    index = torch.randint(0, 1 << 10, (1 << 22,), device="cuda", generator=g)
    out = torch.zeros(1 << 10, device="cuda").index_add_(0, index, src)
    torch.cuda.synchronize()
    return hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()


def train_twice(tmp: Path) -> list[dict]:
    data = tmp / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(data)], check=True,
                   capture_output=True)
    rt = tmp / "rt"
    rt.mkdir()
    (rt / "hermetic_runtime").symlink_to(REPO / "hermetic" / "runtime")
    runs = []
    for i in range(2):
        outputs = tmp / f"out{i}"
        env = {**os.environ, "PYTHONPATH": str(rt), "HERMETIC_OUTPUTS": str(outputs), "HERMETIC_SEED": "1234",
               "HERMETIC_DETERMINISM": "strict", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "NVIDIA_TF32_OVERRIDE": "0"}
        p = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--data", str(data), "--device", "cuda"],
                           env=env, capture_output=True, text=True, timeout=600)
        files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(outputs.glob("*")) if f.is_file()}
        runs.append({"exit": p.returncode, "stderr": p.stderr[-1000:], "outputs": files})
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    report: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    report["probe"] = run_probe(out)
    if torch.cuda.is_available():
        off = [nondeterministic_op(False) for _ in range(2)]
        strict = [nondeterministic_op(True) for _ in range(2)]
        report["index_add_"] = {"off": off, "off_bitwise_equal": off[0] == off[1],
                                "strict": strict, "strict_bitwise_equal": strict[0] == strict[1]}
        with tempfile.TemporaryDirectory() as tmp:
            runs = train_twice(Path(tmp))
        report["torch_mlp_strict_cuda"] = {"runs": runs, "bitwise_equal": runs[0]["outputs"] == runs[1]["outputs"]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "probe"}, indent=2, default=str)[:4000])


if __name__ == "__main__":
    main()
