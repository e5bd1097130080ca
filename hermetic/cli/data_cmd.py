"""``hermetic data manifest`` / ``hermetic data verify``: dataset checksums."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hermetic.cli.common import config_option, emit_json, json_option, progress_enabled
from hermetic.core.errors import IntegrityError

_SHOW_PER_KIND = 20


@click.group()
def data() -> None:
    """Dataset checksum manifests and their verification.

    A manifest is one `<sha256>  <path>` line per file, the format of
    `sha256sum -c` and of BagIt's manifest-sha256.txt; its own sha256 is the
    dataset's ID. Verification reports missing, extra and changed files.

    \b
    hermetic data manifest data/train -o data/train.sha256
    hermetic data verify data/train data/train.sha256           # stat cache: seconds for 100k files
    hermetic data verify data/train data/train.sha256 --full    # re-hash every byte
    hermetic data verify                                        # every dataset in hermetic.yaml
    (cd data/train && sha256sum -c ../train.sha256)             # the same check, without hermetic
    """


@data.command("manifest")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the manifest here (atomically) instead of to stdout.")
@json_option
def manifest_cmd(directory: Path, output: Path | None, as_json: bool) -> None:
    """Hash every file under DIRECTORY into a manifest.

    Lines are sorted by path bytes; CR, LF and % in names are percent-encoded
    (RFC 8493). Also prints the file count and total bytes (bytes.count, BagIt's
    Payload-Oxum) and the manifest's sha256 -- the dataset's ID. Symlinks that
    leave the directory, absolute symlinks, FIFOs and names that differ only by
    Unicode normalization are refused. The output file is left out of the
    listing when it lies inside DIRECTORY.

    \b
    hermetic data manifest data/train -o data/train.sha256
    hermetic data manifest data/train > train.sha256
    """
    from hermetic.data.manifest import format_manifest
    from hermetic.data.verify import build_manifest
    from hermetic.hostfs.fsutil import atomic_write_bytes

    m = build_manifest(directory, exclude=[output] if output else [], progress=progress_enabled())
    text = format_manifest(m.entries)
    if output is not None:
        atomic_write_bytes(output, text)
    facts = {"directory": str(directory), "manifest": str(output) if output else None, "sha256": m.sha256,
             "file_count": m.file_count, "total_bytes": m.total_bytes, "oxum": m.oxum}
    if as_json:
        if output is None:
            facts["text"] = text.decode("utf-8")
        emit_json(facts)
        return
    if output is None:
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
    say = click.echo if output is not None else (lambda s: click.echo(s, err=True))
    say(f"{output or 'manifest'}: {m.file_count} files, {m.total_bytes} bytes (bytes.count {m.oxum})")
    say(f"sha256 {m.sha256}  (the dataset's ID)")


@data.command("verify")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.argument("manifest", required=False, type=click.Path(path_type=Path))
@click.option("--full", is_flag=True, help="Re-hash every file instead of trusting the stat cache.")
@config_option
@click.option("-d", "--dataset", "names", multiple=True, metavar="NAME",
              help="With no DIRECTORY: verify only this dataset of hermetic.yaml (repeatable).")
@json_option
def verify_cmd(directory: Path | None, manifest: Path | None, full: bool, config_path: str | None,
               names: tuple[str, ...], as_json: bool) -> None:
    """Check DIRECTORY against MANIFEST; with neither, every dataset in hermetic.yaml.

    Reports missing, extra and changed files (changed with the expected and
    actual sha256) and exits 65 if there is any; a malformed manifest is refused
    with its file:line (exit 65).

    By default a file whose (device, inode, size, mtime, ctime) is unchanged
    since hermetic last hashed it is not read again (git's racy-clean rule
    guards changes made in the same clock tick). That cannot see a change that
    keeps all five -- bit rot, raw device writes, a clock set back: --full
    re-hashes every byte, on all cores.

    \b
    hermetic data verify data/train data/train.sha256
    hermetic data verify data/train data/train.sha256 --full --json
    hermetic data verify -C project/ -d train
    """
    if directory is not None and manifest is None:
        raise click.UsageError("give both DIRECTORY and MANIFEST, or neither (to verify hermetic.yaml's datasets)")
    if directory is not None and (config_path or names):
        raise click.UsageError("-C/--config and --dataset apply only without DIRECTORY and MANIFEST")
    if directory is not None and manifest is not None:
        from hermetic.data.verify import verify_dataset

        report = verify_dataset(directory, manifest, full=full, progress=progress_enabled())
        if as_json:
            emit_json(report.to_json())
        else:
            _print_report(report, None)
        if not report.ok:
            raise IntegrityError(report.summary())
        return

    from hermetic.config.load import load_config
    from hermetic.data.verify import verify_configured

    cfg = load_config(config_path)
    results = verify_configured(cfg, list(names) or None, full=full, progress=progress_enabled())
    failed = [r for r in results if not r.report.ok]
    if as_json:
        emit_json({"ok": not failed, "config": str(cfg.path),
                   "datasets": [{"name": r.name, "mount": r.mount, **r.report.to_json()} for r in results]})
    elif not results:
        click.echo(f"{cfg.path}: no datasets declared")
    else:
        for r in results:
            _print_report(r.report, r.name)
    if failed:
        more = f" (and {len(failed) - 1} more datasets)" if len(failed) > 1 else ""
        raise IntegrityError(f"dataset {failed[0].name!r}: {failed[0].report.summary()}{more}")


def _print_report(report: Any, name: str | None) -> None:
    from hermetic.data.verify import problem_lines

    label = f"{name}: " if name else ""
    for line in problem_lines(report, label, _SHOW_PER_KIND):
        click.echo(line)
    how = (f"{report.mode}: {report.hashed_files} hashed, {report.cached_files} from cache, "
           f"{report.seconds:.2f} s")
    if report.ok:
        click.echo(f"{label}OK {report.root}: {report.file_count} files, {report.total_bytes} bytes "
                   f"(bytes.count {report.oxum}), manifest sha256 {report.manifest_sha256} [{how}]")
