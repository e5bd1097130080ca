"""`hermetic fetch`: the content-addressed wheel store, from indexes and find-links."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli, tree_digest
from wheelfactory import make_index, make_wheel, requirements_lock, sha256_of

BASE = "hermetic/debian-bookworm-python3@sha256:" + "a" * 64


def project(tmp_path: Path, lock_text: str) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "hermetic.yaml").write_text(f"name: p\nbase: {BASE}\n")
    (proj / "requirements.lock").write_text(lock_text)
    return proj


@pytest.fixture
def index(tmp_path, isolated_pip, monkeypatch):
    src = tmp_path / "src"
    files = [
        make_wheel(src, "alpha", "1.0"),
        make_wheel(src, "beta", "2.0", tag="cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"),
        make_wheel(src, "beta", "2.0", tag="cp311-cp311-musllinux_1_2_x86_64"),
        make_wheel(src, "beta", "2.0", tag="py3-none-any"),
    ]
    url = make_index(tmp_path / "index", files)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    return {f.name: f for f in files}


def lock_for(index, *pins):
    rows = []
    for name, version in pins:
        hashes = [sha256_of(f) for fn, f in index.items() if fn.startswith(f"{name}-{version}-")]
        rows.append((name, version, hashes))
    return requirements_lock(rows)


def test_fetch_then_refetch_downloads_nothing(tmp_path, cache_dir, index):
    proj = project(tmp_path, lock_for(index, ("alpha", "1.0"), ("beta", "2.0")))
    first = run_cli("fetch", "-C", str(proj), "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    # beta: the most specific compatible wheel (manylinux cp311), not musl, not py3-none-any
    chosen = {w["name"]: w["filename"] for w in out["wheels"]}
    assert chosen["beta"] == "beta-2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert sorted(out["downloaded"]) == sorted(chosen.values())
    second = run_cli("fetch", "-C", str(proj), "--json", "--offline",
                     env={"PIP_INDEX_URL": "http://127.0.0.1:9/nothing-here"})
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["downloaded"] == []


def test_wheel_missing_with_network_off_names_it(tmp_path, cache_dir, index):
    proj = project(tmp_path, lock_for(index, ("alpha", "1.0")))
    proc = run_cli("fetch", "-C", str(proj), "--offline")
    assert_clean_error(proc, 69, "alpha==1.0", "network is off")


def test_index_file_with_other_hash_is_refused(tmp_path, cache_dir, index):
    """The index offers alpha 1.0, but not with a hash the lock allows."""
    proj = project(tmp_path, requirements_lock([("alpha", "1.0", ["f" * 64])]))
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "alpha==1.0", "hashes are not in the lock")
    assert tree_digest(cache_dir / "wheels" / "sha256") == {}


def test_wheels_for_the_image_whose_hashes_are_not_locked_are_named(tmp_path, cache_dir, isolated_pip, monkeypatch):
    """A lock made for another platform (its hashes: a macOS wheel and the sdist): the error names the
    manylinux wheel that exists, says its hash is not in the lock and how to re-lock -- not "only an
    sdist", not a list of macOS wheels as if nothing else existed."""
    src = tmp_path / "src"
    linux = make_wheel(src, "delta", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    mac = make_wheel(src, "delta", "1.0", tag="cp311-cp311-macosx_11_0_arm64")
    sdist = src / "delta-1.0.tar.gz"
    sdist.write_bytes(b"an sdist")
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", [linux, mac, sdist]))
    proj = project(tmp_path, requirements_lock([("delta", "1.0", [sha256_of(mac), sha256_of(sdist)])]))
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "delta==1.0", linux.name, "hashes are not in the lock", "hermetic lock")
    assert "sdist" not in proc.stderr and mac.name not in proc.stderr


def test_tampered_download_is_refused_and_store_unchanged(tmp_path, cache_dir, isolated_pip, monkeypatch):
    """find-links gives no hash up front: the bytes are hashed on their way in."""
    good = make_wheel(tmp_path / "good", "alpha", "1.0")
    links = tmp_path / "links"
    bad = make_wheel(links, "alpha", "1.0", files={"alpha/extra.py": b"x = 1\n"})
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    proj = project(tmp_path, requirements_lock([("alpha", "1.0", [sha256_of(good)])]))
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "alpha==1.0", "sha256 mismatch", sha256_of(good), sha256_of(bad), "not stored")
    assert not list((cache_dir / "wheels").rglob("*.whl"))
    assert not list((cache_dir / "wheels" / "tmp").iterdir())


def test_sdist_only_is_refused(tmp_path, cache_dir, isolated_pip, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    sdist = src / "gamma-1.0.tar.gz"
    sdist.write_bytes(b"not really a tarball")
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", [sdist]))
    proj = project(tmp_path, requirements_lock([("gamma", "1.0", [sha256_of(sdist)])]))
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "gamma==1.0", "only an sdist", "not hermetic")


def test_no_wheel_for_the_target_platform(tmp_path, cache_dir, isolated_pip, monkeypatch):
    src = tmp_path / "src"
    w = make_wheel(src, "delta", "1.0", tag="cp311-cp311-win_amd64")
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", [w]))
    proj = project(tmp_path, requirements_lock([("delta", "1.0", [sha256_of(w)])]))
    proc = run_cli("fetch", "-C", str(proj))
    assert_clean_error(proc, 65, "delta==1.0", "no wheel for x86_64-manylinux_2_28", "win_amd64")


class _HalfServer(http.server.BaseHTTPRequestHandler):
    payload = b""

    def do_GET(self):  # noqa: N802
        if self.path.endswith("/alpha/"):
            body = b'<a href="/files/alpha-1.0-py3-none-any.whl">alpha-1.0-py3-none-any.whl</a>'
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload[: len(self.payload) // 2])  # then hang up mid-file
        self.wfile.flush()
        self.connection.close()

    def log_message(self, *args):
        pass


def test_interrupted_download_leaves_nothing(tmp_path, cache_dir, isolated_pip, monkeypatch):
    good = make_wheel(tmp_path / "good", "alpha", "1.0", payload_bytes=200_000)
    _HalfServer.payload = good.read_bytes()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HalfServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_address[1]}/simple")
        proj = project(tmp_path, requirements_lock([("alpha", "1.0", [sha256_of(good)])]))
        proc = run_cli("fetch", "-C", str(proj))
        assert proc.returncode == 69, proc.stderr
        assert "alpha==1.0" in proc.stderr and "Traceback" not in proc.stderr
        assert not list((cache_dir / "wheels").rglob("*.whl"))
        assert not list((cache_dir / "wheels" / "tmp").iterdir())
    finally:
        srv.shutdown()
