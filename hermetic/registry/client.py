"""One registry over the OCI Distribution API: blobs, uploads, manifests.

This module speaks HTTP and nothing else: which blobs to send, in which
order, and what to verify are push.py's and pull.py's business. It owns
authentication (a ping of /v2/ learns the challenge before any body is sent,
so a 200 MB layer is never streamed just to be answered 401), retries of
idempotent requests, the deadlines, and the byte counters the benchmarks print.

Deadlines (docs/registry.md, "Deadlines"): a client's whole transfer (one
push or pull) must end within ``Timeouts.total`` (HERMETIC_REGISTRY_TIMEOUT,
``--timeout``), and one request other than a blob's bytes (a manifest, a HEAD,
a token, an upload session) within ``Timeouts.request``
(HERMETIC_REGISTRY_REQUEST_TIMEOUT), which is also the longest a blob transfer
may go without a byte. A per-read socket timeout alone does not bound a
request (a server that trickles a byte at a time resets it on every read), so
each request has a watchdog that shuts its socket down when its deadline
passes; the blocked read or write returns at once, and the request ends in
RegistryTimeout (exit 75) naming the blob or manifest.

What the registry says is data, never trusted: a digest it names is checked
(``sha256:<64 hex>``) before it becomes a URL or a path, an answer is read up
to a size limit, and text from it (error bodies, headers) has its control
characters escaped before it goes into a message (hermetic/display.py).

Plain HTTP is used for loopback registries (127.0.0.0/8, ::1, localhost:
the Docker Engine treats them as insecure by default too) and for hosts
listed in HERMETIC_INSECURE_REGISTRIES (comma-separated); HTTPS otherwise.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import IO, Any, Callable, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError
from urllib3.poolmanager import ProxyManager

from hermetic import __version__
from hermetic.display import escape_controls
from hermetic.errors import EXIT_NOINPUT, EXIT_UNAVAILABLE, IntegrityError, ProtocolError, TempFail, UsageError
from hermetic.reference import check_digest, is_digest, is_tag, show_value
from hermetic.registry.auth import AuthError, Challenge, Credentials, find_credentials, parse_challenge, scope_for
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES

INSECURE_ENV = "HERMETIC_INSECURE_REGISTRIES"
TOTAL_TIMEOUT_ENV = "HERMETIC_REGISTRY_TIMEOUT"
REQUEST_TIMEOUT_ENV = "HERMETIC_REGISTRY_REQUEST_TIMEOUT"
DEFAULT_TOTAL_TIMEOUT_S = 3600.0  # one push or pull: a few GB over a slow link
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # one manifest/HEAD/token request; the longest pause of a blob transfer
CONNECT_TIMEOUT_S = 15.0
MAX_TIMEOUT_S = 30 * 86400.0  # a longer limit is a typo (and overflows the timers)
# Every manifest type we can read; the registry picks the one it holds.
MANIFEST_ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
# Distribution refuses manifests over 4 MiB, containerd will not read them: a bigger answer is not a document.
MAX_DOCUMENT_BYTES = 4 << 20
MAX_ERROR_BODY_BYTES = 64 << 10  # of an error answer, only the start is read (for its code and message)
MAX_SHOWN = 200  # characters of registry text in one message
# Attempts of a request: one that could not connect (any method) or broke off (GET/HEAD), and of a GET/HEAD
# answered 429/502/503/504 (what urllib3's Retry(connect=2, read=2, status=3) did).
ATTEMPTS = 3
STATUS_ATTEMPTS = 4
RETRY_STATUSES = (429, 502, 503, 504)
MAX_RETRY_WAIT_S = 10.0  # a Retry-After longer than this is not waited for
USER_AGENT = f"hermetic/{__version__}"

ProgressFn = Callable[[int], None]


class RegistryError(ProtocolError):
    """The registry answered something we cannot use (one line, names host and request);
    one that cannot be reached at all is EXIT_UNAVAILABLE."""
    code: str = ""  # the Distribution error code (e.g. DIGEST_INVALID), when the registry sent one


class RegistryTimeout(TempFail):
    """A deadline passed (exit 75): the registry is stalled or too slow; trying again later may work."""


@dataclass(frozen=True)
class Timeouts:
    """``total``: seconds for everything one client does (a push or a pull); ``request``: for one request
    other than a blob's bytes, and the longest a blob transfer may go without a byte moving."""

    total: float = DEFAULT_TOTAL_TIMEOUT_S
    request: float = DEFAULT_REQUEST_TIMEOUT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, total: float | None = None) -> "Timeouts":
        env = os.environ if env is None else env
        return cls(total=total if total is not None else _seconds(env, TOTAL_TIMEOUT_ENV, DEFAULT_TOTAL_TIMEOUT_S),
                   request=_seconds(env, REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT_S))


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise UsageError(f"{name}={show_value(raw)}: not a number of seconds above 0 (at most {MAX_TIMEOUT_S:g})",
                         hint=f"e.g. {name}={default:g}, or unset it for the default")
    return value


