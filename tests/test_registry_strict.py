"""The registry client is strict (issue 24, item 7): what a registry answers is data, never trusted.

- A digest that is not ``sha256:<64 lowercase hex>``: 64 when the user typed it, 65 when a registry
  said it (a manifest, an index, a Docker-Content-Digest header, a referrers list); one line naming
  the value, never a traceback, never a path or a URL.
- Deadlines: a registry that accepts and never answers, trickles a body, or trickles its headers ends
  the pull or push with 75 naming the blob or manifest, within the configured deadline.
- Text from a registry is printed with its control characters escaped: one error line, no forged one.
- Attestations are checked, what they say included, before any blob of the pull enters the store.

The misbehaving registries are FakeRegistry (tests/registry_support.py) on 127.0.0.1; the attestation
tests push to the real docker-registry and tamper with its storage. Timings are never asserted: a
subprocess timeout only proves that nothing hangs.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.core.canonical import canonical_json, sha256_digest
from hermetic.core.display import escape_controls
from hermetic.core.errors import EXIT_USAGE, UsageError
from hermetic.provenance import MT_CYCLONEDX, MT_DSSE, MT_STATEMENT
from hermetic.registry import RegistryCache
from hermetic.registry.deadlines import REQUEST_TIMEOUT_ENV, TOTAL_TIMEOUT_ENV, Timeouts
from hermetic.store.oci import MT_INDEX, MT_MANIFEST, Descriptor, OciStore
from hermetic.store.referrers import add_referrers, artifact_manifest
from registry_support import (
    FakeRegistry,
    Reply,
    have_registry_tools,
    make_image,
    random_layer,
    registry_env,
    self_signed_cert,
    start_registry,
)

pytestmark = [pytest.mark.registry]
REPO_ROOT = Path(__file__).resolve().parent.parent
UPPER = "sha256:" + "ABCDEF0123456789" * 4  # 64 hex digits, but not lowercase
SHORT = "sha256:xyz"
TRAVERSAL = "sha256:../../../../../../tmp/hermetic-escape"
NO_HANG_S = 60  # a subprocess that runs longer than this hung (the deadlines in the tests are 1-2 s)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A new process's environment: its own cache, no credentials, no proxy, default deadlines."""
    return registry_env(tmp_path)


def hermetic(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, whole_env=True, cwd=cwd or REPO_ROOT, timeout=NO_HANG_S)


def store_of(env: dict[str, str]) -> OciStore:
    return OciStore(Path(env["HERMETIC_CACHE"]) / "oci")


def seeded_store(env: dict[str, str]) -> OciStore:
    """The pulling machine's store, holding another image already (so 'unchanged' is not 'empty')."""
    store = store_of(env).ensure()
    make_image(store, [random_layer(2000, seed=1)], ref="already/here:v1")
    return store


def snapshot(store: OciStore) -> dict[str, bytes]:
    """Every file under the store (lock files included), by path: what 'the store is unchanged' compares.
    The gc lock is there once a pull has begun (empty: it is only ever flock-ed), and is no content."""
    return {str(p.relative_to(store.root)): p.read_bytes() for p in sorted(store.root.rglob("*"))
            if p.is_file() and not (p.name == ".gc.lock" and p.parent == store.root and p.stat().st_size == 0)}


# -- digests the user typed: 64 -------------------------------------------------------------

@pytest.mark.parametrize("digest", [UPPER, SHORT, "sha512:" + "a" * 128, "sha256:" + "a" * 63])
@pytest.mark.parametrize("command", ["pull", "verify", "push"])
def test_a_malformed_digest_the_user_typed_is_a_usage_error(command, digest, env) -> None:
    proc = hermetic(command, f"127.0.0.1:9/team/x@{digest}", env=env)
    assert_clean_error(proc, 64, digest)


@pytest.mark.parametrize("digest", [UPPER, SHORT])
def test_push_image_option_with_a_malformed_digest_is_a_usage_error(digest, env) -> None:
    proc = hermetic("push", "127.0.0.1:9/team/x:v1", "--image", digest, env=env)
    assert_clean_error(proc, 64, "--image", digest)


