"""Provenance, SBOM and DSSE documents (pure), and attestations in the local OCI store (issue 20).

No engine, no registry: the in-toto/SLSA statement round-trips and refuses what
it must; the SBOM validates against CycloneDX 1.6's own JSON schema; DSSE
matches the spec's PAE vector and openssl verifies our ed25519 signatures;
``cache gc`` keeps an image's referrers exactly as long as the image.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from hermetic.core.canonical import sha256_digest
from hermetic.core.errors import DataError, IntegrityError
from hermetic.provenance import MT_CYCLONEDX, MT_STATEMENT
from hermetic.provenance.dsse import PAYLOAD_TYPE, pae, sign, verify
from hermetic.provenance.sbom import installed_deb_packages, make_sbom
from hermetic.provenance.statement import (
    BuildFacts, LayerFact, ProvenanceError, WheelFact, read_statement, statement, statement_bytes,
)
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore
from hermetic.store.referrers import (
    EMPTY_DIGEST, EMPTY_JSON, add_referrers, artifact_manifest, list_referrers, read_artifact, referrers_tag,
)

IMAGE = "sha256:" + "ab" * 32
BASE = "sha256:" + "cd" * 32
WHEEL_SHA = "ef" * 32
LOCK = b"numpy==2.4.6 \\\n    --hash=sha256:" + WHEEL_SHA.encode() + b"\n"
DPKG_STATUS = """Package: libc6
Status: install ok installed
Priority: optional
Architecture: amd64
Multi-Arch: same
Source: glibc
Version: 2.36-9+deb12u14
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: removed-thing
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: bsdutils
Status: hold ok installed
Architecture: amd64
Source: util-linux (2.38.1-5+deb12u3)
Version: 1:2.38.1-5+deb12u3
"""
OS_RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'


def facts(**changes) -> BuildFacts:
    f = BuildFacts(
        name="demo", manifest_digest=IMAGE, manifest_size=708, media_type=MT_MANIFEST,
        image_id="sha256:" + "12" * 32, config={"name": "demo", "base": f"hermetic/base@{BASE}"},
        config_sha256="34" * 32, lock_path="requirements.lock", lock_format="requirements", lock_bytes=LOCK,
        lock_indexes=("https://mirror.example/simple",), target_platform="x86_64-manylinux_2_28",
        target_python="3.11", build_key="56" * 32, hermetic_version="0.1.0", layer_format=2,
        runtime_sha256="78" * 32, installer_version="1.1.0", base_reference=f"hermetic/base@{BASE}",
        base_digest=BASE, base_layers=1, base_os="Debian GNU/Linux 12 (bookworm)", base_glibc="2.36",
        wheels=(WheelFact("numpy", "2.4.6", "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", WHEEL_SHA,
                          16_918_164, 1, None),),
        layers=(LayerFact(0, "sha256:" + "01" * 32, 220170240, "application/vnd.oci.image.layer.v1.tar",
                          "base layer 0", (), True),
                LayerFact(1, "sha256:" + "02" * 32, 58255360, "application/vnd.oci.image.layer.v1.tar",
                          "numpy==2.4.6", ("numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",)),
                LayerFact(2, "sha256:" + "03" * 32, 71680, "application/vnd.oci.image.layer.v1.tar",
                          "hermetic runtime + venv")),
        sbom={"digest": "sha256:" + "09" * 32, "size": 65736, "mediaType": MT_CYCLONEDX},
    )
    return dataclasses.replace(f, **changes)


# -- the statement -------------------------------------------------------------------

def test_statement_is_in_toto_v1_slsa_v1_and_round_trips() -> None:
    doc = statement(facts())
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    assert doc["subject"][0]["digest"] == {"sha256": IMAGE[7:]}
    bd = doc["predicate"]["buildDefinition"]
    assert set(bd) == {"buildType", "externalParameters", "internalParameters", "resolvedDependencies"}
    assert set(doc["predicate"]["runDetails"]) == {"builder", "byproducts"}  # no timestamps: bytes follow inputs
    lock = next(d for d in bd["resolvedDependencies"] if d["name"] == "lock")
    assert base64.b64decode(lock["content"]) == LOCK
    wheel = next(d for d in bd["resolvedDependencies"] if d.get("uri") == "pkg:pypi/numpy@2.4.6")
    assert wheel["digest"] == {"sha256": WHEEL_SHA} and wheel["annotations"]["layer"] == 1
    data = statement_bytes(facts())
    assert data == statement_bytes(facts())  # deterministic
    back = read_statement(data, subject_digest=IMAGE)
    assert back == facts()
    assert back.layer_of(back.wheels[0].filename).contents == "numpy==2.4.6"


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(_type="https://in-toto.io/Statement/v0.1"), "not an in-toto Statement v1"),
    (lambda d: d.update(predicateType="https://spdx.dev/Document"), "predicateType"),
    (lambda d: d["predicate"]["buildDefinition"].update(buildType="https://example.com/other"), "buildType"),
    (lambda d: next(x for x in d["predicate"]["buildDefinition"]["resolvedDependencies"] if x["name"] == "lock")
     .update(content=base64.b64encode(b"numpy==9.9\n").decode()), "does not hash to its digest"),
])
def test_read_statement_refuses_what_it_cannot_trust(mutate, needle) -> None:
    doc = statement(facts())
    mutate(doc)
    with pytest.raises(ProvenanceError, match=needle) as e:
        read_statement(json.dumps(doc).encode(), subject_digest=IMAGE)
    assert e.value.exit_code == 65


def test_a_provenance_about_another_digest_is_refused_naming_both() -> None:
    other = "sha256:" + "99" * 32
    with pytest.raises(ProvenanceError) as e:
        read_statement(statement_bytes(facts()), subject_digest=other)
    assert f"its subject is {IMAGE}, not the image {other}" in e.value.message


# -- the SBOM --------------------------------------------------------------------------

def test_dpkg_status_lists_installed_packages_only() -> None:
    pkgs = installed_deb_packages(DPKG_STATUS)
    assert [(p.name, p.version, p.arch, p.source) for p in pkgs] == [
        ("bsdutils", "1:2.38.1-5+deb12u3", "amd64", "util-linux"),
        ("libc6", "2.36-9+deb12u14", "amd64", "glibc"),
    ]


def _sbom() -> bytes:
    return make_sbom(image_name="demo", manifest_digest=IMAGE, created_epoch=0, hermetic_version="0.1.0",
                     runtime_sha256="78" * 32,
                     wheels=[WheelFact("numpy", "2.4.6", "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
                                       WHEEL_SHA, None, None)],
                     dpkg_status=DPKG_STATUS, os_release_text=OS_RELEASE)


def test_sbom_is_valid_cyclonedx_1_6_and_deterministic() -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    data = _sbom()
    assert data == _sbom()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode()) is None  # None: no errors
    doc = json.loads(data)
    assert doc["specVersion"] == "1.6" and doc["metadata"]["component"]["version"] == IMAGE
    by_purl = {c.get("purl"): c for c in doc["components"]}
    numpy = by_purl["pkg:pypi/numpy@2.4.6?file_name=numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert numpy["hashes"] == [{"alg": "SHA-256", "content": WHEEL_SHA}]
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=bookworm" in by_purl
    assert "pkg:deb/debian/bsdutils@1:2.38.1-5%2Bdeb12u3?arch=amd64&distro=bookworm" in by_purl
    assert not any("removed-thing" in (p or "") for p in by_purl)


# -- DSSE ---------------------------------------------------------------------------------

def test_pae_matches_the_dsse_spec_vector() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for who in ("alice", "mallory"):
        key = tmp_path / f"{who}.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True,
                       capture_output=True)
        pub = tmp_path / f"{who}.pub.pem"
        subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True,
                       capture_output=True)
        out[who], out[f"{who}.pub"] = key, pub
    return out


def test_dsse_sign_verify_and_openssl_agrees(keys, tmp_path) -> None:
    payload = statement_bytes(facts())
    envelope = sign(payload, keys["alice"])
    assert envelope == sign(payload, keys["alice"])  # ed25519 is deterministic
    assert verify(envelope, keys["alice.pub"]) == payload
    # An independent verifier: openssl checks the signature over PAE(payloadType, payload).
    doc = json.loads(envelope)
    (tmp_path / "msg").write_bytes(pae(PAYLOAD_TYPE, payload))
    (tmp_path / "sig").write_bytes(base64.b64decode(doc["signatures"][0]["sig"]))
    ok = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(keys["alice.pub"]), "-rawin",
                         "-in", str(tmp_path / "msg"), "-sigfile", str(tmp_path / "sig")], capture_output=True, text=True)
    assert ok.returncode == 0 and "Signature Verified Successfully" in ok.stdout, ok.stdout + ok.stderr

    with pytest.raises(IntegrityError, match="no signature verifies"):
        verify(envelope, keys["mallory.pub"])
    doc["payload"] = base64.b64encode(payload.replace(b"numpy", b"nump0")).decode()
    with pytest.raises(IntegrityError, match="no signature verifies"):
        verify(json.dumps(doc).encode(), keys["alice.pub"])


def test_a_key_that_is_not_ed25519_is_refused_as_bad_input(tmp_path) -> None:
    rsa = tmp_path / "rsa.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(rsa)],
                   check=True, capture_output=True)
    with pytest.raises(DataError, match="not an ed25519 key") as e:
        sign(b"{}", rsa)
    assert e.value.exit_code == 65


# -- referrers in the store, and gc -----------------------------------------------------------

def _image(store: OciStore, label: str) -> Descriptor:
    from registry_support import make_image, normalized_tar

    digest = make_image(store, [normalized_tar({"etc/motd": label.encode()})], ref=f"demo:{label}")
    return Descriptor(MT_MANIFEST, digest, store.blob_size(digest))


def test_store_referrers_are_an_index_under_the_fallback_tag_name(tmp_path) -> None:
    store = OciStore(tmp_path / "oci").ensure()
    img = _image(store, "a")
    sbom = artifact_manifest(img, MT_CYCLONEDX, b'{"bomFormat":"CycloneDX"}')
    prov = artifact_manifest(img, MT_STATEMENT, b'{"_type":"x"}', annotations={"org.opencontainers.image.title": "p"})
    add_referrers(store, img.digest, [sbom, prov])
    add_referrers(store, img.digest, [prov])  # idempotent
    ref = store.resolve(referrers_tag(img.digest))
    assert ref is not None and ref.media_type == "application/vnd.oci.image.index.v1+json"
    listed = list_referrers(store, img.digest)
    assert {d["digest"] for d in listed} == {sbom.digest, prov.digest}
    assert {d["artifactType"] for d in listed} == {MT_CYCLONEDX, MT_STATEMENT}
    assert next(d for d in listed if d["digest"] == prov.digest)["annotations"] == {"org.opencontainers.image.title": "p"}
    doc = json.loads(prov.manifest)
    assert doc["config"] == {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_DIGEST, "size": 2}
    assert sha256_digest(EMPTY_JSON) == EMPTY_DIGEST
    assert doc["subject"]["digest"] == img.digest and doc["artifactType"] == MT_STATEMENT
    assert read_artifact(store, listed[0], img.digest).blob in (b'{"bomFormat":"CycloneDX"}', b'{"_type":"x"}')
    # An artifact about another image is refused on the way in.
    other = _image(store, "b")
    with pytest.raises(IntegrityError, match="subject"):
        add_referrers(store, img.digest, [artifact_manifest(other, MT_STATEMENT, b"{}")])


def test_gc_keeps_referrers_with_their_image_and_drops_them_with_it(tmp_path) -> None:
    from hermetic.builder.gc import gc
    from hermetic.core.paths import CachePaths

    paths = CachePaths(tmp_path / "cache")
    store = OciStore(paths.oci).ensure()
    img = _image(store, "kept")
    prov = artifact_manifest(img, MT_STATEMENT, b'{"kept":1}')
    add_referrers(store, img.digest, [prov])
    blob = json.loads(prov.manifest)["layers"][0]["digest"]
    report = gc(paths)
    assert report.kept_refs == ["demo:kept"] and store.resolve(referrers_tag(img.digest)) is not None
    assert store.has_blob(prov.digest) and store.has_blob(blob) and store.has_blob(EMPTY_DIGEST)

    store.remove_ref("demo:kept")  # the image is no longer named: its attestations go with it
    report = gc(paths)
    assert report.removed_blobs >= 4  # image manifest, config, layer; artifact manifest, its blob, the empty config
    assert not store.has_blob(prov.digest) and not store.has_blob(blob) and not store.has_blob(img.digest)
    assert store.resolve(referrers_tag(img.digest)) is None
