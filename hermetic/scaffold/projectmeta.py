"""What a Python project declares about itself, read without running any of its code: its dependencies
(``pyproject.toml``'s ``[project]``, or setuptools' dynamic files; ``setup.cfg``'s ``[options]``; ``setup.py``
parsed with :mod:`ast`, literal lists only, anything computed refused saying where) and its own package
(under ``src/`` or the root, named like the project or in ``packages=``), which its scripts import.
"""

from __future__ import annotations

import ast
import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hermetic.core.errors import DataError, NotFound, UsageError

WHAT_TO_DO = ("list the packages the script imports in requirements.in, one per line (e.g. `torch`), "
              "then run hermetic init again")
# Root-level packages that are never the project's own importable code.
NOT_THE_PACKAGE = frozenset({"tests", "test", "docs", "doc", "examples", "example", "benchmarks", "bench",
                             "scripts", "tools", "build", "dist", "runs"})


@dataclass(frozen=True)
class Declared:
    """The requirements a project declares: PEP 508 strings, and a phrase saying where they came from."""

    requirements: list[str]
    source: str  # e.g. "setup.py install_requires", "pyproject.toml [project].dependencies + extra dev"
    files: list[str] = field(default_factory=list)  # requirement files named instead of listed (-r FILE)


@dataclass(frozen=True)
class OwnPackage:
    """The project's importable package(s): ``layout`` "src" (under src/) or "root"; top-level names."""

    layout: str
    names: list[str]

    @property
    def shown(self) -> str:
        prefix = "src/" if self.layout == "src" else ""
        return ", ".join(f"{prefix}{n}/" for n in self.names)


@dataclass
class _Meta:
    """What the metadata files say, as far as init needs it."""

    name: str | None = None
    packages: list[str] | None = None  # declared top-level package names, when listed literally
    src_layout: bool = False  # package_dir {"": "src"} or find_packages("src") / where = src
    packaging: bool = False  # the project is installable (pip install -e . would do something)


# --- requirements ---------------------------------------------------------------------------------

def pyproject_locks_directly(root: Path) -> bool:
    """Whether pyproject.toml's ``[project].dependencies`` are static: then the resolver reads the file itself
    (uv reads static metadata without building the project), as `hermetic lock` does later."""
    doc = _pyproject(root)
    project = doc.get("project") if doc else None
    return isinstance(project, dict) and "dependencies" not in _dynamic(project)


def declared_requirements(root: Path, extras: Sequence[str] = ()) -> Declared | None:
    """The project's declared requirements (with ``extras``' optional ones), or None when it has no packaging
    metadata that lists any. Raises NotFound, naming the file and line, when they exist but are computed at
    run time; UsageError for an extra the project does not declare."""
    doc = _pyproject(root)
    project = doc.get("project") if doc else None
    if isinstance(project, dict):
        dynamic = _dynamic(project)
        if "dependencies" not in dynamic:
            reqs = _str_list(project.get("dependencies", []), "pyproject.toml", "[project].dependencies")
            optional = project.get("optional-dependencies") or {}
            if not isinstance(optional, dict):
                raise DataError("pyproject.toml: [project.optional-dependencies] must be a table of lists")
            return _with_extras(reqs, {k: _str_list(v, "pyproject.toml", f"[project.optional-dependencies].{k}")
                                       for k, v in optional.items()},
                                extras, "pyproject.toml [project].dependencies", project.get("name"))
        dyn = ((doc.get("tool") or {}).get("setuptools") or {}).get("dynamic") or {}
        files = _dynamic_files(dyn.get("dependencies"))
        if files is not None:
            return _from_files(root, files, dyn.get("optional-dependencies"), extras)
    cfg = _setup_cfg(root)
    if cfg is not None and cfg.has_option("options", "install_requires"):
        return _from_setup_cfg(root, cfg, extras)
    if (root / "setup.py").is_file():
        declared = _from_setup_py(root, extras)
        if declared is not None:
            return declared
    if isinstance(project, dict):  # dynamic dependencies that nothing above gave
        raise NotFound("pyproject.toml: [project].dependencies are dynamic (the build backend computes them when "
                       "the project is built); hermetic init does not build or run the project", hint=WHAT_TO_DO)
    if extras:
        raise UsageError(f"--extra {extras[0]}: the project declares no optional dependencies "
                         "(pyproject.toml [project.optional-dependencies], setup.cfg or setup.py extras_require)")
    return None


