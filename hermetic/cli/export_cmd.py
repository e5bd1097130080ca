"""``hermetic export``: an image as one file for a cluster's shared filesystem."""

from __future__ import annotations

from pathlib import Path

import click

from hermetic.cli.common import config_option, emit_json, json_option


@click.command("export")
@click.argument("image", required=False)
@click.option("--squashfs", "squashfs", is_flag=True, required=True,
              help="Write the image's filesystem as one SquashFS file (the one form export writes).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Where the file goes (default: $HERMETIC_CACHE/squashfs/sha256-<manifest hex>.sqfs); its "
                   "sidecar PATH.json goes beside it.")
@config_option
@json_option
def export(image: str | None, squashfs: bool, output: str | None, config_path: str | None, as_json: bool) -> None:
    """Write an image from the local store as one byte-reproducible SquashFS file.

    IMAGE is a manifest digest, an image ID, a store ref (name:tag), or
    omitted for the image of hermetic.yaml (from hermetic.image.json). The
    file is made from the store's verified layers (whiteouts applied;
    owners, modes and times as the layers say; nothing unpacked on this
    machine) by hermetic's own writer, data stored uncompressed (a run reads
    libraries as they lie, not decompressed at every mount): the same image
    gives the same bytes on every machine. A sidecar PATH.json
    binds the file's sha256 to the image's manifest digest; `hermetic verify
    FILE.sqfs` checks both. An intact file for the same image is kept.

    Run it with Charliecloud (`ch-run FILE.sqfs -- CMD`; `run.engine:
    charliecloud` uses it by itself), enroot/pyxis (`srun
    --container-image=FILE.sqfs`) or Apptainer (`apptainer exec FILE.sqfs
    CMD`); docs/scale-out.md says which where.

    Exit status: 0 written or already there; 66 no such image in the store;
    65 a layer blob that fails its digest or holds what cannot be packed.

    \b
    Examples:
      hermetic export --squashfs
      hermetic export sha256:3f1c... --squashfs -o /shared/images/train.sqfs --json
    """
    from hermetic.builder.image_record import recorded_manifest_digest
    from hermetic.builder.inspect import find_image
    from hermetic.config.load import find_config
    from hermetic.core.paths import cache_paths
    from hermetic.engines import squashfs as sqfs
    from hermetic.store.oci import OciStore

    paths = cache_paths()
    store = OciStore(paths.oci)
    if image is None:
        manifest_digest = recorded_manifest_digest(find_config(config_path).parent)
    else:
        manifest_digest = find_image(store, image)
    out = Path(output) if output else sqfs.store_path(paths.root, manifest_digest)
    if not as_json:
        click.echo(f"hermetic: packing {manifest_digest} into {out} ...", err=True)
    made = sqfs.make(store, manifest_digest, out.absolute())
    if as_json:
        emit_json(made.to_json())
        return
    state = "written" if made.made else "already there, intact"
    click.echo(f"{made.path} ({state})")
    click.echo(f"manifest digest: {made.manifest_digest}")
    click.echo(f"sha256:          {made.sha256}  ({made.size:,} bytes, {made.tool})")
