"""The Docker Engine's client (hermetic/engines/dockerclient.py: docker-py's, with hermetic's errors) and what
the engine is asked through it: DOCKER_HOST read and refused by name, the API version chosen from the engine's
one answer, against a fake engine on a unix socket (an engine too old or too new, which the real one is not);
a container's whole life and the completeness check of its log, against the real engine."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from pathlib import Path

import pytest

from hermetic.engines import dockerclient
from hermetic.core.errors import EngineError


@pytest.mark.parametrize("env, expected", [
    ({}, "unix:///var/run/docker.sock"),
    ({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}, "unix:///run/user/1000/docker.sock"),
    ({"DOCKER_HOST": "/run/docker.sock"}, "unix:///run/docker.sock"),
    ({"DOCKER_HOST": "tcp://10.0.0.5:2375"}, "tcp://10.0.0.5:2375"),
    ({"DOCKER_HOST": "tcp://[::1]:2375"}, "tcp://[::1]:2375"),
])
def test_docker_host_is_read_as_the_docker_cli_reads_it(env, expected):
    assert dockerclient.docker_host(env) == expected


def test_ssh_and_other_hosts_are_refused_by_name_with_what_to_do():
    with pytest.raises(EngineError, match="does not talk to the engine over ssh") as e:
        dockerclient.docker_host({"DOCKER_HOST": "ssh://me@gpu-box"})
    assert "DOCKER_HOST=unix:///tmp/docker.sock" in (e.value.hint or "")
    with pytest.raises(EngineError, match="not unix://PATH or tcp://HOST:PORT"):
        dockerclient.docker_host({"DOCKER_HOST": "npipe:////./pipe/docker_engine"})
    with pytest.raises(EngineError, match="the port is not a number"):
        dockerclient.docker_host({"DOCKER_HOST": "tcp://build-host:twenty"})


def test_the_api_version_is_the_engines_own_within_what_docker_py_and_the_engine_take():
    newest = (1, 45)
    assert dockerclient.choose_api({"ApiVersion": "1.41", "MinAPIVersion": "1.12"}, newest) == "1.41"
    assert dockerclient.choose_api({"ApiVersion": "1.52", "MinAPIVersion": "1.24"}, newest) == "1.45"
    assert dockerclient.choose_api({"ApiVersion": "1.60", "MinAPIVersion": "1.50"}, newest) == "1.50"
    with pytest.raises(EngineError, match=r"speaks API 1\.39 \(Docker 18\.09\.9\); hermetic needs API 1\.40"):
        dockerclient.choose_api({"ApiVersion": "1.39", "MinAPIVersion": "1.12", "Version": "18.09.9"}, newest)


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeEngine:
    """An engine of another version on a unix socket: its /version as given, what it was asked, and a load
    whose progress stream carries an error (as an engine reports a bad layer: status 200)."""

    def __init__(self, path: Path, version_doc: dict) -> None:
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # noqa: ANN002
                pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _any(self) -> None:
                if self.headers.get("Transfer-Encoding") == "chunked":  # read all of it, as an engine does
                    while size := int(self.rfile.readline().strip(), 16):
                        self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                else:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.requests.append((self.command, self.path))
                if self.path == "/version":
                    self._answer(200, json.dumps(version_doc).encode())
                elif "/images/load" in self.path:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for line in (b'{"stream":"Loading"}\n', b'{"errorDetail":{"message":"bad layer"},"error":"bad layer"}\n'):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self._answer(200, b"{}")

            do_GET = do_POST = do_DELETE = _any

        self.server = _UnixHTTPServer(str(path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    made = []

    def start(version_doc: dict) -> FakeEngine:
        sock = tmp_path / f"docker{len(made)}.sock"
        engine = FakeEngine(sock, version_doc)
        made.append(engine)
        monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
        monkeypatch.setattr(dockerclient, "_client", None)
        return engine

    yield start
    dockerclient._client = None
    for engine in made:
        engine.close()


def test_the_engine_is_asked_its_version_once_and_spoken_to_in_it(fake_engine):
    engine = fake_engine({"Version": "99.1.2", "ApiVersion": "1.41", "MinAPIVersion": "1.12"})
    client = dockerclient.engine_client(timeout=10)
    assert dockerclient.engine_version()["Version"] == "99.1.2"
    client.info()
    client.info()
    assert engine.requests == [("GET", "/version"), ("GET", "/v1.41/info"), ("GET", "/v1.41/info")]


def test_an_engine_too_old_for_device_requests_is_refused_by_name(fake_engine):
    fake_engine({"Version": "18.09.9", "ApiVersion": "1.39", "MinAPIVersion": "1.12"})
    with pytest.raises(EngineError, match=r"speaks API 1\.39 \(Docker 18\.09\.9\); hermetic needs API 1\.40"):
        dockerclient.engine_client(timeout=10)


def test_an_error_inside_the_loads_progress_stream_refuses_the_load(fake_engine):
    from hermetic.engines.dockerimages import _send_archive

    engine = fake_engine({"Version": "99.1.2", "ApiVersion": "1.41", "MinAPIVersion": "1.12"})
    assert _send_archive(iter([b"x" * 1000, b"y" * 10])) == "bad layer"
    assert engine.requests[-1][0] == "POST" and engine.requests[-1][1].startswith("/v1.41/images/load")


def test_no_engine_is_said_with_its_cause_and_the_command_that_starts_one(tmp_path, monkeypatch):
    monkeypatch.setattr(dockerclient, "_client", None)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(EngineError, match=rf"no Docker Engine answers at unix://{tmp_path}/no\.sock "
                                          r"\(FileNotFoundError\)") as e:
        dockerclient.engine_client()
    assert "scripts/ensure-docker" in (e.value.hint or "")
    assert dockerclient.containers_labelled("org.hermetic.driver") is None  # `hermetic runs`: nothing to ask


# ---------------------------------------------------------------- on the real engine


@pytest.mark.docker
def test_a_containers_life_on_the_real_engine(docker_client, tmp_path, logreg_built):
    """Created from the spec (its labels and its driver's), attached before start (nothing missed), the two
    streams apart, waited for, its log per stream, removed; run_capture's timeout ends and removes it."""
    from hermetic.engines.base import DRIVER_LABEL, ContainerSpec
    from hermetic.engines.base import remove_container
    from hermetic.engines.dockercontainer import create, run_capture

    client = dockerclient.engine_client()
    assert dockerclient.engine_version()["Version"] == docker_client.version()["Version"]
    image_id = logreg_built[1]["image_id"]
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    spec = ContainerSpec(image_id=image_id, command=["/opt/venv/bin/python", "-c", script], mounts=[], env={},
                         user="1000:1000", labels={"org.hermetic.test": "dockerclient"}, driver="host-a:1:2")
    c = create(client, spec)
    try:
        stream = c.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
        c.start()
        got = list(stream)
        assert b"".join(o for o, _ in got if o) == b"out\n" and b"".join(e for _, e in got if e) == b"err\n"
        assert c.wait()["StatusCode"] == 3
        assert c.logs(stdout=True, stderr=False) == b"out\n" and c.logs(stdout=False, stderr=True) == b"err\n"
        labels = docker_client.containers.get(c.id).labels
        assert (labels["org.hermetic.test"], labels[DRIVER_LABEL]) == ("dockerclient", "host-a:1:2")
    finally:
        remove_container(c)
    assert not docker_client.containers.list(all=True, filters={"id": c.id})
    sleeper = ContainerSpec(image_id=image_id, command=["/opt/venv/bin/python", "-c", "import time; time.sleep(60)"],
                            mounts=[], env={}, user="1000:1000", labels={"org.hermetic.test": "dockerclient-timeout"})
    with pytest.raises(TimeoutError):
        run_capture(client, sleeper, timeout=1)
    assert not docker_client.containers.list(all=True, filters={"label": "org.hermetic.test=dockerclient-timeout"})


@pytest.mark.docker
def test_a_lost_end_of_a_long_output_is_taken_from_the_engines_log(docker_client, logreg_built, tmp_path):
    """The attach stream can lose the end of a container's output (moby#29285); the run's logs are then
    rewritten from the engine's log: a complete stream leaves the files alone, a lost end is taken from the log."""
    from hermetic.engines.base import complete_logs

    client = dockerclient.engine_client()
    script = ("import sys\n"
              "for i in range(20000): sys.stdout.write('line %06d ' % i + 'x' * 80 + '\\n')\n"
              "sys.stderr.write('the end\\n')")
    created = client.api.create_container_from_config(
        {"Image": logreg_built[1]["image_id"], "Cmd": ["/opt/venv/bin/python", "-c", script], "User": "1000:1000",
         "Labels": {"org.hermetic.test": "dockerclient"}, "HostConfig": {"NetworkMode": "none", "ReadonlyRootfs": True}})
    c = client.containers.get(created["Id"])
    try:
        c.start()
        assert c.wait()["StatusCode"] == 0
        out, err = c.logs(stdout=True, stderr=False), c.logs(stdout=False, stderr=True)
        assert len(out) > 1 << 20 and err == b"the end\n"

        def files(n: int = 3):
            return [open(tmp_path / f"log{i}", "w+b") for i in range(n)]

        streamed = files()
        for f in streamed:
            f.write(b"as streamed")
        complete_logs(c, streamed, [len(out), len(err)], False)
        assert all(f.seek(0) == 0 and f.read() == b"as streamed" for f in streamed)  # nothing rewritten
        lost = files()  # the attach stream lost the last 1000 bytes of stdout, and stderr's line
        complete_logs(c, lost, [len(out) - 1000, 0], False)
        got = [(f.seek(0), f.read())[1] for f in lost]
        assert got[0] == out and got[1] == err and len(got[2]) == len(out) + len(err)
        for f in streamed + lost:
            f.close()
    finally:
        c.remove(force=True)
