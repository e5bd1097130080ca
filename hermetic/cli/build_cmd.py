"""``hermetic build`` and ``hermetic inspect``."""

from __future__ import annotations

import click

from hermetic.cli.common import config_option, emit, emit_json, human_bytes, json_option, oci_store
from hermetic.core.paths import cache_paths


@click.command()
@config_option
@click.option("--offline", is_flag=True, help="Never touch the network (wheels and base must be in the store).")
@click.option("--no-load", is_flag=True, help="Build into the OCI store only; do not load into the Docker Engine.")
@click.option("--cache", "cache_repo", metavar="REGISTRY/REPO", default=None,
              help="CI cache: pull the image for this build key from REGISTRY/REPO if there, else build and push.")
@json_option
def build(config_path: str | None, offline: bool, no_load: bool, cache_repo: str | None, as_json: bool) -> None:
    """Build the image for hermetic.yaml: byte-reproducible, referenced by digest.

    No Dockerfile, no pip inside a container: locked wheels are installed
    from the verified wheel store into normalized, uncompressed layers (one
    per big wheel), so the same inputs give the same image ID on any machine.
    A build whose key is already in the store is a no-op. The image is loaded
    into the Docker Engine only when the engine lacks it; hermetic.image.json
    beside hermetic.yaml records every input with its digest, and
    hermetic.provenance.json is its SLSA provenance (docs/provenance.md).

    \b
    Example:
      hermetic build                # prints the image ID and manifest digest
      hermetic build --json | jq .image_id
      hermetic build --cache 127.0.0.1:5000/team/train   # CI: reuse across runners
    """
    from hermetic.config.load import load_config

    paths = cache_paths()
    cfg = load_config(config_path)

    def on_layer(b) -> None:
        if not as_json:
            state = "cached" if b.cached else f"built in {b.seconds:.1f}s"
            click.echo(f"  layer {b.descriptor.digest[7:19]}  {human_bytes(b.descriptor.size):>9}  {state:<16} "
                       f"{b.spec.description}", err=True)

    from hermetic.builder.build import build as do_build
    from hermetic.registry import pull_base

    cache = None
    if cache_repo:  # the registry client only when asked: a no-op build stays light
        from hermetic.registry import RegistryCache

        cache = RegistryCache(cache_repo)
    result = do_build(cfg, paths, offline=offline, load=not no_load, on_layer=on_layer, pull_base=pull_base,
                      log=None if as_json else (lambda s: click.echo(s, err=True)), cache=cache)
    if as_json:
        emit_json(result.to_json())
        return
    for n in result.notes:
        click.echo(f"hermetic: warning: {n}", err=True)
    state = "up to date" if result.noop else "built"
    if result.loaded:
        state += ", loaded into the Docker Engine"
    click.echo(f"{state} in {result.seconds:.2f}s")
    click.echo(f"image id:        {result.image_id}")
    click.echo(f"manifest digest: {result.manifest_digest}")


@click.command("inspect")
@click.argument("image", required=False)
@config_option
@json_option
def inspect_image(image: str | None, config_path: str | None, as_json: bool) -> None:
    """Show an image's layers, env and labels from the OCI store.

    IMAGE is a manifest digest, an image ID, a store ref (name:tag), or
    omitted for the image of hermetic.yaml (from hermetic.image.json).

    \b
    Example:
      hermetic inspect
      hermetic inspect sha256:3f1c... --json
    """
    from hermetic.builder.image_record import recorded_manifest_digest
    from hermetic.builder.inspect import describe, find_image
    from hermetic.config.load import find_config

    store = oci_store()
    if image is None:
        manifest_digest = recorded_manifest_digest(find_config(config_path).parent)
    else:
        manifest_digest = find_image(store, image)
    info = describe(store, manifest_digest)
    emit(as_json, info, "\n".join([
        f"manifest digest: {info['manifest_digest']}", f"image id:        {info['image_id']}",
        f"created:         {info['created']}   user: {info['user']}   workdir: {info['workdir']}", "layers:",
        *(f"  {la['digest'][7:19]}  {human_bytes(la['size']):>9}  {la['created_by']}" for la in info["layers"]),
        "env:", *(f"  {e}" for e in info["env"]),
        "labels:", *(f"  {k}={v}" for k, v in sorted(info["labels"].items()))]))