def requirements_in_text(declared: Declared) -> str:
    """requirements.in as init writes it from ``declared``."""
    head = (f"# Written by `hermetic init` from {declared.source}, which it reads without running the project's\n"
            "# code; `hermetic lock` locks this file (edit it, or delete it and run init again, when those change).\n")
    return head + "".join(f"-r {f}\n" for f in declared.files) + "".join(f"{r}\n" for r in declared.requirements)


def _with_extras(reqs: list[str], optional: dict[str, list[str]], extras: Sequence[str], source: str,
                 name: Any) -> Declared:
    out = list(reqs)
    for extra in extras:
        if extra not in optional:
            have = ", ".join(sorted(optional)) or "none"
            raise UsageError(f"--extra {extra}: {source.split()[0]} declares no such optional dependencies "
                             f"(it has: {have})")
    # An extra may name the project itself (all = ["mypkg[a,b]"]): expand it rather than ask the index for it.
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for r in optional.get(extra, []):
            own = _self_extras(r, name)
            if own is None:
                out.append(r)
            else:
                todo += [e for e in own if e in optional]
    if extras:
        source += " + " + ", ".join(f"extra {e}" for e in extras)
    return Declared(list(dict.fromkeys(out)), source)


def _self_extras(requirement: str, name: Any) -> list[str] | None:
    """The extras of ``requirement`` when it names the project itself, else None."""
    if not isinstance(name, str):
        return None
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    return sorted(req.extras) if canonicalize_name(req.name) == canonicalize_name(name) else None


def _str_list(value: Any, file: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise DataError(f"{file}: {key} must be a list of requirement strings")
    from packaging.requirements import InvalidRequirement, Requirement

    for item in value:
        try:
            Requirement(item)
        except InvalidRequirement as e:
            raise DataError(f"{file}: {key}: {item!r} is not a requirement ({e})") from None
    return list(value)


def _pyproject(root: Path) -> dict[str, Any] | None:
    path = root / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid TOML: {e}") from None


def _dynamic(project: dict[str, Any]) -> set[str]:
    dynamic = project.get("dynamic") or []
    return {d for d in dynamic if isinstance(d, str)} if isinstance(dynamic, list) else set()


def _dynamic_files(entry: Any) -> list[str] | None:
    """The files of a ``[tool.setuptools.dynamic]`` entry (``{file = [...]}``, or one file), or None."""
    files = entry.get("file") if isinstance(entry, dict) else None
    if isinstance(files, str):
        files = [files]
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else None


def _from_files(root: Path, files: list[str], optional: Any, extras: Sequence[str]) -> Declared:
    """Dependencies setuptools reads from requirement files: requirements.in includes them (-r FILE)."""
    for extra in extras:
        listed = _dynamic_files(optional.get(extra) if isinstance(optional, dict) else None)
        if listed is None:
            raise UsageError(f"--extra {extra}: pyproject.toml declares no such optional dependencies "
                             "([tool.setuptools.dynamic.optional-dependencies])")
        files = files + listed
    for f in files:
        if not (root / f).is_file():
            raise NotFound(f"pyproject.toml: [tool.setuptools.dynamic] names {f}, which does not exist")
    source = "pyproject.toml [tool.setuptools.dynamic] dependencies" + "".join(f" + extra {e}" for e in extras)
    return Declared([], source, files=list(dict.fromkeys(files)))


def _setup_cfg(root: Path) -> configparser.ConfigParser | None:
    path = root / "setup.cfg"
    if not path.is_file():
        return None
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(path.read_text(encoding="utf-8"), source=str(path))
    except (configparser.Error, UnicodeDecodeError) as e:  # configparser's message quotes the line: not shown
        line = f":{e.lineno}" if isinstance(getattr(e, "lineno", None), int) else ""
        raise DataError(f"{path}{line}: not a valid setup.cfg ({type(e).__name__})") from None
    return cfg


def _cfg_list(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("#", ";"))]


def _from_setup_cfg(root: Path, cfg: configparser.ConfigParser, extras: Sequence[str]) -> Declared:
    raw = cfg.get("options", "install_requires")
    files: list[str] = []
    if raw.strip().startswith("file:"):
        files = [f.strip() for f in raw.strip()[5:].split(",") if f.strip()]
        reqs: list[str] = []
    else:
        reqs = _str_list(_cfg_list(raw), "setup.cfg", "[options] install_requires")
    optional = {k: _str_list(_cfg_list(v), "setup.cfg", f"[options.extras_require] {k}")
                for k, v in (cfg.items("options.extras_require") if cfg.has_section("options.extras_require") else [])}
    name = cfg.get("metadata", "name", fallback=None)
    declared = _with_extras(reqs, optional, extras, "setup.cfg [options] install_requires", name)
    return Declared(declared.requirements, declared.source, files)


