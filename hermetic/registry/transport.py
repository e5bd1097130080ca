"""One registry host over HTTP, each exchange under the limits of deadlines.py, retried where that is safe (a
request that never reached the server; a GET or HEAD that broke off or got 429/502/503/504), the answer read up to
a size limit; registry text escaped before it goes into a message; the bytes counted (TransferStats).
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import fields
from typing import Any, Callable, Iterator, TypeVar

import requests
import urllib3.exceptions
from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError
from urllib3.util.retry import Retry

from hermetic.core.display import escape_controls
from hermetic.core.errors import EXIT_UNAVAILABLE, IntegrityError, ProtocolError, UsageError
from hermetic.core.transfer import MAX_TIMEOUT_S, Watch, new_session, watch_requests
from hermetic.registry.deadlines import (CONNECT_TIMEOUT_S, MIN_RATE_ENV, RATE_WINDOW_ENV, REQUEST_TIMEOUT_ENV,
                                         TOTAL_TIMEOUT_ENV, RegistryTimeout, Timeouts)

# Distribution refuses manifests over 4 MiB, containerd will not read them: a bigger answer is not a document.
MAX_DOCUMENT_BYTES = 4 << 20
MAX_ERROR_BODY_BYTES = 64 << 10  # of an error answer, only the start is read (for its code and message)
MAX_SHOWN = 200  # characters of registry text in one message
# Attempts of a request: one that could not connect (any method) or broke off (GET/HEAD), and of a GET/HEAD
# answered 429/502/503/504 (the counts of urllib3's Retry(connect=2, read=2, status=3)).
ATTEMPTS = 3
STATUS_ATTEMPTS = 4
RETRY_STATUSES = (429, 502, 503, 504)
MAX_RETRY_WAIT_S = 10.0  # a Retry-After longer than this is not waited for
T = TypeVar("T")


class RegistryError(ProtocolError):
    """The registry answered something we cannot use (one line, names host and request);
    one that cannot be reached at all is EXIT_UNAVAILABLE."""
    code: str = ""  # the Distribution error code (e.g. DIGEST_INVALID), when the registry sent one


class TransferStats:
    """What crossed the wire (COUNTS, read as attributes); thread-safe counters for parallel transfers."""

    COUNTS = ("bytes_sent", "bytes_received", "blobs_uploaded", "blobs_mounted", "blobs_skipped", "blobs_downloaded")

    def __init__(self) -> None:
        self._counts = dict.fromkeys(self.COUNTS, 0)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> int:
        if name in TransferStats.COUNTS:
            return self._counts[name]
        raise AttributeError(name)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self._counts[k] += v

    def to_json(self) -> dict[str, int]:
        return dict(self._counts)


def result_json(result: Any, names: dict[str, str] | None = None) -> dict[str, Any]:
    """A push's or pull's result (a dataclass) as JSON: its fields in order, ``names`` renaming some, tuples as
    lists; its stats' counts last."""
    doc = {(names or {}).get(f.name, f.name): getattr(result, f.name) for f in fields(result) if f.name != "stats"}
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in doc.items()}, **result.stats.to_json()}


