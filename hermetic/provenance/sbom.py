"""The image's SBOM: CycloneDX 1.6 JSON (cyclonedx-python-lib; why not SPDX: docs/provenance.md).

Components: each wheel (``pkg:pypi``, with its sha256), each Debian package of the base from its dpkg status
(``pkg:deb``), the base OS, the runtime; the image is the subject. Deterministic: bom-refs are purls, the serial
a UUIDv5 of the image digest, the timestamp the image's ``created``, keys sorted.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import uuid
from dataclasses import dataclass
from typing import Iterable

from hermetic.core.canonical import pretty_json
from hermetic.provenance.statement import WheelFact


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    source: str | None = None


def installed_deb_packages(status: str) -> list[DebPackage]:
    """Installed packages of a dpkg status file (deb822 paragraphs). A paragraph without a Status field counts
    as installed: distroless images keep one file per package in ``var/lib/dpkg/status.d/`` without it."""
    out = []
    for para in re.split(r"\n\s*\n", status):
        fields = {}
        for line in para.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line[:1].isspace():  # (continuation lines: Description, Conffiles: not needed)
                fields[key.strip()] = value.strip()
        if fields.get("Package") and "installed" in fields.get("Status", "install ok installed").split():
            source = fields.get("Source", "").split(" ")[0] or None
            out.append(DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""), source))
    return sorted(out, key=lambda p: (p.name, p.arch))


def os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip().strip('"')
    return out


def make_sbom(*, image_name: str, manifest_digest: str, created_epoch: int, hermetic_version: str,
              runtime_sha256: str, wheels: Iterable[WheelFact], dpkg_status: str, os_release_text: str) -> bytes:
    """The CycloneDX 1.6 JSON bytes for one image."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"urn:hermetic:sbom:{manifest_digest}"))
    bom.metadata.timestamp = _dt.datetime.fromtimestamp(created_epoch, _dt.timezone.utc)
    root_purl = PackageURL("oci", None, image_name.rsplit("/", 1)[-1], manifest_digest)
    root = Component(name=image_name, version=manifest_digest, type=ComponentType.CONTAINER, purl=root_purl,
                     bom_ref=root_purl.to_string())
    bom.metadata.component = root
    bom.metadata.tools.components.add(Component(name="hermetic", version=hermetic_version,
                                                type=ComponentType.APPLICATION, bom_ref="tool:hermetic"))
    components = []
    for w in wheels:
        purl = PackageURL("pypi", None, w.name, w.version, {"file_name": w.filename})
        components.append(Component(name=w.name, version=w.version, type=ComponentType.LIBRARY, purl=purl,
                                    bom_ref=purl.to_string(),
                                    hashes=[HashType(alg=HashAlgorithm.SHA_256, content=w.sha256)]))
    osr = os_release(os_release_text)
    distro_id = (osr.get("ID") or "debian").lower()
    codename = osr.get("VERSION_CODENAME")
    for p in installed_deb_packages(dpkg_status):
        qualifiers = {"arch": p.arch} if p.arch else {}
        if codename:
            qualifiers["distro"] = codename
        purl = PackageURL("deb", distro_id, p.name, p.version, qualifiers)
        props = [Property(name="hermetic:deb:source", value=p.source)] if p.source else []
        components.append(Component(name=p.name, version=p.version, type=ComponentType.LIBRARY, purl=purl,
                                    bom_ref=purl.to_string(), properties=props))
    if osr.get("ID"):
        components.append(Component(name=osr["ID"], version=osr.get("VERSION_ID") or None,
                                    type=ComponentType.OPERATING_SYSTEM, description=osr.get("PRETTY_NAME"),
                                    bom_ref=f"os:{osr['ID']}:{osr.get('VERSION_ID', '')}"))
    components.append(Component(name="hermetic-runtime", version=hermetic_version, type=ComponentType.LIBRARY,
                                bom_ref="hermetic-runtime",
                                properties=[Property(name="hermetic:sources-sha256", value=runtime_sha256)]))
    for c in components:
        bom.components.add(c)
    bom.register_dependency(root, components)
    text = JsonV1Dot6(bom).output_as_string()
    return pretty_json(json.loads(text)).encode("utf-8")
