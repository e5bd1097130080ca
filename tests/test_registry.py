"""Push/pull against a real docker-registry (Distribution 2.8) on 127.0.0.1.

Independent readers check what we write: skopeo (inspect docker:// and
oci:) and the Docker Engine (pull by digest, run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.core.canonical import sha256_digest
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.registry import (
    cache_fetch,
    cache_lookup,
    cache_publish,
    cache_tag,
    ensure_image,
    pull_image,
    push_image,
    repo_digests,
    resolve_tag,
)
from hermetic.registry.auth import AuthError, Credentials
from hermetic.registry.client import RegistryClient
from hermetic.store.oci import (
    MT_DOCKER_CONFIG,
    MT_DOCKER_LAYER,
    MT_DOCKER_LIST,
    MT_DOCKER_MANIFEST,
    MT_INDEX,
    MT_MANIFEST,
    Descriptor,
    OciStore,
)
from registry_support import (
    FaultProxy,
    RegistryServer,
    busybox_layer,
    have_registry_tools,
    make_image,
    normalized_tar,
    random_layer,
    start_registry,
)

pytestmark = [
    pytest.mark.registry,
    pytest.mark.skipif(have_registry_tools() is not None, reason=str(have_registry_tools())),
]
REPO_ROOT = Path(__file__).resolve().parent.parent


# -- fixtures ---------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _no_ambient_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the credentials they set up themselves."""
    empty = tmp_path / "empty-docker-config"
    empty.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(empty))
    monkeypatch.delenv("HERMETIC_REGISTRY_USER", raising=False)
    monkeypatch.delenv("HERMETIC_REGISTRY_PASSWORD", raising=False)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    server = start_registry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def htpasswd_registry(tmp_path_factory: pytest.TempPathFactory):
    server = start_registry(tmp_path_factory.mktemp("registry-htpasswd"), auth="htpasswd")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory):
    server = start_registry(tmp_path_factory.mktemp("registry-token"), auth="token")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def layer() -> bytes:
    return busybox_layer()


@pytest.fixture
def store(tmp_path: Path) -> OciStore:
    return OciStore(tmp_path / "store").ensure()


@pytest.fixture
def fresh_store(tmp_path: Path) -> OciStore:
    return OciStore(tmp_path / "fresh-store").ensure()


