"""``hermetic init``: make an existing project ready for `hermetic run`; ``--ci``: a CI job for it."""

from __future__ import annotations

from pathlib import Path

import click

from hermetic.cli.common import emit_json, json_option, oci_store
from hermetic.scaffold import CI_TEMPLATES, VERSION_PLACEHOLDER, render_ci, write_ci  # noqa: F401 (the CLI's API)


@click.command()
@click.option("--data", "data", multiple=True, metavar="DIR",
              help="A dataset directory of the project: a manifest is made beside it (DIR.sha256) and the "
                   "script finds it at the same path in the container. Repeatable.")
@click.option("--base", metavar="REF@sha256:…", help="The base image, pinned by digest (default: the Debian "
                                                       "bookworm + Python 3.11 base, from the store or bootstrapped).")
@click.option("--python", "python", metavar="X.Y", help="The image's Python version (default: the base's).")
@click.option("--name", help="The image's name (default: the folder's name).")
@click.option("--extra", "extras", multiple=True, metavar="NAME",
              help="Also lock these optional dependencies of the project (pyproject.toml "
                   "[project.optional-dependencies], setup.cfg or setup.py extras_require). Repeatable.")
@click.option("--ci", "ci", type=click.Choice(sorted(CI_TEMPLATES)),
              help="Also (alone: only) write a CI job that shares builds through a registry.")
@click.option("--dir", "project_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The project (repository root) to write into.")
@click.option("--force", is_flag=True, help="Replace an existing hermetic.yaml (or CI file).")
@json_option
def init(data: tuple[str, ...], base: str | None, python: str | None, name: str | None, extras: tuple[str, ...],
         ci: str | None, project_dir: Path, force: bool, as_json: bool) -> None:
    """Make an existing training project ready for its first recorded run.

    Writes hermetic.yaml: the name from the folder; a base found in the
    local store, else bootstrapped from Debian's packages (about a minute,
    once), pinned by digest; its Python version; the lock: uv.lock,
    pylock.toml, requirements.lock or a fully hashed requirements.txt as they
    are, else requirements.in / requirements.txt / pyproject.toml locked into
    requirements.lock; else the requirements setup.py (parsed, never run),
    setup.cfg or a dynamic pyproject.toml declare, written to requirements.in
    and locked. A project with its own package (a directory with __init__.py
    at the root or under src/, as `pip install -e .` would install) gets
    PYTHONPATH under env:, so scripts in subdirectories import it. Each --data
    DIR gets a checksum manifest and a dataset entry (verified before every
    run; the script reads it where it is). Adds runs/ to .gitignore. An
    existing hermetic.yaml is kept unless --force. Then prints the next
    command.

    \b
      --ci github  ->  .github/workflows/hermetic.yml  (GitHub Actions, cache on ghcr.io)
      --ci gitlab  ->  .gitlab-ci.yml                  (GitLab CI, cache in the project registry)
    With --ci alone only the CI file is written. The job runs `hermetic build
    --cache "$REGISTRY/$REPO"` (pull on a hit, build and push on a miss),
    then `hermetic run`; credentials come from HERMETIC_REGISTRY_USER and
    HERMETIC_REGISTRY_PASSWORD.

    \b
    Examples:
      git clone https://example.org/my-model && cd my-model
      hermetic init --data data         # then: hermetic run train.py
      hermetic init --ci github && git add .github/workflows/hermetic.yml
    """
    ci_only = ci is not None and not (data or base or python or name or extras)
    result = None
    if not ci_only:
        from hermetic.scaffold import init_project

        say = None if as_json else (lambda msg: click.echo(f"hermetic: {msg}", err=True))
        result = init_project(project_dir, data=list(data), base=base, python=python, name=name, force=force,
                              store=oci_store(), extras=list(extras), log=say)
    ci_written = write_ci(project_dir, ci, force=force) if ci else None
    if as_json:
        out = result.to_json() if result else {}
        if ci_written:
            out.update({"ci": ci, "path": str(ci_written[0]), "replaced": ci_written[1]})
        emit_json(out)
        return
    if result is not None:
        click.echo(f"wrote {result.config}: base {result.base} ({result.base_source}), Python {result.python}, "
                   f"lock {result.lock} ({result.lock_source})", err=True)
        for d in result.datasets:
            click.echo(f"  dataset {d['name']}: {d['path']}/ ({d['files']} files, {d['bytes']} bytes) -> "
                       f"{d['manifest']}", err=True)
        if result.requirements_in:
            click.echo(f"  requirements.in: written from {result.requirements_in}", err=True)
        for key, value in result.env.items():
            why = f" (the project's own package {result.own_package})" if key == "PYTHONPATH" else ""
            click.echo(f"  env: {key}={value}{why}", err=True)
        if result.gitignore:
            click.echo(f"  .gitignore: + {' '.join(result.gitignore)}", err=True)
    if ci_written:
        click.echo(f"{'replaced' if ci_written[1] else 'wrote'} {ci_written[0]}", err=True)
        click.echo("edit the `hermetic run` line to your entry point, then commit it", err=True)
    if result is not None:
        click.echo("before the first run: `hermetic build` (it writes hermetic.image.json and "
                   "hermetic.provenance.json) and commit those with what init wrote, so the run is recorded by its "
                   "commit, not as dirty; or run now and commit after (docs/your-script.md)", err=True)
        click.echo(f"next: {result.next}")
