"""One registry over the OCI Distribution API: blobs, uploads, manifests.

This module speaks HTTP and nothing else: which blobs to send, in which
order, and what to verify are push.py's and pull.py's business. It owns
authentication (a ping of /v2/ learns the challenge before any body is sent,
so a 200 MB layer is never streamed just to be answered 401), retries of
idempotent requests, and the byte counters the benchmarks print.

Plain HTTP is used for loopback registries (127.0.0.0/8, ::1, localhost:
the Docker Engine treats them as insecure by default too) and for hosts
listed in HERMETIC_INSECURE_REGISTRIES (comma-separated); HTTPS otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from hermetic import __version__
from hermetic.errors import EXIT_NOINPUT, EXIT_UNAVAILABLE, ProtocolError
from hermetic.registry.auth import AuthError, Challenge, Credentials, find_credentials, parse_challenge, scope_for
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES

INSECURE_ENV = "HERMETIC_INSECURE_REGISTRIES"
# Every manifest type we can read; the registry picks the one it holds.
MANIFEST_ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
TIMEOUT = (15, 300)  # (connect, read) seconds
USER_AGENT = f"hermetic/{__version__}"

ProgressFn = Callable[[int], None]


class RegistryError(ProtocolError):
    """The registry answered something we cannot use (one line, names host and request);
    one that cannot be reached at all is EXIT_UNAVAILABLE."""
    code: str = ""  # the Distribution error code (e.g. DIGEST_INVALID), when the registry sent one


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
    digest_header: str | None


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

    @staticmethod
    def _new_session() -> requests.Session:
        s = requests.Session()
        retry = Retry(
            total=3, connect=2, read=2, status=3, backoff_factor=0.5,
            allowed_methods=frozenset({"GET", "HEAD"}), status_forcelist=(429, 502, 503, 504),
            raise_on_status=False, respect_retry_after_header=True,
        )
        adapter = HTTPAdapter(max_retries=retry, pool_connections=4, pool_maxsize=8)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        s.headers["User-Agent"] = USER_AGENT
        return s

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
        resp = self._send("GET", self.base_url + "/v2/", headers={}, body=None, stream=False)
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
        raise AuthError(f"registry {self.host}: unsupported auth scheme {ch.scheme!r}")

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
        try:
            if creds is not None and creds.identity_token:
                # OAuth2 refresh-token grant (what `docker login` stores as identitytoken).
                form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                        "client_id": "hermetic", "scope": " ".join(scope_list)}
                if service:
                    form["service"] = service
                resp = self.session.post(realm, data=form, timeout=TIMEOUT)
            else:
                params: list[tuple[str, str]] = [("service", service)] if service else []
                params += [("scope", s) for s in scope_list]
                headers = {"Authorization": creds.basic_header()} if creds is not None and creds.has_basic else {}
                resp = self.session.get(realm, params=params, headers=headers, timeout=TIMEOUT)
        except requests.RequestException as e:
            raise AuthError(f"registry {self.host}: token service {_origin(realm)} unreachable "
                            f"({_short_reason(e)})") from None
        if resp.status_code in (401, 403):
            who = f"user {creds.username!r} ({creds.source})" if creds and creds.username else (
                f"identity token ({creds.source})" if creds else "anonymous access")
            raise AuthError(f"registry {self.host}: authentication failed for {who} at {_origin(realm)} "
                            f"({resp.status_code})")
        if resp.status_code != 200:
            raise AuthError(f"registry {self.host}: token service {_origin(realm)} answered {resp.status_code}")
        try:
            answer = resp.json()
            token = answer.get("token") or answer.get("access_token")
        except ValueError:
            token = None
        if not token:
            raise AuthError(f"registry {self.host}: token service {_origin(realm)} returned no token")
        return str(token)

    # -- requests ---------------------------------------------------------
    def _send(self, method: str, url: str, *, headers: dict[str, str], body: Any, stream: bool,
              allow_redirects: bool = True) -> requests.Response:
        try:
            return self.session.request(method, url, headers=headers, data=body, stream=stream,
                                        timeout=TIMEOUT, allow_redirects=allow_redirects)
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.host}: {method} {_path(url)} failed: {_short_reason(e)}",
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
    ) -> requests.Response:
        """One authenticated request; ``body`` may be a factory so a retry can resend it.

        Raises RegistryError/AuthError for any status outside ``ok``.
        """
        self._ping()
        url = url_or_path if "://" in url_or_path else self.base_url + url_or_path
        scopes = frozenset((scope_for(repository, actions),) + extra_scopes)
        for attempt in (1, 2):
            h = dict(headers or {})
            auth = self._auth_header(scopes)
            if auth:
                h["Authorization"] = auth
            data = body() if callable(body) else body
            resp = self._send(method, url, headers=h, body=data, stream=stream)
            if resp.status_code != 401 or attempt == 2:
                break
            # Expired token or a challenge that changed: learn it again, retry once.
            resp.close()
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            with self._lock:
                self._challenge = challenge
                self._tokens.pop(scopes, None)
            if challenge is None:
                break
        if resp.status_code in ok:
            return resp
        self._raise_for(resp, method, url, repository)
        raise AssertionError("unreachable")

    def _raise_for(self, resp: requests.Response, method: str, url: str, repository: str) -> None:
        code, message = _error_detail(resp)
        resp.close()
        what = f"{method} {_path(url)}"
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
        err = RegistryError(f"registry {self.host}: {what} answered {resp.status_code}{detail}",
                            exit_code=EXIT_NOINPUT if resp.status_code == 404 else None)
        err.code = code
        raise err

    # -- blobs --------------------------------------------------------------
    def blob_size(self, repository: str, digest: str) -> int | None:
        """Size of a blob the repository holds, or None."""
        resp = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", repository=repository, ok=(200, 404))
        resp.close()
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
        if mount and mount_from:
            path += "?" + urlencode({"mount": mount, "from": mount_from})
            extra = (scope_for(mount_from, "pull"),)
        resp = self.request("POST", path, repository=repository, actions="pull,push", extra_scopes=extra,
                            headers={"Content-Length": "0"}, ok=(201, 202))
        resp.close()
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
            self.request("PUT", _with_query(location, digest=digest), repository=repository, actions="pull,push",
                         headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                         body=body, ok=(201,)).close()
        finally:
            for f in files:
                f.close()
        sent.commit()

    def upload_chunked(self, repository: str, location: str, digest: str, size: int,
                       opener: Callable[[], IO[bytes]], chunk_size: int, progress: ProgressFn | None = None) -> None:
        """PATCH chunks with Content-Range, then PUT ?digest=; a failed chunk resumes at the registry's offset."""
        offset = 0
        failures = 0
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
                        ok=(202,))
                except RegistryError:
                    failures += 1
                    if failures > 3:
                        raise
                    sent.reset()
                    offset, location = self._upload_offset(repository, location)
                    continue
                resp.close()
                sent.commit()
                location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
                offset += length
        self.request("PUT", _with_query(location, digest=digest), repository=repository, actions="pull,push",
                     headers={"Content-Length": "0"}, body=b"", ok=(201,)).close()

    def _upload_offset(self, repository: str, location: str) -> tuple[int, str]:
        """Where an upload session stands (GET on its location: Range 0-<last byte>)."""
        resp = self.request("GET", location, repository=repository, actions="pull,push", ok=(204,))
        resp.close()
        m = re.fullmatch(r"(?:bytes=)?0-(\d+)", resp.headers.get("Range", "").strip())
        new_location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
        return (int(m.group(1)) + 1 if m else 0), new_location

    def open_blob(self, repository: str, digest: str) -> requests.Response:
        """A streaming GET of one blob (redirects followed; auth dropped on another host by requests)."""
        return self.request("GET", f"/v2/{repository}/blobs/{digest}", repository=repository, stream=True)

    def iter_blob(self, repository: str, digest: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        resp = self.open_blob(repository, digest)
        try:
            for data in resp.iter_content(chunk):
                self.stats.add(bytes_received=len(data))
                yield data
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.host}: download of {digest} from {repository} broke off: "
                                f"{_short_reason(e)}", exit_code=EXIT_UNAVAILABLE) from None
        finally:
            resp.close()

    # -- manifests ------------------------------------------------------------
    def get_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> ManifestResponse:
        resp = self.request("GET", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept})
        body = resp.content
        self.stats.add(bytes_received=len(body))
        ctype = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return ManifestResponse(body, ctype, resp.headers.get("Docker-Content-Digest"))

    def head_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> tuple[str | None, str] | None:
        """(Docker-Content-Digest or None, media type) of a manifest, or None when absent."""
        resp = self.request("HEAD", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept}, ok=(200, 404))
        resp.close()
        if resp.status_code == 404:
            return None
        return resp.headers.get("Docker-Content-Digest"), resp.headers.get("Content-Type", "").split(";", 1)[0].strip()

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str | None:
        """PUT a manifest under a tag or its digest; returns the registry's Docker-Content-Digest."""
        resp = self.request("PUT", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            actions="pull,push", headers={"Content-Type": media_type}, body=body, ok=(201, 200))
        resp.close()
        self.stats.add(bytes_sent=len(body))
        return resp.headers.get("Docker-Content-Digest")


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


def _path(url: str) -> str:
    return urlsplit(url).path


def _origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{p.path}"


def _error_detail(resp: requests.Response) -> tuple[str, str]:
    """The first {code, message} of a Distribution error body, if any."""
    try:
        errors = resp.json().get("errors") or []
        first = errors[0]
        return str(first.get("code", "")), str(first.get("message", ""))
    except Exception:
        return "", ""


def _short_reason(e: BaseException) -> str:
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return m.group(1).strip()
    for phrase in ("Connection refused", "timed out", "Connection reset", "Name or service not known",
                   "certificate verify failed", "Connection aborted", "IncompleteRead", "Read timed out"):
        if phrase.lower() in text.lower():
            return phrase
    return type(e).__name__
