"""``hermetic init``: an existing training project, made ready for its first recorded run.

From a fresh clone to the first run in two commands (``hermetic init --data
data``, then ``hermetic run train.py``): init writes hermetic.yaml (the name
from the folder; a base found in the store, else bootstrapped from Debian's
packages, pinned by digest; its Python version), a lock from what the
project already has (requirements.in / requirements.txt / pyproject.toml are
locked; a hashed requirements file, uv.lock or pylock.toml is used as it
is), a dataset entry and a checksum manifest per ``--data DIR``, and
``.gitignore`` lines for ``runs/``. Nothing is overwritten unless asked, and
hermetic.yaml is written last, once everything it names exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hermetic.errors import CannotCreate, NotFound, UsageError
from hermetic.fsutil import atomic_write_bytes, atomic_write_text
from hermetic.paths import CONFIG_FILENAME

DEFAULT_RECIPE = "debian-bookworm-python3"
LOCK_FILE = "requirements.lock"
GITIGNORE_LINES = ("runs/", ".hermetic/")
SCRIPT_GUESSES = ("train.py", "main.py", "run.py", "fit.py")
# CI templates: --ci value -> (template under templates/, where it goes in the project)
CI_TEMPLATES: dict[str, tuple[str, str]] = {
    "github": ("ci/github-actions.yml", ".github/workflows/hermetic.yml"),
    "gitlab": ("ci/gitlab-ci.yml", ".gitlab-ci.yml"),
}
VERSION_PLACEHOLDER = "@HERMETIC_VERSION@"


@dataclass
class InitResult:
    config: Path
    name: str
    base: str
    base_source: str  # "store" | "bootstrapped" | "given"
    python: str
    lock: str
    lock_source: str  # "locked FROM" | "used as it is"
    datasets: list[dict[str, str]] = field(default_factory=list)  # name, path, manifest, files, bytes
    gitignore: list[str] = field(default_factory=list)  # lines added
    next_command: str = ""

    def to_json(self) -> dict:
        return {"config": str(self.config), "name": self.name, "base": self.base, "base_source": self.base_source,
                "python": self.python, "lock": self.lock, "lock_source": self.lock_source,
                "datasets": self.datasets, "gitignore": self.gitignore, "next": self.next_command}


def project_name(root: Path) -> str:
    """The folder's name as hermetic.yaml's ``name:`` takes it (lowercase letters, digits, . _ -)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", root.resolve().name.lower()).strip("-._")
    return name[:128] or "project"


def init_project(root: Path, *, data: list[str], base: str | None = None, python: str | None = None,
                 name: str | None = None, force: bool = False, store=None,
                 log: Callable[[str], None] | None = None) -> InitResult:
    """Scaffold ``root``; refuse when hermetic.yaml exists (unless ``force``), before anything is written."""
    log = log or (lambda _m: None)
    root = root.resolve()
    config = root / CONFIG_FILENAME
    if config.exists() and not force:
        raise CannotCreate(f"{config} already exists; pass --force to replace it (or edit it)")
    dirs = [_dataset_dir(root, d) for d in data]
    name = name or project_name(root)
    base_ref, base_source, base_python = _base(base, store, log)
    python = python or base_python or "3.11"
    lock, lock_source = _lock(root, python, log)
    datasets = [_dataset(root, d, log) for d in dirs]
    text = render_config(name, base_ref, python, lock, datasets)
    from hermetic.config import parse_config  # pydantic: not for `init --ci` or `init --help`

    parse_config(text, config)  # what we write must load: the same validation `hermetic run` does
    added = _gitignore(root)
    atomic_write_text(config, text)
    script = next((s for s in SCRIPT_GUESSES if (root / s).is_file()), "YOUR_SCRIPT.py")
    return InitResult(config, name, base_ref, base_source, python, lock, lock_source, datasets, added,
                      f"hermetic run {script}")


def render_config(name: str, base: str, python: str, lock: str, datasets: list[dict[str, str]]) -> str:
    doc: dict = {"name": name, "base": base, "python": {"path": "/usr/bin/python3", "version": python},
                 "lock": lock, "determinism": {"mode": "strict", "seed": 0, "threads": 1}}
    if datasets:
        doc["datasets"] = [{"name": d["name"], "path": d["path"], "manifest": d["manifest"]} for d in datasets]
    header = ("# Written by `hermetic init`. The base is pinned by digest (`hermetic base pin` changes it);\n"
              "# each dataset is verified against its manifest before every run, and the script finds it at\n"
              "# the same path it has here. docs/your-script.md says what a script sees.\n")
    import yaml

    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _base(given: str | None, store, log) -> tuple[str, str, str | None]:
    from hermetic.builder.bootstrap import bootstrap, find_recipe, load_recipe
    from hermetic.reference import parse_base_reference

    if given:
        try:
            parse_base_reference(given)
        except ValueError as e:
            raise UsageError(f"--base: {e}") from None
        return given, "given", None
    recipe_path = find_recipe(DEFAULT_RECIPE)
    recipe = load_recipe(recipe_path)
    existing = store.resolve(f"{recipe.name}:{recipe.tag}") if store.index_path.exists() else None
    if existing is not None and store.has_image(existing.digest):
        return f"{recipe.name}@{existing.digest}", "store", recipe.python.version
    log(f"no base in the store: bootstrapping {recipe.name}:{recipe.tag} from Debian's packages (about a minute) ...")
    res = bootstrap(recipe_path, store, log=log)
    return res.reference, "bootstrapped", recipe.python.version


