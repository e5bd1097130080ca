"""The Docker Engine API over its socket: the one client hermetic talks to the Docker Engine with.

The calls hermetic makes (docs.docker.com/engine/api): version and info;
containers created, attached, started, waited for, logged, stopped and
removed; images inspected, listed, loaded, tagged, saved and removed. JSON in
and out through http.client, the engine's errors as DockerAPIError (its HTTP
status and message), a container's multiplexed output split by stream.

Why not docker-py: on every ``hermetic run`` it cost ~0.1 s to import
(requests, urllib3, charset_normalizer: a third of the run's overhead
target over ``docker run``) and ~0.03 s more per container in its request
building; measured, a container run from Python took +0.19 s over the docker
CLI through docker-py and +0.07 s through http.client (docs/benchmarks.md).
The Engine API is versioned and stable, and what hermetic needs of it is
small. docker-py stays the tests' independent view of the engine.

``DOCKER_HOST`` as docker-py's ``from_env`` reads it: ``unix://PATH``
(default /var/run/docker.sock) or ``tcp://HOST:PORT``, with TLS when
``DOCKER_TLS_VERIFY`` or ``DOCKER_CERT_PATH`` is set (ca.pem, cert.pem,
key.pem in ``DOCKER_CERT_PATH``, default ~/.docker). ``ssh://`` is refused
with the forwarding to use instead.

The API version: the engine's own (its ``Api-Version`` header on
``GET /_ping``, asked once per process; the record names the engine's
version from the same answer's ``Server`` header), no newer than MAX_API
(an engine newer than that is asked ``GET /version`` for its minimum).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator
from urllib.parse import quote, urlencode

from hermetic.errors import EngineError

DEFAULT_HOST = "unix:///var/run/docker.sock"
MAX_API = (1, 45)  # the newest API whose calls here are checked (Docker 26); an engine's older one is taken
MIN_API = (1, 40)  # DeviceRequests (--gpus) and the Mounts, Init and PidsLimit fields: Docker 19.03
STREAMS = {1: "stdout", 2: "stderr"}


class DockerAPIError(Exception):
    """The engine answered with an error: its HTTP status and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.explanation = message


class DockerNotFound(DockerAPIError):
    """404: no such container or image."""


