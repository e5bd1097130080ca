"""DSSE v1 envelopes over the provenance, signed with an ed25519 key the user holds (optional ``sign`` extra).

The signature is over PAE(payloadType, payload), so the payload's bytes are signed exactly as stored; ed25519 is
deterministic, so the same provenance and key give the same envelope. Keys are PEM as ``openssl genpkey
-algorithm ed25519`` writes them; the keyid is the sha256 of the raw public key (docs/provenance.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from hermetic.core.canonical import canonical_json
from hermetic.core.errors import DataError, IntegrityError, ReadError, Unavailable
from hermetic.provenance import MT_STATEMENT

PAYLOAD_TYPE = MT_STATEMENT


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise Unavailable("signing needs the 'sign' extra (the cryptography package): "
                          "pip install 'hermetic[sign]'") from None
    return serialization, ed25519


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ReadError(f"{what} {path}: cannot read it ({e.strerror or e})") from None


def load_private_key(path: Path):
    serialization, ed25519 = _crypto()
    data = _read(path, "--sign-key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise DataError(f"--sign-key {path}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise DataError(f"--sign-key {path}: not an ed25519 key (make one: openssl genpkey -algorithm ed25519)")
    return key


def load_public_key(path: Path):
    serialization, ed25519 = _crypto()
    data = _read(path, "--key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:  # a private key names its public key too
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as e:
            raise DataError(f"--key {path}: not a PEM public key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise DataError(f"--key {path}: not an ed25519 public key")
    return key


def keyid(public_key: Any) -> str:
    serialization, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def sign(payload: bytes, key_path: Path) -> bytes:
    """A DSSE envelope (canonical JSON) over ``payload``, signed with the ed25519 key at ``key_path``."""
    key = load_private_key(key_path)
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    return canonical_json({
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}],
    })


def verify(envelope: bytes, key_path: Path, *, what: str = "signature") -> bytes:
    """The payload of ``envelope`` if one of its signatures verifies with the public key at ``key_path``."""
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(key_path)
    try:
        doc = json.loads(envelope)
        payload = base64.b64decode(doc["payload"], validate=True)
        payload_type = doc["payloadType"]
        sigs = doc["signatures"]
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{what}: not a DSSE envelope") from None
    if payload_type != PAYLOAD_TYPE:
        raise IntegrityError(f"{what}: payloadType {payload_type!r}, not {PAYLOAD_TYPE}")
    message = pae(payload_type, payload)
    for s in sigs if isinstance(sigs, list) else []:
        try:
            key.verify(base64.b64decode(s.get("sig", ""), validate=True), message)
            return payload
        except (InvalidSignature, ValueError, TypeError, AttributeError):
            continue
    raise IntegrityError(f"{what}: no signature verifies with the key {key_path} (keyid {keyid(key)[:16]}…)")
