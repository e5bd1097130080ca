"""hermetic.dockerapi, the Docker Engine API client: against a fake engine on a unix socket (what it sends,
how it reads answers and errors) and against the real engine (a container's whole life, images)."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import struct
import threading
from pathlib import Path

import pytest

from hermetic.dockerapi import DockerAPI, DockerAPIError, DockerNotFound, Endpoint, demux
from hermetic.errors import EngineError


def frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


def test_demux_splits_frames_across_any_chunking():
    stream = frame(1, b"out one\n") + frame(2, b"err\n") + frame(1, b"") + frame(1, b"x" * 70000)
    expected = [("stdout", b"out one\n"), ("stderr", b"err\n"), ("stdout", b""), ("stdout", b"x" * 70000)]
    for size in (1, 3, 8, 9, 4096, len(stream)):
        chunks = [stream[i:i + size] for i in range(0, len(stream), size)]
        assert list(demux(chunks)) == expected, size


@pytest.mark.parametrize("env, expected", [
    ({}, ("unix", "/var/run/docker.sock")),
    ({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}, ("unix", "/run/user/1000/docker.sock")),
    ({"DOCKER_HOST": "tcp://10.0.0.5:2375"}, ("tcp", "10.0.0.5", 2375, False)),
    ({"DOCKER_HOST": "tcp://build-host"}, ("tcp", "build-host", 2375, False)),
    ({"DOCKER_HOST": "tcp://[::1]:2375"}, ("tcp", "::1", 2375, False)),
])
def test_docker_host_is_read_as_docker_py_reads_it(env, expected):
    ep = Endpoint.from_env(env)
    if expected[0] == "unix":
        assert ep.unix_path == expected[1] and ep.host is None
    else:
        assert (ep.host, ep.port, ep.tls is not None) == expected[1:]


def test_tls_from_the_cert_path_and_ssh_refused_with_the_forward_to_use(tmp_path):
    ep = Endpoint.from_env({"DOCKER_HOST": "tcp://remote:2376", "DOCKER_CERT_PATH": str(tmp_path)})
    assert ep.tls is not None and ep.port == 2376
    with pytest.raises(EngineError, match="does not talk to the engine over ssh") as e:
        Endpoint.from_env({"DOCKER_HOST": "ssh://me@gpu-box"})
    assert "DOCKER_HOST=unix:///tmp/docker.sock" in (e.value.hint or "")
    with pytest.raises(EngineError, match="not unix://PATH or tcp://HOST:PORT"):
        Endpoint.from_env({"DOCKER_HOST": "npipe:////./pipe/docker_engine"})


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeEngine:
    """A fake Docker Engine on a unix socket: /_ping's headers as given, /version, and recorded requests."""

    def __init__(self, path: Path, *, api_version: str | None, version_doc: dict | None = None) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # noqa: ANN002
                pass

            def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding") == "chunked":  # read all of it, as an engine does
                    data = b""
                    while size := int(self.rfile.readline().strip(), 16):
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return data
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _any(self) -> None:
                body = self._body()
                fake.requests.append((self.command, self.path, body))
                if self.path == "/_ping":
                    hdrs = {"Server": "Docker/99.1.2 (linux)"}
                    if api_version:
                        hdrs["Api-Version"] = api_version
                    self._answer(200, b"OK", hdrs)
                elif self.path == "/version":
                    self._answer(200, json.dumps(version_doc or {}).encode())
                elif self.path.endswith("/containers/nope/json"):
                    self._answer(404, b'{"message":"No such container: nope"}')
                elif "/containers/create" in self.path:
                    self._answer(201, b'{"Id":"c0ffee","Warnings":[]}')
                elif self.path.endswith("/images/load?quiet=1"):
                    self._answer(200, b'{"stream":"Loading"}\n{"errorDetail":{"message":"bad layer"},'
                                      b'"error":"bad layer"}\n')
                else:
                    self._answer(200, b"{}")

            do_GET = do_POST = do_DELETE = _any

        self.server = _UnixHTTPServer(str(path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_engine(tmp_path):
    made = []

    def start(**kw) -> tuple[FakeEngine, DockerAPI]:
        sock = tmp_path / f"docker{len(made)}.sock"
        engine = FakeEngine(sock, **kw)
        made.append(engine)
        return engine, DockerAPI(Endpoint(f"unix://{sock}", unix_path=str(sock)), timeout=10)

    yield start
    for engine in made:
        engine.close()


def test_the_api_version_is_the_engines_own_from_its_ping_and_the_engine_version_from_its_server_header(
        fake_engine):
    engine, api = fake_engine(api_version="1.41")
    assert api.prefix() == "/v1.41" and api.engine_version() == "99.1.2"
    api.info()
    api.info()
    assert [p for _, p, _ in engine.requests] == ["/_ping", "/v1.41/info", "/v1.41/info"]  # pinged once


def test_a_newer_engine_is_spoken_to_in_the_newest_api_known_unless_it_no_longer_takes_it(fake_engine):
    _, api = fake_engine(api_version="1.52", version_doc={"ApiVersion": "1.52", "MinAPIVersion": "1.24"})
    assert api.prefix() == "/v1.45"
    _, api = fake_engine(api_version="1.60", version_doc={"ApiVersion": "1.60", "MinAPIVersion": "1.50"})
    assert api.prefix() == "/v1.50"
    _, api = fake_engine(api_version=None, version_doc={"ApiVersion": "1.43", "MinAPIVersion": "1.12"})
    assert api.prefix() == "/v1.43"  # no header: its /version says


def test_an_engine_too_old_for_device_requests_is_refused_by_name(fake_engine):
    _, api = fake_engine(api_version="1.39")
    with pytest.raises(EngineError, match=r"speaks API 1\.39 \(Docker 99\.1\.2\); hermetic needs API 1\.40"):
        api.prefix()


def test_the_engines_errors_carry_its_status_and_message_and_a_load_error_in_its_stream_is_raised(fake_engine):
    engine, api = fake_engine(api_version="1.41")
    with pytest.raises(DockerNotFound) as e:
        api.container("nope")
    assert e.value.status == 404 and e.value.explanation == "No such container: nope"
    with pytest.raises(DockerAPIError, match="bad layer"):
        api.load_image(iter([b"x" * 1000, b"y" * 10]))
    method, path, body = engine.requests[-1]
    assert (method, path) == ("POST", "/v1.41/images/load?quiet=1")


def test_json_bodies_and_query_parameters_are_sent_as_the_engine_reads_them(fake_engine):
    engine, api = fake_engine(api_version="1.41")
    api.create_container({"Image": "sha256:ab", "Cmd": ["true"]}, name="n1")
    api.containers(all=True, filters={"label": ["a=b"]})
    (m1, p1, b1), (m2, p2, _) = engine.requests[-2:]
    assert (m1, p1, json.loads(b1)) == ("POST", "/v1.41/containers/create?name=n1", {"Image": "sha256:ab",
                                                                                      "Cmd": ["true"]})
    assert (m2, p2) == ("GET", "/v1.41/containers/json?all=1&filters=%7B%22label%22%3A+%5B%22a%3Db%22%5D%7D")


@pytest.mark.docker
def test_a_containers_life_on_the_real_engine(docker_client, tmp_path, logreg_built):
    """Create, attach (before start: nothing missed), start, the two streams apart, wait, logs, remove."""
    from hermetic.engine import engine_client

    api = engine_client()
    assert api.engine_version() == docker_client.version()["Version"]
    image_id = logreg_built[1]["image_id"]
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    c = api.create_container({"Image": image_id, "Cmd": ["/opt/venv/bin/python", "-c", script],
                              "User": "1000:1000", "Labels": {"org.hermetic.test": "dockerapi"},
                              "HostConfig": {"NetworkMode": "none", "ReadonlyRootfs": True}})
    try:
        stream = c.attach(logs=True)
        c.start()
        got = list(stream)
        # each write of the script is a frame of its own (its image runs Python unbuffered)
        assert b"".join(o for o, _ in got if o) == b"out\n" and b"".join(e for _, e in got if e) == b"err\n"
        assert c.wait()["StatusCode"] == 3
        assert c.logs(stdout=True, stderr=False) == b"out\n" and c.logs(stdout=False, stderr=True) == b"err\n"
        c.reload()
        assert c.attrs["Config"]["Labels"]["org.hermetic.test"] == "dockerapi"
    finally:
        c.remove(force=True)
    with pytest.raises(DockerNotFound):
        api.container(c.id)
    assert api.has_image(image_id) and not api.has_image("sha256:" + "0" * 64)
    assert any(row["Id"] == image_id for row in api.images())


def test_nothing_of_docker_py_or_requests_is_imported_by_a_run():
    """What the client is for: `hermetic run`'s process imports neither (tests keep docker-py as their own,
    independent view of the engine)."""
    import subprocess
    import sys

    code = ("import sys, hermetic.run.runner, hermetic.engines.docker, hermetic.dockerapi, hermetic.engine; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('docker', 'requests', 'urllib3')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}).stdout
    assert out.strip() == "[]"


@pytest.mark.docker
def test_a_long_output_is_checked_by_its_tail_and_a_lost_end_is_taken_from_the_log(logreg_built, tmp_path):
    """The attach stream can lose the end of a container's output (moby#29285); the run's logs are then
    rewritten from the engine's log. Counting that whole log took the engine ~3 s for 50 MB, so past
    FULL_COUNT_BYTES its last lines are compared with the end of what was streamed instead: a complete
    stream leaves the files alone after one tail request, a lost end is found and taken from the log."""
    from hermetic.engine import engine_client
    from hermetic.engines import docker as engine

    api = engine_client()
    script = ("import sys\n"
              "for i in range(20000): sys.stdout.write('line %06d ' % i + 'x' * 80 + '\\n')\n"
              "sys.stderr.write('the end\\n')")
    c = api.create_container({"Image": logreg_built[1]["image_id"], "Cmd": ["/opt/venv/bin/python", "-c", script],
                              "User": "1000:1000", "Labels": {"org.hermetic.test": "dockerapi"},
                              "HostConfig": {"NetworkMode": "none", "ReadonlyRootfs": True}})
    try:
        c.start()
        assert c.wait()["StatusCode"] == 0
        out, err = c.logs(stdout=True, stderr=False), c.logs(stdout=False, stderr=True)
        assert len(out) > engine.FULL_COUNT_BYTES and err == b"the end\n"
        asked = []
        real_frames = c.frames
        c.frames = lambda **kw: (asked.append(kw.get("tail")), real_frames(**kw))[1]

        def files(n: int = 3):
            return [open(tmp_path / f"log{i}", "w+b") for i in range(n)]

        streamed = files()
        for f in streamed:
            f.write(b"as streamed")
        engine._complete_logs(c, streamed, [len(out), len(err)], False,
                              [bytearray(out[-engine.KEPT_END_BYTES:]), bytearray(err)])
        assert asked == [engine.TAIL_LINES]  # the tail only, and nothing rewritten
        assert all(f.seek(0) == 0 and f.read() == b"as streamed" for f in streamed)

        asked.clear()
        lost = files()  # the attach stream lost the last 1000 bytes of stdout, and stderr's line
        engine._complete_logs(c, lost, [len(out) - 1000, 0], False, [bytearray(out[:-1000][-engine.KEPT_END_BYTES:]),
                                                                      bytearray()])
        assert asked[0] == engine.TAIL_LINES and None in asked[1:]  # the tail differed: counted in full
        got = [(f.seek(0), f.read())[1] for f in lost]
        assert got[0] == out and got[1] == err and len(got[2]) == len(out) + len(err)
        for f in streamed + lost:
            f.close()
    finally:
        c.remove(force=True)
