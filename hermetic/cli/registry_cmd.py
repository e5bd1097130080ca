"""``hermetic push`` / ``hermetic pull``: the local OCI store <-> a registry, by digest."""

from __future__ import annotations

import click

from hermetic.cli.common import config_option, emit_json, human_bytes, json_option, oci_store, transfer_progress
from hermetic.core.display import escape_controls
from hermetic.core.errors import HermeticError, NotFound, UsageError


timeout_option = click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True, max=30 * 86400), default=None, metavar="SECONDS",
    help="Give up (exit 75) when the whole transfer is not done after this long. "
         "Default: $HERMETIC_REGISTRY_TIMEOUT, else 3600.")


def image_to_push(store, image: str | None, config_path: str | None) -> str:
    """The manifest digest to push: --image (digest or store ref), else the build record."""
    from hermetic.core.reference import check_digest

    if image:
        if image.startswith("sha256:"):
            check_digest(image, "--image", UsageError)
            if store.find_manifest(image) is None:
                raise NotFound(f"--image {image}: no such image in the store {store.root}")
            return image
        desc = store.resolve(image)
        if desc is None:
            raise NotFound(f"--image {image}: no such ref in the store {store.root}",
                                hint="pass the manifest digest (sha256:…) that hermetic build printed")
        return desc.digest
    from hermetic.builder.image_record import recorded_manifest_digest
    from hermetic.config.load import find_config

    try:
        cfg = find_config(config_path)
    except HermeticError as e:
        raise HermeticError(f"{e.message}; or name the image with --image sha256:…", exit_code=e.exit_code) from None
    return recorded_manifest_digest(cfg.parent, otherwise="or pass --image sha256:…")


@click.command()
@click.argument("ref", metavar="REF")
@click.option("--image", metavar="DIGEST|NAME",
              help="Image to push: a manifest digest (sha256:…) or a ref in the local store. "
                   "Default: manifest_digest from hermetic.image.json beside hermetic.yaml.")
@click.option("--workers", type=click.IntRange(1, 8), default=4, show_default=True, help="Parallel blob uploads.")
@click.option("--sign-key", type=click.Path(dir_okay=False), default=None, metavar="KEY.pem",
              help="Sign the provenance with this ed25519 private key (DSSE) and attach the signature; "
                   "check it with `hermetic verify --key PUB.pem`.")
@timeout_option
@config_option
@json_option
def push(ref: str, image: str | None, workers: int, sign_key: str | None, timeout: float | None,
         config_path: str | None, as_json: bool) -> None:
    """Push an image from the local store to a registry, keeping every digest.

    REF is HOST[:PORT]/REPO[:TAG]. The registry receives the exact bytes of the
    store (no recompression), so the repo digest it prints equals the local
    manifest digest. Blobs the repository already has are skipped, blobs known
    to be in another repository of the same registry are mounted, the rest are
    uploaded in parallel. Rerun a push that was interrupted: it finishes.

    The image's SBOM and provenance go along as OCI 1.1 referrers (the
    referrers API where the registry has it, else the tag sha256-<hex>), and
    so does its base's manifest, so `hermetic verify` can rebuild it anywhere.

    Credentials: HERMETIC_REGISTRY_USER / HERMETIC_REGISTRY_PASSWORD, else
    ~/.docker/config.json (docker login, credential helpers). A registry that
    stalls ends the push with exit 75: --timeout bounds the whole push,
    HERMETIC_REGISTRY_REQUEST_TIMEOUT each request, and a blob that moves
    slower than HERMETIC_REGISTRY_MIN_RATE bytes/s (0: no minimum) over
    HERMETIC_REGISTRY_RATE_WINDOW seconds is ended (defaults 60, 1024, 30;
    docs/registry.md).

    \b
    Examples:
      hermetic build && hermetic push ghcr.io/acme/train:v1
      hermetic push 127.0.0.1:5000/train --image sha256:4f1c… --json
      hermetic push 127.0.0.1:5000/train --sign-key release.pem   # openssl genpkey -algorithm ed25519
    """
    from hermetic.registry.push import parse_push_ref, push_image

    name = parse_push_ref(ref)
    store = oci_store()
    digest = image_to_push(store, image, config_path)
    if sign_key:
        from pathlib import Path

        from hermetic.builder.attest import sign_stored_provenance

        sign_stored_provenance(store, digest, Path(sign_key))
    progress = transfer_progress()
    try:
        result = push_image(store, digest, name, workers=workers, progress=progress, timeout=timeout)
    finally:
        progress.close()
    if as_json:
        emit_json(result.to_json())
        return
    s = result.stats
    target = f"{result.registry}/{result.repository}" + (f":{result.tag}" if result.tag else "")
    click.echo(f"pushed {target}: {s.blobs_uploaded} blobs uploaded ({human_bytes(s.bytes_sent)} sent), "
               f"{s.blobs_mounted} mounted, {s.blobs_skipped} already there", err=True)
    for a in result.attached:
        click.echo(f"  attached {escape_controls(a)}", err=True)
    click.echo(result.repo_digest)


@click.command()
@click.argument("ref", metavar="REF@sha256:DIGEST")
@click.option("--platform", default="linux/amd64", show_default=True, metavar="OS/ARCH",
              help="Which image to take from a multi-platform index.")
@timeout_option
@json_option
def pull(ref: str, platform: str, timeout: float | None, as_json: bool) -> None:
    """Pull an image by digest into the local store, verifying every byte.

    Each blob is hashed while it streams in and must match its digest and
    size, and so are the image's attestations (SBOM, provenance, signature:
    its OCI 1.1 referrers), which must name the image as their subject; the
    pull is all or nothing, so a registry that serves one wrong
    byte leaves the store unchanged. An image index (or Docker manifest list)
    resolves to its linux/amd64 image. The image gets the store ref
    HOST/REPO@sha256:… (readable with: skopeo inspect oci:STORE:REF). A
    registry that stalls ends the pull with exit 75: --timeout bounds the
    whole pull, HERMETIC_REGISTRY_REQUEST_TIMEOUT each request, and a blob
    that moves slower than HERMETIC_REGISTRY_MIN_RATE bytes/s (0: no minimum)
    over HERMETIC_REGISTRY_RATE_WINDOW seconds is ended (defaults 60, 1024, 30).

    \b
    Examples:
      hermetic pull ghcr.io/acme/train@sha256:4f1c…
      hermetic pull 127.0.0.1:5000/train@sha256:4f1c… --json
    """
    from hermetic.registry.pull import pull_image

    os_name, sep, arch = platform.partition("/")
    if not sep or not os_name or not arch:
        raise UsageError(f"--platform {platform}: write OS/ARCH, e.g. linux/amd64")
    store = oci_store()
    progress = transfer_progress()
    try:
        result = pull_image(store, ref, platform=(os_name, arch), progress=progress, timeout=timeout)
    finally:
        progress.close()
    if as_json:
        emit_json(result.to_json())
        return
    if result.already_present:
        click.echo(f"already in the store: {result.ref_name}", err=True)
    else:
        s = result.stats
        click.echo(f"pulled {result.ref_name}: {s.blobs_downloaded} blobs ({human_bytes(s.bytes_received)}) verified",
                   err=True)
    for a in result.attestations:
        click.echo(f"  attestation {escape_controls(a)} verified", err=True)
    for n in result.notes:
        click.echo(f"hermetic: warning: {escape_controls(n)}", err=True)
    click.echo(result.manifest_digest)

