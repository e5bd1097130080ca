"""Where hermetic's non-Python files (templates, base recipes) are found.

In a source checkout (and an editable install) they live in the repository's templates/ folder next to the package;
an installed wheel carries them in hermetic/templates/. Both are looked at, checkout first."""

from __future__ import annotations

from pathlib import Path

import hermetic
from hermetic.core.errors import EXIT_SOFTWARE, HermeticError

_PACKAGE_DIR = Path(hermetic.__file__).resolve().parent


def images_dir() -> Path:
    """Base image recipes and the catalog (repo's images/, or the wheel's copy)."""
    for d in (_PACKAGE_DIR.parent / "images", _PACKAGE_DIR / "images"):
        if d.is_dir():
            return d
    return _PACKAGE_DIR / "images"


def template_path(name: str) -> Path:
    """The path of template ``name`` (e.g. ``run-README.md``); HermeticError if absent."""
    dirs = [_PACKAGE_DIR.parent / "templates", _PACKAGE_DIR / "templates"]
    for d in dirs:
        p = d / name
        if p.is_file():
            return p
    looked = ", ".join(str(d) for d in dirs)
    raise HermeticError(f"template {name!r} not found (looked in {looked}); the installation is incomplete",
                        exit_code=EXIT_SOFTWARE)


def read_template(name: str) -> str:
    return template_path(name).read_text(encoding="utf-8")
