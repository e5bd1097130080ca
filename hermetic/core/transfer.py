"""The watchdog of an HTTP transfer (a registry's blob, a wheel download): a request's wall-clock deadline and the
slowest its bytes may move (a minimum rate over a window, as curl's --speed-limit/--speed-time). A per-read socket
timeout alone bounds neither (a server that trickles a byte at a time resets it on every read), so each request
has a ``Watch`` that shuts its socket down when a limit passes.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections import deque
from typing import Any, Mapping

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager

from hermetic import __version__
from hermetic.core.errors import UsageError
from hermetic.core.reference import show_value

MIN_RATE_ENV = "HERMETIC_MIN_RATE"  # every transfer's (a registry's own variables, where set, win for it)
RATE_WINDOW_ENV = "HERMETIC_RATE_WINDOW"
DEFAULT_MIN_RATE = 1024.0  # bytes per second a transfer must move at, averaged over the window (0: no minimum)
DEFAULT_RATE_WINDOW_S = 30.0
MAX_TIMEOUT_S = 30 * 86400.0  # a longer limit is a typo (and overflows the timers)
USER_AGENT = f"hermetic/{__version__}"


def min_rate(env: Mapping[str, str] | None = None, names: tuple[str, str] = (MIN_RATE_ENV, RATE_WINDOW_ENV),
             ) -> tuple[float, float]:
    """(bytes per second, window seconds) from the first of ``names`` then the general variables set, or the
    defaults."""
    env = os.environ if env is None else env
    return (env_number(env, (names[0], MIN_RATE_ENV), DEFAULT_MIN_RATE, zero=True, unit="bytes per second"),
            env_number(env, (names[1], RATE_WINDOW_ENV), DEFAULT_RATE_WINDOW_S))


def env_number(env: Mapping[str, str], names: str | tuple[str, ...], default: float, *, zero: bool = False, unit: str = "seconds") -> float:
    names = (names,) if isinstance(names, str) else names
    name = next((n for n in names if env.get(n, "").strip()), names[0])  # the first one set
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not (0 <= value if zero else 0 < value) or value > MAX_TIMEOUT_S:
        raise UsageError(f"{name}={show_value(raw)}: not a number of {unit} {'from' if zero else 'above'} 0 "
                         f"(at most {MAX_TIMEOUT_S:g})",
                         hint=f"e.g. {name}={default:g}, or unset it for the default")
    return value


# -- the watchdog ---------------------------------------------------------------------

_current = threading.local()  # .watch: the Watch of the request this thread is making


class Watch:
    """One request's wall-clock deadline and, for a blob's bytes, its minimum rate: when either is missed,
    the socket the request uses is shut down, so no read or write on it blocks any longer (the thread then
    sees a connection error, and ``fired`` says which: "deadline" or "rate", with ``seen`` the rate)."""

    def __init__(self, ends_at: float, rate: tuple[float, float] | None = None):
        self.fired = ""
        self.seen = 0.0
        self._ends_at = ends_at
        self._rate = rate if rate and rate[0] > 0 else None  # (bytes per second, window seconds)
        self._moved = 0
        self._samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._sock: socket.socket | None = None
        threading.Thread(target=self._run, daemon=True, name="hermetic-watch").start()

    def attach(self, conn: HTTPConnection) -> None:
        """The connection the request is about to use (every hop of a redirect attaches its own): its socket,
        kept (an answer that closes the connection takes the socket from it)."""
        with self._lock:
            self._sock = getattr(conn, "sock", None)
            if self.fired:
                _shut(self._sock)

    def moved(self, n: int, *, last: bool = False) -> None:
        """``n`` more bytes of the blob went through; ``last``: all of a body was sent (what follows, the
        registry's answer, is under the deadline only)."""
        self._moved += n
        if last:
            self._rate = None

    def _run(self) -> None:
        while True:
            rate, now = self._rate, time.monotonic()  # (``moved`` may drop the rate meanwhile)
            if self._done.wait(max(0.0, min(self._ends_at - now, rate[1] / 4 if rate else math.inf))):
                return
            now = time.monotonic()
            if now >= self._ends_at:
                return self._fire("deadline")
            if rate is not None and self._rate is not None and self._too_slow(now, *rate):
                return self._fire("rate")

    def _too_slow(self, now: float, min_rate: float, window: float) -> bool:
        """Whether the bytes moved over (at least) the last ``window`` seconds average below ``min_rate``."""
        samples = self._samples
        samples.append((now, self._moved))
        while len(samples) > 1 and samples[1][0] <= now - window:
            samples.popleft()
        since, before = samples[0]
        if since > now - window:
            return False  # not a whole window yet
        self.seen = (self._moved - before) / (now - since)
        return self.seen < min_rate

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.fired = why
            _shut(self._sock)

    def close(self) -> None:
        with self._lock:
            self._done.set()
            self._sock = None


def count_moved(n: int, *, last: bool = False) -> None:
    """Bytes of a request body this thread is sending, for its Watch's rate."""
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.moved(n, last=last)


def _shut(sock: socket.socket | None) -> None:
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
        _attach(self)  # type: ignore[arg-type]  # its socket, now there is one

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)  # type: ignore[arg-type]
        super().request(*args, **kwargs)  # type: ignore[misc]


def _attach(conn: HTTPConnection) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


def watch_requests(watch: Watch | None) -> None:
    """Put the requests this thread makes from now on under ``watch`` (None: under none)."""
    _current.watch = watch


def _watched(pool: type[HTTPConnectionPool]) -> type[HTTPConnectionPool]:
    """``pool`` whose connections are ``_Watched``."""
    connection = type(f"_Watched{pool.ConnectionCls.__name__}", (_Watched, pool.ConnectionCls), {})
    return type(f"_Watched{pool.__name__}", (pool,), {"ConnectionCls": connection})


_WATCHED_POOLS = {"http": _watched(HTTPConnectionPool), "https": _watched(HTTPSConnectionPool)}


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