@dataclass
class TransferStats:
    """What crossed the wire; thread-safe counters for parallel transfers."""

    bytes_sent: int = 0
    bytes_received: int = 0
    blobs_uploaded: int = 0
    blobs_mounted: int = 0
    blobs_skipped: int = 0
    blobs_downloaded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in (
            "bytes_sent", "bytes_received", "blobs_uploaded", "blobs_mounted", "blobs_skipped", "blobs_downloaded")}


def is_loopback_host(host: str) -> bool:
    name = host
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_scheme(host: str) -> str:
    insecure = {h.strip() for h in os.environ.get(INSECURE_ENV, "").split(",") if h.strip()}
    return "http" if is_loopback_host(host) or host in insecure else "https"


# -- the watchdog ---------------------------------------------------------------------

_current = threading.local()  # .watch: the _Watch of the request this thread is making


class _Watch:
    """One request's wall-clock deadline: when it passes, the socket the request uses is shut down, so no
    read or write on it blocks any longer (the thread then sees a connection error and ``fired``)."""

    def __init__(self, ends_at: float):
        self.fired = False
        self._lock = threading.Lock()
        self._done = False
        self._conn: HTTPConnection | None = None
        self._timer = threading.Timer(max(0.0, ends_at - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, conn: HTTPConnection) -> None:
        """The connection the request is about to use (every hop of a redirect attaches its own)."""
        with self._lock:
            self._conn = conn
            if self.fired:
                _shut(conn)

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            if self._conn is not None:
                _shut(self._conn)

    def close(self) -> None:
        with self._lock:
            self._done = True
            self._conn = None
        self._timer.cancel()


def _shut(conn: HTTPConnection) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return  # still connecting: the connect timeout bounds that
    try:
        # The plain socket's shutdown, also under TLS: it wakes a blocked read without touching the TLS state.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError):
        pass


class _Watched:
    """Put before HTTPConnection or HTTPSConnection: each connect and request is under the deadline watch."""

    def connect(self) -> None:
        _attach(self)  # type: ignore[arg-type]
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)  # type: ignore[arg-type]
        super().request(*args, **kwargs)  # type: ignore[misc]


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


def _attach(conn: HTTPConnection) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter with connections a _Watch can shut down (also through an HTTP(S) proxy)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any):  # type: ignore[no-untyped-def]
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # a SOCKS manager has its own pools: the per-read timeouts still hold
            manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager


# -- bodies ---------------------------------------------------------------------------

class _CountingReader:
    """A file slice that reports each read to a callback; has a length for Content-Length."""

    def __init__(self, f: IO[bytes], length: int, on_bytes: Callable[[int], None]):
        self._f = f
        self._left = length
        self._length = length
        self._on_bytes = on_bytes

    def __len__(self) -> int:
        return self._length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        if data:
            self._on_bytes(len(data))
        return data


@dataclass(frozen=True)
class ManifestResponse:
    body: bytes
    media_type: str
    digest_header: str | None  # the registry's Docker-Content-Digest, checked to be a digest


_BLOB_OR_MANIFEST = re.compile(r"/v2/(?P<repo>.+)/(?P<kind>blobs|manifests|referrers)/(?P<ref>[^/]+)")


