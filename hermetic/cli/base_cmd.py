"""``hermetic base``: bootstrap, pin and list base images."""

from __future__ import annotations

import click

from dataclasses import asdict

from hermetic.cli.common import config_option, emit, emit_json, json_option, oci_store
from hermetic.core.errors import NotFound, UsageError


@click.group()
def base() -> None:
    """Base images, always pinned by digest."""


@base.command("bootstrap")
@click.argument("recipe", default="debian-bookworm-python3")
@click.option("--pin", "pin_config", metavar="HERMETIC_YAML", type=click.Path(dir_okay=True),
              help="Write the resulting reference into this hermetic.yaml (or directory holding one).")
@click.option("--source-date-epoch", type=int, default=0, show_default=True, help="Timestamp for every file.")
@json_option
def bootstrap_cmd(recipe: str, pin_config: str | None, source_date_epoch: int, as_json: bool) -> None:
    """Build a minimal base image from Debian's packages (mmdebstrap), offline from registries.

    RECIPE is a name under images/ (default: debian-bookworm-python3) or a
    path to a recipe.yaml. The image lands in the local OCI store; its
    reference NAME@sha256:... is what `base:` in hermetic.yaml takes.

    \b
    Example:
      hermetic base bootstrap --pin .
    """
    from hermetic.builder.bootstrap import bootstrap, find_recipe

    path = find_recipe(recipe)
    if pin_config:
        from hermetic.config.load import find_config

        find_config(pin_config)  # a missing hermetic.yaml is said now, not after the bootstrap's minute
    log = None if as_json else (lambda s: click.echo(s, err=True))
    res = bootstrap(path, oci_store(), source_date_epoch=source_date_epoch, log=log)
    pinned = _pin(pin_config, res.reference, quiet=as_json) if pin_config else None
    if as_json:
        emit_json({**asdict(res), "pinned": pinned})
        return
    click.echo(f"{len(res.packages)} Debian packages, {res.size / 1e6:.1f} MB layer")
    click.echo(res.reference)


def _pin(config: str, reference: str, *, quiet: bool) -> str:
    from hermetic.builder.pin import pin_base
    from hermetic.config.load import find_config

    cfg_file = find_config(config)
    old, changed = pin_base(cfg_file, reference)
    if not quiet:
        if changed:
            click.echo(f"pinned {cfg_file}: base: {reference}" + (f" (was {old})" if old else ""), err=True)
        else:
            click.echo(f"{cfg_file} already pins {reference}", err=True)
    return str(cfg_file)


@base.command("pin")
@click.argument("ref")
@config_option
@json_option
def pin_cmd(ref: str, config_path: str | None, as_json: bool) -> None:
    """Resolve a tag to its digest and write NAME:TAG@sha256:... into hermetic.yaml.

    REF is a registry reference (host/repo:tag), or a name in the local store
    (e.g. hermetic/debian-bookworm-python3:bookworm from `base bootstrap`).

    \b
    Example:
      hermetic base pin 127.0.0.1:5000/bases/python:3.11-slim
    """
    from hermetic.core.reference import parse_image_name

    try:
        name = parse_image_name(ref)
    except ValueError as e:
        raise UsageError(f"{e}") from None
    if name.digest:
        pinned = ref
    else:
        local = oci_store().resolve(ref) if not name.has_host else None
        if local is not None:
            pinned = f"{name.repository}@{local.digest}"
        elif not name.has_host:
            raise NotFound(f"{ref}: not in the local store, and it names no registry host to resolve it on",
                                hint="hermetic base bootstrap, or give host/repo:tag")
        else:
            from hermetic.registry import resolve_tag

            digest = resolve_tag(ref)
            pinned = f"{ref}@{digest}"
    where = _pin(config_path or ".", pinned, quiet=as_json)
    emit(as_json, {"reference": pinned, "config": where}, pinned)


@base.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """Show the base catalog (recipes to pin) and the bases already in the store."""
    from hermetic.builder.bootstrap import images_dir, load_recipe
    from hermetic.builder.catalog import load_catalog

    recipes = []
    if images_dir().is_dir():
        for d in sorted(images_dir().iterdir()):
            if (d / "recipe.yaml").is_file():
                r = load_recipe(d / "recipe.yaml")
                recipes.append({"recipe": d.name, "name": f"{r.name}:{r.tag}", "python": r.python.version,
                                "how": f"hermetic base bootstrap {d.name} --pin ."})
    catalog = [vars(e) for e in load_catalog()]
    store = oci_store()
    local = {name: d.digest for name, d in sorted(store.refs().items())} if store.index_path.exists() else {}
    if as_json:
        emit_json({"recipes": recipes, "catalog": catalog, "store": local})
        return
    click.echo("Recipes (offline, from Debian's packages):")
    for r in recipes:
        click.echo(f"  {r['recipe']:<28} python {r['python']:<5} {r['how']}")
    if catalog:
        click.echo("Catalog (registry images; pin with `hermetic base pin REF`):")
        for e in catalog:
            click.echo(f"  {e.get('name', ''):<28} {e.get('ref', '')}")
    click.echo("In the local store:")
    for name, digest in local.items():
        click.echo(f"  {name:<40} {digest}")