def _from_setup_py(root: Path, extras: Sequence[str]) -> Declared | None:
    """setup.py's install_requires (None when setup() is given none at all)."""
    path = root / "setup.py"
    tree, text = _parse_setup_py(path)
    call = _setup_call(tree)
    if call is None:
        raise NotFound(f"{path}: no setup(...) call hermetic init can read; it does not run setup.py",
                       hint=WHAT_TO_DO)
    bindings = _module_bindings(tree)
    keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
    if "install_requires" not in keywords:
        if any(k.arg is None for k in call.keywords):
            raise NotFound(f"{path}:{call.lineno}: setup() gets its arguments through ** (computed when setup.py "
                           "runs); hermetic init does not run setup.py", hint=WHAT_TO_DO)
        if extras:
            raise UsageError(f"--extra {extras[0]}: setup.py declares no install_requires or extras_require")
        return None
    reqs = _str_list(_resolve_list(keywords["install_requires"], bindings, path, text, "install_requires"),
                     "setup.py", "install_requires")
    optional: dict[str, list[str]] = {}
    if extras:
        if "extras_require" not in keywords:
            raise UsageError(f"--extra {extras[0]}: setup.py declares no extras_require")
        optional = _resolve_extras(keywords["extras_require"], bindings, path, text)
    name = keywords.get("name")
    name_value = _resolve_str(name, bindings) if name is not None else None
    return _with_extras(reqs, optional, extras, "setup.py install_requires", name_value)


def _parse_setup_py(path: Path) -> tuple[ast.Module, str]:
    try:
        text = path.read_text(encoding="utf-8")
        return ast.parse(text, filename=str(path)), text
    except SyntaxError as e:
        raise DataError(f"{path}:{e.lineno}: not valid Python: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text: {e}") from None


def _setup_call(tree: ast.Module) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "setup") or (isinstance(f, ast.Attribute) and f.attr == "setup"):
                return node
    return None


