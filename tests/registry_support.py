"""Real registry parts for the registry tests and bench, all on 127.0.0.1.

- ``start_registry``: Debian's docker-registry (Distribution 2.8) on a free
  port with a temp config and storage; optionally htpasswd (bcrypt) Basic
  auth, or Bearer token auth backed by ``TokenServer``.
- ``TokenServer``: a small token service of the Docker token spec: checks
  Basic credentials and issues RS256 JWTs signed with a throwaway cert
  (openssl) that the registry trusts through ``rootcertbundle``.
- ``FaultProxy``: a reverse proxy in front of a registry that can flip a byte
  of one blob it serves or throttle request bodies (to kill a push midway).
- ``make_image``: tiny runnable images (busybox-static in a normalized,
  uncompressed tar layer) written into an OciStore by hand.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hermetic.store.oci import MT_CONFIG, MT_LAYER, MT_MANIFEST, Descriptor, OciStore

REGISTRY_BIN = "/usr/bin/docker-registry"
BUSYBOX = Path("/bin/busybox")


def have_registry_tools() -> str | None:
    """None when the registry tests can run; else what is missing."""
    for tool in (REGISTRY_BIN, "/usr/bin/htpasswd", "/usr/bin/skopeo", "/usr/bin/openssl"):
        if not Path(tool).exists():
            return f"{tool} is not installed (run scripts/ensure-test-deps)"
    if not BUSYBOX.exists():
        return "/bin/busybox is not installed (busybox-static)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_system_registry() -> None:
    """The docker-registry package may start a system service on :5000; the tests use their own."""
    systemctl = shutil.which("systemctl")
    if systemctl and subprocess.run([systemctl, "is-active", "--quiet", "docker-registry"],
                                    check=False, capture_output=True).returncode == 0:
        subprocess.run([systemctl, "stop", "docker-registry"], check=False, capture_output=True)


# -- the registry --------------------------------------------------------------

@dataclass
class RegistryServer:
    host: str  # "127.0.0.1:PORT"
    root: Path  # storage rootdirectory
    proc: subprocess.Popen
    log: Path
    username: str | None = None
    password: str | None = None
    token_server: "TokenServer | None" = None

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def blob_data_path(self, digest: str) -> Path:
        hexpart = digest.split(":", 1)[1]
        return self.root / "docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"

    def skopeo_creds(self) -> list[str]:
        return ["--creds", f"{self.username}:{self.password}"] if self.username else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.token_server:
            self.token_server.stop()


def start_registry(workdir: Path, *, auth: str | None = None, username: str = "hermetic",
                   password: str = "s3cret-pw") -> RegistryServer:
    """Start docker-registry on a free 127.0.0.1 port; ``auth`` is None, "htpasswd" or "token"."""
    stop_system_registry()
    workdir.mkdir(parents=True, exist_ok=True)
    storage = workdir / "storage"
    storage.mkdir(exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": f"127.0.0.1:{port}", "secret": "hermetic-test-secret"},
    }
    token_server = None
    if auth == "htpasswd":
        htpasswd = workdir / "htpasswd"
        out = subprocess.run(["htpasswd", "-Bbn", username, password], check=True, capture_output=True)
        htpasswd.write_bytes(out.stdout)
        config["auth"] = {"htpasswd": {"realm": "hermetic-test", "path": str(htpasswd)}}
    elif auth == "token":
        token_server = TokenServer(workdir / "token", {username: password}, {f"refresh-{password}": username})
        config["auth"] = {"token": {
            "realm": token_server.realm, "service": token_server.service,
            "issuer": token_server.issuer, "rootcertbundle": str(token_server.cert_path),
        }}
    elif auth is not None:
        raise ValueError(auth)
    cfg_path = workdir / "config.yml"
    cfg_path.write_text(json.dumps(config))  # JSON is YAML
    log = workdir / "registry.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([REGISTRY_BIN, "serve", str(cfg_path)], stdout=logf, stderr=subprocess.STDOUT)
    server = RegistryServer(f"127.0.0.1:{port}", storage, proc, log,
                            username if auth else None, password if auth else None, token_server)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v2/")
            status = conn.getresponse().status
            conn.close()
            if status in (200, 401):
                return server
        except OSError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"docker-registry did not come up on {server.host}: {log.read_text()[-2000:]}")


# -- a token service (Docker token auth spec) --------------------------------------

def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class TokenServer:
    """Issues registry JWTs for valid Basic credentials (GET) or a known refresh token
    (POST grant_type=refresh_token, what `docker login` stores as identitytoken); 401 otherwise."""

    issuer = "hermetic-test-issuer"
    service = "hermetic-test-registry"

    def __init__(self, workdir: Path, users: dict[str, str], refresh_tokens: dict[str, str] | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.key_path = workdir / "key.pem"
        self.cert_path = workdir / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key_path),
                        "-out", str(self.cert_path), "-days", "2", "-subj", "/CN=hermetic-test-token"],
                       check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert_path), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self._x5c = base64.b64encode(der).decode("ascii")
        self.users = users
        self.refresh_tokens = refresh_tokens or {}  # token -> user
        self.requests: list[dict[str, Any]] = []  # what was asked (scopes, user), for assertions
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                q = parse_qs(urlsplit(self.path).query)
                user = server._check_basic(self.headers.get("Authorization", ""))
                server.requests.append({"user": user, "scope": q.get("scope", []), "service": q.get("service")})
                if user is None:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": server._issue(user, q.get("scope", [])), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                user = None
                if form.get("grant_type") == ["refresh_token"]:
                    user = server.refresh_tokens.get((form.get("refresh_token") or [""])[0])
                scopes = " ".join(form.get("scope", [])).split()
                server.requests.append({"user": user, "scope": scopes, "service": form.get("service"),
                                        "grant": "refresh_token"})
                if user is None:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"access_token": server._issue(user, scopes), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.realm = f"http://127.0.0.1:{self._httpd.server_address[1]}/token"

    def _check_basic(self, header: str) -> str | None:
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except Exception:
            return None
        return user if self.users.get(user) == password else None

    def _issue(self, user: str, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            for one in scope.split(" "):
                kind, _, rest = one.partition(":")
                name, _, actions = rest.rpartition(":")
                if kind == "repository" and name:
                    access.append({"type": "repository", "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key_path)],
                             input=signing_input.encode(), check=True, capture_output=True).stdout
        return signing_input + "." + _b64url(sig)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# -- a fault-injecting proxy -------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade"}


class _SmallBufferServer(ThreadingHTTPServer):
    # A small receive buffer, so that a throttled client cannot park megabytes
    # in the kernel that would still reach the registry after it was killed.
    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        super().server_bind()


@dataclass
class FaultProxy:
    """Reverse proxy on 127.0.0.1 in front of ``upstream`` ("127.0.0.1:PORT").

    ``tamper_digest``: flip the first byte of that blob whenever it is served.
    ``throttle_bps``: pace every request body at this many bytes per second.
    ``break_once_digest``: the first time that blob is served, send half of
    it and drop the connection (a flaky network).
    All can be changed while it runs. The Host header passes through, so the
    registry's Location headers point back at the proxy.
    """

    upstream: str
    tamper_digest: str | None = None
    throttle_bps: int | None = None
    break_once_digest: str | None = None
    bytes_in: int = 0  # request body bytes seen (what clients sent)
    _httpd: ThreadingHTTPServer | None = field(default=None, repr=False)

    def start(self) -> "FaultProxy":
        proxy = self
        up_host, up_port = self.upstream.rsplit(":", 1)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                conn = http.client.HTTPConnection(up_host, int(up_port), timeout=120)
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP_BY_HOP:
                        conn.putheader(k, v)
                conn.endheaders()
                left = length
                while left > 0:
                    chunk = self.rfile.read(min(left, 64 << 10))
                    if not chunk:
                        break
                    left -= len(chunk)
                    proxy.bytes_in += len(chunk)
                    conn.send(chunk)
                    if proxy.throttle_bps:
                        time.sleep(len(chunk) / proxy.throttle_bps)
                if left > 0:  # the client went away mid-body: drop the upstream request too
                    conn.close()
                    self.close_connection = True
                    return
                resp = conn.getresponse()
                body = resp.read() if self.command != "HEAD" else b""
                tamper = proxy.tamper_digest
                if (tamper and self.command == "GET" and resp.status == 200 and body
                        and self.path.split("?")[0].endswith(f"/blobs/{tamper}")):
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                if self.command == "HEAD":
                    self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                else:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if (proxy.break_once_digest and self.command == "GET" and resp.status == 200
                        and self.path.split("?")[0].endswith(f"/blobs/{proxy.break_once_digest}")):
                    proxy.break_once_digest = None
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    conn.close()
                    return
                if body:
                    self.wfile.write(body)
                conn.close()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._httpd = _SmallBufferServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    @property
    def host(self) -> str:
        assert self._httpd is not None
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()


# -- test images ------------------------------------------------------------------

def normalized_tar(files: dict[str, bytes], *, executable: set[str] = frozenset()) -> bytes:  # type: ignore[assignment]
    """A reproducible tar: sorted paths, explicit parent dirs, mtime 0, root-owned, no PAX."""
    dirs: set[str] = set()
    for path in files:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    entries = sorted([(d + "/", None) for d in dirs] + [(p, data) for p, data in files.items()],
                     key=lambda e: e[0].encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o755 if name in executable else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def busybox_layer() -> bytes:
    return normalized_tar({"bin/busybox": BUSYBOX.read_bytes()}, executable={"bin/busybox"})


def make_image(store: OciStore, layers: list[bytes], *, cmd: list[str] | None = None,
               ref: str | None = None, label: str = "") -> str:
    """An OCI image (uncompressed layers, canonical JSON) in ``store``; returns the manifest digest."""
    store.ensure()
    descs = []
    for data in layers:
        digest = store.put_bytes(data)
        descs.append(Descriptor(MT_LAYER, digest, len(data)))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": ["/bin/busybox"],
            "Cmd": cmd or ["echo", "hello from hermetic"],
            "Env": ["PATH=/bin"],
            "Labels": {"org.hermetic.test": label} if label else {},
        },
        "rootfs": {"type": "layers", "diff_ids": [d.digest for d in descs]},
    }
    config_digest, config_size, _ = store.put_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": Descriptor(MT_CONFIG, config_digest, config_size).to_json(),
        "layers": [d.to_json() for d in descs],
    }
    digest, size, _ = store.put_json(manifest)
    if ref:
        store.set_ref(ref, Descriptor(MT_MANIFEST, digest, size))
    return digest


def random_layer(size: int, seed: int) -> bytes:
    """A tar holding one file of ``size`` incompressible bytes, the same for the same ``seed``."""
    import random

    return normalized_tar({f"data/random-{seed}.bin": random.Random(seed).randbytes(size)})


# -- a scripted registry, for what a real one never does -------------------------------

@dataclass
class Reply:
    """One scripted answer: status, body, headers (Content-Length is added unless given)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class FakeRegistry:
    """A stand-in registry on 127.0.0.1 that answers what a test scripts, including what no real
    registry does: malformed digests, control characters in an error body, a stall, a trickle.

    ``routes`` maps ``(method, path)`` (the path without its query) to a Reply, or to a callable
    ``(handler) -> None`` that answers itself (``handler.wfile`` is the socket; ``self.stopping`` is set
    on stop, so a stalled handler can end). ``GET /v2/`` answers 200 unless routed; anything else
    answers 404 with a Distribution error. ``requests`` records ``(method, path)`` of each request.
    Use as a context manager.
    """

    def __init__(self, routes: dict[tuple[str, str], Any] | None = None, *, tls: tuple[Path, Path] | None = None):
        """``tls``: (cert, key) PEM files: serve HTTPS (``self_signed_cert`` makes a pair for 127.0.0.1)."""
        self.routes: dict[tuple[str, str], Any] = dict(routes or {})
        self.requests: list[tuple[str, str]] = []
        self.stopping = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                path = urlsplit(self.path).path
                fake.requests.append((self.command, path))
                length = int(self.headers.get("Content-Length") or 0)
                route = fake.routes.get((self.command, path))
                if callable(route):
                    route(self)
                    return
                if length:
                    self.rfile.read(length)
                if route is None:
                    route = Reply(200, b"{}") if path == "/v2/" else Reply(
                        404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}',
                        {"Content-Type": "application/json"})
                self.send_response(route.status)
                for k, v in route.headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in route.headers:  # a HEAD may say the blob's size
                    self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(route.body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        if tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"

    def serve_image(self, repository: str, layers: list[bytes], *, config: bytes | None = None,
                    manifest: dict[str, Any] | None = None) -> str:
        """Route a small image (GET and HEAD of its manifest and blobs); returns the manifest digest.
        ``manifest`` replaces the one made from the blobs (to serve a malformed one)."""
        config = config if config is not None else json.dumps(
            {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        blobs = [config] + layers
        for data in blobs:
            self.serve_blob(repository, data)
        doc = manifest or {
            "schemaVersion": 2, "mediaType": MT_MANIFEST,
            "config": {"mediaType": MT_CONFIG, "digest": _sha256(config), "size": len(config)},
            "layers": [{"mediaType": MT_LAYER, "digest": _sha256(x), "size": len(x)} for x in layers],
        }
        return self.serve_manifest(repository, json.dumps(doc).encode())

    def serve_manifest(self, repository: str, body: bytes, media_type: str = MT_MANIFEST) -> str:
        digest = _sha256(body)
        reply = Reply(200, body, {"Content-Type": media_type, "Docker-Content-Digest": digest})
        for method in ("GET", "HEAD"):
            self.routes[(method, f"/v2/{repository}/manifests/{digest}")] = reply
        return digest

    def serve_blob(self, repository: str, data: bytes) -> str:
        digest = _sha256(data)
        for method in ("GET", "HEAD"):
            self.routes[(method, f"/v2/{repository}/blobs/{digest}")] = Reply(
                200, data, {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest})
        return digest

    def stall(self, handler: BaseHTTPRequestHandler) -> None:
        """A route that accepts the request and never answers (until the fake stops)."""
        self.stopping.wait(120)

    def trickle(self, size: int, every_s: float = 0.2) -> Any:
        """A route that answers 200 with ``size`` bytes, one byte every ``every_s`` seconds."""
        def route(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(size))
            handler.end_headers()
            try:
                for _ in range(size):
                    if self.stopping.wait(every_s):
                        return
                    handler.wfile.write(b"x")
                    handler.wfile.flush()
            except OSError:
                pass  # the client gave up: what the test wants
        return route

    def trickle_headers(self, every_s: float = 0.2, for_s: float = 60) -> Any:
        """A route that starts an answer and then sends one byte of a header every ``every_s`` seconds
        for ``for_s`` seconds (then ends the headers): only a wall-clock deadline ends it sooner, as each
        read gets a byte well within any read timeout."""
        def route(handler: BaseHTTPRequestHandler) -> None:
            ends = time.monotonic() + for_s
            try:
                handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not self.stopping.wait(every_s) and time.monotonic() < ends:
                    handler.wfile.write(b"a")
                    handler.wfile.flush()
                handler.wfile.write(b"\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
        return route

    def __enter__(self) -> "FakeRegistry":
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def self_signed_cert(workdir: Path) -> tuple[Path, Path]:
    """(cert, key) for https://127.0.0.1 (openssl); trust it with REQUESTS_CA_BUNDLE=cert."""
    workdir.mkdir(parents=True, exist_ok=True)
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def _sha256(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def registry_env(tmp_path: Path) -> dict[str, str]:
    """A new process's environment for registry tests: its own cache, no credentials, no proxy, the default
    deadlines."""
    from hermetic.registry.deadlines import REQUEST_TIMEOUT_ENV, TOTAL_TIMEOUT_ENV

    docker_config = tmp_path / "docker-config"
    docker_config.mkdir(exist_ok=True)
    out = {k: v for k, v in os.environ.items()
           if k not in (TOTAL_TIMEOUT_ENV, REQUEST_TIMEOUT_ENV, "HERMETIC_REGISTRY_USER", "HERMETIC_REGISTRY_PASSWORD")
           and "proxy" not in k.lower()}
    return {**out, "HERMETIC_CACHE": str(tmp_path / "cache"), "DOCKER_CONFIG": str(docker_config)}
