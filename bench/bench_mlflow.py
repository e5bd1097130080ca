#!/usr/bin/env python3
"""MLflow export: ``hermetic runs export --mlflow`` per run vs logging the same values one call each.

One invocation, same machine, one ``mlflow server`` (sqlite, 127.0.0.1) for both. N finished runs are
made from hermetic's synthetic record, each with a metric history the way the Trainer writes it
(``outputs/out/trainer_state.json``: --metrics names x --steps steps). Then:

* hermetic: ``python -m hermetic runs export --mlflow URI --runs-dir DIR`` (one process for all runs:
  the params, tags, dataset input, every metric value batched, the record as an artifact);
* anchor: what a script that logs to MLflow itself does — ``mlflow.start_run`` and one
  ``mlflow.log_metric(key, value, step=)`` per value (in process: no CLI start counted).

Printed: seconds per run for each, the ratio, and whether hermetic is within the issue's target
(<= 1 s per run on this machine). The export is checked: every run FINISHED with every value.

Usage: bench/bench_mlflow.py [--runs 5] [--steps 200] [--metrics 3] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = open(workdir / "mlflow-server.log", "wb")
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
                             "--artifacts-destination", str(workdir / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench_mlflow: mlflow server exited ({proc.returncode}); see {workdir / 'mlflow-server.log'}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit("bench_mlflow: mlflow server did not answer within 180 s")


def make_runs(root: Path, n: int, steps: int, names: list[str]) -> list[str]:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the tests' synthetic records
    from hermetic.record import finish_record, write_record
    from hermetic.record.rundir import create_run_dir
    from synthetic_records import DATA_MANIFEST, T0, synthetic_record

    ids = []
    for i in range(n):
        rid = f"20261202-0900{i:02d}-{0xb00000 + i:06x}"
        rec = synthetic_record(rid, minutes=i)
        run_dir = create_run_dir(root, rid)
        (run_dir / "data" / "mnist.sha256").write_text(DATA_MANIFEST)
        (run_dir / "outputs" / "out").mkdir()
        history = [{**{m: 1.0 / (s + k) for k, m in enumerate(names)}, "epoch": s / steps, "step": s}
                   for s in range(1, steps + 1)]
        (run_dir / "outputs" / "out" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        write_record(run_dir, finish_record(rec, run_dir, status="succeeded", exit_code=0,
                                            finished_at=T0 + timedelta(minutes=i + 3)))
        ids.append(rid)
    return ids


def by_hand(uri: str, n: int, steps: int, names: list[str]) -> float:
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench-by-hand")
    t = time.perf_counter()
    for i in range(n):
        with mlflow.start_run(run_name=f"by-hand-{i}"):
            for s in range(1, steps + 1):
                for k, m in enumerate(names):
                    mlflow.log_metric(m, 1.0 / (s + k), step=s)
                mlflow.log_metric("epoch", s / steps, step=s)
    return time.perf_counter() - t


def check(uri: str, ids: list[str], doc: dict, steps: int, names: list[str]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exported = {e["id"]: e for e in doc["exported"]}
    assert sorted(exported) == sorted(ids), exported
    for rid in ids:
        run = client.get_run(exported[rid]["mlflow_run_id"])
        assert run.info.status == "FINISHED", (rid, run.info.status)
        hist = client.get_metric_history(run.info.run_id, f"trainer/{names[0]}")
        assert len(hist) == steps, (rid, len(hist))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--metrics", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/hermetic-bench-mlflow"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    a.workdir.mkdir(parents=True)
    names = ["loss", "learning_rate", "grad_norm", "eval_loss", "accuracy"][:max(1, min(a.metrics, 5))]
    ids = make_runs(a.workdir / "runs", a.runs, a.steps, names)
    server, uri = start_server(a.workdir)
    try:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hermetic", "runs", "export", "--json", "--mlflow", uri,
                               "--runs-dir", str(a.workdir / "runs"), "--experiment", "bench-hermetic"],
                              capture_output=True, text=True)
        hermetic_s = time.perf_counter() - t
        if proc.returncode != 0:
            sys.exit(f"bench_mlflow: export failed ({proc.returncode}): {proc.stderr[-3000:]}")
        check(uri, ids, json.loads(proc.stdout), a.steps, names)
        hand_s = by_hand(uri, a.runs, a.steps, names)
    finally:
        import signal

        os.killpg(server.pid, signal.SIGKILL)  # mlflow server and the uvicorn workers it started
        server.wait()
    values = a.steps * (len(names) + 1)
    out = {"runs": a.runs, "values_per_run": values, "hermetic_s_per_run": hermetic_s / a.runs,
           "by_hand_s_per_run": hand_s / a.runs, "ratio": hand_s / hermetic_s,
           "within_target": hermetic_s / a.runs <= TARGET_S,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"load {os.getloadavg()[0]:.2f}"}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"machine: {out['machine']}")
        print(f"{a.runs} runs x {values} metric values each (Trainer log_history)")
        print(f"hermetic runs export --mlflow   {out['hermetic_s_per_run']:.3f} s per run (CLI start included)")
        print(f"mlflow.log_metric per value     {out['by_hand_s_per_run']:.3f} s per run")
        print(f"ratio {out['ratio']:.1f}x   target <= {TARGET_S} s per run: {'ok' if out['within_target'] else 'OVER'}")
    shutil.rmtree(a.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
