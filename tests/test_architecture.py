"""The import graph keeps the data flow of docs/architecture.md: one way, no cycles, a CLI nobody imports.

Every import is counted, including those inside functions (hermetic imports
lazily for speed; a lazy import is still a dependency). Units are the
top-level packages and modules under hermetic/ (hermetic.builder,
hermetic.config, ...); cycles are looked for between units and between files
(module_graph). The runtime's own name in images, hermetic_runtime, is
hermetic.inimage.runtime.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import hermetic

PACKAGE = Path(hermetic.__file__).resolve().parent


# The runtime is shipped into images as the top-level package hermetic_runtime (hermetic/inimage/runtime/):
# its own modules import each other under that name, and it is the same file as hermetic.inimage.runtime.X.
ALIASES = {"hermetic_runtime": "hermetic.inimage.runtime"}


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = (root.name,) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _canonical(name: str, top: str) -> str | None:
    """``name`` as a module of the package ``top`` (an alias resolved), or None when it is not one of them."""
    for alias, real in ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            name = real + name[len(alias):]
    return name if name == top or name.startswith(top + ".") else None


def _imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[str, list[str]]]:
    """Every import of the package's own modules in one file, lazy ones included: (module, names), names
    being what ``from module import ...`` takes (empty for ``import module``)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(t, []) for a in node.names if (t := _canonical(a.name, root.name))]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if t := _canonical(target, root.name):
                found.append((t, [a.name for a in node.names]))
    return found


def _is_module(name: str, root: Path = PACKAGE) -> bool:
    """A module or package under ``root``: a .py file, a package, or a C extension (its .c source is here)."""
    rel = Path(*name.split(".")[1:])
    return (any((root / rel).with_suffix(s).is_file() for s in (".py", ".c")) if rel.parts else False) \
        or (root / rel / "__init__.py").is_file()


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """A copy of the graph (read once per root and test process: every file parsed, ~1 s)."""
    return {k: set(v) for k, v in _module_graph(root).items()}


