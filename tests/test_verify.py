"""Provenance and SBOM attached on push, fetched on pull, and `hermetic verify` (issue 20).

Real parts only: the numpy example built by hermetic, Debian's docker-registry
(Distribution 2.8, no referrers API: the fallback tag is what is exercised,
and a test checks that), skopeo as the independent reader, openssl for keys.
Every `hermetic verify` runs as a new process in an empty directory with a
fresh HERMETIC_CACHE and pip's configuration hidden: a machine that never
saw the project.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from buildsupport import clone_cache
from conftest import assert_clean_error, run_cli
from hermetic.provenance import MT_CYCLONEDX, MT_DSSE, MT_STATEMENT, PROVENANCE_FILE
from hermetic.store.oci import MT_CONFIG, MT_MANIFEST, Descriptor, OciStore
from registry_support import have_registry_tools

pytestmark = [
    pytest.mark.docker, pytest.mark.registry,
    pytest.mark.skipif(have_registry_tools() is not None, reason=str(have_registry_tools())),
]
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"


@pytest.fixture(autouse=True)
def _no_ambient_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-docker-config"
    empty.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(empty))


@pytest.fixture(scope="module")
def publisher_cache(logreg: Path, module_cache: Path, tmp_path_factory) -> Path:
    """The builder's store, cloned: pushes record where they went in its own files, not the session's."""
    return clone_cache(module_cache, tmp_path_factory.mktemp("publisher") / "cache")


@pytest.fixture(scope="module")
def pushed(logreg: Path, registry, publisher_cache: Path) -> dict:
    """The numpy example, built, pushed to REGISTRY/team/logreg:v1 (attestations attached)."""
    proc = run_cli("push", f"{registry.host}/team/logreg:v1", "-C", str(logreg), "--json",
                   env={"HERMETIC_CACHE": str(publisher_cache)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    record = json.loads((logreg / "hermetic.image.json").read_text())
    assert out["manifest_digest"] == record["manifest_digest"]
    return {"digest": out["manifest_digest"], "ref": f"{registry.host}/team/logreg@{out['manifest_digest']}",
            "out": out, "provenance": (logreg / PROVENANCE_FILE).read_bytes(), "record": record}


@pytest.fixture(scope="module")
def numpy_wheel(logreg: Path, module_cache: Path) -> Path:
    prov = json.loads((logreg / PROVENANCE_FILE).read_text())
    deps = prov["predicate"]["buildDefinition"]["resolvedDependencies"]
    wheel = next(d for d in deps if d.get("uri", "").startswith("pkg:pypi/numpy@"))
    return module_cache / "wheels" / "sha256" / wheel["digest"]["sha256"] / wheel["name"]


def fresh_machine(tmp_path: Path, *, find_links: Path | None = None, wheel_store_from: Path | None = None) -> dict:
    """Environment of a machine that never saw the project: empty cache, no pip config, no index."""
    cache = tmp_path / "fresh-cache"
    if wheel_store_from is not None:
        shutil.copytree(wheel_store_from, cache / "wheels")
    env = {"HERMETIC_CACHE": str(cache), "PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": UNREACHABLE_INDEX,
           "PIP_FIND_LINKS": str(find_links) if find_links else "", "PIP_EXTRA_INDEX_URL": "", "PIP_NO_INDEX": ""}
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    return env


def hverify(tmp_path: Path, ref: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run_cli("verify", ref, *args, cwd=tmp_path / "elsewhere", env=env, timeout=600)


def skopeo_raw(ref: str) -> dict:
    proc = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def one_wheel_dir(tmp_path: Path, wheel: Path, *, flip_at: int | None = None) -> Path:
    d = tmp_path / "find-links"
    d.mkdir(exist_ok=True)
    data = bytearray(wheel.read_bytes())
    if flip_at is not None:
        data[flip_at] ^= 0x01
    (d / wheel.name).write_bytes(bytes(data))
    return d


# -- push: the fallback tag, read by skopeo ---------------------------------------------------

def test_push_lists_provenance_and_sbom_under_the_fallback_tag_and_skopeo_reads_them(pushed, registry, tmp_path):
    import requests

    digest = pushed["digest"]
    # Distribution 2.8 has no referrers API, so what follows is the fallback path.
    assert requests.get(f"{registry.url}/v2/team/logreg/referrers/{digest}", timeout=10).status_code == 404
    index = skopeo_raw(f"{registry.host}/team/logreg:sha256-{digest[7:]}")
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    by_type = {m["artifactType"]: m for m in index["manifests"]}
    assert set(by_type) == {MT_STATEMENT, MT_CYCLONEDX}
    assert by_type[MT_STATEMENT]["annotations"]["in-toto.io/predicate-type"] == "https://slsa.dev/provenance/v1"
    for art in by_type.values():
        manifest = skopeo_raw(f"{registry.host}/team/logreg@{art['digest']}")
        assert manifest["subject"]["digest"] == digest and manifest["subject"]["size"] > 0
        assert manifest["artifactType"] == art["artifactType"]
        assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    # skopeo copies the provenance artifact (verifying digests itself): its one blob is hermetic.provenance.json.
    dest = tmp_path / "skopeo-oci"
    proc = subprocess.run(["skopeo", "copy", "--src-tls-verify=false",
                           f"docker://{registry.host}/team/logreg@{by_type[MT_STATEMENT]['digest']}",
                           f"oci:{dest}:provenance"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    layer = skopeo_raw(f"{registry.host}/team/logreg@{by_type[MT_STATEMENT]['digest']}")["layers"][0]
    assert (dest / "blobs/sha256" / layer["digest"][7:]).read_bytes() == pushed["provenance"]
    statement = json.loads(pushed["provenance"])
    assert statement["subject"][0]["digest"]["sha256"] == digest[7:]
    # The base went along, by digest: a fresh machine can pull it from here.
    base = statement["predicate"]["buildDefinition"]["resolvedDependencies"][1]
    assert base["name"] == "base"
    assert skopeo_raw(f"{registry.host}/team/logreg@sha256:{base['digest']['sha256']}")["layers"]
    assert any(a.startswith("referrers tag sha256-") for a in pushed["out"]["attached"])


def test_a_second_push_keeps_one_entry_per_artifact(pushed, registry, logreg, publisher_cache):
    again = run_cli("push", f"{registry.host}/team/logreg:v1", "-C", str(logreg), "--json",
                    env={"HERMETIC_CACHE": str(publisher_cache)})
    assert again.returncode == 0, again.stderr
    assert not any(a.startswith("referrers tag") for a in json.loads(again.stdout)["attached"])  # nothing to add
    index = skopeo_raw(f"{registry.host}/team/logreg:sha256-{pushed['digest'][7:]}")
    assert len(index["manifests"]) == 2


# -- verify on a machine that never saw the project -------------------------------------------

def test_verify_on_a_fresh_machine_reproduces_the_digest(pushed, numpy_wheel, tmp_path):
    env = fresh_machine(tmp_path, find_links=one_wheel_dir(tmp_path, numpy_wheel))
    proc = hverify(tmp_path, pushed["ref"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"reproduced: {pushed['digest']}"
    out = json.loads(hverify(tmp_path, pushed["ref"], env, "--json").stdout)
    assert out["reproduced"] is True and out["rebuilt_digest"] == pushed["digest"]
    assert out["rebuilt_image_id"] == pushed["record"]["image_id"]
    assert out["provenance_reproduced"] is True  # the rebuild's own provenance has the same bytes
    assert out["sbom"] is not None
    # Nothing was left in the (fresh) user cache: the rebuild ran in scratch and was not loaded.
    cache = Path(env["HERMETIC_CACHE"])
    assert not (cache / "oci").exists() and not (cache / "wheels").exists()


def test_verify_takes_wheels_from_the_local_store_by_hash(pushed, module_cache, tmp_path):
    env = fresh_machine(tmp_path, wheel_store_from=module_cache / "wheels")  # no find-links, no index
    proc = hverify(tmp_path, pushed["ref"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"reproduced: {pushed['digest']}")


def test_a_changed_byte_in_a_wheel_is_refused_naming_the_wheel_and_its_layer(pushed, numpy_wheel, tmp_path):
    size = numpy_wheel.stat().st_size
    env = fresh_machine(tmp_path, find_links=one_wheel_dir(tmp_path, numpy_wheel, flip_at=size // 2))
    proc = hverify(tmp_path, pushed["ref"], env)
    assert_clean_error(proc, 65, numpy_wheel.name, "layer 1: numpy==", "sha256 mismatch",
                       "refused before any layer was built")


def test_a_wheel_no_index_has_any_more_is_named(pushed, numpy_wheel, tmp_path):
    empty = tmp_path / "empty-find-links"
    empty.mkdir()
    proc = hverify(tmp_path, pushed["ref"], fresh_machine(tmp_path, find_links=empty))
    assert_clean_error(proc, 65, numpy_wheel.name, "layer 1: numpy==", "no index has this wheel any more")


def _tampered_copy(src: OciStore, dst: OciStore, digest: str, layer_index: int, member: str) -> str:
    """The image with one byte of one file changed inside one layer (config and manifest redone)."""
    import io
    import tarfile

    manifest = src.read_json(digest)
    config = src.read_json(manifest["config"]["digest"])
    layer = manifest["layers"][layer_index]
    raw = bytearray(src.read_blob(layer["digest"]))
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tf:
        m = tf.getmember(member)
    raw[m.offset_data] ^= 0x20  # same size, same tar header: only the file's content changes
    new_layer = dst.put_bytes(bytes(raw))
    for i, x in enumerate(manifest["layers"]):
        if i != layer_index:
            dst.put_bytes(src.read_blob(x["digest"]), x["digest"])
    config["rootfs"]["diff_ids"][layer_index] = new_layer
    config_digest, config_size, _ = dst.put_json(config)
    manifest["layers"][layer_index] = {**layer, "digest": new_layer}
    manifest["config"] = {"mediaType": MT_CONFIG, "digest": config_digest, "size": config_size}
    out, _, _ = dst.put_json(manifest)
    dst.set_ref("forged:v1", Descriptor(MT_MANIFEST, out, dst.blob_size(out)))
    return out


def _attach_forged_provenance(store: OciStore, image: str, provenance: bytes, *, claim_subject: bool) -> None:
    """Attach ``provenance`` to ``image``; with claim_subject, rewritten to name it (what a forger would do)."""
    from hermetic.store.referrers import add_referrers, artifact_manifest

    if claim_subject:
        doc = json.loads(provenance)
        doc["subject"][0]["digest"]["sha256"] = image[7:]
        doc["subject"][0]["annotations"]["size"] = store.blob_size(image)
        provenance = json.dumps(doc, indent=2, sort_keys=True).encode()
    art = artifact_manifest(Descriptor(MT_MANIFEST, image, store.blob_size(image)), MT_STATEMENT, provenance,
                            annotations={"in-toto.io/predicate-type": "https://slsa.dev/provenance/v1"})
    add_referrers(store, image, [art])


def test_an_image_that_differs_from_its_provenance_names_the_layer_and_the_file(pushed, module_cache, numpy_wheel,
                                                                                registry, tmp_path):
    from hermetic.registry import push_image

    member = "opt/venv/lib/python3.11/site-packages/numpy/__init__.py"
    forged_store = OciStore(tmp_path / "forger-oci").ensure()
    forged = _tampered_copy(OciStore(module_cache / "oci"), forged_store, pushed["digest"], 1, member)
    _attach_forged_provenance(forged_store, forged, pushed["provenance"], claim_subject=True)
    from hermetic.reproduce.rebuild import copy_image

    copy_image(OciStore(module_cache / "oci"), forged_store, pushed["record"]["base"]["manifest_digest"])
    push_image(forged_store, forged, f"{registry.host}/team/forged:v1")  # with the base, as hermetic push does

    env = fresh_machine(tmp_path, find_links=one_wheel_dir(tmp_path, numpy_wheel))
    ref = f"{registry.host}/team/forged@{forged}"
    proc = hverify(tmp_path, ref, env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"not reproduced: the rebuild is {pushed['digest']}, the image is {forged}"
    assert lines[1].startswith("  layer 1 (numpy==") and numpy_wheel.name in lines[1]
    assert lines[2].startswith(f"    {member}: content differs (sha256 ")
    out = json.loads(hverify(tmp_path, ref, env, "--json").stdout)
    assert out["reproduced"] is False and [x["index"] for x in out["layers"]] == [1]
    assert out["layers"][0]["files_differing"] == 1 and out["layers"][0]["files"][0].startswith(member)
    assert out["config"] == []  # labels and env agree: only the layer (and so the diff_ids) differ


# -- bad input ------------------------------------------------------------------------------------

def _plain_image(store: OciStore, label: str) -> str:
    from registry_support import busybox_layer, make_image

    return make_image(store, [busybox_layer()], label=label)


def test_an_image_without_provenance_is_refused(registry, tmp_path):
    from hermetic.registry import push_image

    store = OciStore(tmp_path / "plain-oci").ensure()
    digest = _plain_image(store, "no-provenance")
    push_image(store, digest, f"{registry.host}/team/plain:v1")
    proc = hverify(tmp_path, f"{registry.host}/team/plain@{digest}", fresh_machine(tmp_path))
    assert_clean_error(proc, 65, f"team/plain@{digest} has no provenance", f"sha256-{digest[7:]}")


def test_a_provenance_about_another_image_is_refused(pushed, registry, tmp_path):
    from hermetic.registry import push_image

    store = OciStore(tmp_path / "other-oci").ensure()
    digest = _plain_image(store, "borrowed-provenance")
    _attach_forged_provenance(store, digest, pushed["provenance"], claim_subject=False)
    push_image(store, digest, f"{registry.host}/team/borrowed:v1")
    proc = hverify(tmp_path, f"{registry.host}/team/borrowed@{digest}", fresh_machine(tmp_path))
    assert_clean_error(proc, 65, f"its subject is {pushed['digest']}, not the image {digest}")


def test_pull_fetches_and_verifies_the_attestations(pushed, tmp_path):
    env = fresh_machine(tmp_path)
    proc = run_cli("pull", pushed["ref"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {a.split()[0] for a in out["attestations"]} == {MT_STATEMENT, MT_CYCLONEDX}
    from hermetic.builder.attest import stored_provenance

    store = OciStore(Path(env["HERMETIC_CACHE"]) / "oci")
    assert stored_provenance(store, pushed["digest"]) == pushed["provenance"]


def test_a_tampered_sbom_blob_fails_pull_and_verify_naming_it(pushed, registry, numpy_wheel, tmp_path):
    statement = json.loads(pushed["provenance"])
    sbom = next(b for b in statement["predicate"]["runDetails"]["byproducts"] if b["name"] == "sbom")
    data = registry.blob_data_path("sha256:" + sbom["digest"]["sha256"])
    original = data.read_bytes()
    raw = bytearray(original)
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    try:
        env = fresh_machine(tmp_path, find_links=one_wheel_dir(tmp_path, numpy_wheel))
        pull = run_cli("pull", pushed["ref"], env=env)
        assert_clean_error(pull, 65, "sbom.cdx.json (application/vnd.cyclonedx+json)", "nothing was stored")
        store = OciStore(Path(env["HERMETIC_CACHE"]) / "oci")
        assert not store.has_blob(pushed["digest"])  # all or nothing: the image did not land either
        proc = hverify(tmp_path, pushed["ref"], env)
        assert_clean_error(proc, 65, "sbom.cdx.json (application/vnd.cyclonedx+json)", sbom["digest"]["sha256"])
    finally:
        data.write_bytes(original)


# -- signing --------------------------------------------------------------------------------------

def test_signed_provenance_verifies_with_the_key_and_not_without_it(pushed, registry, numpy_wheel, tmp_path):
    keys = {}
    for who in ("release", "other"):
        key = tmp_path / f"{who}.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(tmp_path / f"{who}.pub.pem")],
                       check=True, capture_output=True)
        keys[who] = key
    env = fresh_machine(tmp_path, find_links=one_wheel_dir(tmp_path, numpy_wheel))
    # The publisher's machine: pull (attestations come along), sign, push to another repository.
    publisher = {**env, "HERMETIC_CACHE": str(tmp_path / "publisher-cache")}
    assert run_cli("pull", pushed["ref"], env=publisher).returncode == 0
    signed = run_cli("push", f"{registry.host}/team/signed:v1", "--image", pushed["digest"],
                     "--sign-key", str(keys["release"]), "--json", env=publisher)
    assert signed.returncode == 0, signed.stderr
    assert any(MT_DSSE in a for a in json.loads(signed.stdout)["attached"])
    ref = f"{registry.host}/team/signed@{pushed['digest']}"

    ok = hverify(tmp_path, ref, env, "--key", str(tmp_path / "release.pub.pem"), "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["reproduced"] is True and out["signature"]["envelope"].startswith("sha256:")
    wrong = hverify(tmp_path, ref, env, "--key", str(tmp_path / "other.pub.pem"))
    assert_clean_error(wrong, 65, "no signature verifies with the key")
    # team/logreg was pushed from a store that never signed: --key there is a refusal, not a pass.
    unsigned = hverify(tmp_path, pushed["ref"], env, "--key", str(tmp_path / "release.pub.pem"))
    assert_clean_error(unsigned, 65, "has no signed provenance")


def test_verify_of_an_image_in_the_local_store(pushed, module_cache, tmp_path):
    """A name without a host: the provenance, base and wheels come from the local store (read only)."""
    cache = clone_cache(module_cache, tmp_path / "cache")  # its own: other modules write the session's meanwhile
    before = sorted(p.name for p in (cache / "oci" / "blobs" / "sha256").iterdir())
    proc = run_cli("verify", f"numpy-logreg@{pushed['digest']}", cwd=tmp_path,
                   env={"HERMETIC_CACHE": str(cache), "PIP_CONFIG_FILE": "/dev/null",
                        "PIP_INDEX_URL": UNREACHABLE_INDEX, "PIP_FIND_LINKS": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"reproduced: {pushed['digest']}")
    assert sorted(p.name for p in (cache / "oci" / "blobs" / "sha256").iterdir()) == before


def test_verify_refuses_a_reference_without_digest(tmp_path):
    proc = hverify(tmp_path, "127.0.0.1:5000/team/logreg:v1", fresh_machine(tmp_path))
    assert_clean_error(proc, 64, "is not pinned by digest")
