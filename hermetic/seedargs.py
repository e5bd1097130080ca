"""``{seed}`` in a script's arguments: filled in per run, and left out of "did the arguments change".

``hermetic run --seeds 3 main.py --seed {seed}`` gives each member the
arguments ``--seed 1111``, ``--seed 1112``, ... The record keeps both (
``invocation.args`` as the script received them, ``invocation.args_template``
as typed). Two runs with the same template whose arguments are that template
with their own seed filled in differ in the seed only, which the seed section
already says: the arguments are then compared by their template
(``args_as_input``), in a group summary and in ``hermetic diff`` alike.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from hermetic.errors import UsageError

# Placeholders in the script's arguments; ``{{name}}`` is the literal text ``{name}``.
PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")


def script_args(template: list[str], seed: int) -> list[str]:
    """The script's arguments with ``{seed}`` replaced; ``{{seed}}`` stays a literal ``{seed}``.

    Only ``{identifier}`` is a placeholder, so JSON arguments (``'{"lr": 0.1}'``)
    pass through untouched; an unknown one (``{sed}``) is refused as a typo.
    """
    def one(arg: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) is not None:
                return "{" + m.group(1) + "}"
            if m.group(2) == "seed":
                return str(seed)
            raise UsageError(f"script argument {arg!r}: unknown placeholder {m.group(0)} (the one hermetic "
                             f"fills in is {{seed}}; write {{{m.group(0)}}} for the text itself)")
        return PLACEHOLDER.sub(sub, arg)

    return [one(a) for a in template]


def has_placeholder(args: list[str]) -> bool:
    return any(m.group(2) is not None for a in args for m in PLACEHOLDER.finditer(a))


def filled_template(invocation: Mapping[str, Any], seed: Any) -> list[str] | None:
    """The run's ``args_template`` when its ``args`` are exactly that template with ``seed`` filled in
    (None otherwise: no template, or arguments that say something else)."""
    template = invocation.get("args_template")
    if not isinstance(template, list) or not isinstance(seed, int):
        return None
    try:
        return template if script_args(template, seed) == invocation.get("args") else None
    except UsageError:  # a template hermetic would have refused: not one it filled in
        return None


def args_as_input(invocation: Mapping[str, Any], seed: Any) -> tuple[str, list[str]]:
    """What the arguments contribute as an input beside the seed: ``("template", [...])`` when they are
    their template with the run's seed filled in, else ``("args", [...])`` as the script received them."""
    template = filled_template(invocation, seed)
    return ("template", list(template)) if template is not None else ("args", list(invocation.get("args") or []))


def differ_only_by_seed(inv_a: Mapping[str, Any], seed_a: Any, inv_b: Mapping[str, Any], seed_b: Any) -> bool:
    """Whether two runs' arguments are one template, each filled in with its own seed."""
    ta, tb = filled_template(inv_a, seed_a), filled_template(inv_b, seed_b)
    return ta is not None and ta == tb
