"""Supply-chain documents about an image, pure functions from build facts to bytes and back: ``statement``
(in-toto Statement v1, SLSA Provenance v1), ``sbom`` (CycloneDX 1.6), ``dsse`` (ed25519 envelopes). Nothing
here touches the network, the store or the engine (the builder gathers the facts, the store and the registry
keep and attach the artifacts).
"""

from __future__ import annotations

PROVENANCE_FILE = "hermetic.provenance.json"  # beside hermetic.image.json

# The artifact (and layer) media types of hermetic's attestations; a pull fetches referrers of these types.
MT_STATEMENT = "application/vnd.in-toto+json"  # an in-toto Statement in JSON (attestation spec v1)
MT_CYCLONEDX = "application/vnd.cyclonedx+json"  # IANA-registered
MT_DSSE = "application/vnd.in-toto.provenance+dsse"  # in-toto attestation v1 envelope.md, "Storage convention"
ATTESTATION_TYPES = (MT_STATEMENT, MT_CYCLONEDX, MT_DSSE)