def _store_snapshot(store: OciStore) -> dict[str, bytes]:
    """Every file in the store except the lock files, by relative path."""
    return {str(p.relative_to(store.root)): p.read_bytes()
            for p in sorted(store.root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _hermetic(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, whole_env=True, timeout=timeout, cwd=REPO_ROOT)


def _cli_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMETIC_REGISTRY_")}
    env["HERMETIC_CACHE"] = str(cache)
    env.update(extra)
    return env


# -- push / pull round trips ------------------------------------------------------------

def test_push_then_pull_into_an_empty_store_gives_the_same_digest(registry, store, fresh_store, layer) -> None:
    digest = make_image(store, [layer], ref="roundtrip:v1")
    pushed = push_image(store, digest, f"{registry.host}/roundtrip/img:v1")
    assert pushed.repo_digest == f"{registry.host}/roundtrip/img@{digest}"
    assert pushed.stats.blobs_uploaded == 2 and pushed.stats.blobs_skipped == 0
    assert repo_digests(store, digest) == [pushed.repo_digest]

    pulled = pull_image(fresh_store, pushed.repo_digest)
    assert pulled.manifest_digest == digest and not pulled.already_present
    assert pulled.stats.blobs_downloaded == 2
    assert fresh_store.has_image(digest)
    for blob in [digest] + [d.digest for d in store.image_blobs(digest)]:
        assert fresh_store.read_blob(blob) == store.read_blob(blob)
    assert fresh_store.resolve(pulled.ref_name).digest == digest
    assert repo_digests(fresh_store, digest) == [pushed.repo_digest]
    # The tag resolves to the same digest.
    assert resolve_tag(f"{registry.host}/roundtrip/img:v1") == digest

    # Present already: no network at all (a client for a dead port would fail).
    offline = RegistryClient("127.0.0.1:9")
    again = pull_image(fresh_store, pushed.repo_digest, client=offline)
    assert again.already_present and again.manifest_digest == digest
    assert ensure_image(fresh_store, pushed.repo_digest, client=offline) == digest


def test_second_push_skips_everything_and_another_repo_mounts(registry, store, layer) -> None:
    digest = make_image(store, [layer], label="mount")
    push_image(store, digest, f"{registry.host}/mount/a:v1")
    manifest_size = store.blob_size(digest)

    again = push_image(store, digest, f"{registry.host}/mount/a:v1")
    assert again.stats.blobs_skipped == 2 and again.stats.blobs_uploaded == 0
    assert again.stats.bytes_sent == manifest_size  # only the manifest went over the wire

    other = push_image(store, digest, f"{registry.host}/mount/b")
    assert other.stats.blobs_mounted == 2 and other.stats.blobs_uploaded == 0
    assert other.stats.bytes_sent == manifest_size
    assert other.tag is None  # pushed by digest only
    assert sorted(repo_digests(store, digest)) == [f"{registry.host}/mount/a@{digest}",
                                                   f"{registry.host}/mount/b@{digest}"]


def test_a_stale_mount_record_falls_back_to_upload(registry, store, fresh_store, layer) -> None:
    from hermetic.registry.locations import record_blob_locations

    digest = make_image(store, [layer], label="stale-mount")
    blobs = [d.digest for d in store.image_blobs(digest)]
    record_blob_locations(store, registry.host, "never/pushed", blobs)  # the record says so; the registry disagrees
    result = push_image(store, digest, f"{registry.host}/stale/img:v1")
    assert result.stats.blobs_mounted == 0 and result.stats.blobs_uploaded == 2
    assert pull_image(fresh_store, result.repo_digest).manifest_digest == digest


def test_chunked_upload_of_a_big_blob(registry, store, fresh_store, layer) -> None:
    big = random_layer(300_000, seed=7)
    digest = make_image(store, [layer, big], label="chunked")
    result = push_image(store, digest, f"{registry.host}/chunked/img:v1", chunked_threshold=100_000,
                        chunk_size=64 << 10)
    assert result.stats.blobs_uploaded == 3
    assert pull_image(fresh_store, result.repo_digest).manifest_digest == digest
    assert fresh_store.read_blob(sha256_digest(big)) == big


def test_skopeo_reads_what_we_pushed_and_our_store(registry, store, layer) -> None:
    digest = make_image(store, [layer], ref="skopeo-check:v1", label="skopeo")
    push_image(store, digest, f"{registry.host}/skopeo/img:v1")
    out = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{registry.host}/skopeo/img@{digest}"],
                         capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["Digest"] == digest and info["Layers"] == [sha256_digest(layer)]
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{registry.host}/skopeo/img:v1"],
                         capture_output=True, check=True).stdout
    assert raw == store.read_blob(digest)  # byte for byte
    local = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{store.root}:skopeo-check:v1"],
                                      capture_output=True, text=True, check=True).stdout)
    assert local["Digest"] == digest


def test_pulled_store_ref_is_readable_by_skopeo(registry, store, fresh_store, layer) -> None:
    digest = make_image(store, [layer], label="skopeo-pulled")
    pushed = push_image(store, digest, f"{registry.host}/skopeo/pulled:v1")
    pulled = pull_image(fresh_store, pushed.repo_digest)
    local = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{fresh_store.root}:{pulled.ref_name}"],
                                      capture_output=True, text=True, check=True).stdout)
    assert local["Digest"] == digest