def _lock(root: Path, python: str, log) -> tuple[str, str]:
    """The lock hermetic.yaml names: an existing one as it is, else one made from the project's requirements."""
    for as_is in ("uv.lock", "pylock.toml", LOCK_FILE):
        if (root / as_is).is_file():
            return as_is, "used as it is"
    req_txt = root / "requirements.txt"
    if req_txt.is_file() and _fully_hashed(req_txt):
        return "requirements.txt", "used as it is"
    source = next((root / n for n in ("requirements.in", "requirements.txt", "pyproject.toml") if (root / n).is_file()),
                  None)
    if source is None:
        raise NotFound(f"{root}: no requirements.in, requirements.txt, pyproject.toml, uv.lock or pylock.toml: "
                            "list what the script imports (e.g. `numpy`) in requirements.in, then run init again")
    from hermetic.lock.compile import compile_lock
    from hermetic.lock.model import Target

    log(f"locking {source.name} for linux x86_64 / CPython {python} -> {LOCK_FILE} ...")
    res = compile_lock(source, root / LOCK_FILE, Target(python_version=python))
    if res.torch is not None:
        log(res.torch.sentence())
    for w in res.warnings:
        log(f"warning: {w}")
    return LOCK_FILE, f"locked from {source.name}"


def _fully_hashed(path: Path) -> bool:
    from hermetic.errors import LockError
    from hermetic.lock.requirements import read_requirements_lock
    from hermetic.lock.model import Target

    try:
        return bool(read_requirements_lock(path, path.read_text(encoding="utf-8"), Target())[0])
    except (LockError, UnicodeDecodeError):
        return False


def _dataset_dir(root: Path, given: str) -> Path:
    d = (root / given).resolve() if not Path(given).is_absolute() else Path(given).resolve()
    if not d.is_dir():
        raise UsageError(f"--data {given}: not a directory; a dataset is a directory with a checksum manifest",
                         hint=(f"move {given} into a directory of its own (e.g. data/) and give that, or leave it "
                               "where it is: a file git tracks is part of the code snapshot, hashed with it")
                         if d.is_file() else None)
    try:
        d.relative_to(root)
    except ValueError:
        raise UsageError(f"--data {given}: outside the project {root}; give a directory inside it "
                            "(or add the dataset to hermetic.yaml with a mount: by hand)") from None
    if d == root:
        raise UsageError(f"--data {given}: the whole project cannot be a dataset")
    return d


def _dataset(root: Path, d: Path, log) -> dict[str, str]:
    from hermetic.data.manifest import format_manifest
    from hermetic.data.verify import build_manifest

    rel = d.relative_to(root).as_posix()
    manifest = f"{rel}.sha256"  # beside the directory, never inside it
    log(f"hashing dataset {rel}/ -> {manifest} ...")
    m = build_manifest(d, progress=False)
    atomic_write_bytes(root / manifest, format_manifest(m.entries))
    name = re.sub(r"[^a-z0-9._-]+", "-", d.name.lower()).strip("-._") or "data"
    return {"name": name, "path": rel, "manifest": manifest, "files": str(m.file_count), "bytes": str(m.total_bytes)}


def _gitignore(root: Path) -> list[str]:
    path = root / ".gitignore"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    have = {line.strip() for line in text.splitlines()}
    added = [line for line in GITIGNORE_LINES if line not in have and line.rstrip("/") not in have]
    if added:
        sep = "" if not text or text.endswith("\n") else "\n"
        atomic_write_text(path, text + sep + "".join(line + "\n" for line in added))
    return added


def render_ci(ci: str) -> str:
    """The CI file for ``ci``, with the running hermetic version pinned in its install step."""
    from hermetic import __version__
    from hermetic.resources import read_template

    return read_template(CI_TEMPLATES[ci][0]).replace(VERSION_PLACEHOLDER, __version__)


def write_ci(project_dir: Path, ci: str, *, force: bool = False) -> tuple[Path, bool]:
    """Write the CI file into ``project_dir``; returns (path, whether it replaced a file)."""
    dest = project_dir / CI_TEMPLATES[ci][1]
    existed = dest.exists()
    if existed and not force:
        raise CannotCreate(f"{dest} already exists; pass --force to overwrite it")
    atomic_write_text(dest, render_ci(ci))
    return dest, existed
