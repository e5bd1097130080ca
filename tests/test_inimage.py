"""hermetic/inimage/ runs inside the image or on the image's interpreter: every import there is the standard
library's, the package's own, or a training environment's package imported lazily; none is the host side's.

Every .py under hermetic/inimage/ is read (by glob: a module added there is checked too), every import in it
counted, lazy ones and literal importlib.import_module / __import__ names included.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import hermetic.inimage

INIMAGE = Path(hermetic.inimage.__file__).resolve().parent
PACKAGE = "hermetic.inimage"

# The names the code imports itself by where it runs: the runtime is the image's top-level package
# hermetic_runtime (its _startup.py imports it so); a script's directory is its sys.path[0], so probe.py
# imports probe_gpu.py as ``probe_gpu`` (a sibling: a module file in the same directory).
IMAGE_NAMES = {"hermetic_runtime": "hermetic.inimage.runtime"}

# The training environment's own packages, in some images and not in others: not the host side, and not
# required. Each is imported only inside a function, so that every module imports where they are missing.
ENVIRONMENT_PACKAGES = {
    "torch": "the probe's SM counts (probe_gpu.py); the runtime loads it through _optional, by name",
    "numpy": "the runtime loads it through _optional, by name; the probe's numpy/BLAS facts",
    "threadpoolctl": "the probe's BLAS thread pools",
    "pynvml": "the probe's NVML backend (nvidia-ml-py), before its ctypes fallback",
    "tensorboard": "tb_scalars.py: TensorBoard's own event file reader",
}

LOADERS = ("import_module", "__import__")


def _lazy_nodes(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside a function (lazy: run only when the function is called)."""
    return {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(f)}


def _imported(node: ast.AST, package: str) -> list[str]:
    """The absolute module names ``node`` imports (relative ones resolved against ``package``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if not node.level:
            return [node.module or ""]
        parts = package.split(".")
        if node.level - 1 >= len(parts):  # above the top package: said as written (its top name is "")
            return ["." * node.level + (node.module or "")]
        base = parts[: len(parts) - (node.level - 1)]
        return [".".join(base + ([node.module] if node.module else []))]
    if isinstance(node, ast.Call) and (node.func.id if isinstance(node.func, ast.Name) else
                                       getattr(node.func, "attr", "")) in LOADERS \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return [node.args[0].value]
    return []


def _why_not(name: str, package: str, siblings: set[str], *, lazy: bool) -> str | None:
    """Why importing ``name`` is not allowed in the in-image code, or None."""
    top = name.split(".")[0]
    if name == package or name.startswith(package + "."):
        return None
    if top in ("hermetic", ""):
        return "is the host side"
    if top in ENVIRONMENT_PACKAGES:
        return None if lazy else "imported at module level, not lazily"
    if top in sys.stdlib_module_names or top == "__future__" or top in IMAGE_NAMES or top in siblings:
        return None
    return "is neither the standard library nor in-image code"


def offenders(root: Path = INIMAGE, package: str = PACKAGE) -> list[str]:
    """Every import under ``root`` (the package ``package``) that is not allowed, as 'file:line: why'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        here = ".".join((package, *rel.parent.parts))  # the package a relative import starts from
        siblings = {p.stem for p in path.parent.glob("*.py")} - {"__init__"}
        tree = ast.parse(path.read_bytes(), filename=str(path))
        lazy = _lazy_nodes(tree)
        for node in ast.walk(tree):
            for name in _imported(node, here):
                if why := _why_not(name, package, siblings, lazy=id(node) in lazy):
                    found.append((rel.as_posix(), node.lineno, f"{name} {why}"))
    return [f"{f}:{line}: {why}" for f, line, why in sorted(found)]


def test_the_in_image_code_imports_nothing_from_the_host_side():
    files = {p.relative_to(INIMAGE).as_posix() for p in INIMAGE.rglob("*.py")}
    assert {"runtime/_startup.py", "runtime/seeding.py", "probe/probe.py", "tb_scalars.py", "pyc_server.py"} <= files
    assert offenders() == []


def test_the_image_names_are_the_in_image_packages():
    for alias, real in IMAGE_NAMES.items():
        assert (INIMAGE / Path(*real.split(".")[2:]) / "__init__.py").is_file(), alias


def _planted(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "inimage"
    for rel, text in {"__init__.py": "", "probe/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_check_finds_what_is_planted_and_only_that(tmp_path):
    root = _planted(tmp_path, {
        "runtime/__init__.py": "import os\nfrom . import _io\n",
        "runtime/_io.py": (
            "import json\n"
            "import hermetic.core.errors\n"  # planted: the host side
            "def f():\n"
            "    from hermetic.store import oci\n"  # planted: lazily, still the host side
            "    import torch\n"  # lazy: allowed
            "    import importlib\n"
            "    return importlib.import_module('hermetic.record')\n"),  # planted: by name
        "runtime/_startup.py": "import hermetic_runtime.seeding\nimport numpy\n",  # numpy planted: module level
        "probe/probe.py": (
            "from __future__ import annotations\n"
            "if __package__:\n    from hermetic.inimage.probe.probe_util import reason\n"
            "else:\n    from probe_util import reason\n"
            "from ...core import errors\n"  # planted: relative, out of the package
            "import requests\n"),  # planted: neither stdlib nor ours
        "probe/probe_util.py": "import re\n",
        "tb_scalars.py": "def f():\n    from tensorboard.util import tensor_util\n",
    })
    assert offenders(root, PACKAGE) == [
        "probe/probe.py:6: hermetic.core is the host side",
        "probe/probe.py:7: requests is neither the standard library nor in-image code",
        "runtime/_io.py:2: hermetic.core.errors is the host side",
        "runtime/_io.py:4: hermetic.store is the host side",
        "runtime/_io.py:7: hermetic.record is the host side",
        "runtime/_startup.py:2: numpy imported at module level, not lazily",
    ]
