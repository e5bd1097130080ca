"""Supply-chain documents about an image: pure functions from build facts to bytes, and back.

- ``statement``: the in-toto Statement v1 with a SLSA Provenance v1 predicate
  (everything a rebuild needs: config, the lock's bytes, base and wheels by
  digest, the layer plan) and its strict reader.
- ``sbom``: a CycloneDX 1.6 JSON SBOM (wheels as ``pkg:pypi``, the base's
  Debian packages from its dpkg status as ``pkg:deb``).
- ``dsse``: DSSE envelopes signed with an ed25519 key (optional ``sign`` extra).

Nothing here touches the network, the store or the engine: the builder
(hermetic/builder/attest.py) gathers the facts and stores the artifacts
(hermetic/store/referrers.py); the registry attaches them
(hermetic/registry/referrers.py); hermetic/reproduce rebuilds from them.
"""

from __future__ import annotations

PROVENANCE_FILE = "hermetic.provenance.json"  # beside hermetic.image.json

# The artifact (and layer) media types of hermetic's attestations; a pull fetches referrers of these types.
MT_STATEMENT = "application/vnd.in-toto+json"  # an in-toto Statement in JSON (attestation spec v1)
MT_CYCLONEDX = "application/vnd.cyclonedx+json"  # IANA-registered
MT_DSSE = "application/vnd.in-toto.provenance+dsse"  # in-toto attestation v1 envelope.md, "Storage convention"
ATTESTATION_TYPES = (MT_STATEMENT, MT_CYCLONEDX, MT_DSSE)