def _docker_v2_image(store: OciStore, layer: bytes, label: str) -> str:
    """The same kind of image as a Docker v2 schema 2 manifest (what `docker push` writes)."""
    layer_digest = store.put_bytes(layer)
    config = {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/busybox", "echo", label]},
              "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    cd, cs, _ = store.put_json(config)
    manifest = {"schemaVersion": 2, "mediaType": MT_DOCKER_MANIFEST,
                "config": {"mediaType": MT_DOCKER_CONFIG, "digest": cd, "size": cs},
                "layers": [{"mediaType": MT_DOCKER_LAYER, "digest": layer_digest, "size": len(layer)}]}
    digest, _, _ = store.put_json(manifest)
    return digest


def test_docker_v2_schema2_manifest_round_trip(registry, store, fresh_store, layer) -> None:
    digest = _docker_v2_image(store, layer, "v2s2")
    pushed = push_image(store, digest, f"{registry.host}/dockerv2/img:v1")
    assert pushed.media_type == MT_DOCKER_MANIFEST
    pulled = pull_image(fresh_store, pushed.repo_digest)
    assert pulled.manifest_digest == digest and pulled.media_type == MT_DOCKER_MANIFEST
    assert fresh_store.has_image(digest)


@pytest.mark.parametrize("index_type", [MT_INDEX, MT_DOCKER_LIST])
def test_pull_of_an_index_takes_linux_amd64(registry, store, fresh_store, layer, index_type) -> None:
    if index_type == MT_INDEX:
        amd64 = make_image(store, [layer], label="amd64")
        arm64 = make_image(store, [normalized_tar({"etc/arch": b"arm64\n"})], label="arm64")
        child_type = MT_MANIFEST
    else:
        amd64 = _docker_v2_image(store, layer, "amd64-list")
        arm64 = _docker_v2_image(store, normalized_tar({"etc/arch": b"arm64\n"}), "arm64-list")
        child_type = MT_DOCKER_MANIFEST
    index = {"schemaVersion": 2, "mediaType": index_type, "manifests": [
        {**Descriptor(child_type, arm64, store.blob_size(arm64)).to_json(),
         "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        {**Descriptor(child_type, amd64, store.blob_size(amd64)).to_json(),
         "platform": {"os": "linux", "architecture": "amd64"}},
    ]}
    index_digest, _, _ = store.put_json(index)
    repo = f"{registry.host}/multi/{'oci' if index_type == MT_INDEX else 'docker'}"
    pushed = push_image(store, index_digest, f"{repo}:v1")
    assert pushed.media_type == index_type

    pulled = pull_image(fresh_store, f"{repo}@{index_digest}")
    assert pulled.manifest_digest == amd64 and pulled.requested_digest == index_digest
    assert fresh_store.has_image(amd64) and not fresh_store.has_blob(arm64)
    assert fresh_store.has_blob(index_digest)  # kept, so the index digest resolves offline
    assert ensure_image(fresh_store, f"{repo}@{index_digest}", client=RegistryClient("127.0.0.1:9")) == amd64
    assert f"{repo}@{index_digest}" in repo_digests(fresh_store, index_digest)
    # A pin of the tag names the index (what `hermetic base pin` records).
    assert resolve_tag(f"{repo}:v1") == index_digest


def test_incomplete_image_is_refused_before_anything_is_sent(registry, store, layer) -> None:
    digest = make_image(store, [layer], label="incomplete")
    config = store.image_blobs(digest)[0]
    store.blob_path(config.digest).unlink()
    with pytest.raises(HermeticError, match=f"blob {config.digest} is missing"):
        push_image(store, digest, f"{registry.host}/incomplete/img:v1")
    assert RegistryClient(registry.host).head_manifest("incomplete/img", "v1") is None


def test_unpinned_and_hostless_pulls_are_refused(store) -> None:
    with pytest.raises(HermeticError, match="not pinned by digest") as refused:
        pull_image(store, "127.0.0.1:5000/some/img:latest")
    # The hint spells what to pull with host, port and repository kept (it once said 127.0.0.1@sha256:…).
    assert "hermetic pull 127.0.0.1:5000/some/img@sha256:…" in refused.value.hint
    proc = run_cli("pull", "127.0.0.1:5611/t/ex:v1")
    assert_clean_error(proc, 64, "127.0.0.1:5611/t/ex:v1 is not pinned by digest")
    assert "hint: pull by digest: hermetic pull 127.0.0.1:5611/t/ex@sha256:…" in proc.stderr
    with pytest.raises(HermeticError, match="names no registry"):
        ensure_image(store, "some/img@sha256:" + "0" * 64)


# -- integrity ---------------------------------------------------------------------

def test_a_registry_serving_a_wrong_blob_is_refused_and_the_store_is_unchanged(registry, store, fresh_store,
                                                                                layer) -> None:
    big = random_layer(200_000, seed=11)
    digest = make_image(store, [layer, big], label="tamper-proxy")
    push_image(store, digest, f"{registry.host}/tamper/proxy:v1")
    proxy = FaultProxy(registry.host, tamper_digest=sha256_digest(big)).start()
    try:
        before = _store_snapshot(fresh_store)
        with pytest.raises(IntegrityError, match=f"blob {sha256_digest(big)} with content hashing to sha256:"):
            pull_image(fresh_store, f"{proxy.host}/tamper/proxy@{digest}")
        assert _store_snapshot(fresh_store) == before
        assert list(fresh_store.tmp.iterdir()) == []  # no temp file left behind either
        assert not fresh_store.has_blob(sha256_digest(layer))  # not even the good blob: all or nothing
    finally:
        proxy.stop()
    # Straight from the registry it is fine.
    assert pull_image(fresh_store, f"{registry.host}/tamper/proxy@{digest}").manifest_digest == digest


def test_a_download_that_breaks_off_is_retried(registry, store, fresh_store, layer) -> None:
    big = random_layer(300_000, seed=13)
    digest = make_image(store, [layer, big], label="flaky")
    push_image(store, digest, f"{registry.host}/flaky/img:v1")
    proxy = FaultProxy(registry.host, break_once_digest=sha256_digest(big)).start()
    try:
        pulled = pull_image(fresh_store, f"{proxy.host}/flaky/img@{digest}")
    finally:
        proxy.stop()
    assert proxy.break_once_digest is None  # the fault did fire
    assert pulled.manifest_digest == digest and fresh_store.read_blob(sha256_digest(big)) == big
    assert list(fresh_store.tmp.iterdir()) == []


def test_a_tampered_blob_on_the_registry_disk_fails_the_cli_with_one_line(registry, store, tmp_path, layer) -> None:
    evil = normalized_tar({"etc/motd": b"hello\n" * 100})
    digest = make_image(store, [layer, evil], label="tamper-disk")
    push_image(store, digest, f"{registry.host}/tamper/disk:v1")
    data = registry.blob_data_path(sha256_digest(evil))
    raw = bytearray(data.read_bytes())
    raw[600] ^= 0x01
    data.write_bytes(bytes(raw))
    cache = tmp_path / "cli-cache"
    r = _hermetic("pull", f"{registry.host}/tamper/disk@{digest}", env=_cli_env(cache))
    assert r.returncode == IntegrityError.exit_code, r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("hermetic: error:")]
    assert len(errors) == 1 and sha256_digest(evil) in errors[0]
    store_after = OciStore(cache / "oci")
    assert not store_after.has_blob(sha256_digest(evil)) and not store_after.has_blob(digest)