@functools.lru_cache(maxsize=None)
def _module_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the package at ``root`` it imports, ``from package import name`` resolved to
    the submodule ``package.name`` when there is one (else the package's __init__, whose name it takes).
    The top package itself (hermetic/__init__.py: only the version) is left out."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        found: set[str] = set()
        for target, names in _imports_of(path, root):
            found.update([f"{target}.{n}" if _is_module(f"{target}.{n}", root) else target for n in names] or [target])
        graph[name] = {t for t in found if t != name and t != root.name and _is_module(t, root)}
    return graph


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hermetic"


def unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, targets in module_graph().items():  # `from hermetic import safetree` counts as safetree
        graph.setdefault(unit(mod), set())
        for t in targets:
            if unit(t) not in (unit(mod), "hermetic"):  # hermetic/__init__ is only the version
                graph[unit(mod)].add(unit(t))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_nothing_outside_the_cli_imports_the_cli():
    # `python -m hermetic` is the CLI too
    cli = ("hermetic.cli", "hermetic.__main__")
    offenders = sorted(f"{mod} imports {t}" for mod, targets in module_graph().items()
                       if not mod.startswith(cli) for t in targets if t == "hermetic.cli" or t.startswith("hermetic.cli."))
    assert offenders == []


def test_no_import_cycle_between_top_level_packages():
    assert find_cycle(unit_graph()) is None


def test_no_import_cycle_between_modules():
    """Not between files either (issue 27): a piece two modules share gets its own module below both."""
    assert find_cycle(module_graph()) is None


def _tiny_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_module_graph_finds_a_cycle_between_files(tmp_path):
    """A cycle only through ``from package import submodule``, a relative import and a lazy one: the module
    graph sees it (the package graph cannot: it is all one package)."""
    root = _tiny_package(tmp_path, {
        "sub/__init__.py": "",
        "sub/a.py": "from pkg.sub import b\n",  # the submodule b, not the package sub
        "sub/b.py": "def f():\n    from .c import g  # lazy: still a dependency\n",
        "sub/c.py": "from . import a\nfrom pkg._ext import digest\n",
        "_ext.c": "/* a C extension: only its source is here */\n",
        "other.py": "import pkg.sub.a\n",
    })
    graph = module_graph(root)
    assert graph["pkg.sub.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.c"] == {"pkg.sub.a", "pkg._ext"}
    assert graph["pkg.other"] == {"pkg.sub.a"}
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.sub.a", "pkg.sub.b", "pkg.sub.c"}


def test_module_graph_finds_no_cycle_where_there_is_none(tmp_path):
    """The same files with the shared piece moved below both: no cycle (the finder is not always saying one)."""
    root = _tiny_package(tmp_path, {
        "sub/__init__.py": "",
        "sub/a.py": "from pkg.sub import b\n",
        "sub/b.py": "def f():\n    from .c import g\n",
        "sub/c.py": "from pkg._ext import digest\nfrom pkg import sub\n",  # sub itself: its __init__
        "_ext.c": "",
    })
    graph = module_graph(root)
    assert graph["pkg.sub.c"] == {"pkg._ext", "pkg.sub"}
    assert find_cycle(graph) is None


def test_cycle_finder_finds_a_planted_cycle():
    graph = {**unit_graph(), "store": unit_graph()["store"] | {"builder"}}
    assert find_cycle(graph) is not None


# The arrows of docs/architecture.md that the refactor of issue 19 established.
FORBIDDEN = {
    "builder": {"registry", "run", "diff", "record"},  # the builder is given a base puller and an image cache
    "registry": {"builder", "run", "diff", "record"},
    "store": {"builder", "registry", "run", "engines", "record"},
    "record": {"run", "builder", "registry", "slurm"},
    "diff": {"run", "builder", "registry", "slurm"},
    "config": {"builder", "registry", "run", "store", "record"},
    "lock": {"builder", "registry", "run", "store", "config"},
    "data": {"builder", "registry", "run", "store", "config", "record"},
    # the foundations: core below everything, the host's filesystem edge only above core
    "core": {"hostfs", "config", "lock", "data", "store", "registry", "builder", "engines", "record", "run", "diff",
             "reproduce", "provenance", "integrations", "figures", "slurm", "scaffold", "gpu", "inimage"},
    "hostfs": {"config", "lock", "data", "store", "registry", "builder", "engines", "record", "run", "diff",
               "reproduce", "provenance", "integrations", "figures", "slurm", "scaffold", "gpu"},
    "provenance": {"builder", "registry", "run", "store", "reproduce", "record", "diff"},  # pure documents
    "reproduce": {"run", "diff", "record"},  # rebuilds with the builder; knows nothing of runs
    "run": {"slurm"},  # slurm drives run (a task is runner.execute); run knows nothing of Slurm
    # the engines run a spec and answer questions; a run's liveness comes in through the spec (its driver)
    "engines": {"builder", "registry", "run", "record", "diff", "slurm", "reproduce"},
}


def test_arrows_go_one_way():
    graph = unit_graph()
    assert "inimage" in graph  # a leaf: imports no other unit (test_inimage.py: nor anything but stdlib)
    forbidden = {**FORBIDDEN, "inimage": set(graph) - {"inimage"}}
    wrong = sorted(f"{a} -> {b}" for a, banned in forbidden.items() for b in graph.get(a, set()) & banned)
    assert wrong == []


# ---------------------------------------------------------------- one home per engine (issue 39, item 4)
#
# Outside hermetic/engines/ nothing imports one engine's module (only the package, get_engine and the rest,
# and base.py, the protocol), docker-py included, and nothing decides by an engine's name: what differs is
# an engine's attribute or method. A branch by name is a comparison of an engine's name with a literal one
# (or a collection of them, or a constant bound to them), a table keyed by engine names, a call that picks
# one engine by a literal name, or a match on one; an engine's name in a message or a CLI choice is not.

ENGINE_NAMES = frozenset(("docker", "podman", "charliecloud"))  # hermetic.engines.base.ENGINES, spelled here
NAMED_CONSTANTS = frozenset(("DEFAULT_ENGINE",))  # names that stand for one engine's name
PICKERS = frozenset(("get_engine", "engine_for"))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def engine_module_imports(root: Path = PACKAGE) -> list[str]:
    """Every import, from outside ``<root>/engines/``, of a module there other than the package, base and the
    image's one-file form (squashfs: what `hermetic export` writes and Slurm's tasks check; no engine's own)."""
    home = f"{root.name}.engines"
    shared = {home, f"{home}.base", f"{home}.squashfs"}
    return sorted(f"{mod} imports {t}" for mod, targets in module_graph(root).items() if not _inside(mod, home)
                  for t in targets if _inside(t, home) and t not in shared)


def docker_py_imports(root: Path = PACKAGE) -> list[str]:
    """Every import of docker-py (``docker``) outside ``<root>/engines/``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if (root / "engines") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{_module_name(path, root)}:{node.lineno} imports {n}" for n in names
                      if n == "docker" or n.startswith("docker.")]
    return found


def _speaks_of_an_engine(node: ast.AST) -> bool:
    """An expression that holds an engine or its name: ``engine``, ``engine.name``, ``orphan.engine``,
    ``req.engine``, ``self.engine_name``..."""
    return "engine" in ast.unparse(node).lower()


def _engine_literal(node: ast.AST, bound: dict[str, ast.AST]) -> str | None:
    """The engine name(s) ``node`` spells when it is one literally: a string constant, a tuple/list/set of
    them (every element an engine's name), a name bound to either in the module, DEFAULT_ENGINE."""
    if isinstance(node, ast.Name) and node.id in bound:
        return _engine_literal(bound[node.id], {})
    if isinstance(node, (ast.Name, ast.Attribute)) and (node.id if isinstance(node, ast.Name) else node.attr) \
            in NAMED_CONSTANTS:
        return ast.unparse(node)
    if isinstance(node, ast.Constant) and node.value in ENGINE_NAMES:
        return repr(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and e.value in ENGINE_NAMES for e in node.elts):
        return ast.unparse(node)
    return None


def _branches_in(tree: ast.AST) -> list[tuple[int, str]]:
    bound: dict[str, ast.AST] = {}
    for node in ast.walk(tree):  # NAMES = ("docker", "podman"): its uses are the literal's
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and _engine_literal(node.value, {}):
                    bound[t.id] = node.value
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                literal = _engine_literal(side, bound)
                others = sides[:i] + sides[i + 1:]
                collection = literal is not None and not isinstance(side, ast.Constant) and (
                    "," in literal or "{" in literal or isinstance(side, ast.Name) and side.id in bound)
                if literal is not None and (collection or any(_speaks_of_an_engine(o) for o in others)):
                    found.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and k.value in ENGINE_NAMES for k in node.keys):
            found.append((node.lineno, "a table by engine name: " + ast.unparse(node)[:80]))
        elif isinstance(node, ast.Call) and (node.func.id if isinstance(node.func, ast.Name) else
                                             getattr(node.func, "attr", "")) in PICKERS and any(
                _engine_literal(a, bound) for a in node.args):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _speaks_of_an_engine(node.subject) and any(
                isinstance(c.pattern, ast.MatchValue) and _engine_literal(c.pattern.value, bound)
                for c in node.cases):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
    return sorted(found)


def engine_name_branches(root: Path = PACKAGE) -> list[str]:
    """Every branch by an engine's name (above) in a file outside ``<root>/engines/``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if (root / "engines") in path.parents:
            continue
        tree = ast.parse(path.read_bytes(), filename=str(path))
        found += [f"{_module_name(path, root)}:{line}: {code}" for line, code in _branches_in(tree)]
    return found


def test_no_engine_module_is_imported_outside_the_engines():
    assert engine_module_imports() == []
    assert docker_py_imports() == []


def test_nothing_outside_the_engines_branches_on_an_engines_name():
    assert engine_name_branches() == []


def test_the_engine_checks_find_what_is_planted_and_only_that(tmp_path):
    """A tiny package with each kind of branch and import planted, and the look-alikes that are not (a base
    reference's kind, Slurm's container kind, messages, CLI choices, the engines' own code)."""
    root = _tiny_package(tmp_path, {
        "engines/__init__.py": "def get_engine(name=None): ...\n",
        "engines/base.py": "ENGINES = ('docker', 'podman', 'charliecloud')\n",
        "engines/docker.py": "import docker\nNAME = 'docker'\n\ndef f(engine):\n    return engine.name == 'docker'\n",
        "run.py": (
            "from pkg.engines import get_engine\n"
            "from pkg.engines.base import ENGINES\n"
            "from pkg.engines import docker\n"  # planted: an engine's own module
            "import docker.errors\n"  # planted: docker-py
            "LOCAL = ('docker', 'podman')\n"
            "HOMES = {'docker': 'the Docker Engine', 'podman': \"Podman's storage\"}\n"  # planted: a table
            "def a(engine, orphan, name, req):\n"
            "    if engine.name == 'docker': pass\n"  # planted
            "    if 'podman' != orphan.engine: pass\n"  # planted
            "    if name not in LOCAL: pass\n"  # planted: a constant bound to engine names
            "    if req.engine in ('docker', 'charliecloud'): pass\n"  # planted
            "    if engine.name == DEFAULT_ENGINE: pass\n"  # planted
            "    get_engine('podman')\n"  # planted: one engine picked by its name
            "    match engine.name:\n"
            "        case 'charliecloud': pass\n"  # planted
            "        case _: pass\n"),
        "fine.py": (
            "CONTAINERS = ('docker', 'pyxis')\n"
            "def b(ref, container, engine, choice):\n"
            "    if ref.kind == 'docker': pass\n"  # a base reference's kind
            "    if container not in CONTAINERS: pass\n"  # Slurm's container kind: not only engine names
            "    if container == 'docker': pass\n"
            "    raise ValueError(f\"engine {engine.name!r}: one of docker, podman\")\n"
            "def c(choice=['docker', 'podman', 'charliecloud'], engine=None):\n"  # a CLI's choices
            "    return get_engine(engine), {'name': 'docker'}\n"),
    })
    assert engine_module_imports(root) == ["pkg.run imports pkg.engines.docker"]
    assert docker_py_imports(root) == ["pkg.run:4 imports docker.errors"]
    found = engine_name_branches(root)
    assert [f.split(":", 2)[:2] for f in found] == [["pkg.run", str(n)] for n in (6, 8, 9, 10, 11, 12, 13, 14)], found