def _version_tuple(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return (0, 0)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("docker", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Endpoint:
    """Where the engine listens: a unix socket path, or host and port with an optional TLS context."""

    url: str  # as DOCKER_HOST says it (for messages)
    unix_path: str | None = None
    host: str | None = None
    port: int | None = None
    tls: Any = None  # an ssl.SSLContext (ssl is imported only for a TLS endpoint)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Endpoint":
        env = os.environ if environ is None else environ
        url = env.get("DOCKER_HOST") or DEFAULT_HOST
        if url.startswith("unix://"):
            return cls(url, unix_path=url[len("unix://"):] or "/var/run/docker.sock")
        if url.startswith("/"):
            return cls(url, unix_path=url)
        if url.startswith(("tcp://", "http://", "https://")):
            rest = url.split("://", 1)[1].rstrip("/")
            host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
            cert_path = env.get("DOCKER_CERT_PATH") or ""
            verify = env.get("DOCKER_TLS_VERIFY") or ""
            tls = None
            if verify or cert_path or url.startswith("https://"):
                tls = _tls_context(cert_path or os.path.join(os.path.expanduser("~"), ".docker"), bool(verify))
            try:
                number = int(port) if port else (2376 if tls else 2375)
            except ValueError:
                raise EngineError(f"DOCKER_HOST={url}: the port is not a number") from None
            return cls(url, host=host.strip("[]") or "localhost", port=number, tls=tls)
        if url.startswith("ssh://"):
            raise EngineError(f"DOCKER_HOST={url}: hermetic does not talk to the engine over ssh",
                              hint="forward its socket and point DOCKER_HOST at the copy: ssh -nNT -L "
                                   "/tmp/docker.sock:/var/run/docker.sock HOST, then DOCKER_HOST=unix:///tmp/docker.sock")
        raise EngineError(f"DOCKER_HOST={url}: not unix://PATH or tcp://HOST:PORT")

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.unix_path is not None:
            return _UnixConnection(self.unix_path, timeout)
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host or "localhost", self.port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection(self.host or "localhost", self.port, timeout=timeout)


def _tls_context(cert_path: str, verify: bool) -> Any:
    import ssl

    ctx = ssl.create_default_context(cafile=os.path.join(cert_path, "ca.pem") if verify else None)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert, key = os.path.join(cert_path, "cert.pem"), os.path.join(cert_path, "key.pem")
    if os.path.isfile(cert) and os.path.isfile(key):
        ctx.load_cert_chain(cert, key)
    return ctx


class DockerAPI:
    """A client of one engine: requests and their JSON, over kept-alive connections (one per request in
    flight, so that a watch thread can stop a container while the main thread reads its output)."""

    def __init__(self, endpoint: Endpoint, *, timeout: float | None = 600) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._version_doc: dict[str, Any] | None = None
        self._ping: dict[str, str] | None = None
        self._prefix: str | None = None

    @classmethod
    def from_env(cls, *, timeout: float | None = 600) -> "DockerAPI":
        return cls(Endpoint.from_env(), timeout=timeout)

    # -- the transport ------------------------------------------------------------------------------------

    def _take(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.endpoint.connection(self.timeout)

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _url(self, path: str, params: dict[str, Any] | None, versioned: bool = True) -> str:
        query = ""
        if params:
            pairs = {k: (json.dumps(v) if isinstance(v, (dict, list)) else
                         ("1" if v is True else "0" if v is False else str(v)))
                     for k, v in params.items() if v is not None}
            query = "?" + urlencode(pairs)
        return (self.prefix() if versioned else "") + path + query

    def _send(self, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
              timeout: float | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """The request sent and its response's head read; a kept-alive connection the engine closed is
        opened again once (only when nothing of the request could have been acted on)."""
        while True:
            conn = self._take()
            reused = conn.sock is not None
            if timeout is not None:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            try:
                conn.request(method, url, body=body, headers=headers or {})
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                if not reused or not isinstance(body, (bytes, type(None))):
                    raise  # a fresh connection failed, or a streamed body is gone: nothing to send again
            except BaseException:
                conn.close()
                raise

    def _done(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close or not resp.isclosed():
            conn.close()
        else:
            conn.timeout = self.timeout
            if conn.sock is not None:
                conn.sock.settimeout(self.timeout)
            self._give_back(conn)

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None,
                timeout: float | None = None, versioned: bool = True) -> bytes:
        """The whole answer's body; DockerAPIError (DockerNotFound for 404) when the engine says no."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        return self._exchange(method, self._url(path, params, versioned), data, headers, timeout)[1]

    def _exchange(self, method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
                  timeout: float | None = None) -> tuple[http.client.HTTPResponse, bytes]:
        """One request and its whole answer (the connection kept for the next); an error status raised."""
        conn, resp = self._send(method, url, data, headers, timeout)
        try:
            payload = resp.read()
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)
        if resp.status >= 400:
            raise _error(resp.status, payload)
        return resp, payload

    def json(self, method: str, path: str, **kw: Any) -> Any:
        payload = self.request(method, path, **kw)
        return json.loads(payload) if payload.strip() else None

    def stream(self, method: str, path: str, *, params: dict[str, Any] | None = None,
               chunks: Iterable[bytes] | None = None, content_type: str = "application/x-tar") -> Iterator[bytes]:
        """The answer's body as it arrives (a request body of ``chunks`` is sent chunked)."""
        headers = {"Content-Type": content_type} if chunks is not None else {}
        conn, resp = self._send(method, self._url(path, params), chunks, headers)
        try:
            if resp.status >= 400:
                raise _error(resp.status, resp.read())
            while True:
                piece = resp.read1(1 << 16) if hasattr(resp, "read1") else resp.read(1 << 16)
                if not piece:
                    break
                yield piece
        finally:
            conn.close()

    def prefix(self) -> str:
        """``/vMAJOR.MINOR``: the engine's API version (its ping says it), capped at MAX_API."""
        if self._prefix is None:
            said = self.ping().get("api-version")
            chosen = _version_tuple(said) if said else (0, 0)
            if not said or chosen > MAX_API:  # no header (not Docker?), or newer than we know: its whole answer
                doc = self.version()
                chosen = min(_version_tuple(doc.get("ApiVersion", "1.40")), MAX_API)
                chosen = max(chosen, _version_tuple(doc.get("MinAPIVersion", "1.12")))
            if chosen < MIN_API:
                raise EngineError(f"the Docker Engine at {self.endpoint.url} speaks API {chosen[0]}.{chosen[1]} "
                                  f"(Docker {self.engine_version()}); hermetic needs API "
                                  f"{MIN_API[0]}.{MIN_API[1]} (Docker 19.03) or newer")
            self._prefix = f"/v{chosen[0]}.{chosen[1]}"
        return self._prefix

    # -- the engine -----------------------------------------------------------------------------------------

    def ping(self) -> dict[str, str]:
        """``GET /_ping``'s headers, lower-cased (asked once): the engine answers, and says its API version."""
        if self._ping is None:
            resp, _ = self._exchange("GET", "/_ping")
            self._ping = {k.lower(): v for k, v in resp.getheaders()}
        return self._ping

    def version(self) -> dict[str, Any]:
        """``GET /version`` (asked once)."""
        if self._version_doc is None:
            self._version_doc = json.loads(self.request("GET", "/version", versioned=False))
        return self._version_doc

    def engine_version(self) -> str:
        """The engine's release ("20.10.24"): from its ping's ``Server: Docker/20.10.24 (linux)``, else asked."""
        server = self.ping().get("server", "")
        if server.startswith("Docker/"):
            return server[len("Docker/"):].split()[0]
        return str(self.version().get("Version", "?"))

    def info(self) -> dict[str, Any]:
        return self.json("GET", "/info")

    # -- containers -----------------------------------------------------------------------------------------

    def create_container(self, config: dict[str, Any], name: str | None = None) -> "Container":
        created = self.json("POST", "/containers/create", params={"name": name}, body=config)
        return Container(self, created["Id"])

    def container(self, container_id: str) -> "Container":
        """The container by ID or name, inspected (DockerNotFound when there is none)."""
        c = Container(self, container_id)
        c.reload()
        return c

    def containers(self, *, all: bool = True, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.json("GET", "/containers/json", params={"all": all, "filters": filters}) or []

    # -- images -----------------------------------------------------------------------------------------------

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return self.json("GET", f"/images/{quote(ref, safe='/:@')}/json")

    def has_image(self, ref: str) -> bool:
        try:
            self.request("GET", f"/images/{quote(ref, safe='/:@')}/json")
            return True
        except DockerNotFound:
            return False

    def images(self, *, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.json("GET", "/images/json", params={"filters": filters}) or []

    def load_image(self, chunks: Iterable[bytes]) -> None:
        """``POST /images/load`` of a docker-archive stream; an error the engine reports in its progress
        stream (with status 200) is raised as DockerAPIError."""
        buf = b""
        for piece in self.stream("POST", "/images/load", params={"quiet": True}, chunks=chunks):
            buf += piece
            *lines, buf = buf.split(b"\n")
            for line in lines:
                _raise_stream_error(line)
        _raise_stream_error(buf)

    def tag_image(self, image: str, repo: str, tag: str) -> None:
        self.request("POST", f"/images/{quote(image, safe='/:@')}/tag", params={"repo": repo, "tag": tag})

    def save_image(self, image: str) -> Iterator[bytes]:
        """``docker save`` of one image: the docker-archive tar, as it arrives."""
        return self.stream("GET", f"/images/{quote(image, safe='/:@')}/get")

    def remove_image(self, image: str, *, noprune: bool = False) -> None:
        self.request("DELETE", f"/images/{quote(image, safe='/:@')}", params={"noprune": noprune})


def _error(status: int, payload: bytes) -> DockerAPIError:
    try:
        message = str(json.loads(payload).get("message", ""))
    except (ValueError, AttributeError):
        message = payload.decode("utf-8", "replace").strip()
    cls = DockerNotFound if status == 404 else DockerAPIError
    return cls(status, message or http.client.responses.get(status, "error"))


def _raise_stream_error(line: bytes) -> None:
    if not line.strip():
        return
    try:
        doc = json.loads(line)
    except ValueError:
        return
    if isinstance(doc, dict) and doc.get("error"):
        raise DockerAPIError(500, str(doc.get("error")))


class Container:
    """One container of the engine by ID: what hermetic does with it (the names docker-py gives them)."""

    def __init__(self, api: DockerAPI, container_id: str) -> None:
        self.api = api
        self.id = container_id
        self.attrs: dict[str, Any] = {}

    def reload(self) -> None:
        self.attrs = self.api.json("GET", f"/containers/{self.id}/json")

    def start(self) -> None:
        self.api.request("POST", f"/containers/{self.id}/start")

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """{"StatusCode": ...} once the container has stopped; TimeoutError after ``timeout`` seconds."""
        try:
            return self.api.json("POST", f"/containers/{self.id}/wait", timeout=timeout) or {}
        except socket.timeout:
            raise TimeoutError(f"container {self.id[:12]} still running after {timeout} s") from None

    def stop(self, timeout: int = 10) -> None:
        self.api.request("POST", f"/containers/{self.id}/stop", params={"t": timeout},
                         timeout=None if self.api.timeout is None else self.api.timeout + timeout)

    def kill(self) -> None:
        self.api.request("POST", f"/containers/{self.id}/kill")

    def remove(self, force: bool = False) -> None:
        self.api.request("DELETE", f"/containers/{self.id}", params={"force": force})

    def logs(self, *, stdout: bool = True, stderr: bool = True, stream: bool = False,
             follow: bool = False) -> bytes | Iterator[bytes]:
        """The container's output from the engine's log (stdout and/or stderr, in order): all of it, or
        as it comes (``stream``)."""
        payloads = (data for _, data in self.frames(stdout=stdout, stderr=stderr, follow=follow))
        return payloads if stream else b"".join(payloads)

    def frames(self, *, stdout: bool = True, stderr: bool = True, follow: bool = False,
               tail: int | None = None) -> Iterator[tuple[str, bytes]]:
        """The engine's log of the container as (``stdout`` | ``stderr``, bytes) frames, in order; ``tail``: its
        last so many lines only (the engine reads them from the end of its file)."""
        return demux(self.api.stream("GET", f"/containers/{self.id}/logs",
                                     params={"stdout": stdout, "stderr": stderr, "follow": follow, "tail": tail}))

    def attach(self, *, logs: bool = True) -> "AttachStream":
        """The container's stdout and stderr from now on (and, with ``logs``, what it printed before):
        attach before start, and nothing it prints is missed."""
        return AttachStream.open(self.api, self.id, logs)


class AttachStream:
    """``POST /containers/{id}/attach``: the connection the engine hijacks, read as (stream, bytes) frames."""

    def __init__(self, sock: socket.socket, first: bytes) -> None:
        self._sock = sock
        self._first = first

    @classmethod
    def open(cls, api: DockerAPI, container_id: str, logs: bool) -> "AttachStream":
        conn = api.endpoint.connection(api.timeout)
        conn.connect()
        sock = conn.sock
        url = api._url(f"/containers/{container_id}/attach", {"stream": True, "stdout": True, "stderr": True,
                                                              "logs": logs})
        sock.sendall(f"POST {url} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\nConnection: Upgrade\r\n"
                     "Upgrade: tcp\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            piece = sock.recv(65536)
            if not piece:
                break
            head += piece
            if len(head) > 1 << 20:
                break
        status_line, _, rest = head.partition(b"\r\n")
        parts = status_line.split()
        headers, _, body = rest.partition(b"\r\n\r\n")
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status not in (101, 200):
            sock.close()
            raise _error(status or 500, body)
        return cls(sock, body)

    def _chunks(self) -> Iterator[bytes]:
        if self._first:
            yield self._first
        while True:
            try:
                piece = self._sock.recv(1 << 16)
            except (ConnectionResetError, OSError):
                return
            if not piece:
                return
            yield piece

    def __iter__(self) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(stdout bytes, stderr bytes), one of them None, as docker-py's ``demux=True`` gives them."""
        try:
            for kind, data in demux(self._chunks()):
                yield (data, None) if kind != "stderr" else (None, data)
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


_HEADER = struct.Struct(">BxxxL")


def demux(chunks: Iterable[bytes]) -> Iterator[tuple[str, bytes]]:
    """The engine's multiplexed stream (a container without a TTY: an 8-byte header per frame, its stream
    and length) as (``stdout`` | ``stderr``, bytes) frames."""
    buf = bytearray()
    for piece in chunks:
        buf += piece
        at = 0
        while len(buf) - at >= _HEADER.size:
            kind, size = _HEADER.unpack_from(buf, at)
            end = at + _HEADER.size + size
            if len(buf) < end:
                break
            yield STREAMS.get(kind, "stdout"), bytes(buf[at + _HEADER.size:end])
            at = end
        del buf[:at]

