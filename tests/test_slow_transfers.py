"""Transfers that crawl end (issue 40, item 6): a blob that moves slower than the minimum rate over the window
(HERMETIC_REGISTRY_MIN_RATE, HERMETIC_REGISTRY_RATE_WINDOW, as curl's --speed-limit/--speed-time) ends the pull
or push with 75, one line naming the registry, the blob, the rate seen and the limit; nothing half-written stays.
A transfer that keeps the rate passes under the same limits.

The crawling registries are FakeRegistry routes on 127.0.0.1 (a blob trickled a byte at a time; an upload read a
little at a time); the fast ones are the same fake serving at full speed and Debian's docker-registry. No timing
is asserted: the window is 2 s, and a subprocess timeout well past it proves that nothing hangs (on the code
before the minimum rate, the crawls ran into it).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.core.canonical import sha256_digest
from hermetic.registry.deadlines import MIN_RATE_ENV, RATE_WINDOW_ENV
from hermetic.store.oci import OciStore
from registry_support import (
    FakeRegistry, Reply, have_registry_tools, make_image, random_layer, registry_env, start_registry,
)

pytestmark = [pytest.mark.registry]
REPO_ROOT = Path(__file__).resolve().parent.parent
NO_HANG_S = 40  # far past the 2 s window; the crawls below would take many minutes
LIMITS = {MIN_RATE_ENV: "4096", RATE_WINDOW_ENV: "2"}
BIG = 24 << 20  # more than the loopback socket buffers hold, so a slow reader holds the sender back


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A new process's environment: its own cache, no credentials, no proxy, default deadlines, the test's limits."""
    return {**registry_env(tmp_path), **LIMITS}


def hermetic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, whole_env=True, cwd=REPO_ROOT, timeout=NO_HANG_S)


def store_of(env: dict[str, str]) -> OciStore:
    return OciStore(Path(env["HERMETIC_CACHE"]) / "oci").ensure()


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under the store, temp files included, but the empty gc lock a pull takes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".gc.lock"}


def slow_reader(fake: FakeRegistry, bytes_per_read: int = 100, every_s: float = 0.2):
    """A route that reads an upload's body ``bytes_per_read`` at a time, every ``every_s`` seconds, then 201."""
    def route(handler) -> None:
        left = int(handler.headers.get("Content-Length") or 0)
        try:
            while left > 0 and not fake.stopping.wait(every_s):
                left -= len(handler.rfile.read(min(bytes_per_read, left)) or b"x" * left)
            handler.send_response(201)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        except OSError:
            pass  # the client gave up: what the test wants
    return route


def test_a_crawling_blob_ends_the_pull_with_75_and_nothing_is_stored(env) -> None:
    layer = random_layer(4000, seed=40)
    store = store_of(env)
    make_image(store, [random_layer(2000, seed=1)], ref="already/here:v1")
    before = files_under(store.root)
    with FakeRegistry() as fake:
        digest = fake.serve_image("team/x", [layer])
        fake.routes[("GET", f"/v2/team/x/blobs/{sha256_digest(layer)}")] = fake.trickle(len(layer), every_s=0.5)
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert_clean_error(proc, 75, f"registry {fake.host}", f"blob {sha256_digest(layer)} of team/x", " bytes/s over",
                       "below the minimum of 4096 bytes/s", MIN_RATE_ENV)
    assert files_under(store.root) == before  # no blob, no temp file, no ref


def test_the_same_blob_served_fast_is_pulled_under_the_same_limit(env) -> None:
    layer = random_layer(4000, seed=40)
    with FakeRegistry() as fake:
        digest = fake.serve_image("team/x", [layer])
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert store_of(env).has_blob(sha256_digest(layer))


def test_a_registry_that_reads_an_upload_slowly_ends_the_push_with_75(env) -> None:
    store = store_of(env)
    layer = random_layer(BIG, seed=41)
    image = make_image(store, [layer])
    with FakeRegistry() as fake:
        fake.routes[("POST", "/v2/team/x/blobs/uploads/")] = Reply(202, b"", {"Location": "/v2/team/x/blobs/uploads/u1"})
        fake.routes[("PUT", "/v2/team/x/blobs/uploads/u1")] = slow_reader(fake)
        proc = hermetic("push", f"{fake.host}/team/x:v1", "--image", image, env=env)
    assert_clean_error(proc, 75, f"registry {fake.host}", f"the upload of blob {sha256_digest(layer)} to team/x",
                       " bytes/s over", "below the minimum of 4096 bytes/s")


def test_a_fast_registry_takes_the_same_image_both_ways_under_the_same_limit(env, tmp_path) -> None:
    missing = have_registry_tools()
    if missing:
        pytest.skip(missing)
    registry = start_registry(tmp_path / "registry")
    try:
        store = store_of(env)
        layer = random_layer(BIG, seed=41)
        image = make_image(store, [layer])
        pushed = hermetic("push", f"{registry.host}/team/x:v1", "--image", image, env=env)
        assert pushed.returncode == 0, pushed.stderr
        pulled = hermetic("pull", f"{registry.host}/team/x@{image}", env={**env, "HERMETIC_CACHE": str(tmp_path / "c2")})
        assert pulled.returncode == 0, pulled.stderr
        assert OciStore(tmp_path / "c2" / "oci").has_blob(sha256_digest(layer))
    finally:
        registry.stop()


@pytest.mark.parametrize("name, value", [(MIN_RATE_ENV, "-1"), (MIN_RATE_ENV, "fast"), (RATE_WINDOW_ENV, "0"),
                                         (RATE_WINDOW_ENV, "nan")])
def test_a_bad_rate_setting_is_a_usage_error(name, value, env) -> None:
    proc = hermetic("pull", f"127.0.0.1:9/team/x@{sha256_digest(b'x')}", env={**env, name: value})
    assert_clean_error(proc, 64, name)


def test_no_minimum_rate_lets_a_slow_blob_finish(env) -> None:
    """HERMETIC_REGISTRY_MIN_RATE=0 turns the minimum off: a slow but steady blob completes."""
    layer = random_layer(3000, seed=42)
    with FakeRegistry() as fake:
        digest = fake.serve_image("team/x", [layer])
        fake.routes[("GET", f"/v2/team/x/blobs/{sha256_digest(layer)}")] = slow_sender(layer)
        proc = hermetic("pull", f"{fake.host}/team/x@{digest}", env={**env, MIN_RATE_ENV: "0"})
    assert proc.returncode == 0, proc.stderr


def slow_sender(data: bytes, pieces: int = 6, every_s: float = 0.5):
    """A route that sends ``data`` in ``pieces`` parts, one every ``every_s`` seconds (slower than LIMITS)."""
    def route(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        step = -(-len(data) // pieces)
        for i in range(0, len(data), step):
            threading.Event().wait(every_s)
            handler.wfile.write(data[i:i + step])
            handler.wfile.flush()
    return route
