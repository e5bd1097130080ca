"""How requests to one registry are authenticated: a ping of /v2/ learns the challenge before any body is sent;
Basic gets the credentials auth.py finds, Bearer a token per set of scopes from its realm (kept until a 401). A
token is printable ASCII or refused; secrets never go into a message."""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit

import requests

from hermetic.core.display import escape_controls
from hermetic.registry.auth import AuthError, Challenge, Credentials, find_credentials, parse_challenge
from hermetic.registry.transport import MAX_SHOWN, RegistryError, Transport, short_reason


class Authenticator:
    """The challenge, credentials and tokens of one registry host; safe to share between threads."""

    def __init__(self, transport: Transport, base_url: str, credentials: Credentials | None | bool = True):
        self._transport = transport
        self.host = transport.host
        self._base_url = base_url
        # credentials=True: look them up lazily (only if the registry asks).
        self._creds_lookup = credentials is True
        self._creds: Credentials | None = None if credentials is True or credentials is False else credentials
        self._lock = threading.Lock()
        self._challenge: Challenge | None = None
        self._pinged = False
        self._tokens: dict[frozenset[str], str] = {}

    @property
    def credentials(self) -> Credentials | None:
        with self._lock:  # one lookup (a credential helper run) per client, whatever the threads
            if self._creds_lookup:
                self._creds = find_credentials(self.host)
                self._creds_lookup = False
            return self._creds

    def ping(self) -> None:
        """Learn the registry's challenge (GET /v2/), once."""
        with self._lock:
            if self._pinged:
                return
        resp = self._transport.send("GET", self._base_url + "/v2/", headers={}, body=None, what="/v2/")
        challenge = None
        if resp.status_code == 401:
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        elif resp.status_code >= 400 and resp.status_code != 404:
            raise RegistryError(f"registry {self.host}: GET /v2/ answered {resp.status_code}; is this an OCI registry?")
        with self._lock:
            self._challenge = challenge
            self._pinged = True

    def header(self, scopes: frozenset[str]) -> str | None:
        """The Authorization header for a request with these scopes, None when the registry asks for none."""
        ch = self._challenge
        if ch is None:
            return None
        if ch.scheme == "basic":
            creds = self.credentials
            if creds is None or not creds.has_basic:
                raise self.no_credentials()
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

    def relearn(self, www_authenticate: str, scopes: frozenset[str]) -> bool:
        """After a 401 (an expired token, a challenge that changed): take its challenge, forget the token of
        these scopes; False when the 401 carries no challenge (nothing to try again with)."""
        challenge = parse_challenge(www_authenticate)
        with self._lock:
            self._challenge = challenge
            self._tokens.pop(scopes, None)
        return challenge is not None

    def no_credentials(self) -> AuthError:
        return AuthError(
            f"registry {self.host} requires a login and no credentials were found "
            f"(set HERMETIC_REGISTRY_USER and HERMETIC_REGISTRY_PASSWORD, or run: docker login {self.host})"
        )

    def refused(self, repository: str, code: str) -> AuthError:
        """What a 401 to an authenticated request means: no credentials, or these were refused."""
        creds = self.credentials
        if creds is None:
            return self.no_credentials()
        return AuthError(f"registry {self.host}: {creds.who} was refused for {repository}: "
                         f"401 {code or 'UNAUTHORIZED'}")

    def _fetch_token(self, ch: Challenge, scopes: frozenset[str]) -> str:
        realm = ch.realm
        if not realm:
            raise AuthError(f"registry {self.host}: Bearer challenge without a realm")
        creds = self.credentials
        service = ch.params.get("service")
        scope_list = sorted(scopes)
        p = urlsplit(realm)
        where = escape_controls(f"{p.scheme}://{p.netloc}{p.path}", MAX_SHOWN)
        what = f"the token from {where}"
        try:
            if creds is not None and creds.identity_token:
                # OAuth2 refresh-token grant (what `docker login` stores as identitytoken).
                form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                        "client_id": "hermetic", "scope": " ".join(scope_list)}
                if service:
                    form["service"] = service
                resp = self._transport.exchange("POST", realm, what=what, headers={}, body=lambda: form)
            else:
                params: list[tuple[str, str]] = [("service", service)] if service else []
                params += [("scope", s) for s in scope_list]
                headers = {"Authorization": creds.basic_header()} if creds is not None and creds.has_basic else {}
                resp = self._transport.exchange("GET", realm, what=what, headers=headers, body=None, params=params)
        except requests.RequestException as e:
            raise AuthError(f"registry {self.host}: token service {where} unreachable "
                            f"({short_reason(e)})") from None
        if resp.status_code in (401, 403):
            raise AuthError(f"registry {self.host}: authentication failed for "
                            f"{creds.who if creds else 'anonymous access'} at {where} "
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