def test_a_cache_ref_with_a_malformed_digest_is_a_usage_error() -> None:
    for ref in (f"127.0.0.1:9/team/cache@{SHORT}", f"127.0.0.1:9/team/cache@{UPPER}"):
        with pytest.raises(UsageError) as e:
            RegistryCache(ref)
        assert e.value.exit_code == EXIT_USAGE and ref in e.value.message


# -- digests a registry answered: 65 ----------------------------------------------------------

def _layer_desc(digest: object, size: object = 3) -> dict:
    return {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}


@pytest.mark.parametrize("bad_layer, shown", [
    (_layer_desc(UPPER), UPPER),
    (_layer_desc(SHORT), SHORT),
    (_layer_desc(TRAVERSAL), TRAVERSAL),
    (_layer_desc(None), "None"),
    (_layer_desc("sha256:" + "a" * 64, size=-1), "-1"),
    (_layer_desc("sha256:" + "a" * 64, size="3"), "'3'"),
])
def test_a_malformed_descriptor_in_a_manifest_is_refused_and_nothing_is_stored(bad_layer, shown, env) -> None:
    with FakeRegistry() as fake:
        config = b'{"architecture":"amd64","os":"linux"}'
        fake.serve_blob("team/x", config)
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": sha256_digest(config), "size": len(config)},
                    "layers": [bad_layer]}
        digest = fake.serve_manifest("team/x", json.dumps(manifest).encode())
        before = snapshot(seeded_store(env))
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, 65, shown)
    assert snapshot(store_of(env)) == before
    assert not Path("/tmp/hermetic-escape").exists()
    # Refused on reading the manifest: no blob of it was asked for, so no bad digest became a URL.
    assert {p for _, p in fake.requests} <= {"/v2/", f"/v2/team/x/manifests/{digest}"}


@pytest.mark.parametrize("bad", [UPPER, SHORT, TRAVERSAL])
def test_a_malformed_digest_in_an_index_is_refused(bad, env) -> None:
    with FakeRegistry() as fake:
        index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [
            {"mediaType": MT_MANIFEST, "digest": bad, "size": 10, "platform": {"os": "linux", "architecture": "amd64"}}]}
        digest = fake.serve_manifest("team/x", json.dumps(index).encode(), MT_INDEX)
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, 65, bad)
    assert {p for _, p in fake.requests} <= {"/v2/", f"/v2/team/x/manifests/{digest}"}


@pytest.mark.parametrize("bad", [UPPER, SHORT])
def test_a_malformed_docker_content_digest_header_is_refused(bad, env, tmp_path) -> None:
    with FakeRegistry() as fake:
        # `hermetic base pin HOST/REPO:TAG` trusts the header for the pin: a malformed one is refused.
        fake.routes[("HEAD", "/v2/team/base/manifests/v1")] = Reply(
            200, b"", {"Content-Type": MT_MANIFEST, "Docker-Content-Digest": bad})
        pin = hermetic("base", "pin", f"{fake.host}/team/base:v1", env=env, cwd=tmp_path)
        # A pull reads it on the manifest's answer too.
        digest = fake.serve_image("team/x", [b"layer"])
        get = ("GET", f"/v2/team/x/manifests/{digest}")
        fake.routes[get] = Reply(200, fake.routes[get].body, {"Content-Type": MT_MANIFEST, "Docker-Content-Digest": bad})
        pull = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(pin, 65, "Docker-Content-Digest", bad)
    assert_clean_error(pull, 65, "Docker-Content-Digest", bad)
    assert not (tmp_path / "hermetic.yaml").exists()


@pytest.mark.parametrize("bad", [UPPER, SHORT])
def test_a_malformed_digest_in_a_referrers_list_is_refused_and_nothing_is_stored(bad, env) -> None:
    with FakeRegistry() as fake:
        digest = fake.serve_image("team/x", [random_layer(3000, seed=2)])
        listing = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [
            {"mediaType": MT_MANIFEST, "digest": bad, "size": 100, "artifactType": MT_STATEMENT}]}
        fake.routes[("GET", f"/v2/team/x/referrers/{digest}")] = Reply(
            200, json.dumps(listing).encode(), {"Content-Type": MT_INDEX})
        before = snapshot(seeded_store(env))
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, 65, bad, "referrers")
    assert snapshot(store_of(env)) == before


