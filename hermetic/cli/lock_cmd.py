"""``hermetic lock``: requirements.in / pyproject.toml -> hashed lock for the image platform."""

from __future__ import annotations

from pathlib import Path

import click

from hermetic.cli.common import config_option, emit, json_option


@click.command()
@click.argument("input_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@config_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Lock file to write (default: `lock:` in hermetic.yaml).")
@click.option("--resolver", type=click.Choice(["uv", "pip-tools"]), default="uv", show_default=True,
              help="pip-tools only works when the host Python is the image's Python version.")
@click.option("--upgrade", is_flag=True, help="Allow newer versions than the current lock pins.")
@click.option("--no-index-check", is_flag=True, help="Do not probe index URLs before resolving.")
@click.option("--no-pip-find-links", is_flag=True,
              help="Ignore the find-links directories of pip's configuration (e.g. a local torch+cpu wheel that "
                   "would win over PyPI's CUDA build); find-links in the input still count.")
@json_option
def lock(input_file: Path | None, config_path: str | None, output: Path | None, resolver: str,
         upgrade: bool, no_index_check: bool, no_pip_find_links: bool, as_json: bool) -> None:
    """Resolve requirements into a lock with sha256 hashes for the image's platform.

    Resolution targets the image (linux x86_64, manylinux_2_28, the Python
    version in hermetic.yaml), not the machine you run this on, and admits
    wheels only: an sdist would need a build, which is not hermetic. When the
    lock holds torch, the last line says which build: the CPU wheel
    (`+cpu`), or PyPI's CUDA build with its nvidia-* wheels (several GB, of
    use only with a GPU; pin `torch==X+cpu` for a machine without one).

    \b
    Example:
      hermetic lock                      # requirements.in -> requirements.lock
      hermetic lock pyproject.toml -o pylock.toml
      hermetic lock --no-pip-find-links  # torch's CUDA build from PyPI, not a local +cpu wheel
    """
    from hermetic.config.load import load_config
    from hermetic.lock.compile import compile_lock, find_input
    from hermetic.lock.model import Target

    cfg = load_config(config_path)
    target = Target(python_version=cfg.model.python.version)
    src = input_file or find_input(cfg.root)
    out = output or cfg.lock_path
    res = compile_lock(src.resolve(), out.resolve(), target, resolver=resolver, upgrade=upgrade,
                       check_indexes=not no_index_check, pip_find_links=not no_pip_find_links)
    for w in res.warnings:
        click.echo(f"hermetic: warning: {w}", err=True)
    emit(as_json, {"lock": str(res.output), "packages": res.packages, "resolver": res.resolver,
                   "target": {"platform": target.platform, "python": target.python_version},
                   "torch": res.torch.to_json() if res.torch else None, "warnings": res.warnings},
         f"locked {res.packages} packages for {target.platform} / CPython {target.python_version} -> {res.output}"
         + (f"\n{res.torch.sentence()}" if res.torch is not None else ""))
