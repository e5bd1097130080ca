"""The import graph keeps the data flow of docs/architecture.md: one way, no cycles, a CLI nobody imports.

Every import is counted, including those inside functions (hermetic imports
lazily for speed; a lazy import is still a dependency). Units are the
top-level packages and modules under hermetic/ (hermetic.builder,
hermetic.config, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import hermetic

PACKAGE = Path(hermetic.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ("hermetic",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> every hermetic module it imports (absolute names)."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("hermetic"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.startswith("hermetic"):
                    found.add(target)
        out[name] = found
    return out


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hermetic"


def unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, targets in imports().items():
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
    cli = ("hermetic.cli", "hermetic.__main__")  # `python -m hermetic` is the CLI too
    offenders = sorted(f"{mod} imports {t}" for mod, targets in imports().items()
                       if not mod.startswith(cli) for t in targets if t == "hermetic.cli" or t.startswith("hermetic.cli."))
    assert offenders == []


def test_no_import_cycle_between_top_level_packages():
    assert find_cycle(unit_graph()) is None


def test_cycle_finder_finds_a_planted_cycle():
    graph = {**unit_graph(), "store": unit_graph()["store"] | {"builder"}}
    assert find_cycle(graph) is not None


# The arrows of docs/architecture.md that the refactor of issue 19 established.
FORBIDDEN = {
    "builder": {"registry", "run", "diff", "record"},  # the builder is given a base puller and an image cache
    "registry": {"builder", "run", "diff", "record"},
    "store": {"builder", "registry", "run", "engine", "record"},
    "record": {"run", "builder", "registry", "slurm"},
    "diff": {"run", "builder", "registry", "slurm"},
    "config": {"builder", "registry", "run", "store", "record"},
    "lock": {"builder", "registry", "run", "store", "config"},
    "data": {"builder", "registry", "run", "store", "config", "record"},
    "determinism": {"builder", "registry", "run", "config", "record", "diff"},
    "reference": {"builder", "registry", "config"},
    "containerpaths": {"builder", "registry", "run", "config", "record"},
    "provenance": {"builder", "registry", "run", "store", "reproduce", "record", "diff"},  # pure documents
    "reproduce": {"run", "diff", "record"},  # rebuilds with the builder; knows nothing of runs
    "run": {"slurm"},  # slurm drives run (a task is runner.execute); run knows nothing of Slurm
}


def test_arrows_go_one_way():
    graph = unit_graph()
    wrong = sorted(f"{a} -> {b}" for a, banned in FORBIDDEN.items() for b in graph.get(a, set()) & banned)
    assert wrong == []


def test_the_fast_listing_path_agrees_on_the_config_file_name():
    from hermetic.config import CONFIG_FILENAME
    from hermetic.record.locate import CONFIG_FILENAME as listed

    assert listed == CONFIG_FILENAME