def _what(method: str, url: str) -> str:
    """What a request moves, for messages: ``blob sha256:… of team/x``, ``manifest v1 of team/x``."""
    parts = urlsplit(url)
    m = _BLOB_OR_MANIFEST.fullmatch(parts.path)
    if m and m["ref"] != "uploads":
        kind = {"blobs": "blob", "manifests": "manifest", "referrers": "the referrers of"}[m["kind"]]
        return escape_controls(f"{kind} {m['ref']} of {m['repo']}", MAX_SHOWN)
    digest = dict(parse_qsl(parts.query)).get("digest")
    if "/blobs/uploads/" in parts.path and digest:
        return escape_controls(f"the upload of blob {digest}", MAX_SHOWN)
    return escape_controls(parts.path, MAX_SHOWN)


class RegistryClient:
    """A session with one registry host; safe to share between upload threads."""

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None | bool = True,
        scheme: str | None = None,
        stats: TransferStats | None = None,
        session: requests.Session | None = None,
        timeouts: Timeouts | None = None,
    ):
        self.host = host
        self.scheme = scheme or default_scheme(host)
        self.base_url = f"{self.scheme}://{host}"
        # credentials=True: look them up lazily (only if the registry asks).
        self._creds_lookup = credentials is True
        self._creds: Credentials | None = None if credentials is True or credentials is False else credentials
        self.stats = stats or TransferStats()
        self.session = session or self._new_session()
        self._lock = threading.Lock()
        self._challenge: Challenge | None = None
        self._pinged = False
        self._tokens: dict[frozenset[str], str] = {}
        self.timeouts = timeouts or Timeouts.from_env()
        self.begin("transfer")

    @staticmethod
    def _new_session() -> requests.Session:
        # Retries are ours (_exchange), so that they and their waits stay inside the deadlines.
        s = requests.Session()
        adapter = _WatchedAdapter(max_retries=0, pool_connections=4, pool_maxsize=8)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        s.headers["User-Agent"] = USER_AGENT
        return s

    # -- deadlines --------------------------------------------------------
    def begin(self, operation: str, total: float | None = None) -> None:
        """Start the clock of one push or pull (``operation`` names it in messages): every request the
        client makes from now on ends by ``total`` seconds (default: ``timeouts.total``) from now."""
        total = total if total is not None else self.timeouts.total
        if not (math.isfinite(total) and 0 < total <= MAX_TIMEOUT_S):
            raise UsageError(f"a registry deadline of {total!r} s: not a number of seconds above 0 "
                             f"(at most {MAX_TIMEOUT_S:g})")
        self.operation = operation
        self._total = total
        self._ends_at = time.monotonic() + self._total

    def _timeout_error(self, what: str, which: str) -> RegistryTimeout:
        hint = (f"the registry is stalled or too slow; try again later, or allow more time "
                f"(--timeout SECONDS, {TOTAL_TIMEOUT_ENV}, {REQUEST_TIMEOUT_ENV})")
        if which == "total":
            return RegistryTimeout(f"registry {self.host}: {what}: not done when the {self._total:g} s deadline "
                                   f"of the {self.operation} ran out ({TOTAL_TIMEOUT_ENV})", hint=hint)
        if which == "stall":
            return RegistryTimeout(f"registry {self.host}: {what}: nothing received for {self.timeouts.request:g} s "
                                   f"({REQUEST_TIMEOUT_ENV})", hint=hint)
        return RegistryTimeout(f"registry {self.host}: {what}: no complete answer within "
                               f"{self.timeouts.request:g} s ({REQUEST_TIMEOUT_ENV})", hint=hint)

    def _deadline(self, bulk: bool, started: float) -> tuple[float, str]:
        """(monotonic time the request must end by, which limit that is)."""
        if bulk:
            return self._ends_at, "total"
        own = started + self.timeouts.request
        return (own, "request") if own < self._ends_at else (self._ends_at, "total")

    def check_deadline(self, what: str) -> None:
        if time.monotonic() >= self._ends_at:
            raise self._timeout_error(what, "total")

    # -- auth -------------------------------------------------------------
    @property
    def credentials(self) -> Credentials | None:
        with self._lock:  # one lookup (a credential helper run) per client, whatever the threads
            if self._creds_lookup:
                self._creds = find_credentials(self.host)
                self._creds_lookup = False
            return self._creds

    def _ping(self) -> None:
        with self._lock:
            if self._pinged:
                return
        resp = self._send("GET", self.base_url + "/v2/", headers={}, body=None, what="/v2/")
        challenge = None
        if resp.status_code == 401:
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        elif resp.status_code >= 400 and resp.status_code != 404:
            raise RegistryError(f"registry {self.host}: GET /v2/ answered {resp.status_code}; is this an OCI registry?")
        with self._lock:
            self._challenge = challenge
            self._pinged = True

    def _auth_header(self, scopes: frozenset[str]) -> str | None:
        ch = self._challenge
        if ch is None:
            return None
        if ch.scheme == "basic":
            creds = self.credentials
            if creds is None or not creds.has_basic:
                raise self._no_credentials()
            return creds.basic_header()
        if ch.scheme == "bearer":
            with self._lock:
                token = self._tokens.get(scopes)
            if token is None:
                token = self._fetch_token(ch, scopes)
                with self._lock:
                    self._tokens[scopes] = token
            return "Bearer " + token
        raise AuthError(f"registry {self.host}: unsupported auth scheme {escape_controls(repr(ch.scheme), MAX_SHOWN)}")

    def _no_credentials(self) -> AuthError:
        return AuthError(
            f"registry {self.host} requires a login and no credentials were found "
            f"(set HERMETIC_REGISTRY_USER and HERMETIC_REGISTRY_PASSWORD, or run: docker login {self.host})"
        )

    def _fetch_token(self, ch: Challenge, scopes: frozenset[str]) -> str:
        realm = ch.realm
        if not realm:
            raise AuthError(f"registry {self.host}: Bearer challenge without a realm")
        creds = self.credentials
        service = ch.params.get("service")
        scope_list = sorted(scopes)
        where = _origin(realm)
        what = f"the token from {where}"
        try:
            if creds is not None and creds.identity_token:
                # OAuth2 refresh-token grant (what `docker login` stores as identitytoken).
                form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                        "client_id": "hermetic", "scope": " ".join(scope_list)}
                if service:
                    form["service"] = service
                resp = self._exchange("POST", realm, what=what, headers={}, body=lambda: form)
            else:
                params: list[tuple[str, str]] = [("service", service)] if service else []
                params += [("scope", s) for s in scope_list]
                headers = {"Authorization": creds.basic_header()} if creds is not None and creds.has_basic else {}
                resp = self._exchange("GET", realm, what=what, headers=headers, body=None, params=params)
        except requests.RequestException as e:
            raise AuthError(f"registry {self.host}: token service {where} unreachable "
                            f"({_short_reason(e)})") from None
        if resp.status_code in (401, 403):
            who = f"user {creds.username!r} ({creds.source})" if creds and creds.username else (
                f"identity token ({creds.source})" if creds else "anonymous access")
            raise AuthError(f"registry {self.host}: authentication failed for {who} at {where} "
                            f"({resp.status_code})")
        if resp.status_code != 200:
            raise AuthError(f"registry {self.host}: token service {where} answered {resp.status_code}")
        try:
            answer = resp.json()
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise AuthError(f"registry {self.host}: token service {where} returned no token")
        if not isinstance(token, str) or not re.fullmatch(r"[\x21-\x7e]+", token):
            raise AuthError(f"registry {self.host}: token service {where} returned a token that is not "
                            "printable ASCII")
        return token

    # -- requests ---------------------------------------------------------
    def _exchange(self, method: str, url: str, *, what: str, headers: dict[str, str], body: Any,
                  bulk: bool = False, stream: bool = False, allow_redirects: bool = True,
                  params: Any = None) -> requests.Response:
        """One HTTP exchange under the deadlines, retried where that is safe; raises requests' errors
        (other than timeouts, which are RegistryTimeout). Without ``stream`` the answer is read here,
        up to MAX_DOCUMENT_BYTES (an error answer: its first MAX_ERROR_BODY_BYTES).

        ``body`` may be a factory, called once per attempt. ``bulk``: a blob's bytes, bounded by the
        whole transfer's deadline and the longest pause, not by the one-request deadline."""
        idempotent = method in ("GET", "HEAD")
        for attempt in range(1, STATUS_ATTEMPTS + 1):
            started = time.monotonic()
            ends_at, which = self._deadline(bulk, started)
            left = ends_at - started
            if left <= 0:
                raise self._timeout_error(what, which)
            watch = _Watch(ends_at)
            _current.watch = watch
            resp = None
            try:
                resp = self.session.request(
                    method, url, headers=headers, data=body() if callable(body) else body, params=params,
                    stream=True, allow_redirects=allow_redirects,
                    timeout=(min(CONNECT_TIMEOUT_S, left), min(self.timeouts.request, left)))
                if not stream:
                    _read_answer(resp, self.host, what)
                if watch.fired:  # a shut socket can also look like an answer that ended early
                    raise _DeadlinePassed()
            except _DeadlinePassed:
                watch.close()
                if resp is not None:
                    resp.close()
                raise self._timeout_error(what, which) from None
            except requests.RequestException as e:
                watch.close()
                if resp is not None:
                    resp.close()
                if watch.fired:
                    raise self._timeout_error(what, which) from None
                if _is_read_timeout(e):
                    raise self._timeout_error(what, "total" if time.monotonic() >= self._ends_at else
                                              ("stall" if bulk else which)) from None
                retry = (_failed_to_connect(e) or idempotent) and attempt < ATTEMPTS
                if not retry or not self._wait(_backoff(attempt), ends_at):
                    raise
                continue
            except BaseException:
                watch.close()
                if resp is not None:
                    resp.close()
                raise
            finally:
                _current.watch = None
            if stream:
                resp.hermetic_watch = watch  # type: ignore[attr-defined]  # closed when the body is read
            else:
                watch.close()
            if idempotent and resp.status_code in RETRY_STATUSES and attempt < STATUS_ATTEMPTS:
                wait = _retry_after(resp.headers.get("Retry-After"), _backoff(attempt))
                if wait <= MAX_RETRY_WAIT_S and self._wait(wait, ends_at):
                    _close(resp)
                    continue
            return resp
        raise AssertionError("unreachable")

    @staticmethod
    def _wait(seconds: float, ends_at: float) -> bool:
        """Sleep before a retry, if the retry can still start before ``ends_at``."""
        if time.monotonic() + seconds >= ends_at:
            return False
        time.sleep(seconds)
        return True

    def _send(self, method: str, url: str, *, headers: dict[str, str], body: Any, what: str,
              bulk: bool = False, stream: bool = False, allow_redirects: bool = True) -> requests.Response:
        try:
            return self._exchange(method, url, what=what, headers=headers, body=body, bulk=bulk, stream=stream,
                                  allow_redirects=allow_redirects)
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.host}: {method} {what} failed: {_short_reason(e)}",
                                exit_code=EXIT_UNAVAILABLE) from None

    def request(
        self,
        method: str,
        url_or_path: str,
        *,
        repository: str,
        actions: str = "pull",
        extra_scopes: tuple[str, ...] = (),
        headers: dict[str, str] | None = None,
        body: bytes | Callable[[], Any] | None = None,
        stream: bool = False,
        ok: tuple[int, ...] = (200,),
        what: str | None = None,
        bulk: bool = False,
    ) -> requests.Response:
        """One authenticated request; ``body`` may be a factory so a retry can resend it.

        Raises RegistryError/AuthError for any status outside ``ok``, RegistryTimeout when a deadline
        passes. ``stream``: the caller reads the answer (``iter_answer``). ``what`` names the blob or
        manifest for messages (default: from the path).
        """
        self._ping()
        url = url_or_path if "://" in url_or_path else self.base_url + url_or_path
        what = what or _what(method, url)
        scopes = frozenset((scope_for(repository, actions),) + extra_scopes)
        for attempt in (1, 2):
            h = dict(headers or {})
            auth = self._auth_header(scopes)
            if auth:
                h["Authorization"] = auth
            resp = self._send(method, url, headers=h, body=body, what=what, bulk=bulk, stream=stream)
            if resp.status_code != 401 or attempt == 2:
                break
            # Expired token or a challenge that changed: learn it again, retry once.
            _close(resp)
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            with self._lock:
                self._challenge = challenge
                self._tokens.pop(scopes, None)
            if challenge is None:
                break
        if resp.status_code in ok:
            return resp
        if stream:  # the error's body, for its code and message
            try:
                _read_answer(resp, self.host, what)
            except requests.RequestException:
                pass
        self._raise_for(resp, method, what, repository)
        raise AssertionError("unreachable")

    def _raise_for(self, resp: requests.Response, method: str, what: str, repository: str) -> None:
        code, message = _error_detail(resp)
        _close(resp)
        if resp.status_code == 401:
            creds = self.credentials
            if creds is None:
                raise self._no_credentials()
            who = f"user {creds.username!r}" if creds.username else "identity token"
            raise AuthError(f"registry {self.host}: {who} ({creds.source}) was refused for {repository}: "
                            f"401 {code or 'UNAUTHORIZED'}")
        if resp.status_code == 403:
            why = f"{code or 'DENIED'}: {message}" if message else (code or "DENIED")
            raise AuthError(f"registry {self.host}: access to {repository} denied (403 {why})")
        detail = f" {code}" if code else ""
        detail += f": {message}" if message else ""
        # 404 is the registry saying "no such manifest/blob/repository": a thing not found, not a protocol fault.
        err = RegistryError(f"registry {self.host}: {method} {what} answered {resp.status_code}{detail}",
                            exit_code=EXIT_NOINPUT if resp.status_code == 404 else None)
        err.code = code
        raise err

    def _digest_header(self, resp: requests.Response, what: str) -> str | None:
        """The answer's Docker-Content-Digest, None when absent; a value that is not a digest is refused."""
        value = resp.headers.get("Docker-Content-Digest")
        if not value:
            return None
        return check_digest(value, f"registry {self.host}: the Docker-Content-Digest of {what}", IntegrityError)

    # -- blobs --------------------------------------------------------------
    def blob_size(self, repository: str, digest: str) -> int | None:
        """Size of a blob the repository holds, or None."""
        what = f"blob {_digest_arg(digest)} of {repository}"
        resp = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", repository=repository, ok=(200, 404),
                            what=what)
        _close(resp)
        if resp.status_code == 404:
            return None
        try:
            return int(resp.headers.get("Content-Length", "-1"))
        except ValueError:
            return -1

    def start_upload(self, repository: str, *, mount: str | None = None, mount_from: str | None = None) -> str | None:
        """POST an upload session; returns its Location, or None when the mount succeeded (201)."""
        path = f"/v2/{repository}/blobs/uploads/"
        extra: tuple[str, ...] = ()
        what = f"an upload session in {repository}"
        if mount and mount_from:
            path += "?" + urlencode({"mount": _digest_arg(mount), "from": mount_from})
            extra = (scope_for(mount_from, "pull"),)
            what = f"the mount of blob {mount} from {mount_from}"
        resp = self.request("POST", path, repository=repository, actions="pull,push", extra_scopes=extra,
                            headers={"Content-Length": "0"}, ok=(201, 202), what=what)
        _close(resp)
        if resp.status_code == 201:
            return None
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError(f"registry {self.host}: upload to {repository} answered 202 without a Location")
        return urljoin(self.base_url + "/", location)

    def upload_monolithic(self, repository: str, location: str, digest: str, size: int,
                          opener: Callable[[], IO[bytes]], progress: ProgressFn | None = None) -> None:
        """One PUT ?digest= with the whole blob as its body."""
        sent = _Tally(self.stats, progress)
        files: list[IO[bytes]] = []

        def body() -> _CountingReader:
            sent.reset()
            for f in files:
                f.close()
            f = opener()
            files.append(f)
            return _CountingReader(f, size, sent.add)

        try:
            self.request("PUT", _with_query(location, digest=_digest_arg(digest)), repository=repository,
                         actions="pull,push",
                         headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                         body=body, ok=(201,), what=f"the upload of blob {digest} to {repository}", bulk=True).close()
        finally:
            for f in files:
                f.close()
        sent.commit()

    def upload_chunked(self, repository: str, location: str, digest: str, size: int,
                       opener: Callable[[], IO[bytes]], chunk_size: int, progress: ProgressFn | None = None) -> None:
        """PATCH chunks with Content-Range, then PUT ?digest=; a failed chunk resumes at the registry's offset."""
        offset = 0
        failures = 0
        what = f"the upload of blob {_digest_arg(digest)} to {repository}"
        with opener() as f:
            while offset < size:
                length = min(chunk_size, size - offset)
                sent = _Tally(self.stats, progress)

                def body(start: int = offset, n: int = length, tally: _Tally = sent) -> _CountingReader:
                    tally.reset()
                    f.seek(start)
                    return _CountingReader(f, n, tally.add)

                try:
                    resp = self.request(
                        "PATCH", location, repository=repository, actions="pull,push", body=body,
                        headers={"Content-Type": "application/octet-stream", "Content-Length": str(length),
                                 "Content-Range": f"{offset}-{offset + length - 1}"},
                        ok=(202,), what=what, bulk=True)
                except RegistryError:
                    failures += 1
                    if failures > 3:
                        raise
                    sent.reset()
                    offset, location = self._upload_offset(repository, location, what)
                    continue
                resp.close()
                sent.commit()
                location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
                offset += length
        self.request("PUT", _with_query(location, digest=digest), repository=repository, actions="pull,push",
                     headers={"Content-Length": "0"}, body=b"", ok=(201,), what=what, bulk=True).close()

    def _upload_offset(self, repository: str, location: str, what: str) -> tuple[int, str]:
        """Where an upload session stands (GET on its location: Range 0-<last byte>)."""
        resp = self.request("GET", location, repository=repository, actions="pull,push", ok=(204,), what=what)
        resp.close()
        m = re.fullmatch(r"(?:bytes=)?0-(\d{1,19})", resp.headers.get("Range", "").strip())
        new_location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
        return (int(m.group(1)) + 1 if m else 0), new_location

    def open_blob(self, repository: str, digest: str) -> requests.Response:
        """A streaming GET of one blob (redirects followed; auth dropped on another host by requests);
        read it with ``iter_answer``."""
        return self.request("GET", f"/v2/{repository}/blobs/{_digest_arg(digest)}", repository=repository,
                            stream=True, bulk=True, what=f"blob {digest} of {repository}")

    def iter_blob(self, repository: str, digest: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        resp = self.open_blob(repository, digest)
        yield from self.iter_answer(resp, f"blob {digest} of {repository}", chunk)

    def iter_answer(self, resp: requests.Response, what: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        """The body of a streamed answer, under its deadlines; closes it."""
        watch: _Watch | None = getattr(resp, "hermetic_watch", None)
        try:
            for data in resp.iter_content(chunk):
                self.stats.add(bytes_received=len(data))
                self.check_deadline(what)
                yield data
            if watch is not None and watch.fired:  # a body read until the close ends early when its socket is shut
                raise self._timeout_error(what, "total")
        except requests.RequestException as e:
            if (watch is not None and watch.fired) or time.monotonic() >= self._ends_at:
                raise self._timeout_error(what, "total") from None
            if _is_read_timeout(e):
                raise self._timeout_error(what, "stall") from None
            raise RegistryError(f"registry {self.host}: download of {what} broke off: {_short_reason(e)}",
                                exit_code=EXIT_UNAVAILABLE) from None
        finally:
            _close(resp)

    # -- manifests ------------------------------------------------------------
    def get_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> ManifestResponse:
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("GET", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept}, what=what)
        body = resp.content
        self.stats.add(bytes_received=len(body))
        ctype = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return ManifestResponse(body, ctype, self._digest_header(resp, what))

    def head_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> tuple[str | None, str] | None:
        """(Docker-Content-Digest or None, media type) of a manifest, or None when absent."""
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("HEAD", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept}, ok=(200, 404), what=what)
        _close(resp)
        if resp.status_code == 404:
            return None
        return self._digest_header(resp, what), resp.headers.get("Content-Type", "").split(";", 1)[0].strip()

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str | None:
        """PUT a manifest under a tag or its digest; returns the registry's Docker-Content-Digest."""
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("PUT", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            actions="pull,push", headers={"Content-Type": media_type}, body=body, ok=(201, 200),
                            what=what)
        _close(resp)
        self.stats.add(bytes_sent=len(body))
        return self._digest_header(resp, what)