# -- authentication ------------------------------------------------------------------

def test_basic_auth_push_pull_with_environment_credentials(htpasswd_registry: RegistryServer, store, fresh_store,
                                                           layer, monkeypatch) -> None:
    reg = htpasswd_registry
    digest = make_image(store, [layer], label="basic")
    monkeypatch.setenv("HERMETIC_REGISTRY_USER", reg.username)
    monkeypatch.setenv("HERMETIC_REGISTRY_PASSWORD", reg.password)
    pushed = push_image(store, digest, f"{reg.host}/auth/basic:v1")
    assert pull_image(fresh_store, pushed.repo_digest).manifest_digest == digest
    out = subprocess.run(["skopeo", "inspect", "--tls-verify=false", *reg.skopeo_creds(),
                          f"docker://{reg.host}/auth/basic@{digest}"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["Digest"] == digest
    for record in (store.root / "pushed.json", store.root / "blob-locations.json"):
        assert reg.password not in record.read_text()


def test_basic_auth_from_docker_config(htpasswd_registry: RegistryServer, store, layer, tmp_path, monkeypatch) -> None:
    import base64

    reg = htpasswd_registry
    cfg = tmp_path / "docker-config-with-auth"
    cfg.mkdir()
    token = base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {f"http://{reg.host}": {"auth": token}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    digest = make_image(store, [layer], label="docker-config")
    assert push_image(store, digest, f"{reg.host}/auth/config:v1").stats.blobs_uploaded == 2


def test_auth_failures_are_one_line_errors_without_secrets(htpasswd_registry: RegistryServer, store, tmp_path,
                                                           layer) -> None:
    reg = htpasswd_registry
    digest = make_image(store, [layer], label="auth-fail")
    with pytest.raises(AuthError, match="requires a login and no credentials were found"):
        push_image(store, digest, f"{reg.host}/auth/fail:v1")
    wrong = Credentials(username=reg.username, password="wrong-password-123", source="test")
    with pytest.raises(AuthError, match=f"user '{reg.username}' \\(test\\) was refused"):
        push_image(store, digest, f"{reg.host}/auth/fail:v1", client=RegistryClient(reg.host, credentials=wrong))

    cache = tmp_path / "cli-cache"
    cli_store = OciStore(cache / "oci").ensure()
    make_image(cli_store, [layer], ref="auth-fail", label="auth-fail")
    env = _cli_env(cache, HERMETIC_REGISTRY_USER=reg.username, HERMETIC_REGISTRY_PASSWORD="wrong-password-123")
    r = _hermetic("push", f"{reg.host}/auth/fail:v1", "--image", "auth-fail", env=env)
    assert r.returncode == AuthError.exit_code
    assert "Traceback" not in r.stderr and "wrong-password-123" not in r.stderr + r.stdout
    assert r.stderr.startswith("hermetic: error: registry ") and len(r.stderr.strip().splitlines()) == 1


def test_bearer_token_auth(token_registry: RegistryServer, store, fresh_store, layer, monkeypatch) -> None:
    reg = token_registry
    assert reg.token_server is not None
    digest = make_image(store, [layer], label="bearer")
    monkeypatch.setenv("HERMETIC_REGISTRY_USER", reg.username)
    monkeypatch.setenv("HERMETIC_REGISTRY_PASSWORD", reg.password)
    pushed = push_image(store, digest, f"{reg.host}/auth/bearer:v1")
    assert pull_image(fresh_store, pushed.repo_digest).manifest_digest == digest
    asked = [s for r in reg.token_server.requests for s in r["scope"]]
    assert "repository:auth/bearer:pull,push" in asked
    # A mount into another repository asks for pull on the source repository too.
    mounted = push_image(store, digest, f"{reg.host}/auth/bearer2:v1")
    assert mounted.stats.blobs_mounted == 2
    assert "repository:auth/bearer:pull" in [s for r in reg.token_server.requests for s in r["scope"]]

    monkeypatch.setenv("HERMETIC_REGISTRY_PASSWORD", "not-the-password")
    with pytest.raises(AuthError, match=f"authentication failed for user '{reg.username}'") as e:
        pull_image(OciStore(fresh_store.root.parent / "other").ensure(), pushed.repo_digest)
    assert "not-the-password" not in str(e.value)


def test_bearer_with_an_identity_token_from_docker_config(token_registry: RegistryServer, store, layer, tmp_path,
                                                          monkeypatch) -> None:
    reg = token_registry
    assert reg.token_server is not None
    cfg = tmp_path / "docker-config-identity"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps(
        {"auths": {reg.host: {"auth": "", "identitytoken": f"refresh-{reg.password}"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    digest = make_image(store, [layer], label="identity-token")
    assert push_image(store, digest, f"{reg.host}/auth/identity:v1").stats.blobs_uploaded == 2
    grants = [r for r in reg.token_server.requests if r.get("grant") == "refresh_token"]
    assert grants and grants[-1]["user"] == reg.username
    assert "repository:auth/identity:pull,push" in grants[-1]["scope"]


# -- CLI --------------------------------------------------------------------------------

def test_cli_push_reads_the_build_record_and_pull_round_trips(registry, tmp_path, layer) -> None:
    cache = tmp_path / "cli-cache"
    cli_store = OciStore(cache / "oci").ensure()
    digest = make_image(cli_store, [layer], label="cli")
    project = tmp_path / "project"
    project.mkdir()
    (project / "hermetic.yaml").write_text("name: demo\n")
    (project / "hermetic.image.json").write_text(json.dumps({"manifest_digest": digest}))
    env = _cli_env(cache)
    r = _hermetic("push", f"{registry.host}/cli/img:v1", "-C", str(project), "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["repo_digest"] == f"{registry.host}/cli/img@{digest}" and out["blobs_uploaded"] == 2

    r = _hermetic("push", f"{registry.host}/cli/img:v2", "-C", str(project), env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"{registry.host}/cli/img@{digest}"

    other = _cli_env(tmp_path / "other-cache")
    r = _hermetic("pull", f"{registry.host}/cli/img@{digest}", "--json", env=other)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["manifest_digest"] == digest
    assert OciStore(tmp_path / "other-cache" / "oci").has_image(digest)

    r = _hermetic("push", f"{registry.host}/cli/img:v1", "-C", str(tmp_path), env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "--image" in r.stderr


def test_a_push_killed_midway_completes_when_rerun(registry, tmp_path, layer) -> None:
    cache = tmp_path / "cli-cache"
    cli_store = OciStore(cache / "oci").ensure()
    big = random_layer(16_000_000, seed=3)
    digest = make_image(cli_store, [layer, big], label="killed")
    config_digest = cli_store.image_blobs(digest)[0].digest
    proxy = FaultProxy(registry.host, throttle_bps=400_000).start()
    direct = RegistryClient(registry.host)
    try:
        ref = f"{proxy.host}/killed/img:v1"
        proc = subprocess.Popen([sys.executable, "-m", "hermetic", "push", ref, "--image", digest, "--workers", "2"],
                                env=_cli_env(cache), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        landed = []
        while time.monotonic() < deadline and not landed:
            landed = [d for d in (config_digest, sha256_digest(layer))
                      if direct.blob_size("killed/img", d) is not None]
            time.sleep(0.05)
        assert landed, "no blob landed within 60 s"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert direct.blob_size("killed/img", sha256_digest(big)) is None  # the big one was in flight
        assert direct.head_manifest("killed/img", "v1") is None  # no manifest without its blobs

        proxy.throttle_bps = None
        r = _hermetic("push", ref, "--image", digest, "--json", env=_cli_env(cache))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["blobs_skipped"] >= 1 and out["blobs_uploaded"] >= 1
        assert out["repo_digest"] == f"{proxy.host}/killed/img@{digest}"
    finally:
        proxy.stop()
    fresh = OciStore(tmp_path / "after-kill").ensure()
    assert pull_image(fresh, f"{registry.host}/killed/img@{digest}").manifest_digest == digest
    assert fresh.has_image(digest)


# -- CI cache ---------------------------------------------------------------------------

def test_cache_miss_publish_hit(registry, store, fresh_store, layer) -> None:
    key = sha256_digest(b"build inputs v1").split(":")[1]
    repo = f"{registry.host}/ci/cache"
    assert cache_lookup(repo, key) is None
    assert cache_fetch(fresh_store, repo, key) is None
    digest = make_image(store, [layer], label="cache")
    published = cache_publish(store, repo, key, digest)
    assert published.pushed and published.replaced is None and published.tag == cache_tag(key)
    assert cache_lookup(repo, key) == digest
    hit = cache_fetch(fresh_store, repo, key)
    assert hit is not None and hit.manifest_digest == digest and fresh_store.has_image(digest)
    # A second publisher of the same build finds it there and sends nothing.
    again = cache_publish(store, repo, key, digest)
    assert not again.pushed and again.stats.bytes_sent == 0
    assert repo_digests(store, digest) == [f"{repo}@{digest}"]


def test_concurrent_cache_publishes_of_the_same_build_agree(registry, tmp_path, layer) -> None:
    key = sha256_digest(b"racing runners").split(":")[1]
    repo = f"{registry.host}/ci/race"
    stores = [OciStore(tmp_path / f"runner{i}").ensure() for i in range(3)]
    digests = [make_image(s, [layer, random_layer(100_000, seed=5)], label="race") for s in stores]
    assert len(set(digests)) == 1  # reproducible: every runner built the same image
    results, errors = [], []

    def publish(s: OciStore) -> None:
        try:
            # Each runner checks the cache, misses, then publishes: the race to the tag.
            assert cache_lookup(repo, key) in (None, digests[0])
            results.append(cache_publish(s, repo, key, digests[0]))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r.replaced is None for r in results)
    assert cache_lookup(repo, key) == digests[0]


def test_cache_repo_must_be_host_and_repo(store) -> None:
    with pytest.raises(HermeticError, match="HOST\\[:PORT\\]/REPO"):
        cache_lookup("127.0.0.1:5000/ci/cache:tag", "ab" * 32)
    with pytest.raises(HermeticError, match="HOST\\[:PORT\\]/REPO"):
        cache_lookup("ci/cache", "ab" * 32)


# -- the Docker Engine --------------------------------------------------------------------

@pytest.fixture(scope="module")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:  # no engine here
        pytest.skip(f"Docker Engine not reachable: {e}")
    yield client
    client.close()


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["oci-uncompressed", "docker-v2-uncompressed"])
def test_docker_engine_pulls_by_digest_and_runs(registry, store, layer, docker_client, kind) -> None:
    """Docker 20.10 accepts our uncompressed layers under both manifest types and keeps the config digest as ID."""
    if kind == "oci-uncompressed":
        digest = make_image(store, [layer], cmd=["echo", f"hello {kind}"], label=kind)
    else:
        digest = _docker_v2_image(store, layer, f"hello {kind}")
    config_digest = store.image_blobs(digest)[0].digest
    pushed = push_image(store, digest, f"{registry.host}/engine/{kind}:v1")
    ref = pushed.repo_digest
    try:
        image = docker_client.images.pull(ref)
        assert image.id == config_digest
        assert ref in image.attrs["RepoDigests"]
        out = docker_client.containers.run(ref, remove=True, network_mode="none")
        assert out.decode().strip() == f"hello {kind}"
    finally:
        try:
            docker_client.images.remove(ref)
        except Exception:
            pass
