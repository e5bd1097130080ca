"""``hermetic verify``: rebuild an image from its provenance and say whether it reproduces."""

from __future__ import annotations

from pathlib import Path

import click

from hermetic.cli.common import json_option


@click.command()
@click.argument("ref", metavar="REF@sha256:DIGEST | FILE.sqfs")
@click.option("--key", "key", type=click.Path(dir_okay=False), default=None, metavar="PUB.pem",
              help="Also require a DSSE signature of the provenance by this ed25519 public key "
                   "(made by `hermetic push --sign-key`).")
@click.option("--scratch", "scratch", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Where the scratch rebuild goes (default: the system's temp dir). Needs room for the "
                   "base and the image.")
@click.option("--keep", is_flag=True, help="Keep the scratch directory (its path is printed).")
@json_option
def verify(ref: str, key: str | None, scratch: str | None, keep: bool, as_json: bool) -> int:
    """Rebuild an image from its provenance and compare it, digest for digest.

    Reads the image's provenance (attached by `hermetic push` as an OCI 1.1
    referrer), checks it names exactly this digest and that the attached SBOM
    is the one it names, then rebuilds in a scratch directory: the config and
    the lock come from the provenance, the base by digest (the local store or
    the image's repository), every wheel by its exact sha256 (the local wheel
    store, else the lock's indexes and pip's configured indexes/find-links).
    No project checkout is needed; the local store and the Docker Engine are
    not touched. Prints `reproduced: <digest>` (exit 0), or which layer
    differs, down to the files, and which config keys (exit 1). A refusal
    (no provenance, wrong subject, tampered attestation, bad signature, a
    wheel no index has, another hermetic version) is one error line: exit 65 for
    what cannot be trusted, 66 for what is missing, 69 for what cannot be reached.

    Given FILE.sqfs (made by `hermetic export --squashfs`), checks the file
    against its sidecar, then makes it again from the image in the local
    store and compares the bytes: "reproduced" (0), "differs" (1); a
    truncated, altered or misnamed file, or one from another writer, is
    refused (65); an image not in the store, 66.

    \b
    Examples:
      hermetic verify 127.0.0.1:5000/team/train@sha256:4f1c…
      hermetic verify /shared/images/sha256-4f1c….sqfs
      hermetic verify ghcr.io/acme/train@sha256:4f1c… --key release.pub.pem --json
    """
    from hermetic.core.paths import cache_paths

    if ref.endswith(".sqfs"):
        return _verify_squashfs(Path(ref), cache_paths().root, as_json)
    from hermetic.reproduce import dumps, render, verify as do_verify
    from hermetic.reproduce.source import parse_verify_ref

    name = parse_verify_ref(ref)
    from hermetic.core.display import escape_controls

    # What verify says embeds what the registry served (layer file names, notes): one line each, escaped.
    log = None if as_json else (lambda s: click.echo(f"hermetic: {escape_controls(s)}", err=True))
    result = do_verify(name, user_paths=cache_paths(), key=Path(key) if key else None, keep=keep,
                       scratch_root=Path(scratch) if scratch else None, log=log)
    if as_json:
        click.echo(dumps(result))
    else:
        for line in render(result):
            click.echo(escape_controls(line))
    return result.exit_code


def _verify_squashfs(path: Path, cache_root: Path, as_json: bool) -> int:
    """FILE.sqfs against its sidecar, then against the file made again from its image in the local store."""
    import tempfile

    from hermetic.cli.common import emit_json
    from hermetic.core.display import escape_controls
    from hermetic.engines import squashfs as sqfs
    from hermetic.store.oci import OciStore

    found = sqfs.check(path)
    with tempfile.TemporaryDirectory(prefix="hermetic-verify-") as tmp:
        again = sqfs.make(OciStore(cache_root / "oci"), found.manifest_digest, Path(tmp) / path.name)
    same = again.sha256 == found.sha256
    if as_json:
        emit_json({"file": str(path), "manifest_digest": found.manifest_digest, "sha256": found.sha256,
                   "made_again_sha256": again.sha256, "reproduced": same, "tool": again.tool})
    elif same:
        click.echo(f"reproduced: {escape_controls(str(path))} is image {found.manifest_digest} "
                   f"(sha256 {found.sha256}, made again by {again.tool})")
    else:
        click.echo(f"differs: {escape_controls(str(path))} (sha256 {found.sha256}) is not what image "
                   f"{found.manifest_digest} makes here (sha256 {again.sha256}, {again.tool})")
    return 0 if same else 1