def _digest_arg(digest: str) -> str:
    """A digest about to become part of a URL: what the user typed was checked when it was parsed (64),
    so one that is not a digest here came from a registry or a stored document (65)."""
    return check_digest(digest, "a blob or manifest named by a registry or the store", IntegrityError)


def _reference_arg(reference: str) -> str:
    if is_digest(reference) or (":" not in reference and is_tag(reference)):
        return reference
    return check_digest(reference, "a manifest named by a registry or the store", IntegrityError)


def _read_answer(resp: requests.Response, host: str, what: str) -> None:
    """Read the answer's body into ``resp.content`` (what requests does itself for a non-streamed answer),
    up to a limit: a document over MAX_DOCUMENT_BYTES is refused; of an error answer only the start is kept."""
    limit = MAX_ERROR_BODY_BYTES if resp.status_code >= 400 else MAX_DOCUMENT_BYTES
    data = bytearray()
    for chunk in resp.iter_content(64 << 10):
        data += chunk
        if len(data) > limit:
            resp.raw.close()  # unread bytes: the connection must not go back to the pool
            if resp.status_code >= 400:
                del data[limit:]
                break
            raise IntegrityError(f"registry {host}: {what}: the answer is over {limit} bytes; refused")
    resp._content = bytes(data)  # type: ignore[attr-defined]
    resp._content_consumed = True  # type: ignore[attr-defined]
    _close(resp)


