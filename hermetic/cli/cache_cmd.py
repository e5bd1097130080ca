"""``hermetic cache``: verify and garbage-collect the local stores."""

from __future__ import annotations

import click

from hermetic.cli.common import emit_json, json_option


@click.group()
def cache() -> None:
    """The local stores under $HERMETIC_CACHE (wheels, OCI blobs, layer cache)."""


@cache.command("verify")
@click.option("--repair", is_flag=True, help="Delete corrupt entries so the next fetch/build recreates them.")
@json_option
def verify_cmd(repair: bool, as_json: bool) -> None:
    """Rehash every blob and wheel; exit 3 if any does not match its digest.

    \b
    Example:
      hermetic cache verify --repair
    """
    from hermetic.builder.gc import verify
    from hermetic.paths import cache_paths

    paths = cache_paths()
    rep = verify(paths, repair=repair)
    if as_json:
        emit_json({"root": str(paths.root), "blobs": rep.blobs, "wheels": rep.wheels, "ok": rep.ok,
                   "problems": rep.problems, "removed": rep.removed})
    else:
        for p in rep.problems:
            click.echo(f"corrupt: {p}")
        click.echo(f"{rep.blobs} blobs, {rep.wheels} wheels checked in {paths.root}: "
                   + ("all match their digests" if rep.ok else f"{len(rep.problems)} problem(s)")
                   + (f"; removed {len(rep.removed)}" if rep.removed else ""))
    if not rep.ok:
        raise click.exceptions.Exit(3)


@cache.command("gc")
@click.option("--keep-builds", type=click.IntRange(0), default=10, show_default=True,
              help="Per-build-key image refs to keep (most recent first).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def gc_cmd(keep_builds: int, dry_run: bool, as_json: bool) -> None:
    """Remove blobs no kept image needs, stale cache entries and staging leftovers.

    Kept: every named image in the store (NAME:latest, bootstrapped and pulled
    bases) and the --keep-builds most recent per-build-key refs.
    """
    from hermetic.builder.gc import gc
    from hermetic.paths import cache_paths

    rep = gc(cache_paths(), keep_builds=keep_builds, dry_run=dry_run)
    if as_json:
        emit_json({"kept_refs": rep.kept_refs, "dropped_refs": rep.dropped_refs, "removed_blobs": rep.removed_blobs,
                   "freed_bytes": rep.freed_bytes, "removed_entries": rep.removed_entries, "dry_run": dry_run})
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {rep.removed_blobs} blob(s), {rep.freed_bytes / 1e6:.1f} MB; "
               f"{len(rep.dropped_refs)} old build ref(s); kept {len(rep.kept_refs)} ref(s)")
