"""``hermetic init``: an existing training project made ready for its first recorded run: hermetic.yaml (name,
a base from the store or bootstrapped, pinned by digest), a lock from what the project has (requirements
files and pyproject.toml locked; a hashed lock used as is), a dataset and manifest per ``--data DIR``, and
``.gitignore`` lines. Nothing is overwritten unless asked; hermetic.yaml is written last.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hermetic.core.errors import CannotCreate, LockError, NotFound, UsageError
from hermetic.hostfs.fsutil import atomic_write_bytes, atomic_write_text
from hermetic.core.paths import CONFIG_FILENAME, NAME_MAX, slug
from hermetic.scaffold.projectmeta import WHAT_TO_DO, Declared, own_package

DEFAULT_RECIPE = "debian-bookworm-python3"
LOCK_FILE = "requirements.lock"
GITIGNORE_LINES = ("runs/", ".hermetic/")
SCRIPT_GUESSES = ("train.py", "main.py", "run.py", "fit.py")
NOT_SCRIPTS = frozenset({"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "__init__.py", "__main__.py"})
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
    next: str = ""  # the command to run next
    requirements_in: str | None = None  # where the requirements.in init wrote came from (None: none written)
    env: dict[str, str] = field(default_factory=dict)  # hermetic.yaml's env: as written
    own_package: str | None = None  # the project's own package(s), e.g. "mingpt/" (what PYTHONPATH is for)

    def to_json(self) -> dict:
        return {**asdict(self), "config": str(self.config)}


def init_project(root: Path, *, data: list[str], base: str | None = None, python: str | None = None,
                 name: str | None = None, force: bool = False, store=None, extras: Sequence[str] = (),
                 log: Callable[[str], None] | None = None) -> InitResult:
    """Scaffold ``root``; refuse when hermetic.yaml exists (unless ``force``), before anything is written.
    ``extras``: optional dependencies (pyproject.toml / setup.cfg / setup.py) to lock as well."""
    log = log or (lambda _m: None)
    root = root.resolve()
    config = root / CONFIG_FILENAME
    if config.exists() and not force:
        raise CannotCreate(f"{config} already exists; pass --force to replace it (or edit it)")
    dirs = [_dataset_dir(root, d) for d in data]
    name = name or slug(root.name, NAME_MAX) or "project"  # the folder's name, as ``name:`` takes it
    own = own_package(root)
    plan = _lock_plan(root, list(extras))  # a project whose requirements cannot be read is refused here
    base_ref, base_source, base_python = _base(base, store, log)
    python = python or base_python or "3.11"
    lock, lock_source = _lock(root, plan, python, log)
    requirements_from = plan.declared.source if plan.declared else None
    datasets = [_dataset(root, d, log) for d in dirs]
    from hermetic.config.load import BuildConfig, parse_config  # pydantic: not for `init --ci` or `init --help`

    env: dict[str, str] = {}
    comments: dict[str, str] = {}
    if own is not None:
        workdir = BuildConfig().workdir  # init writes no build: section, so the default is the workdir
        env["PYTHONPATH"] = workdir + ("/src" if own.layout == "src" else "")
        comments["PYTHONPATH"] = f"the project's own package ({own.shown}), as pip install -e . would"
    text = render_config(name, base_ref, python, lock, datasets, env=env, env_comments=comments)
    parse_config(text, config)  # what we write must load: the same validation `hermetic run` does
    added = _gitignore(root)
    atomic_write_text(config, text)
    return InitResult(config, name, base_ref, base_source, python, lock, lock_source, datasets, added,
                      f"hermetic run {guess_script(root) or 'YOUR_SCRIPT.py'}", requirements_from, env,
                      own.shown if own else None)


def guess_script(root: Path) -> str | None:
    """The project's one obvious entry point: train.py, main.py (SCRIPT_GUESSES), else the only top-level .py
    with an ``if __name__ == "__main__":``, else the only top-level .py that does something when run (a
    gallery script: statements, not only definitions); None when there is no one."""
    found = next((s for s in SCRIPT_GUESSES if (root / s).is_file()), None)
    if found:
        return found
    parsed = [(p, _parse(p)) for p in sorted(root.glob("*.py")) if p.is_file() and p.name not in NOT_SCRIPTS]
    with_main = [p for p, tree in parsed if tree is not None and any(_is_main_guard(n) for n in tree.body)]
    if len(with_main) == 1:
        return with_main[0].name
    if with_main:
        return None
    acting = [p for p, tree in parsed if tree is not None and any(not _defines(n) for n in tree.body)]
    return acting[0].name if len(acting) == 1 else None


def _parse(path: Path):
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _is_main_guard(node) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__")


def _defines(node) -> bool:
    """A statement that only defines (imports, functions, classes, assignments, the docstring)."""
    return isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                             ast.Assign, ast.AnnAssign)) or (isinstance(node, ast.Expr)
                                                             and isinstance(node.value, ast.Constant))


def render_config(name: str, base: str, python: str, lock: str, datasets: list[dict[str, str]], *,
                  env: dict[str, str] | None = None, env_comments: dict[str, str] | None = None) -> str:
    """hermetic.yaml's text; ``env_comments`` say, at the end of each ``env:`` line, why init set it."""
    doc: dict = {"name": name, "base": base, "python": {"path": "/usr/bin/python3", "version": python},
                 "lock": lock, "determinism": {"mode": "strict", "seed": 0, "threads": 1}}
    if env:
        doc["env"] = dict(env)
    if datasets:
        doc["datasets"] = [{"name": d["name"], "path": d["path"], "manifest": d["manifest"]} for d in datasets]
    header = ("# Written by `hermetic init`. The base is pinned by digest (`hermetic base pin` changes it);\n"
              "# each dataset is verified against its manifest before every run, and the script finds it at\n"
              "# the same path it has here. docs/your-script.md says what a script sees.\n")
    import yaml

    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    for key, comment in (env_comments or {}).items():
        line = yaml.safe_dump({"env": {key: env[key]}}, sort_keys=False, default_flow_style=False).splitlines()[1]
        body = body.replace("\n" + line + "\n", f"\n{line}  # {comment}\n", 1)
    return header + body


