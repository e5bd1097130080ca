"""``hermetic init --ci github|gitlab``: write a CI job that shares builds through a registry."""

from __future__ import annotations

from pathlib import Path

import click

from hermetic.cli.common import emit_json, json_option
from hermetic.errors import HermeticError

# --ci value -> (template under templates/, where it goes in the project)
CI_TEMPLATES: dict[str, tuple[str, str]] = {
    "github": ("ci/github-actions.yml", ".github/workflows/hermetic.yml"),
    "gitlab": ("ci/gitlab-ci.yml", ".gitlab-ci.yml"),
}
VERSION_PLACEHOLDER = "@HERMETIC_VERSION@"


def render_ci(ci: str) -> str:
    """The CI file for ``ci``, with the running hermetic version pinned in its install step."""
    from hermetic import __version__
    from hermetic.resources import read_template

    return read_template(CI_TEMPLATES[ci][0]).replace(VERSION_PLACEHOLDER, __version__)


def write_ci(project_dir: Path, ci: str, *, force: bool = False) -> tuple[Path, bool]:
    """Write the CI file into ``project_dir``; returns (path, whether it replaced a file)."""
    from hermetic.fsutil import atomic_write_text

    dest = project_dir / CI_TEMPLATES[ci][1]
    existed = dest.exists()
    if existed and not force:
        raise HermeticError(f"{dest} already exists; pass --force to overwrite it")
    atomic_write_text(dest, render_ci(ci))
    return dest, existed


@click.command()
@click.option("--ci", "ci", type=click.Choice(sorted(CI_TEMPLATES)), required=True,
              help="Which CI system to write a job for.")
@click.option("--dir", "project_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The repository root to write into.")
@click.option("--force", is_flag=True, help="Overwrite an existing CI file.")
@json_option
def init(ci: str, project_dir: Path, force: bool, as_json: bool) -> None:
    """Write a CI job that builds once per input set and shares the image through a registry.

    \b
      --ci github  ->  .github/workflows/hermetic.yml  (GitHub Actions, cache on ghcr.io)
      --ci gitlab  ->  .gitlab-ci.yml                  (GitLab CI, cache in the project registry)

    The job runs `hermetic build --cache "$REGISTRY/$REPO"` (pull on a cache
    hit, build and push on a miss), then `hermetic run`. Registry credentials
    come from the CI's secret store through HERMETIC_REGISTRY_USER and
    HERMETIC_REGISTRY_PASSWORD. An existing file is kept unless --force.

    \b
    Example:
      hermetic init --ci github && git add .github/workflows/hermetic.yml
    """
    path, replaced = write_ci(project_dir, ci, force=force)
    if as_json:
        emit_json({"ci": ci, "path": str(path), "replaced": replaced})
        return
    click.echo(f"{'replaced' if replaced else 'wrote'} {path}", err=True)
    click.echo("edit the `hermetic run` line to your entry point, then commit it", err=True)
