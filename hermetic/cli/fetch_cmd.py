"""``hermetic fetch``: locked wheels -> the verified wheel store."""

from __future__ import annotations

import time

import click

from hermetic.cli.common import config_option, download_bars, emit_json, json_option, progress_enabled
from hermetic.core.paths import cache_paths


@click.command()
@config_option
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), help="Lock file (default: `lock:` in hermetic.yaml).")
@click.option("-j", "--jobs", type=click.IntRange(1, 32), default=4, show_default=True, help="Parallel downloads.")
@click.option("--offline", is_flag=True, help="Fail instead of touching the network when a wheel is missing.")
@json_option
def fetch(config_path: str | None, lock_file: str | None, jobs: int, offline: bool, as_json: bool) -> None:
    """Put every locked wheel for the image's platform into the wheel store.

    A wheel is admitted only when its sha256 is one the lock allows; a wheel
    already in the store is never downloaded again, so a second fetch (and
    every build) works with the network off. Sources: the lock's own URLs and
    indexes, then pip's configured find-links and indexes.

    \b
    Example:
      hermetic fetch               # uses hermetic.yaml's lock
      HERMETIC_CACHE=/ci/cache hermetic fetch --json
    """
    from pathlib import Path

    from hermetic.config.load import load_config
    from hermetic.lock.indexes import read_pip_sources
    from hermetic.lock.model import Target
    from hermetic.lock.read import read_lock
    from hermetic.store.fetch import fetch as do_fetch
    from hermetic.store.wheels import WheelStore

    t0 = time.monotonic()
    cfg = load_config(config_path)
    lock = read_lock(Path(lock_file) if lock_file else cfg.lock_path, Target(python_version=cfg.model.python.version))
    store = WheelStore(cache_paths().wheels)
    progress_cb, finish = download_bars(not as_json and progress_enabled())
    try:
        report = do_fetch(lock, store, read_pip_sources(), jobs=jobs, progress=progress_cb, offline=offline)
    finally:
        finish()
    elapsed = time.monotonic() - t0
    if as_json:
        emit_json({
            "lock": lock.path, "lock_sha256": lock.sha256, "store": str(store.root),
            "wheels": [{"name": r.locked.name, "version": r.locked.version, "filename": r.filename,
                        "sha256": r.sha256, "size": r.size} for r in report.resolved],
            "downloaded": sorted(report.downloaded), "bytes_downloaded": report.bytes_downloaded,
            "seconds": round(elapsed, 3), "notes": report.notes,
        })
        return
    for n in report.notes:
        click.echo(f"hermetic: note: {n}", err=True)
    total = sum(r.size or 0 for r in report.resolved)
    if report.downloaded:
        click.echo(f"fetched {len(report.downloaded)} wheel(s), {report.bytes_downloaded / 1e6:.1f} MB; "
                   f"{len(report.resolved)} locked wheels ({total / 1e6:.1f} MB) in {store.root} [{elapsed:.2f}s]")
    else:
        click.echo(f"all {len(report.resolved)} locked wheels already in {store.root} ({total / 1e6:.1f} MB) [{elapsed:.2f}s]")