def _base(given: str | None, store, log) -> tuple[str, str, str | None]:
    from hermetic.builder.bootstrap import bootstrap, find_recipe, load_recipe
    from hermetic.core.reference import parse_base_reference

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


@dataclass(frozen=True)
class _LockPlan:
    """What init locks, decided before anything slow or written: a lock used as it is (``as_is``), a file
    to lock (``source``), or requirements the project declares (``declared``: written to requirements.in)."""

    as_is: str | None = None
    source: Path | None = None
    declared: Declared | None = None


def _lock_plan(root: Path, extras: list[str]) -> _LockPlan:
    from hermetic.scaffold.projectmeta import declared_requirements, pyproject_locks_directly

    def no_extras(what: str) -> None:
        if extras:
            again = " (delete it to lock the project's requirements again)" if what == LOCK_FILE else ""
            raise UsageError(f"--extra {extras[0]}: the lock comes from {what}{again}, which has no optional "
                             "dependencies; --extra selects pyproject.toml's, setup.cfg's or setup.py's")

    for as_is in ("uv.lock", "pylock.toml", LOCK_FILE):
        if (root / as_is).is_file():
            no_extras(as_is)
            return _LockPlan(as_is=as_is)
    req_txt = root / "requirements.txt"
    if req_txt.is_file() and _fully_hashed(req_txt):
        no_extras("requirements.txt")
        return _LockPlan(as_is="requirements.txt")
    source = next((root / n for n in ("requirements.in", "requirements.txt") if (root / n).is_file()), None)
    if source is not None:
        no_extras(source.name)
        return _LockPlan(source=source)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and pyproject_locks_directly(root) and not extras:
        return _LockPlan(source=pyproject)  # static [project].dependencies: the resolver reads them itself
    declared = declared_requirements(root, extras)
    if declared is not None:
        if not declared.requirements and not declared.files:
            raise NotFound(f"{root}: {declared.source} lists no packages", hint=WHAT_TO_DO)
        return _LockPlan(declared=declared)
    if pyproject.is_file():
        return _LockPlan(source=pyproject)  # no [project] table: the resolver asks its build backend
    declaring = next((n for n in ("setup.py", "setup.cfg") if (root / n).is_file()), None)
    if declaring is not None:
        raise NotFound(f"{root / declaring}: declares no install_requires, and there is no requirements.in or "
                       "requirements.txt", hint=WHAT_TO_DO)
    raise NotFound(f"{root}: no requirements.in, requirements.txt, pyproject.toml, setup.py, setup.cfg, uv.lock or "
                   "pylock.toml: list what the script imports (e.g. `numpy`) in requirements.in, then run init again")


