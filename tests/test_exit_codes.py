"""One table of hermetic's own exit codes (README "Exit codes" = hermetic.core.errors), clear of what scripts return."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

from hermetic.core import errors

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "hermetic").rglob("*.py"))
# What hermetic may exit with besides its own 64-78: success, the "differ" verdict, and signals as a shell reports them.
VERDICTS_AND_SIGNALS = {errors.EXIT_OK, errors.EXIT_DIFFERENT, errors.EXIT_INTERRUPTED, errors.EXIT_BROKEN_PIPE}


def _constants() -> dict[str, int]:
    return {k: v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}


def _readme_codes() -> set[int]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes: set[int] = set()
    for row in re.findall(r"^\| ([0-9][0-9 /]*) \|", section, re.M):
        codes.update(int(c) for c in row.split("/"))
    return codes


def test_readme_table_is_the_modules_table():
    assert _readme_codes() == set(_constants().values())


def test_hermetics_own_codes_are_in_the_sysexits_range():
    own = set(_constants().values()) - VERDICTS_AND_SIGNALS
    assert own and all(64 <= c <= 78 for c in own), sorted(own)


def _error_classes() -> list[type[errors.HermeticError]]:
    import importlib
    import pkgutil

    import hermetic

    for mod in pkgutil.walk_packages(hermetic.__path__, "hermetic."):
        if mod.name.endswith("__main__") or ".runtime." in mod.name or mod.name.endswith("_startup"):
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:  # an optional extra (mlflow, matplotlib) that is not installed
            continue
    seen, todo = [], [errors.HermeticError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


def test_every_error_class_exits_with_a_documented_code_that_is_not_1_or_2():
    documented = set(_constants().values())
    for cls in _error_classes():
        assert cls.exit_code in documented, (cls, cls.exit_code)
        assert cls.exit_code not in (1, 2), cls


def _calls_of(name: str):
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                yield path, node


def test_a_bare_hermetic_error_always_says_its_code():
    """The base class's own code is EXIT_SOFTWARE; a user-facing error names its kind (a subclass) or its code."""
    bare = [f"{p.relative_to(ROOT)}:{n.lineno}" for p, n in _calls_of("HermeticError")
            if not any(k.arg == "exit_code" for k in n.keywords)]
    assert bare == []


def test_no_literal_exit_code_outside_the_table():
    """exit_code=<number> and sys.exit(<number>) are written with the table's names, so the table stays the truth."""
    literal = []
    for path in SOURCES:
        if path.name in ("errors.py",) or "probe" in path.parts or "runtime" in path.parts:
            continue  # the in-image probe and runtime exit inside the container, not as the CLI
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "exit_code" and isinstance(node.value, ast.Constant) \
                    and node.value.value not in (0, None):
                literal.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "exit_code" for t in stmt.targets) \
                            and isinstance(stmt.value, ast.Constant):
                        literal.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert literal == []


def _hermetic(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=120)


@pytest.mark.parametrize("args", [["build", "--no-such-option"], ["run"], ["diff", "only-one"], ["nonsense"]])
def test_click_usage_errors_exit_64_not_2(args, tmp_path):
    proc = _hermetic(*args, cwd=tmp_path)
    assert proc.returncode == errors.EXIT_USAGE, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["run", "--seeed", "3", "main.py"], "No such option '--seeed'. (Did you mean one of: '--seed', '--seeds'?)"),
    (["run", "--detatch", "main.py"], "'--detach'"),
    (["run", "-x", "main.py"], "No such option '-x'"),
    (["submit", "--wiat", "main.py"], "'--wait'"),
    (["run", "--seeds", "3", "--seeds=4", "main.py"], "--seeds given twice (3 and 4): give it once"),
    (["run", "--json", "--json", "main.py"], "--json given twice"),
])
def test_a_mistyped_or_repeated_option_before_the_script_is_a_usage_error(args, says, tmp_path):
    """Options after the script are the script's (`run train.py --lr 0.1`); before it they are hermetic's,
    and one it does not know is not taken for the script's name (it once gave exit 66, no such file)."""
    proc = _hermetic(*args, cwd=tmp_path)
    assert proc.returncode == errors.EXIT_USAGE and says in proc.stderr, (proc.returncode, proc.stderr)


def test_options_after_the_script_reach_the_script_untouched(tmp_path):
    from hermetic.cli.common import own_options
    from hermetic.cli.run_cmd import run

    args = ["--seed", "3", "-C", ".", "train.py", "--seed", "9", "--seeds", "1", "--bogus"]
    assert [(i, o.name, v) for i, o, v in own_options(args, run)] == [(0, "seed", "3"), (2, "config_path", ".")]


def test_help_and_version_exit_0():
    assert _hermetic("--help").returncode == 0
    assert _hermetic("run", "--help").returncode == 0
    assert _hermetic("--version").returncode == 0


def test_a_bug_exits_70_with_its_traceback_and_says_it_is_one():
    # A real command failing the way a bug does (an exception hermetic did not anticipate), through the real main().
    code = ("import hermetic.config.load, hermetic.cli\n"
            "def broken(path=None):\n"
            "    return {}['missing']\n"
            "hermetic.config.load.load_config = broken\n"
            "hermetic.cli.main(['config', 'show'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == errors.EXIT_SOFTWARE, proc.stderr
    assert "Traceback" in proc.stderr and "KeyError: 'missing'" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("hermetic: internal error (a bug in hermetic")


def test_a_config_error_and_a_missing_run_differ_in_code(tmp_path):
    (tmp_path / "hermetic.yaml").write_text("name: x\nbase: docker:sha256:" + "0" * 64 + "\nbogus_key: 1\n")
    bad_config = _hermetic("config", "show", "-C", str(tmp_path))
    assert bad_config.returncode == errors.EXIT_CONFIG and "bogus_key" in bad_config.stderr
    missing = _hermetic("runs", "show", "--runs-dir", str(tmp_path / "runs"), "20990101-000000-000000")
    assert missing.returncode == errors.EXIT_NOINPUT, missing.stderr
