"""hermetic.slurm.shared alone, without Slurm or an engine: which filesystems count as the nodes' own, and the
copy of an image into a shared store (every blob checked as it is written; one it holds is not copied again; a
corrupt one is refused and nothing of it enters)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hermetic.core.canonical import canonical_json
from hermetic.core.errors import IntegrityError
from hermetic.hostfs.filesystems import filesystem_of
from hermetic.slurm.shared import copy_image, shared_because
from hermetic.store.oci import MT_CONFIG, MT_LAYER, MT_MANIFEST, Descriptor, OciStore


def small_image(store: OciStore) -> tuple[str, str]:
    """(manifest digest, layer digest) of a one-layer image written into ``store``."""
    layer = store.put_bytes(b"not a real tar, but a blob with a digest" * 100)
    config = store.put_bytes(canonical_json({"architecture": "amd64", "os": "linux",
                                             "rootfs": {"type": "layers", "diff_ids": [layer]}}))
    manifest = canonical_json({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config, "size": store.blob_size(config)},
        "layers": [{"mediaType": MT_LAYER, "digest": layer, "size": store.blob_size(layer)}],
    })
    digest = store.put_bytes(manifest)
    store.set_ref("small:latest", Descriptor(MT_MANIFEST, digest, len(manifest)))
    return digest, layer


def test_tmpfs_is_no_nodes_filesystem_and_a_shared_root_is():
    assert filesystem_of(Path("/dev/shm")) is not None and filesystem_of(Path("/dev/shm"))[1] == "tmpfs"
    assert shared_because(Path("/dev/shm/x"), ()) is None
    assert shared_because(Path("/dev/shm/x"), (Path("/dev/shm"),)) == "below --shared-root /dev/shm"


def test_an_image_is_copied_blob_by_blob_once_and_named(tmp_path):
    src = OciStore(tmp_path / "a" / "oci").ensure()
    dst = OciStore(tmp_path / "b" / "oci")
    digest, _layer = small_image(src)
    assert copy_image(src, dst, digest, "small:latest") == 3  # manifest, config, layer
    assert dst.has_image(digest) and dst.resolve("small:latest").digest == digest
    assert copy_image(src, dst, digest, "small:latest") == 0  # what it holds intact is not copied again


def test_a_corrupt_blob_is_refused_and_nothing_of_it_enters(tmp_path):
    src = OciStore(tmp_path / "a" / "oci").ensure()
    dst = OciStore(tmp_path / "b" / "oci")
    digest, layer = small_image(src)
    blob = src.blob_path(layer)
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[10] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"blob {layer} in the store at .* does not match its digest"):
        copy_image(src, dst, digest)
    assert not dst.blob_path(layer).exists()
    assert not any(json.loads((dst.root / "index.json").read_text()).get("manifests") or [])
