#!/usr/bin/env python3
"""Registry push/pull: hermetic vs skopeo, on a real docker-registry on 127.0.0.1.

What it measures (one invocation, same machine, same image):

1. First push of an image (one big random layer + a small busybox layer) to
   an empty registry: wall time and bytes sent (counted by our client).
2. Second push after a one-layer change: only the changed layer (plus the new
   config and manifest) may go over the wire.
3. CI cache: a hit on a fresh store (tag lookup + verified pull) vs the pull
   alone: the lookup must cost next to nothing.
4. The anchor users would otherwise reach for: ``skopeo copy oci:… docker://…``
   (default: it gzips uncompressed layers, so the registry digests change) and
   ``skopeo copy --preserve-digests``, each to its own empty registry; and
   ``skopeo copy docker://… oci:…`` for the pull.

Usage: bench/bench_registry.py [--size-mb 200 | --image OCI_DIR:REF] [--json]

``--image`` benches an existing image from an OCI layout (e.g. the torch
example: ``--image $HERMETIC_CACHE/oci:<ref>``); its blobs are hard-linked into
a scratch store, and the "one-layer change" replaces its last layer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

from hermetic.registry import cache_fetch, cache_publish, pull_image, push_image  # noqa: E402
from hermetic.registry.client import RegistryClient  # noqa: E402
from hermetic.store.oci import MT_MANIFEST, Descriptor, OciStore  # noqa: E402
from registry_support import (  # noqa: E402
    BUSYBOX,
    have_registry_tools,
    make_image,
    normalized_tar,
    random_layer,
    start_registry,
)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def skopeo(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run(["skopeo", *args], check=True, capture_output=True)
    return time.perf_counter() - t


def import_image(store: OciStore, spec: str, as_ref: str = "bench:a") -> str:
    """Hard-link (else copy) an image from another OCI layout into the scratch store."""
    src_dir, sep, ref = spec.partition(":")
    src = OciStore(src_dir)
    desc = src.resolve(ref) if sep else None
    if desc is None:
        raise SystemExit(f"bench_registry: no ref {ref!r} in {src_dir}")
    for d in [desc.digest] + [b.digest for b in src.image_blobs(desc.digest)]:
        dest = store.blob_path(d)
        if not dest.exists():
            try:
                os.link(src.blob_path(d), dest)
            except OSError:
                shutil.copyfile(src.blob_path(d), dest)
    store.set_ref(as_ref, Descriptor(desc.media_type, desc.digest, desc.size))
    return desc.digest


def with_last_layer_replaced(store: OciStore, digest: str, layer: bytes) -> str:
    """The same image with its last layer swapped for ``layer`` (a one-layer change)."""
    manifest = store.read_json(digest)
    config = store.read_json(manifest["config"]["digest"])
    layer_digest = store.put_bytes(layer)
    config["rootfs"]["diff_ids"][-1] = layer_digest
    cd, cs, _ = store.put_json(config)
    manifest["config"] = {**manifest["config"], "digest": cd, "size": cs}
    manifest["layers"][-1] = {"mediaType": manifest["layers"][-1]["mediaType"], "digest": layer_digest,
                              "size": len(layer)}
    md, ms, _ = store.put_json(manifest)
    store.set_ref("bench:b", Descriptor(manifest.get("mediaType", MT_MANIFEST), md, ms))
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200, help="size of the big random layer (default 200)")
    ap.add_argument("--image", metavar="OCI_DIR:REF", help="bench this image instead of a synthetic one")
    ap.add_argument("--image-b", metavar="OCI_DIR:REF",
                    help="with --image: the second image (e.g. the same example after a one-package change); "
                         "default: --image with its last layer replaced")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    missing = have_registry_tools()
    if missing:
        print(f"bench_registry: {missing}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="hermetic-bench-registry-"))
    servers = []
    try:
        ours, anchor, anchor_pd = (start_registry(tmp / name) for name in ("reg-ours", "reg-skopeo", "reg-skopeo-pd"))
        servers += [ours, anchor, anchor_pd]
        store = OciStore(tmp / "store").ensure()
        small_b = normalized_tar({"bin/busybox": BUSYBOX.read_bytes(), "etc/version": b"b\n"},
                                 executable={"bin/busybox"})
        if args.image:
            image_a = import_image(store, args.image)
            described = args.image
        else:
            big = random_layer(args.size_mb * 1_000_000, seed=1)
            small_a = normalized_tar({"bin/busybox": BUSYBOX.read_bytes()}, executable={"bin/busybox"})
            image_a = make_image(store, [big, small_a], ref="bench:a", label="a")
            del big
            described = f"{args.size_mb} MB random layer + busybox layer, uncompressed"
        if args.image and args.image_b:
            image_b = import_image(store, args.image_b, "bench:b")
            described += f" -> {args.image_b}"
        else:
            image_b = with_last_layer_replaced(store, image_a, small_b)
        total_a = sum(d.size for d in store.image_blobs(image_a)) + store.blob_size(image_a)
        in_a = {d.digest for d in store.image_blobs(image_a)}
        changed = sum(d.size for d in store.image_blobs(image_b) if d.digest not in in_a) + store.blob_size(image_b)

        r: dict[str, float | int | str] = {"image": described, "image_bytes": total_a,
                                           "layers": len(store.image_blobs(image_a)) - 1}

        first, r["push_first_s"] = timed(lambda: push_image(store, image_a, f"{ours.host}/bench/img:a"))
        r["push_first_bytes"] = first.stats.bytes_sent
        second, r["push_second_s"] = timed(lambda: push_image(store, image_b, f"{ours.host}/bench/img:b"))
        r["push_second_bytes"] = second.stats.bytes_sent
        r["push_second_expected_bytes"] = changed

        r["skopeo_push_first_s"] = skopeo("copy", "--dest-tls-verify=false", f"oci:{store.root}:bench:a",
                                          f"docker://{anchor.host}/bench/img:a")
        r["skopeo_push_second_s"] = skopeo("copy", "--dest-tls-verify=false", f"oci:{store.root}:bench:b",
                                           f"docker://{anchor.host}/bench/img:b")
        skopeo_digest = json.loads(subprocess.run(
            ["skopeo", "inspect", "--tls-verify=false", f"docker://{anchor.host}/bench/img:a"],
            check=True, capture_output=True, text=True).stdout)["Digest"]
        r["skopeo_default_keeps_digest"] = str(skopeo_digest == image_a)
        r["skopeo_pd_push_first_s"] = skopeo("copy", "--preserve-digests", "--dest-tls-verify=false",
                                             f"oci:{store.root}:bench:a", f"docker://{anchor_pd.host}/bench/img:a")

        key = "5e" * 32
        cache_publish(store, f"{ours.host}/bench/cache", key, image_a)
        # Interleaved, fresh store each time, median of five: page-cache order must not pick the winner.
        hits, pulls = [], []
        for i in range(5):
            fresh = OciStore(tmp / f"fresh-hit{i}").ensure()
            hit, t = timed(lambda f=fresh: cache_fetch(f, f"{ours.host}/bench/cache", key))
            assert hit is not None and hit.manifest_digest == image_a and fresh.has_image(image_a)
            hits.append(t)
            fresh = OciStore(tmp / f"fresh-pull{i}").ensure()
            pulled, t = timed(lambda f=fresh: pull_image(f, f"{ours.host}/bench/img@{image_a}"))
            assert pulled.manifest_digest == image_a and fresh.has_image(image_a)
            pulls.append(t)
            shutil.rmtree(tmp / f"fresh-hit{i}")
            shutil.rmtree(tmp / f"fresh-pull{i}")
        r["cache_hit_s"], r["pull_s"] = sorted(hits)[2], sorted(pulls)[2]
        r["pull_bytes"] = pulled.stats.bytes_received
        r["skopeo_pull_s"] = skopeo("copy", "--src-tls-verify=false", "--dest-oci-accept-uncompressed-layers",
                                    f"docker://{ours.host}/bench/img@{image_a}", f"oci:{tmp / 'skopeo-pull'}:a")
        lookup_client = RegistryClient(ours.host)
        _, r["cache_lookup_s"] = timed(lambda: lookup_client.head_manifest("bench/cache", "hk-" + key))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    mb = 1_000_000
    if args.json:
        print(json.dumps(r, indent=2, sort_keys=True))
        return 0
    rows = [
        ("first push (empty registry)", r["push_first_s"], r["skopeo_push_first_s"],
         f"{r['push_first_bytes'] / mb:.1f} MB sent"),
        ("second push (one small layer changed)", r["push_second_s"], r["skopeo_push_second_s"],
         f"{r['push_second_bytes'] / 1000:.1f} kB sent (changed blobs: {r['push_second_expected_bytes'] / 1000:.1f} kB)"),
        ("pull by digest into an empty store", r["pull_s"], r["skopeo_pull_s"],
         f"{r['pull_bytes'] / mb:.1f} MB verified"),
    ]
    print(f"image: {r['image']} ({r['layers']} layers, {r['image_bytes'] / mb:.1f} MB)")
    print(f"{'':40} {'hermetic':>9} {'skopeo':>9} {'ratio':>7}")
    for name, ours_s, theirs_s, note in rows:
        print(f"{name:40} {ours_s:8.2f}s {theirs_s:8.2f}s {theirs_s / ours_s:6.2f}x  {note}")
    print(f"{'first push, skopeo --preserve-digests':40} {r['push_first_s']:8.2f}s "
          f"{r['skopeo_pd_push_first_s']:8.2f}s {r['skopeo_pd_push_first_s'] / r['push_first_s']:6.2f}x")
    print(f"skopeo copy (default) kept the manifest digest: {r['skopeo_default_keeps_digest']}")
    print(f"CI cache hit on a fresh store: {r['cache_hit_s']:.2f}s vs pull alone {r['pull_s']:.2f}s "
          f"(ratio {r['cache_hit_s'] / r['pull_s']:.2f}; tag lookup alone {r['cache_lookup_s'] * 1000:.1f} ms)")
    print("ratio = skopeo time / hermetic time (>1: hermetic is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
