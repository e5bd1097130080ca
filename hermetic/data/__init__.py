"""Datasets: checksum manifests (sha256sum / BagIt format) and fast verification.

The API other modules call (``hermetic run`` refuses to start when a dataset
fails; ``hermetic diff`` names the data files that changed between runs):

- ``verify_dataset(root, manifest_path, *, full=False, progress=False) -> VerifyReport``
- ``verify_configured(cfg, names=None, *, full=False, progress=False) -> list[DatasetReport]``
- ``read_manifest(path) -> Manifest`` (ManifestError with file:line when malformed)
- ``build_manifest(root) -> Manifest``; ``format_manifest(entries) -> bytes``
- ``diff_manifests(old, new) -> (added, removed, changed)``
- ``StatCache``: (dev, ino, size, mtime_ns, ctime_ns) -> sha256 with git's racy-clean rule
"""

from hermetic.data.manifest import (
    Manifest, ManifestError, diff_manifests, format_manifest, parse_manifest, read_manifest,
)
from hermetic.data.scan import TreeError
from hermetic.data.statcache import StatCache, stat_key
from hermetic.data.verify import DatasetReport, VerifyReport, build_manifest, verify_configured, verify_dataset

__all__ = [
    "DatasetReport", "Manifest", "ManifestError", "StatCache", "TreeError", "VerifyReport",
    "build_manifest", "diff_manifests", "format_manifest", "parse_manifest", "read_manifest",
    "stat_key", "verify_configured", "verify_dataset",
]
