"""A real MLflow tracking server for the export tests: ``mlflow server`` on a free 127.0.0.1 port.

The backend store is a sqlite file and artifacts go to a local directory
(``--artifacts-destination``, served by the same server), both in a temp dir.
MLflow's job runner (background workers for its GenAI features) is turned
off: these tests do not use it and it would start a dozen processes.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry_support import free_port

MLFLOW_BIN = Path(sys.executable).with_name("mlflow")


@dataclass
class MlflowServer:
    uri: str
    root: Path
    proc: subprocess.Popen
    log: Path

    def client(self):  # -> mlflow.tracking.MlflowClient
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def stop(self) -> None:
        if self.proc.poll() is None:
            # the server runs uvicorn as a child: end the process group this fixture started
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_mlflow_server(workdir: Path, *, timeout: float = 120, base_env: dict[str, str] | None = None) -> MlflowServer:
    """Start ``mlflow server`` and wait (bounded) until /health answers 200."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "mlflow-server.log"
    env = {**(os.environ if base_env is None else base_env), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [str(MLFLOW_BIN), "server", "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
           "--artifacts-destination", str(workdir / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = MlflowServer(f"http://127.0.0.1:{port}", workdir, proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return server
        except OSError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"mlflow server did not answer on {server.uri} within {timeout:.0f} s: "
                       f"{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One ``mlflow server`` for the whole run (its start-up is the slow part: started when the run
    begins, see conftest's early work); tests name their own experiments."""
    from conftest import early

    server = early("mlflow") or start_mlflow_server(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()