def test_a_malformed_digest_answered_to_a_push_is_refused(env) -> None:
    store = store_of(env).ensure()
    digest = make_image(store, [random_layer(1000, seed=3)])
    with FakeRegistry() as fake:
        for b in store.image_blobs(digest):  # the registry has every blob already
            fake.routes[("HEAD", f"/v2/team/x/blobs/{b.digest}")] = Reply(200, b"", {"Content-Length": str(b.size)})
        fake.routes[("PUT", "/v2/team/x/manifests/v1")] = Reply(201, b"", {"Docker-Content-Digest": UPPER})
        proc = hermetic("push", f"{fake.host}/team/x:v1", "--image", digest, env=env)
    assert_clean_error(proc, 65, "Docker-Content-Digest", UPPER)


def test_the_store_refuses_a_malformed_digest_as_a_path(tmp_path) -> None:
    store = OciStore(tmp_path / "store").ensure()
    for bad in (UPPER, SHORT, TRAVERSAL, ""):
        with pytest.raises(ValueError) as e:  # a BadDigest: an IntegrityError (65) and a ValueError
            store.blob_path(bad)
        assert getattr(e.value, "exit_code", None) == 65
        with pytest.raises(ValueError):
            store.has_blob(bad)
    assert not Path("/tmp/hermetic-escape").exists()


# -- deadlines: 75, and nothing hangs -------------------------------------------------------------

def test_a_registry_that_never_answers_ends_the_pull_within_the_deadline(env) -> None:
    with FakeRegistry() as fake:
        digest = sha256_digest(b"anything")
        fake.routes[("GET", f"/v2/team/x/manifests/{digest}")] = fake.stall
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env={**env, TOTAL_TIMEOUT_ENV: "2"})
    assert_clean_error(proc, 75, f"manifest {digest} of team/x", TOTAL_TIMEOUT_ENV)


def test_a_per_request_deadline_ends_a_stalled_request(env) -> None:
    with FakeRegistry() as fake:
        digest = sha256_digest(b"anything")
        fake.routes[("GET", f"/v2/team/x/manifests/{digest}")] = fake.stall
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env={**env, REQUEST_TIMEOUT_ENV: "1"})
    assert_clean_error(proc, 75, f"manifest {digest} of team/x", REQUEST_TIMEOUT_ENV)


def test_a_trickled_blob_ends_the_pull_at_the_deadline_and_nothing_is_stored(env) -> None:
    layer = random_layer(4000, seed=4)
    with FakeRegistry() as fake:
        digest = fake.serve_image("team/x", [layer])
        fake.routes[("GET", f"/v2/team/x/blobs/{sha256_digest(layer)}")] = fake.trickle(len(layer))
        before = snapshot(seeded_store(env))
        # One byte every 0.2 s never trips the 60 s pause limit; only the 2 s deadline of the pull ends it.
        proc = hermetic("pull", "--timeout", "2", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, 75, f"blob {sha256_digest(layer)} of team/x", "2 s")
    assert snapshot(store_of(env)) == before


def test_trickled_headers_cannot_hold_a_request_past_its_deadline(env) -> None:
    with FakeRegistry() as fake:
        digest = sha256_digest(b"anything")
        fake.routes[("GET", f"/v2/team/x/manifests/{digest}")] = fake.trickle_headers()
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env={**env, REQUEST_TIMEOUT_ENV: "2"})
    assert_clean_error(proc, 75, f"manifest {digest} of team/x")