class _DeadlinePassed(Exception):
    pass


def _close(resp: requests.Response) -> None:
    watch = getattr(resp, "hermetic_watch", None)
    if watch is not None:
        watch.close()
    resp.close()


def _is_read_timeout(e: BaseException) -> bool:
    if isinstance(e, requests.ConnectTimeout):
        return False
    if isinstance(e, requests.ReadTimeout):
        return True
    return any(isinstance(x, ReadTimeoutError) for x in _causes(e))


def _failed_to_connect(e: BaseException) -> bool:
    """The request never reached the server (refused, unreachable, name unknown): safe to send again."""
    return isinstance(e, requests.ConnectTimeout) or any(isinstance(x, ConnectTimeoutError) for x in _causes(e))


def _causes(e: BaseException) -> list[Any]:
    out: list[Any] = []
    stack: list[Any] = [e]
    while stack and len(out) < 16:
        x = stack.pop()
        out.append(x)
        stack += [a for a in getattr(x, "args", ()) if isinstance(a, BaseException)]
        for attr in ("reason", "__cause__", "__context__"):
            nxt = getattr(x, attr, None)
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return out


def _backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: 0, 1, 2 (urllib3's backoff_factor 0.5)."""
    return 0.0 if attempt == 1 else 0.5 * 2 ** (attempt - 1)


def _retry_after(value: str | None, default: float) -> float:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); ``default`` without one."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return default