class Transport:
    """HTTP with one registry host under the deadlines; safe to share between threads."""

    def __init__(self, host: str, *, stats: TransferStats | None = None, session: requests.Session | None = None,
                 timeouts: Timeouts | None = None):
        self.host = host
        self.stats = stats or TransferStats()
        self.session = session or new_session()
        self.timeouts = timeouts or Timeouts.from_env()
        self.begin("transfer")

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

    def _timeout_error(self, what: str, which: str, watch: Watch | None = None) -> RegistryTimeout:
        hint = (f"the registry is stalled or too slow; try again later, or allow more time "
                f"(--timeout SECONDS, {TOTAL_TIMEOUT_ENV}, {REQUEST_TIMEOUT_ENV}, {MIN_RATE_ENV})")
        t = self.timeouts
        why = {"total": f"not done when the {self._total:g} s deadline of the {self.operation} ran out "
                        f"({TOTAL_TIMEOUT_ENV})",
               "stall": f"nothing received for {t.request:g} s ({REQUEST_TIMEOUT_ENV})",
               "request": f"no complete answer within {t.request:g} s ({REQUEST_TIMEOUT_ENV})"}[which]
        if watch is not None and watch.fired == "rate":
            why = (f"{watch.seen:.0f} bytes/s over the last {t.rate_window:g} s, below the minimum of "
                   f"{t.min_rate:g} bytes/s ({MIN_RATE_ENV}, {RATE_WINDOW_ENV})")
        return RegistryTimeout(f"registry {self.host}: {what}: {why}", hint=hint)

    def _deadline(self, bulk: bool, started: float) -> tuple[float, str]:
        """(monotonic time the request must end by, which limit that is)."""
        if bulk:
            return self._ends_at, "total"
        own = started + self.timeouts.request
        return (own, "request") if own < self._ends_at else (self._ends_at, "total")

    def check_deadline(self, what: str) -> None:
        if time.monotonic() >= self._ends_at:
            raise self._timeout_error(what, "total")

    def exchange(self, method: str, url: str, *, what: str, headers: dict[str, str], body: Any,
                 bulk: bool = False, stream: bool = False, params: Any = None) -> requests.Response:
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
            metered = bulk and (stream or callable(body))  # a blob's bytes: a body we send, or one we read
            watch = Watch(ends_at, (self.timeouts.min_rate, self.timeouts.rate_window) if metered else None)
            watch_requests(watch)
            resp = None
            try:
                resp = self.session.request(
                    method, url, headers=headers, data=body() if callable(body) else body, params=params,
                    stream=True,
                    timeout=(min(CONNECT_TIMEOUT_S, left), min(self.timeouts.request, left)))
                if not stream:
                    read_answer(resp, self.host, what)
                if watch.fired:  # a shut socket can also look like an answer that ended early
                    raise requests.ConnectionError("the deadline watch shut the connection")
            except BaseException as e:
                watch.close()
                if resp is not None:
                    resp.close()
                if not isinstance(e, requests.RequestException):
                    raise
                if watch.fired:
                    raise self._timeout_error(what, which, watch) from None
                if _is_read_timeout(e):
                    raise self._timeout_error(what, "total" if time.monotonic() >= self._ends_at else
                                              ("stall" if bulk else which)) from None
                retry = (_failed_to_connect(e) or idempotent) and attempt < ATTEMPTS
                if not retry or not self._wait(_backoff(attempt), ends_at):
                    raise
                continue
            finally:
                watch_requests(None)
            if stream:
                resp.hermetic_watch = watch  # type: ignore[attr-defined]  # closed when the body is read
            else:
                watch.close()
            if idempotent and resp.status_code in RETRY_STATUSES and attempt < STATUS_ATTEMPTS:
                wait = _retry_after(resp.headers.get("Retry-After"), _backoff(attempt))
                if wait <= MAX_RETRY_WAIT_S and self._wait(wait, ends_at):
                    close_answer(resp)
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

    def send(self, method: str, url: str, *, headers: dict[str, str], body: Any, what: str,
             bulk: bool = False, stream: bool = False, params: Any = None) -> requests.Response:
        """``exchange``, a failure to reach the registry a RegistryError (exit 69) naming the request."""
        try:
            return self.exchange(method, url, what=what, headers=headers, body=body, bulk=bulk, stream=stream,
                                 params=params)
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.host}: {method} {what} failed: {short_reason(e)}",
                                exit_code=EXIT_UNAVAILABLE) from None

    def iter_answer(self, resp: requests.Response, what: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        """The body of a streamed answer, under its deadlines and minimum rate; closes it. Each read returns
        what has arrived (up to ``chunk``), so the Watch counts bytes as they come."""
        watch: Watch | None = getattr(resp, "hermetic_watch", None)
        try:
            while data := resp.raw.read1(chunk, decode_content=True):
                if watch is not None:
                    watch.moved(len(data))
                self.stats.add(bytes_received=len(data))
                self.check_deadline(what)
                yield data
            if watch is not None and watch.fired:  # a body read until the close ends early when its socket is shut
                raise self._timeout_error(what, "total", watch)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
            if (watch is not None and watch.fired) or time.monotonic() >= self._ends_at:
                raise self._timeout_error(what, "total", watch) from None
            if _is_read_timeout(e):
                raise self._timeout_error(what, "stall") from None
            raise RegistryError(f"registry {self.host}: download of {what} broke off: {short_reason(e)}",
                                exit_code=EXIT_UNAVAILABLE) from None
        finally:
            close_answer(resp)


def retried(attempts: int, fn: Callable[[], T], retry_if: Callable[[RegistryError], bool] = lambda e: True,
            pause: Callable[[int], float] = lambda attempt: 0.0) -> T:
    """``fn()``, called again (after ``pause(attempt)`` seconds) when it raises a RegistryError that ``retry_if``
    accepts, ``attempts`` times in all: a step of a push or pull that a broken connection or a race may fail."""
    for attempt in range(1, attempts):
        try:
            return fn()
        except RegistryError as e:
            if not retry_if(e):
                raise
        time.sleep(pause(attempt))
    return fn()


def read_answer(resp: requests.Response, host: str, what: str) -> None:
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
    close_answer(resp)


def close_answer(resp: requests.Response) -> None:
    """Close an answer, and the Watch a streamed one keeps until its body is read."""
    watch = getattr(resp, "hermetic_watch", None)
    if watch is not None:
        watch.close()
    resp.close()


def _cause(e: BaseException) -> BaseException:
    """The urllib3 error under requests' wrapper (a MaxRetryError: its reason)."""
    inner = e.args[0] if isinstance(e, requests.RequestException) and e.args else e
    reason = getattr(inner, "reason", None)
    return reason if isinstance(reason, BaseException) else inner


def _is_read_timeout(e: BaseException) -> bool:
    return isinstance(e, requests.ReadTimeout) or isinstance(_cause(e), ReadTimeoutError)


def _failed_to_connect(e: BaseException) -> bool:
    """The request never reached the server (refused, unreachable, name unknown): safe to send again."""
    return isinstance(e, requests.ConnectTimeout) or isinstance(_cause(e), ConnectTimeoutError)


def _backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: 0, 1, 2 (urllib3's backoff_factor 0.5)."""
    return 0.0 if attempt == 1 else 0.5 * 2 ** (attempt - 1)


def _retry_after(value: str | None, default: float) -> float:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); ``default`` without one."""
    try:
        return Retry().parse_retry_after(value) if value else default
    except urllib3.exceptions.InvalidHeader:
        return default


def short_reason(e: BaseException) -> str:
    """Why a request failed, in a few words: the errno's text, a phrase requests uses, or the error's type."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return escape_controls(m.group(1).strip(), MAX_SHOWN)
    for phrase in ("Connection refused", "timed out", "Connection reset", "Name or service not known",
                   "certificate verify failed", "Connection aborted", "IncompleteRead", "Read timed out"):
        if phrase.lower() in text.lower():
            return phrase
    return type(e).__name__
