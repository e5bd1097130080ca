"""One registry over the OCI Distribution API: blobs, uploads, manifests (which to send and what to verify is
push.py's and pull.py's). Requests are authenticated (tokens.py); refusals are one line: 401/403 AuthError, 404
not found (66), else RegistryError. What the registry says is data: digests are checked before they become a URL
or a path. Plain HTTP for loopback hosts and HERMETIC_INSECURE_REGISTRIES, HTTPS otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator
from urllib.parse import urljoin, urlsplit

import requests

from hermetic.core.canonical import sha256_digest
from hermetic.core.display import escape_controls
from hermetic.core.errors import EXIT_NOINPUT, IntegrityError
from hermetic.core.reference import check_digest, is_digest, is_tag
from hermetic.core.transfer import count_moved
from hermetic.registry.auth import AuthError, Credentials, scope_for
from hermetic.registry.deadlines import Timeouts
from hermetic.registry.tokens import Authenticator
from hermetic.registry.transport import (MAX_SHOWN, RegistryError, TransferStats, Transport, close_answer,
                                         read_answer)
from hermetic.store.oci import INDEX_TYPES, MANIFEST_TYPES

INSECURE_ENV = "HERMETIC_INSECURE_REGISTRIES"
# Every manifest type we can read; the registry picks the one it holds.
MANIFEST_ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)

ProgressFn = Callable[[int], None]


def is_loopback_host(host: str) -> bool:
    try:
        name = urlsplit(f"//{host}").hostname or host  # no port, no brackets around an IPv6 address
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_scheme(host: str) -> str:
    insecure = {h.strip() for h in os.environ.get(INSECURE_ENV, "").split(",") if h.strip()}
    return "http" if is_loopback_host(host) or host in insecure else "https"


class _Body:
    """A slice of a blob file as a request body, called once per attempt (a factory) to start again from the
    slice's start: every byte sent counts on the wire (TransferStats); progress counts one attempt's bytes,
    undone when the slice is sent again (``rewind``)."""

    def __init__(self, f: IO[bytes], start: int, length: int, stats: TransferStats, progress: ProgressFn | None):
        self._f, self._start, self._length = f, start, length
        self._stats, self._progress = stats, progress
        self._left = self.count = 0

    def __call__(self) -> "_Body":
        self.rewind()
        self._f.seek(self._start)
        self._left = self._length
        return self

    def rewind(self) -> None:
        if self.count and self._progress:
            self._progress(-self.count)
        self.count = 0

    def __len__(self) -> int:
        return self._length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        data = self._f.read(self._left if n is None or n < 0 else min(n, self._left))
        self._left -= len(data)
        self.count += len(data)
        self._stats.add(bytes_sent=len(data))
        if data and self._progress:
            self._progress(len(data))
        count_moved(len(data), last=self._left <= 0 or not data)
        return data


@dataclass(frozen=True)
class ManifestResponse:
    body: bytes
    media_type: str
    digest_header: str | None  # the registry's Docker-Content-Digest, checked to be a digest


class RegistryClient(Transport):
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
        super().__init__(host, stats=stats, session=session, timeouts=timeouts)
        self.scheme = scheme or default_scheme(host)
        self.base_url = f"{self.scheme}://{host}"
        self.auth = Authenticator(self, self.base_url, credentials)

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
        what: str,
        bulk: bool = False,
        params: dict[str, str] | None = None,
    ) -> requests.Response:
        """One authenticated request; ``body`` may be a factory so a retry can resend it.

        Raises RegistryError/AuthError for any status outside ``ok``, RegistryTimeout when a deadline passes.
        ``stream``: the caller reads the answer (``iter_answer``). ``what`` names the blob or manifest for messages.
        """
        self.auth.ping()
        url = url_or_path if "://" in url_or_path else self.base_url + url_or_path
        scopes = frozenset((scope_for(repository, actions),) + extra_scopes)
        for attempt in (1, 2):
            h = dict(headers or {})
            auth = self.auth.header(scopes)
            if auth:
                h["Authorization"] = auth
            resp = self.send(method, url, headers=h, body=body, what=what, bulk=bulk, stream=stream, params=params)
            if resp.status_code != 401 or attempt == 2:
                break
            # Expired token or a challenge that changed: learn it again, retry once.
            close_answer(resp)
            if not self.auth.relearn(resp.headers.get("WWW-Authenticate", ""), scopes):
                break
        if resp.status_code in ok:
            return resp
        if stream:  # the error's body, for its code and message
            try:
                read_answer(resp, self.host, what)
            except requests.RequestException:
                pass
        self._raise_for(resp, method, what, repository)
        raise AssertionError("unreachable")

    def _raise_for(self, resp: requests.Response, method: str, what: str, repository: str) -> None:
        code, message = _error_detail(resp)
        close_answer(resp)
        if resp.status_code == 401:
            raise self.auth.refused(repository, code)
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
        close_answer(resp)
        if resp.status_code == 404:
            return None
        try:
            return int(resp.headers.get("Content-Length", "-1"))
        except ValueError:
            return -1

    def start_upload(self, repository: str, *, mount: str | None = None, mount_from: str | None = None) -> str | None:
        """POST an upload session; returns its Location, or None when the mount succeeded (201)."""
        params, extra, what = None, (), f"an upload session in {repository}"
        if mount and mount_from:
            params = {"mount": _digest_arg(mount), "from": mount_from}
            extra = (scope_for(mount_from, "pull"),)
            what = f"the mount of blob {mount} from {mount_from}"
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/", repository=repository, actions="pull,push",
                            extra_scopes=extra, headers={"Content-Length": "0"}, ok=(201, 202), what=what,
                            params=params)
        close_answer(resp)
        if resp.status_code == 201:
            return None
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError(f"registry {self.host}: upload to {repository} answered 202 without a Location")
        return urljoin(self.base_url + "/", location)

    def upload(self, repository: str, location: str, digest: str, size: int, f: IO[bytes], chunk_size: int,
               progress: ProgressFn | None = None) -> None:
        """Send a blob into an upload session: one PUT ?digest= with the whole blob, or (a blob over ``chunk_size``)
        PATCH chunks with Content-Range, then the PUT; a failed chunk resumes at the registry's offset."""
        what = f"the upload of blob {_digest_arg(digest)} to {repository}"
        offset = failures = 0
        while size > chunk_size and offset < size:
            length = min(chunk_size, size - offset)
            chunk = _Body(f, offset, length, self.stats, progress)
            try:
                resp = self.request(
                    "PATCH", location, repository=repository, actions="pull,push", body=chunk,
                    headers={"Content-Type": "application/octet-stream", "Content-Length": str(length),
                             "Content-Range": f"{offset}-{offset + length - 1}"},
                    ok=(202,), what=what, bulk=True)
            except RegistryError:
                failures += 1
                if failures > 3:
                    raise
                chunk.rewind()
                offset, location = self._upload_offset(repository, location, what)
                continue
            resp.close()
            location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
            offset += length
        whole = _Body(f, 0, size, self.stats, progress) if size <= chunk_size else b""
        self.request("PUT", location, repository=repository, actions="pull,push", params={"digest": digest},
                     headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(whole))},
                     body=whole, ok=(201,), what=what, bulk=True).close()

    def _upload_offset(self, repository: str, location: str, what: str) -> tuple[int, str]:
        """Where an upload session stands (GET on its location: Range 0-<last byte>)."""
        resp = self.request("GET", location, repository=repository, actions="pull,push", ok=(204,), what=what)
        resp.close()
        m = re.fullmatch(r"(?:bytes=)?0-(\d{1,19})", resp.headers.get("Range", "").strip())
        new_location = urljoin(self.base_url + "/", resp.headers.get("Location") or location)
        return (int(m.group(1)) + 1 if m else 0), new_location

    def iter_blob(self, repository: str, digest: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of one blob, streamed (redirects followed; auth dropped on another host by requests)."""
        what = f"blob {_digest_arg(digest)} of {repository}"
        resp = self.request("GET", f"/v2/{repository}/blobs/{digest}", repository=repository, stream=True, bulk=True,
                            what=what)
        yield from self.iter_answer(resp, what, chunk)

    # -- manifests ------------------------------------------------------------
    def get_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> ManifestResponse:
        """A manifest by tag or digest; one by digest must hash to it (IntegrityError otherwise)."""
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("GET", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept}, what=what)
        body = resp.content
        self.stats.add(bytes_received=len(body))
        if is_digest(reference) and sha256_digest(body) != reference:
            raise IntegrityError(f"registry {self.host} served {what} with content hashing to {sha256_digest(body)}; "
                                 "nothing was stored")
        ctype = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return ManifestResponse(body, ctype, self._digest_header(resp, what))

    def head_manifest(self, repository: str, reference: str, accept: str = MANIFEST_ACCEPT) -> tuple[str | None, str] | None:
        """(Docker-Content-Digest or None, media type) of a manifest, or None when absent."""
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("HEAD", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            headers={"Accept": accept}, ok=(200, 404), what=what)
        close_answer(resp)
        if resp.status_code == 404:
            return None
        return self._digest_header(resp, what), resp.headers.get("Content-Type", "").split(";", 1)[0].strip()

    def tag_digest(self, repository: str, tag: str) -> str | None:
        """The digest ``tag`` names now (its Docker-Content-Digest, else the sha256 of the manifest), or None."""
        head = self.head_manifest(repository, tag)
        if head is None:
            return None
        return head[0] or sha256_digest(self.get_manifest(repository, tag).body)

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str | None:
        """PUT a manifest under a tag or its digest; returns the registry's Docker-Content-Digest."""
        what = f"manifest {_reference_arg(reference)} of {repository}"
        resp = self.request("PUT", f"/v2/{repository}/manifests/{reference}", repository=repository,
                            actions="pull,push", headers={"Content-Type": media_type}, body=body, ok=(201, 200),
                            what=what)
        close_answer(resp)
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


def _error_detail(resp: requests.Response) -> tuple[str, str]:
    """The first {code, message} of a Distribution error body, if any, control characters escaped."""
    try:
        errors = resp.json().get("errors") or []
        first = errors[0]
        code, message = str(first.get("code", "")), str(first.get("message", ""))
    except Exception:
        return "", ""
    return escape_controls(code, 64), escape_controls(message, MAX_SHOWN)
