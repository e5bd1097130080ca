"""``hermetic verify``: rebuild an image from its provenance and compare, digest for digest.

``source`` reads and checks the image and its attestations, ``rebuild`` builds from the provenance alone,
``compare`` says which layer, file or config key differs. 0 only for the same manifest digest;
NOT_REPRODUCED when it differs; a refusal is a HermeticError with its own code.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermetic.core.errors import EXIT_DIFFERENT
from hermetic.core.reference import ImageName
from hermetic.core.paths import CachePaths
from hermetic.store.oci import OciStore

NOT_REPRODUCED = EXIT_DIFFERENT  # like `hermetic diff`: a verdict, not an error


@dataclass
class VerifyResult:
    reference: str
    digest: str
    rebuilt_digest: str
    image_id: str
    rebuilt_image_id: str
    provenance: str
    sbom: str | None
    signature: dict[str, Any] | None
    layers: list[Any] = field(default_factory=list)  # compare.LayerDiff
    config: list[str] = field(default_factory=list)
    provenance_reproduced: bool = False
    notes: list[str] = field(default_factory=list)
    scratch: str | None = None

    @property
    def reproduced(self) -> bool:
        return self.digest == self.rebuilt_digest

    @property
    def exit_code(self) -> int:
        return 0 if self.reproduced else NOT_REPRODUCED

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "reference": self.reference, "digest": self.digest,
                "rebuilt_digest": self.rebuilt_digest, "image_id": self.image_id,
                "rebuilt_image_id": self.rebuilt_image_id, "provenance": self.provenance, "sbom": self.sbom,
                "signature": self.signature, "layers": [x.to_json() for x in self.layers], "config": self.config,
                "provenance_reproduced": self.provenance_reproduced, "notes": self.notes, "scratch": self.scratch}


def verify(name: ImageName, *, user_paths: CachePaths, key: Path | None = None, keep: bool = False,
           scratch_root: Path | None = None, log: Callable[[str], None] | None = None) -> VerifyResult:
    """Rebuild ``name`` from its provenance in a scratch directory (under ``scratch_root``, default the
    system's temp dir; removed afterwards unless ``keep``) and compare."""
    from hermetic.provenance import PROVENANCE_FILE
    from hermetic.reproduce import compare
    from hermetic.reproduce.rebuild import rebuild
    from hermetic.reproduce.source import open_subject

    subject = open_subject(name, local_store=OciStore(user_paths.oci), key=key)
    facts = subject.facts
    if log:
        log(f"provenance {subject.provenance_artifact[:19]}: {facts.name}, {len(facts.wheels)} wheel(s), "
            f"{len(facts.layers)} layer(s), hermetic {facts.hermetic_version}")
    if scratch_root is not None:
        scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="hermetic-verify.", dir=scratch_root))
    try:
        sources = [ImageName(name.host, name.registry_repository(), None, None)] if name.host else []
        rebuilt = rebuild(facts, scratch, user_paths=user_paths, base_sources=sources, log=log)
        store = OciStore(rebuilt.paths.oci)
        new_manifest = store.read_json(rebuilt.manifest_digest)
        new_config = store.read_json(new_manifest["config"]["digest"])
        result = VerifyResult(str(name), subject.digest, rebuilt.manifest_digest,
                              subject.manifest["config"]["digest"], new_manifest["config"]["digest"],
                              subject.provenance_artifact, subject.sbom, subject.signature,
                              notes=subject.notes + rebuilt.notes, scratch=str(scratch) if keep else None)
        try:
            result.provenance_reproduced = (rebuilt.project / PROVENANCE_FILE).read_bytes() == subject.provenance
        except FileNotFoundError:
            pass
        if not result.reproduced:
            contents = [x.contents for x in facts.layers]
            wheels = [x.wheels for x in facts.layers]
            result.layers = compare.layer_differences(subject.manifest, new_manifest, contents, wheels)
            for diff in result.layers:
                if diff.image_digest and diff.rebuilt_digest:
                    ours = store.blob_path(diff.rebuilt_digest)
                    theirs = subject.fetch_blob(diff.image_digest, store)
                    lines = compare.tar_differences(theirs, ours)
                    diff.files_differing = len(lines)
                    diff.files = lines[:compare.MAX_FILE_NOTES]
            if result.image_id != result.rebuilt_image_id:
                result.config = compare.config_differences(subject.config, new_config)
            if not result.layers and not result.config:
                ann = (subject.manifest.get("annotations"), new_manifest.get("annotations"))
                result.config = [f"the manifests differ outside layers and config (annotations {ann[0]!r} vs "
                                 f"{ann[1]!r})"]
        return result
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def render(result: VerifyResult) -> list[str]:
    """The human report; the first line is the verdict."""
    if result.reproduced:
        lines = [f"reproduced: {result.digest}"]
    else:
        lines = [f"not reproduced: the rebuild is {result.rebuilt_digest}, the image is {result.digest}"]
        for d in result.layers:
            lines.append("  " + d.headline())
            for f in d.files:
                lines.append(f"    {f}")
            if d.files_differing > len(d.files):
                lines.append(f"    … {d.files_differing - len(d.files)} more")
        for c in result.config:
            lines.append(f"  config: {c}")
    if result.signature:
        lines.append(f"  signature: {result.signature['envelope'][:19]} verified (keyid {result.signature['keyid'][:16]}…)")
    lines.append(f"  provenance: {result.provenance}" + (f", sbom: {result.sbom}" if result.sbom else ""))
    for n in result.notes:
        lines.append(f"  note: {n}")
    if result.scratch:
        lines.append(f"  scratch kept: {result.scratch}")
    return lines


def dumps(result: VerifyResult) -> str:
    return json.dumps(result.to_json(), indent=2, sort_keys=True)