class _Tally:
    """Bytes of one upload attempt: the wire counter keeps every byte sent; progress is undone on a resend."""

    def __init__(self, stats: TransferStats, progress: ProgressFn | None):
        self._stats = stats
        self._progress = progress
        self.count = 0

    def add(self, n: int) -> None:
        self.count += n
        self._stats.add(bytes_sent=n)
        if self._progress:
            self._progress(n)

    def reset(self) -> None:
        # A resend: progress goes back, the wire counter keeps what was really sent.
        if self.count and self._progress:
            self._progress(-self.count)
        self.count = 0

    def commit(self) -> None:
        self.count = 0


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def _origin(url: str) -> str:
    p = urlsplit(url)
    return escape_controls(f"{p.scheme}://{p.netloc}{p.path}", MAX_SHOWN)


def _error_detail(resp: requests.Response) -> tuple[str, str]:
    """The first {code, message} of a Distribution error body, if any, control characters escaped."""
    try:
        errors = resp.json().get("errors") or []
        first = errors[0]
        code, message = str(first.get("code", "")), str(first.get("message", ""))
    except Exception:
        return "", ""
    return escape_controls(code, 64), escape_controls(message, MAX_SHOWN)


def _short_reason(e: BaseException) -> str:
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return escape_controls(m.group(1).strip(), MAX_SHOWN)
    for phrase in ("Connection refused", "timed out", "Connection reset", "Name or service not known",
                   "certificate verify failed", "Connection aborted", "IncompleteRead", "Read timed out"):
        if phrase.lower() in text.lower():
            return phrase
    return type(e).__name__
