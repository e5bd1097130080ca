"""``hermetic cache``: verify and garbage-collect the local stores."""

from __future__ import annotations

from dataclasses import asdict

import click

from hermetic.cli.common import emit_json, human_bytes, json_option
from hermetic.core.errors import IntegrityError
from hermetic.core.paths import cache_paths


@click.group()
def cache() -> None:
    """The local stores under $HERMETIC_CACHE (wheels, OCI blobs, layer cache)."""


def _say_waiting(pids: list[int]) -> None:
    """gc's (and a repair's) note while it waits for the builds using the store."""
    who = f" (pid {', '.join(map(str, pids))})" if pids else ""
    click.echo(f"hermetic: waiting for the build(s) writing to the store{who} to finish ...", err=True)


@cache.command("verify")
@click.option("--repair", is_flag=True,
              help="Delete corrupt entries, and the refs of incomplete images, so the next fetch/build recreates them.")
@json_option
def verify_cmd(repair: bool, as_json: bool) -> None:
    """Rehash every blob and wheel, and check that every kept image is complete; exit 65 if a
    blob does not match its digest or an image lacks one.

    A missing blob is named with the image it belongs to (its ref, and its
    role: config, layer N, a manifest an index lists). --repair removes
    corrupt blobs and wheels, and the refs of incomplete images, and says how
    to get each back (build, pull or bootstrap it again); it waits for running
    builds, as `cache gc` does. Also lists the temporary files that dead
    writers left (a killed fetch's download, a killed build's layer): `hermetic
    cache gc` removes them. A temp file whose writer is still running is never
    counted.

    \b
    Example:
      hermetic cache verify --repair
    """
    from hermetic.builder.gc import verify

    paths = cache_paths()
    rep = verify(paths, repair=repair, on_wait=_say_waiting)
    left = rep.leftovers
    if as_json:
        emit_json({"root": str(paths.root), "blobs": rep.blobs, "wheels": rep.wheels, "ok": rep.ok,
                   "problems": rep.problems, "removed": rep.removed, "missing": [asdict(m) for m in rep.missing],
                   "dead_temp_files": asdict(left)})
    else:
        for b in rep.bad_blobs:
            click.echo(f"corrupt: blob {b.name}: {b.reason}")
        for m in rep.missing:
            click.echo(f"incomplete: {m}")
        for w in rep.wheel_problems:
            click.echo(f"corrupt: wheel {w}")
        for r in rep.removed:
            click.echo(f"removed: {r}")
        click.echo(f"{rep.blobs} blobs, {rep.wheels} wheels checked in {paths.root}: "
                   + ("all match their digests, every kept image complete" if rep.ok
                      else f"{len(rep.problems)} problem(s)")
                   + (f"; removed {len(rep.removed)}" if rep.removed else ""))
        if rep.missing and not repair:
            click.echo(f"{len(rep.incomplete_refs)} incomplete image(s): `hermetic cache verify --repair` drops "
                       "their refs; then build, pull or bootstrap each again")
        if left.count:
            click.echo(f"{left.count} temp file(s) of dead writers, {human_bytes(left.bytes)}: "
                       "`hermetic cache gc` removes them")
    if not rep.ok:
        raise click.exceptions.Exit(IntegrityError.exit_code)


@cache.command("gc")
@click.option("--keep-builds", type=click.IntRange(0), default=10, show_default=True,
              help="Per-build-key image refs to keep (most recent first).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def gc_cmd(keep_builds: int, dry_run: bool, as_json: bool) -> None:
    """Remove blobs no kept image needs, stale cache entries and dead writers' temp files.

    Kept: every named image in the store (NAME:latest, bootstrapped and pulled
    bases), the --keep-builds most recent per-build-key refs, and the images
    that running processes use (a `hermetic run`'s image). A build that is
    running is waited for (it says so): gc never removes what it is writing.
    A temp file whose writer is still running is never removed.

    \b
    Example:
      hermetic cache gc --dry-run
      hermetic cache gc --keep-builds 3 --json
    """
    from hermetic.builder.gc import gc

    rep = gc(cache_paths(), keep_builds=keep_builds, dry_run=dry_run, on_wait=_say_waiting)
    if as_json:
        emit_json({**asdict(rep), "dry_run": dry_run})
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {rep.removed_blobs} blob(s) ({human_bytes(rep.freed_bytes)}), "
               f"{rep.temp_files} temp file(s) of dead writers ({human_bytes(rep.temp_bytes)})"
               + ("" if dry_run else
                  f", {rep.removed_entries} stale cache entr{'y' if rep.removed_entries == 1 else 'ies'}")
               + f"; {len(rep.dropped_refs)} old build ref(s); kept {len(rep.kept_refs)} ref(s)")