def _module_bindings(tree: ast.Module) -> dict[str, ast.expr]:
    """NAME -> the expression last assigned to it at module level (``NAME = ...`` only)."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _computed(path: Path, text: str, node: ast.expr, key: str) -> NotFound:
    segment = " ".join((ast.get_source_segment(text, node) or "").split())
    segment = segment if len(segment) <= 60 else segment[:57] + "..."
    return NotFound(f"{path}:{node.lineno}: {key} is computed when setup.py runs (`{segment}`); "
                    "hermetic init reads setup.py without running it", hint=WHAT_TO_DO)


def _resolve_list(node: ast.expr, bindings: dict[str, ast.expr], path: Path, text: str, key: str,
                  depth: int = 0) -> list[Any]:
    """A literal list (or tuple), a name bound to one, or such lists joined with +."""
    if depth < 8:
        if isinstance(node, ast.Name) and node.id in bindings:
            return _resolve_list(bindings[node.id], bindings, path, text, key, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return (_resolve_list(node.left, bindings, path, text, key, depth + 1)
                    + _resolve_list(node.right, bindings, path, text, key, depth + 1))
        if isinstance(node, (ast.List, ast.Tuple)):
            try:
                return list(ast.literal_eval(node))
            except ValueError:
                pass
    raise _computed(path, text, node, key)


def _resolve_extras(node: ast.expr, bindings: dict[str, ast.expr], path: Path, text: str) -> dict[str, list[str]]:
    node = _bound(node, bindings)
    if not isinstance(node, ast.Dict):
        raise _computed(path, text, node, "extras_require")
    out: dict[str, list[str]] = {}
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            raise _computed(path, text, node, "extras_require")
        out[k.value] = _str_list(_resolve_list(v, bindings, path, text, f"extras_require[{k.value!r}]"),
                                 "setup.py", f"extras_require[{k.value!r}]")
    return out


def _bound(node: ast.expr, bindings: dict[str, ast.expr]) -> ast.expr:
    """What a module-level NAME is bound to (``node`` itself when it is no such name)."""
    return bindings[node.id] if isinstance(node, ast.Name) and node.id in bindings else node


def _resolve_str(node: ast.expr, bindings: dict[str, ast.expr]) -> str | None:
    node = _bound(node, bindings)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


# --- the project's own package --------------------------------------------------------------------

def own_package(root: Path) -> OwnPackage | None:
    """The package(s) ``pip install -e .`` would make importable, when the project is installable: under
    src/ (the src layout), else at the root (named like the project, listed in ``packages=``, or, when the
    metadata lists none, every root directory with an __init__.py but tests/, docs/ and the like)."""
    meta = _meta(root)
    if not meta.packaging:
        return None
    src = root / "src"
    in_src = _package_dirs(src) if src.is_dir() else []
    at_root = _package_dirs(root)
    if meta.packages:  # listed: where the listed ones are
        listed_src = [n for n in in_src if n in meta.packages]
        listed_root = [n for n in at_root if n in meta.packages]
        if listed_src and (meta.src_layout or not listed_root):
            return OwnPackage("src", listed_src)
        if listed_root:
            return OwnPackage("root", listed_root)
    if in_src:  # setuptools' own discovery tries the src layout first
        return OwnPackage("src", in_src)
    if meta.name:
        wanted = re.sub(r"[-_.]+", "_", meta.name).lower()
        named = [n for n in at_root if n.lower() == wanted]
        if named:
            return OwnPackage("root", named)
    if meta.packages is None:  # find_packages() or nothing said: what setuptools would find
        found = [n for n in at_root if n not in NOT_THE_PACKAGE]
        if found:
            return OwnPackage("root", found)
    return None


def _package_dirs(d: Path) -> list[str]:
    try:
        return sorted(p.name for p in d.iterdir()
                      if p.is_dir() and not p.is_symlink() and p.name.isidentifier() and (p / "__init__.py").is_file())
    except OSError:
        return []


def _meta(root: Path) -> _Meta:
    meta = _Meta()
    try:
        doc = _pyproject(root)
    except DataError:
        doc = None
    if doc:
        project = doc.get("project")
        tool = doc.get("tool") or {}
        setuptools = tool.get("setuptools") if isinstance(tool, dict) else None
        meta.packaging = isinstance(project, dict) or "build-system" in doc or isinstance(setuptools, dict)
        if isinstance(project, dict) and isinstance(project.get("name"), str):
            meta.name = project["name"]
        if isinstance(setuptools, dict):
            pkgs = setuptools.get("packages")
            if isinstance(pkgs, list):
                meta.packages = sorted({p.split(".")[0] for p in pkgs if isinstance(p, str)})
            elif isinstance(pkgs, dict):
                where = (pkgs.get("find") or {}).get("where") if isinstance(pkgs.get("find"), dict) else None
                meta.src_layout = isinstance(where, list) and "src" in where
            pdir = setuptools.get("package-dir")
            meta.src_layout = meta.src_layout or (isinstance(pdir, dict) and pdir.get("") == "src")
    try:
        cfg = _setup_cfg(root)
    except DataError:
        cfg = None
    if cfg is not None and (cfg.has_section("metadata") or cfg.has_section("options")):
        meta.packaging = True
        meta.name = meta.name or cfg.get("metadata", "name", fallback=None)
        pkgs = cfg.get("options", "packages", fallback="").strip()
        if pkgs and not pkgs.startswith("find"):
            meta.packages = sorted({p.split(".")[0] for p in _cfg_list(pkgs.replace(",", "\n"))})
        meta.src_layout = meta.src_layout or "=src" in cfg.get("options", "package_dir", fallback="").replace(" ", "")
        meta.src_layout = meta.src_layout or cfg.get("options.packages.find", "where", fallback="").strip() == "src"
    if (root / "setup.py").is_file():
        meta.packaging = True
        try:
            tree, _ = _parse_setup_py(root / "setup.py")
        except DataError:
            return meta
        call = _setup_call(tree)
        if call is not None:
            _meta_from_setup_call(call, _module_bindings(tree), meta)
    return meta


def _meta_from_setup_call(call: ast.Call, bindings: dict[str, ast.expr], meta: _Meta) -> None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
    if "name" in keywords:
        meta.name = meta.name or _resolve_str(keywords["name"], bindings)
    pkgs = _bound(keywords["packages"], bindings) if "packages" in keywords else None
    if isinstance(pkgs, (ast.List, ast.Tuple)):
        try:
            meta.packages = sorted({str(p).split(".")[0] for p in ast.literal_eval(pkgs)})
        except ValueError:
            pass
    elif isinstance(pkgs, ast.Call):  # find_packages("src") / find_packages(where="src")
        args = [a.value for a in pkgs.args if isinstance(a, ast.Constant)]
        args += [k.value.value for k in pkgs.keywords if k.arg == "where" and isinstance(k.value, ast.Constant)]
        meta.src_layout = meta.src_layout or "src" in args
    pdir = keywords.get("package_dir")
    if isinstance(pdir, ast.Dict):
        try:
            meta.src_layout = meta.src_layout or ast.literal_eval(pdir).get("") == "src"
        except ValueError:
            pass