def test_the_deadline_holds_over_tls(tmp_path, monkeypatch) -> None:
    """Real registries speak HTTPS: the watchdog shuts a TLS socket down just the same."""
    from hermetic.registry.client import RegistryClient
    from hermetic.registry.deadlines import RegistryTimeout

    cert, key = self_signed_cert(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    with FakeRegistry(tls=(cert, key)) as fake:
        digest = fake.serve_image("team/x", [b"layer"])
        client = RegistryClient(fake.host, scheme="https", credentials=False, timeouts=Timeouts(total=600, request=2))
        assert client.get_manifest("team/x", digest).digest_header == digest  # TLS works
        fake.routes[("GET", f"/v2/team/x/manifests/{digest}")] = fake.trickle_headers(for_s=3 * NO_HANG_S)
        outcome: list[BaseException] = []
        worker = threading.Thread(target=lambda: _catch(outcome, client.get_manifest, "team/x", digest), daemon=True)
        worker.start()
        worker.join(NO_HANG_S)
        assert not worker.is_alive(), "the request outlived its deadline"
    assert len(outcome) == 1 and isinstance(outcome[0], RegistryTimeout), outcome
    assert outcome[0].exit_code == 75 and f"manifest {digest} of team/x" in outcome[0].message


def _catch(into: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 (the test looks at it)
        into.append(e)


def test_a_stalled_upload_ends_the_push_naming_the_blob(env) -> None:
    store = store_of(env).ensure()
    layer = random_layer(1000, seed=5)
    digest = make_image(store, [layer])
    with FakeRegistry() as fake:
        fake.routes[("POST", "/v2/team/x/blobs/uploads/")] = Reply(202, b"", {"Location": "/v2/team/x/blobs/uploads/u1"})
        fake.routes[("PUT", "/v2/team/x/blobs/uploads/u1")] = fake.stall
        proc = hermetic("push", f"{fake.host}/team/x:v1", "--image", digest, "--timeout", "2", env=env)
    assert_clean_error(proc, 75, "the upload of blob sha256:", "team/x")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e300"])
def test_a_bad_deadline_setting_is_a_usage_error(value, env) -> None:
    with pytest.raises(UsageError):
        Timeouts.from_env({TOTAL_TIMEOUT_ENV: value})
    proc = hermetic("pull", f"127.0.0.1:9/team/x@{sha256_digest(b'x')}", env={**env, REQUEST_TIMEOUT_ENV: value})
    assert_clean_error(proc, 64, REQUEST_TIMEOUT_ENV)


# -- text from a registry cannot forge output ----------------------------------------------------

FORGED = "bad\r\nhermetic: ok: pull succeeded\n\x1b[2J\x1b]0;pwned\x07\u009b31m\u2028done"


@pytest.mark.parametrize("status, code", [(400, 76), (403, 77), (404, 66), (500, 76)])
def test_control_characters_in_an_error_body_are_escaped(status, code, env) -> None:
    with FakeRegistry() as fake:
        digest = sha256_digest(b"anything")
        body = json.dumps({"errors": [{"code": "MANIFEST_INVALID\r\nhermetic: ok: x", "message": FORGED}]}).encode()
        fake.routes[("GET", f"/v2/team/x/manifests/{digest}")] = Reply(status, body, {"Content-Type": "application/json"})
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, code)
    lines = proc.stderr.splitlines()
    assert [ln for ln in lines if ln.startswith("hermetic:")] == [ln for ln in lines if ln.startswith("hermetic: error:")]
    assert not any(ln.startswith("hermetic: ok") for ln in lines)
    for c in ("\r", "\x1b", "\x07", "\u009b", "\u2028"):
        assert c not in proc.stderr
    assert "bad\\r\\nhermetic: ok: pull succeeded\\n\\x1b[2J" in proc.stderr  # escaped, still readable


def test_control_characters_in_a_header_are_escaped(env) -> None:
    with FakeRegistry() as fake:
        fake.routes[("GET", "/v2/")] = Reply(401, b"", {"WWW-Authenticate": 'Evil\x1b[2J\x1b]0;t\x07 realm="x"'})
        proc = hermetic("pull", f"{fake.host}/team/x@{sha256_digest(b'x')}", env=env)
    assert_clean_error(proc, 77, "unsupported auth scheme")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr


def test_escape_controls_keeps_text_and_escapes_controls() -> None:
    assert escape_controls("plain — ünïcode ok") == "plain — ünïcode ok"
    assert escape_controls("a\r\nb\tc\x1b[0m\x7f\x9b\u2028\u202e") == "a\\r\\nb\\tc\\x1b[0m\\x7f\\x9b\\u2028\\u202e"
    assert escape_controls("x" * 50, limit=10) == "x" * 10 + "… (50 characters)"


# -- attestations are checked before anything is stored (the real registry) ----------------------------

@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    if have_registry_tools() is not None:
        pytest.skip(str(have_registry_tools()))
    server = start_registry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


def _statement(subject_digest: str) -> bytes:
    return canonical_json({"_type": "https://in-toto.io/Statement/v1",
                           "subject": [{"name": "image", "digest": {"sha256": subject_digest.partition(":")[2]}}],
                           "predicateType": "https://example.org/test-attestation/v1", "predicate": {}})


def _envelope(payload: bytes) -> bytes:
    import base64

    return canonical_json({"payloadType": MT_STATEMENT, "payload": base64.b64encode(payload).decode(),
                           "signatures": [{"keyid": "test", "sig": base64.b64encode(b"not checked by a pull").decode()}]})


def _pushed_image(registry, tmp_path: Path, repo: str, attach) -> tuple[str, dict[str, bytes]]:
    """An image with the attestations ``attach(subject)`` returns ({type: blob}), pushed to ``repo``."""
    from hermetic.registry import push_image

    store = OciStore(tmp_path / f"publisher-{repo.replace('/', '-')}").ensure()
    digest = make_image(store, [random_layer(5000, seed=sum(repo.encode()))])
    subject = Descriptor(MT_MANIFEST, digest, store.blob_size(digest))
    blobs = attach(subject)
    add_referrers(store, digest, [artifact_manifest(subject, t, b) for t, b in blobs.items()])
    push_image(store, digest, f"{registry.host}/{repo}:v1")
    return digest, blobs


def test_honest_attestations_are_pulled_along(registry, tmp_path, env) -> None:
    """The control: the same layout, untampered, is pulled with its attestations."""
    digest, _ = _pushed_image(registry, tmp_path, "strict/honest", lambda s: {
        MT_STATEMENT: _statement(s.digest), MT_CYCLONEDX: b'{"bomFormat":"CycloneDX"}',
        MT_DSSE: _envelope(_statement(s.digest))})
    proc = hermetic("pull", f"{registry.host}/strict/honest@{digest}", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert {a.split()[0] for a in json.loads(proc.stdout)["attestations"]} == {MT_STATEMENT, MT_CYCLONEDX, MT_DSSE}


def test_a_tampered_attestation_blob_is_refused_and_the_store_is_unchanged(registry, tmp_path, env) -> None:
    digest, blobs = _pushed_image(registry, tmp_path, "strict/tampered", lambda s: {
        MT_STATEMENT: _statement(s.digest), MT_CYCLONEDX: b'{"bomFormat":"CycloneDX","components":[]}'})
    data = registry.blob_data_path(sha256_digest(blobs[MT_CYCLONEDX]))
    data.write_bytes(data.read_bytes().replace(b"components", b"compunents"))
    before = snapshot(seeded_store(env))
    proc = hermetic("pull", f"{registry.host}/strict/tampered@{digest}", env=env)
    assert_clean_error(proc, 65, MT_CYCLONEDX, "nothing was stored")
    assert snapshot(store_of(env)) == before


@pytest.mark.parametrize("kind", ["statement", "envelope"])
def test_an_attestation_about_another_image_is_refused_and_the_store_is_unchanged(kind, registry, tmp_path,
                                                                                    env) -> None:
    """Every digest matches; what the document says does not: it is about another image."""
    other = sha256_digest(b"another image")
    digest, _ = _pushed_image(registry, tmp_path, f"strict/other-{kind}", lambda s: (
        {MT_STATEMENT: _statement(other)} if kind == "statement" else
        {MT_STATEMENT: _statement(s.digest), MT_DSSE: _envelope(_statement(other))}))
    before = snapshot(seeded_store(env))
    proc = hermetic("pull", f"{registry.host}/strict/other-{kind}@{digest}", env=env)
    assert_clean_error(proc, 65, f"its subject is not the image {digest}")
    assert snapshot(store_of(env)) == before