def _lock(root: Path, plan: _LockPlan, python: str, log) -> tuple[str, str]:
    """The lock hermetic.yaml names, and how it was had: as it is, else made from the project's requirements
    (the declared ones written to requirements.in first, and removed again if the lock fails)."""
    if plan.as_is is not None:
        return plan.as_is, "used as it is"
    from hermetic.lock.compile import compile_lock
    from hermetic.lock.model import Target
    from hermetic.scaffold.projectmeta import requirements_in_text

    source, declared = plan.source, plan.declared
    if declared is not None:
        source = root / "requirements.in"
        atomic_write_text(source, requirements_in_text(declared))
        log(f"wrote requirements.in from {declared.source} ({len(declared.requirements)} requirement(s)"
            + (f", -r {', '.join(declared.files)}" if declared.files else "") + "), read without running the "
            "project's code")
    assert source is not None
    log(f"locking {source.name} for linux x86_64 / CPython {python} -> {LOCK_FILE} ...")
    try:
        res = compile_lock(source, root / LOCK_FILE, Target(python_version=python))
    except BaseException:
        if declared is not None:  # nothing half-written: the requirements.in made for this lock goes too
            source.unlink(missing_ok=True)
        raise
    if res.torch is not None:
        log(res.torch.sentence())
    for w in res.warnings:
        log(f"warning: {w}")
    return LOCK_FILE, f"locked from {source.name}" + (f", written from {declared.source}" if declared else "")


def _fully_hashed(path: Path) -> bool:
    from hermetic.lock.requirements import read_requirements_lock
    from hermetic.lock.model import Target

    try:
        return bool(read_requirements_lock(path, path.read_text(encoding="utf-8"), Target())[0])
    except (LockError, UnicodeDecodeError):
        return False


def _dataset_dir(root: Path, given: str) -> Path:
    d = (root / given).resolve()  # an absolute ``given`` stays itself
    if not d.is_dir():
        raise UsageError(f"--data {given}: not a directory; a dataset is a directory with a checksum manifest",
                         hint=(f"move {given} into a directory of its own (e.g. data/) and give that, or leave it "
                               "where it is: a file git tracks is part of the code snapshot, hashed with it")
                         if d.is_file() else None)
    if not d.is_relative_to(root):
        raise UsageError(f"--data {given}: outside the project {root}; give a directory inside it "
                         "(or add the dataset to hermetic.yaml with a mount: by hand)")
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
    name = slug(d.name, NAME_MAX) or "data"
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
    from hermetic.core.resources import read_template

    return read_template(CI_TEMPLATES[ci][0]).replace(VERSION_PLACEHOLDER, __version__)


def write_ci(project_dir: Path, ci: str, *, force: bool = False) -> tuple[Path, bool]:
    """Write the CI file into ``project_dir``; returns (path, whether it replaced a file)."""
    dest = project_dir / CI_TEMPLATES[ci][1]
    existed = dest.exists()
    if existed and not force:
        raise CannotCreate(f"{dest} already exists; pass --force to overwrite it")
    atomic_write_text(dest, render_ci(ci))
    return dest, existed
