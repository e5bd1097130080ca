"""Registry credentials, first match wins: HERMETIC_REGISTRY_USER / HERMETIC_REGISTRY_PASSWORD (every registry),
else ``$DOCKER_CONFIG/config.json`` read as the docker CLI reads it (``credHelpers[host]``, ``credsStore``,
``auths[host]``; helpers run as ``docker-credential-<name> get``). Secrets leave this module only as an
Authorization header: no repr, message or record carries them.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from hermetic.core.errors import PermissionDenied

ENV_USER = "HERMETIC_REGISTRY_USER"
ENV_PASSWORD = "HERMETIC_REGISTRY_PASSWORD"
DOCKER_HUB_HOSTS = frozenset({"registry-1.docker.io", "docker.io", "index.docker.io"})
# The key Docker Hub credentials are stored under by `docker login`.
DOCKER_HUB_CONFIG_KEY = "https://index.docker.io/v1/"
HELPER_TIMEOUT_S = 30


class AuthError(PermissionDenied):
    """Credentials were missing, refused, or could not be read."""


@dataclass(frozen=True)
class Credentials:
    """A username/password pair or an identity (refresh) token; never printed."""

    username: str | None = None
    password: str | None = None
    identity_token: str | None = None
    source: str = ""  # where they came from, for messages ("env", "docker config", "helper ecr-login")

    @property
    def who(self) -> str:
        """Whose they are, for a message: the user (or an identity token) and where they came from."""
        return f"{f'user {self.username!r}' if self.username else 'identity token'} ({self.source})"

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(username={self.username!r}, source={self.source!r}, secret=<hidden>)"

    __str__ = __repr__

    @property
    def has_basic(self) -> bool:
        return self.username is not None and self.password is not None

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


# -- where credentials live ---------------------------------------------------

def normalize_config_key(key: str) -> str:
    """``https://host:port/v1/`` -> ``host:port`` (how docker matches auths keys)."""
    return re.sub(r"^https?://", "", key.strip()).split("/", 1)[0]


def config_key_for_host(host: str) -> str:
    return DOCKER_HUB_CONFIG_KEY if host in DOCKER_HUB_HOSTS else host


def find_credentials(host: str, env: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials for ``host`` (``name[:port]``), or None to go anonymous."""
    env = os.environ if env is None else env
    user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
    if user or password:
        if not (user and password):
            missing = ENV_PASSWORD if user else ENV_USER
            raise AuthError(f"{missing} is not set (set both {ENV_USER} and {ENV_PASSWORD}, or neither)")
        return Credentials(username=user, password=password, source="environment")
    path = (Path(env["DOCKER_CONFIG"]).expanduser() if env.get("DOCKER_CONFIG") else Path.home() / ".docker")
    path /= "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise AuthError(f"{path}: cannot read docker config: {type(e).__name__}") from None
    if not isinstance(config, dict):
        raise AuthError(f"{path}: not a JSON object")
    return credentials_from_docker_config(config, host, path=path, env=env)


def credentials_from_docker_config(
    config: dict, host: str, *, path: Path | None = None, env: Mapping[str, str] | None = None,
) -> Credentials | None:
    """Docker CLI precedence: credHelpers[host], then credsStore, then auths."""
    where = str(path) if path else "docker config"
    wanted = normalize_config_key(config_key_for_host(host))
    helpers = config.get("credHelpers") or {}
    for key, helper in helpers.items():
        if normalize_config_key(key) == wanted:
            return run_credential_helper(str(helper), config_key_for_host(host), env=env)
    store = config.get("credsStore")
    if store:
        return run_credential_helper(str(store), config_key_for_host(host), env=env)
    for key, entry in (config.get("auths") or {}).items():
        if normalize_config_key(key) != wanted or not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            return Credentials(identity_token=str(entry["identitytoken"]), source=where)
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"], validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise AuthError(f"{where}: auths[{key!r}].auth is not base64 of user:password") from None
            if not sep:
                raise AuthError(f"{where}: auths[{key!r}].auth is not base64 of user:password")
            return Credentials(username=user, password=password, source=where)
        if entry.get("username") and entry.get("password"):
            return Credentials(username=str(entry["username"]), password=str(entry["password"]), source=where)
    return None


def run_credential_helper(helper: str, server: str, env: Mapping[str, str] | None = None) -> Credentials | None:
    """``docker-credential-<helper> get`` (docker-credential-helpers protocol)."""
    exe = f"docker-credential-{helper}"
    try:
        proc = subprocess.run(
            [exe, "get"], input=server.encode(), capture_output=True, timeout=HELPER_TIMEOUT_S,
            env=dict(env) if env is not None else None, check=False,
        )
    except FileNotFoundError:
        raise AuthError(f"credential helper {exe} is not on PATH (named by the docker config for {server})") from None
    except subprocess.TimeoutExpired:
        raise AuthError(f"credential helper {exe} did not answer within {HELPER_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        # The protocol's "not found" answer: go anonymous, like docker does.
        if b"credentials not found" in proc.stdout.lower() + proc.stderr.lower():
            return None
        first = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()[:1]
        raise AuthError(f"credential helper {exe} failed for {server}: {first[0] if first else f'exit {proc.returncode}'}")
    try:
        answer = json.loads(proc.stdout)
        user, secret = answer["Username"], answer["Secret"]
    except (ValueError, KeyError, TypeError):
        raise AuthError(f"credential helper {exe} returned something other than {{Username, Secret}} JSON") from None
    source = f"credential helper {helper}"
    if user == "<token>":  # the protocol's spelling of an identity token
        return Credentials(identity_token=secret, source=source)
    return Credentials(username=user, password=secret, source=source)


# -- challenges ---------------------------------------------------------------

_PARAM = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" | "bearer" (lowercase)
    params: dict[str, str]

    @property
    def realm(self) -> str | None:
        return self.params.get("realm")


def parse_challenge(header: str) -> Challenge | None:
    """``Bearer realm="…",service="…",scope="…"`` -> Challenge (first one only)."""
    header = header.strip()
    if not header:
        return None
    scheme, _, rest = header.partition(" ")
    params = {}
    for m in _PARAM.finditer(rest):
        key = m.group(1).lower()
        if key in params:
            break  # a second challenge starts here
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[key] = re.sub(r"\\(.)", r"\1", value)
    return Challenge(scheme.lower(), params)


def scope_for(repository: str, actions: str) -> str:
    return f"repository:{repository}:{actions}"
