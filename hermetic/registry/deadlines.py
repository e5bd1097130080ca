"""The deadlines of a registry transfer (docs/registry.md, "Deadlines") and the watchdog that keeps them.

A client's whole transfer (one push or pull) must end within
``Timeouts.total`` (HERMETIC_REGISTRY_TIMEOUT, ``--timeout``), and one
request other than a blob's bytes (a manifest, a HEAD, a token, an upload
session) within ``Timeouts.request`` (HERMETIC_REGISTRY_REQUEST_TIMEOUT),
which is also the longest a blob transfer may go without a byte. A per-read
socket timeout alone does not bound a request (a server that trickles a byte
at a time resets it on every read), so each request has a ``Watch`` that
shuts its socket down when its deadline passes; the blocked read or write
returns at once, and the request ends in RegistryTimeout (exit 75) naming the
blob or manifest. ``new_session`` is requests' session with connections a
Watch can shut, also through an HTTP(S) proxy.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager

from hermetic import __version__
from hermetic.core.errors import TempFail, UsageError
from hermetic.core.reference import show_value

TOTAL_TIMEOUT_ENV = "HERMETIC_REGISTRY_TIMEOUT"
REQUEST_TIMEOUT_ENV = "HERMETIC_REGISTRY_REQUEST_TIMEOUT"
DEFAULT_TOTAL_TIMEOUT_S = 3600.0  # one push or pull: a few GB over a slow link
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # one manifest/HEAD/token request; the longest pause of a blob transfer
CONNECT_TIMEOUT_S = 15.0
MAX_TIMEOUT_S = 30 * 86400.0  # a longer limit is a typo (and overflows the timers)
USER_AGENT = f"hermetic/{__version__}"


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


# -- the watchdog ---------------------------------------------------------------------

_current = threading.local()  # .watch: the Watch of the request this thread is making


class Watch:
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


def watch_requests(watch: Watch | None) -> None:
    """Put the requests this thread makes from now on under ``watch`` (None: under none)."""
    _current.watch = watch


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter with connections a Watch can shut down (also through an HTTP(S) proxy)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any):  # type: ignore[no-untyped-def]
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # a SOCKS manager has its own pools: the per-read timeouts still hold
            manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager


def new_session() -> requests.Session:
    """A session whose connections a Watch can shut; it never retries (the caller's retries stay inside
    the deadlines)."""
    s = requests.Session()
    adapter = _WatchedAdapter(max_retries=0, pool_connections=4, pool_maxsize=8)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.headers["User-Agent"] = USER_AGENT
    return s
