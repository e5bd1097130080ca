"""Where registry credentials come from, and how challenges parse (no registry needed)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from hermetic.registry.auth import (
    AuthError,
    Credentials,
    find_credentials,
    normalize_config_key,
    parse_challenge,
)
from hermetic.registry.cache import cache_tag


def _env(tmp_path: Path, config: dict | None = None, **extra: str) -> dict[str, str]:
    cfg_dir = tmp_path / "docker-config"
    cfg_dir.mkdir(exist_ok=True)
    if config is not None:
        (cfg_dir / "config.json").write_text(json.dumps(config))
    env = {"DOCKER_CONFIG": str(cfg_dir), "PATH": os.environ.get("PATH", "")}
    env.update(extra)
    return env


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_no_config_means_anonymous(tmp_path: Path) -> None:
    assert find_credentials("127.0.0.1:5000", _env(tmp_path)) is None


def test_environment_wins_over_docker_config(tmp_path: Path) -> None:
    env = _env(tmp_path, {"auths": {"reg.example:5000": {"auth": _b64("cfguser:cfgpass")}}},
               HERMETIC_REGISTRY_USER="ci", HERMETIC_REGISTRY_PASSWORD="tok")
    creds = find_credentials("reg.example:5000", env)
    assert creds is not None and (creds.username, creds.password, creds.source) == ("ci", "tok", "environment")


def test_half_set_environment_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="HERMETIC_REGISTRY_PASSWORD is not set"):
        find_credentials("h", _env(tmp_path, HERMETIC_REGISTRY_USER="ci"))


@pytest.mark.parametrize("key", ["reg.example:5000", "https://reg.example:5000", "http://reg.example:5000/v2/"])
def test_auths_entry_matches_however_the_key_is_spelled(tmp_path: Path, key: str) -> None:
    env = _env(tmp_path, {"auths": {key: {"auth": _b64("alice:pa:ss")}, "other:1": {"auth": _b64("x:y")}}})
    creds = find_credentials("reg.example:5000", env)
    assert creds is not None and (creds.username, creds.password) == ("alice", "pa:ss")


def test_identity_token_entry(tmp_path: Path) -> None:
    env = _env(tmp_path, {"auths": {"reg.example": {"auth": "", "identitytoken": "refresh-123"}}})
    creds = find_credentials("reg.example", env)
    assert creds is not None and creds.identity_token == "refresh-123" and creds.username is None


def test_docker_hub_uses_the_index_key(tmp_path: Path) -> None:
    env = _env(tmp_path, {"auths": {"https://index.docker.io/v1/": {"auth": _b64("hubuser:hubpass")}}})
    creds = find_credentials("registry-1.docker.io", env)
    assert creds is not None and creds.username == "hubuser"


def test_corrupt_auth_field_names_the_key(tmp_path: Path) -> None:
    env = _env(tmp_path, {"auths": {"reg.example": {"auth": "!!notbase64"}}})
    with pytest.raises(AuthError, match=r"auths\['reg.example'\]\.auth"):
        find_credentials("reg.example", env)


def _helper(tmp_path: Path, name: str, script: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / f"docker-credential-{name}"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_cred_helper_for_host_is_run_with_the_host_on_stdin(tmp_path: Path) -> None:
    # A real executable speaking the docker-credential-helpers protocol.
    bindir = _helper(tmp_path, "hermetictest", (
        'read server\n'
        '[ "$1" = get ] || exit 2\n'
        'printf \'{"ServerURL":"%s","Username":"helper-user","Secret":"helper-secret"}\' "$server"\n'))
    env = _env(tmp_path, {"credHelpers": {"reg.example:5000": "hermetictest"}, "auths": {}})
    env["PATH"] = f"{bindir}:{env['PATH']}"
    creds = find_credentials("reg.example:5000", env)
    assert creds is not None and (creds.username, creds.password) == ("helper-user", "helper-secret")
    assert creds.source == "credential helper hermetictest"


def test_creds_store_not_found_means_anonymous_and_token_username_means_identity(tmp_path: Path) -> None:
    bindir = _helper(tmp_path, "store", (
        'read server\n'
        'if [ "$server" = known.example ]; then echo \'{"Username":"<token>","Secret":"idtok"}\'; exit 0; fi\n'
        'echo "credentials not found in native keychain"; exit 1\n'))
    env = _env(tmp_path, {"credsStore": "store"})
    env["PATH"] = f"{bindir}:{env['PATH']}"
    assert find_credentials("unknown.example", env) is None
    creds = find_credentials("known.example", env)
    assert creds is not None and creds.identity_token == "idtok"


def test_missing_or_failing_helper_is_one_clear_line(tmp_path: Path) -> None:
    env = _env(tmp_path, {"credsStore": "nonexistent-helper"})
    with pytest.raises(AuthError, match="docker-credential-nonexistent-helper is not on PATH"):
        find_credentials("reg.example", env)
    bindir = _helper(tmp_path, "broken", 'echo "keychain locked" >&2; exit 3\n')
    env = _env(tmp_path, {"credsStore": "broken"})
    env["PATH"] = f"{bindir}:{env['PATH']}"
    with pytest.raises(AuthError, match="keychain locked"):
        find_credentials("reg.example", env)


def test_credentials_repr_hides_secrets() -> None:
    c = Credentials(username="u", password="hunter2", identity_token="tok-xyz", source="environment")
    assert "hunter2" not in repr(c) and "tok-xyz" not in repr(c) and "hunter2" not in str(c)


def test_parse_bearer_and_basic_challenges() -> None:
    ch = parse_challenge('Bearer realm="https://auth.example/token",service="registry.example",'
                         'scope="repository:a/b:pull,push"')
    assert ch is not None and ch.scheme == "bearer"
    assert ch.params == {"realm": "https://auth.example/token", "service": "registry.example",
                         "scope": "repository:a/b:pull,push"}
    basic = parse_challenge('Basic realm="hermetic-test"')
    assert basic is not None and basic.scheme == "basic" and basic.realm == "hermetic-test"
    assert parse_challenge("") is None


def test_normalize_config_key() -> None:
    assert normalize_config_key("https://index.docker.io/v1/") == "index.docker.io"
    assert normalize_config_key("127.0.0.1:5000") == "127.0.0.1:5000"


def test_cache_tag_is_a_pure_valid_function_of_the_key() -> None:
    key = "ab" * 32
    assert cache_tag(key) == cache_tag(key) == "hk-" + key
    assert len(cache_tag(key)) <= 128
    assert cache_tag("cd" * 32) != cache_tag(key)
    for bad in ("AB" * 32, "ab" * 31, "sha256:" + "ab" * 32):
        with pytest.raises(ValueError):
            cache_tag(bad)
