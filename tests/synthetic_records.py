"""A complete, plausible record built from fixed values: for the tests and the benchmarks (bench/)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from typing import Any

from hermetic import __version__
from hermetic.core.canonical import canonical_sha256
from hermetic.config.determinism import is_knob, knob_env
from hermetic.record.ids import iso_utc

T0 = datetime(2026, 11, 29, 21, 45, 0, tzinfo=timezone.utc)


def h(text: str) -> str:
    """A stable fake sha256 hex for a label."""
    return hashlib.sha256(text.encode()).hexdigest()


def synthetic_config(seed: int = 0) -> dict[str, Any]:
    return {
        "name": "mnist-demo",
        "base": "debian@sha256:" + h("base"),
        "python": {"path": "/usr/bin/python3", "version": "3.11"},
        "lock": "requirements.lock",
        "determinism": {"mode": "strict", "seed": seed, "threads": 1, "env": {}},
        "env": {},
        "datasets": [{"name": "mnist", "path": "data/mnist", "manifest": "data/mnist.sha256", "mount": "/data/mnist"}],
        "runs_dir": "runs",
        "build": {"source_date_epoch": 0, "prefix": "/opt/venv", "bytecode": "none", "compression": "none",
                  "user": "1000:1000", "workdir": "/workspace"},
    }


PACKAGES = [("numpy", "2.1.3"), ("torch", "2.9.1"), ("nvidia-cublas-cu12", "12.8.4.1"), ("filelock", "3.16.1")]
# What a strict-mode image with one thread bakes in: hermetic.config.determinism's own values, never a copy.
DETERMINISM_ENV = {k: v for k, v in knob_env("strict", 1, 0, {}).items() if is_knob(k)}
DATA_MANIFEST = "".join(f"{h(f'img{i}')}  train/{i:04d}.png\n" for i in range(8))


def synthetic_record(run_id: str = "20261129-214500-1a2b3c", *, seed: int = 0, minutes: int = 0,
                     n_source_files: int = 5) -> dict[str, Any]:
    """An unsealed, valid record (pass it to write_record or seal)."""
    started = T0 + timedelta(minutes=minutes)
    cfg = synthetic_config(seed)
    files = {f"src/module{i}.py": h(f"module{i}") for i in range(n_source_files)}
    files["train.py"] = h("train.py")
    return {
        "record": {"schema_version": 1, "run_id": run_id, "tool": f"hermetic {__version__}",
                   "started_at": iso_utc(started), "finished_at": iso_utc(started + timedelta(minutes=3)),
                   "status": "succeeded", "exit_code": 0, "record_sha256": ""},
        "invocation": {"argv": ["hermetic", "run", "train.py", "--epochs", "3"], "script": "train.py",
                       "args": ["--epochs", "3"], "config": cfg, "config_sha256": canonical_sha256(cfg),
                       "name": None, "replay_of": None, "group": None, "gpus": "all", "network": "none"},
        "image": {
            "id": "sha256:" + h("image"), "manifest_digest": "sha256:" + h("manifest"), "repo_digests": [],
            "base": cfg["base"], "lock_sha256": h("lock"),
            "packages": [{"name": n, "version": v, "sha256": h(f"{n}-{v}"),
                          "filename": f"{n.replace('-', '_')}-{v}-py3-none-any.whl"} for n, v in PACKAGES],
            "cuda": {"runtime": "12.8.90", "cudnn": "9.10.2.21", "cublas": "12.8.4.1", "nccl": "2.27.5",
                     "torch_variant": "cu128"},
            "labels": {"org.opencontainers.image.title": "mnist-demo"},
        },
        "code": {
            "git": {"commit": h("commit")[:40], "branch": "main", "dirty": False, "diff_sha256": None,
                    "diff_file": None, "untracked": {}},
            "snapshot": {"file": "code/source.tar", "sha256": canonical_sha256(files), "files": files},
        },
        "data": {"mnist": {"path": "data/mnist", "mount": "/data/mnist", "manifest_file": "data/mnist.sha256",
                           "manifest_sha256": hashlib.sha256(DATA_MANIFEST.encode()).hexdigest(),
                           "bytes": 8 * 784, "count": 8, "verify_mode": "stat-cache"}},
        "seed": {"value": seed, "policy": "config",
                 "applied": {"random": True, "numpy": True, "torch": True, "torch.use_deterministic_algorithms": True}},
        "env": {"determinism": dict(DETERMINISM_ENV), "passed": {}, "secrets": []},
        # software and hardware in the shape hermetic/inimage/probe/probe.py reports them
        "software": {"python": {"version": "3.11.2", "implementation": "CPython", "executable": "/usr/bin/python3"},
                     "numpy": {"version": "2.1.3"},
                     "torch": {"version": "2.9.1+cu128", "cuda": "12.8", "cudnn": 91002, "nccl": "2.27.5",
                               "cuda_available": True, "device_count": 1,
                               "deterministic_algorithms": True, "deterministic_warn_only": False,
                               "cudnn_benchmark": False, "cudnn_deterministic": True, "tf32_matmul": False,
                               "tf32_cudnn": False, "num_threads": 1},
                     "blas": [{"internal_api": "openblas", "version": "0.3.27", "num_threads": 1,
                               "threading_layer": "pthreads", "architecture": "Haswell"}],
                     "env": dict(DETERMINISM_ENV)},
        "hardware": {"kernel": {"release": "6.1.0-28-amd64", "version": "#1 SMP Debian", "machine": "x86_64"},
                     "os": "Debian GNU/Linux 12 (bookworm)", "glibc": "2.36",
                     "cpu": {"model": "AMD EPYC 7763 64-Core Processor", "vendor": "AuthenticAMD",
                             "flags_of_interest": ["avx", "avx2", "fma", "sse4_2"], "logical_cores": 16,
                             "affinity": 16, "cgroup_cpus": None},
                     "memory_bytes": 128 * 2**30, "memory_limit_bytes": None,
                     "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-" + h("gpu0")[:32],
                               "memory_bytes": 141 * 2**30, "compute_capability": "9.0", "sm_count": 132,
                               "sm_count_source": "torch", "driver_version": "570.133.20",
                               "cuda_driver_version": "12.8", "ecc_enabled": True, "mig_mode": "disabled",
                               "clocks": {"sm_max_mhz": 1980, "mem_max_mhz": 3201}, "power_limit_w": 700.0,
                               "pci_bus_id": "00000000:19:00.0"}],
                     "gpu_source": "nvml"},
        "outputs": {"files": {"model.pt": {"sha256": h("model"), "size": 4_000_000},
                              "metrics.jsonl": {"sha256": h("metrics"), "size": 1200}}},
        "metrics": {"final": {"accuracy": 0.9812, "loss": 0.0613}, "steps": 1407, "file": "outputs/metrics.jsonl"},
    }


def write_synthetic_run(runs_root, record: dict[str, Any], manifests: dict[str, str] | None = None):  # noqa: ANN001, ANN201
    """Create the run dir with its manifests (``manifests``: name -> text, default DATA_MANIFEST), outputs and
    snapshot written to agree with the record, as after a real run; write the record and return it sealed.
    """
    from hermetic.record.rundir import create_run_dir, write_record

    run_dir = create_run_dir(runs_root, record["record"]["run_id"])
    for name, ds in record["data"].items():
        text = (manifests or {}).get(name, DATA_MANIFEST)
        (run_dir / ds["manifest_file"]).write_text(text)
        ds["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    for rel, f in record["outputs"]["files"].items():
        if f.get("symlink") is not None or f.get("type"):
            continue
        data = f"synthetic output {f['sha256']}\n".encode()
        path = run_dir / "outputs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        f.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    snap = record["code"]["snapshot"]  # not a tar: bytes that stand for it, as the outputs' do
    data = f"synthetic source snapshot {snap['sha256']}\n".encode()
    (run_dir / snap["file"]).write_bytes(data)
    snap["sha256"] = hashlib.sha256(data).hexdigest()
    return write_record(run_dir, record)
