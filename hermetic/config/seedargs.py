"""``{seed}`` in a script's arguments, filled in per run: the record keeps ``args`` and ``args_template``, and
runs that differ only by the seed filled in are compared by their template (``args_as_input``). ``--seeds``
(``parse_seeds``): a count or seeds and ranges, checked by arithmetic before any list is made, at most
``MAX_GROUP_SEEDS`` (Slurm's default MaxArraySize is 1001)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from hermetic.core.errors import UsageError

SEED_MAX = 2**32 - 1  # numpy's legacy seed() takes 32 bits; hermetic.yaml and --seed have the same bound
MAX_GROUP_SEEDS = 1000  # members of one --seeds group (docs/your-script.md); a larger sweep is several groups
_SHOWN = 40  # characters of a refused --seeds value quoted back in the message

# Placeholders in the script's arguments; ``{{name}}`` is the literal text ``{name}``.
PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")


def script_args(template: list[str], seed: int) -> list[str]:
    """The script's arguments with ``{seed}`` replaced (``{{seed}}`` is a literal); only ``{identifier}`` is a
    placeholder, so JSON passes untouched, and an unknown one (``{sed}``) is refused as a typo."""
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


def seed_ranges(text: str, first: int) -> list[tuple[int, int]]:
    """The seeds of ``--seeds`` as inclusive ranges, checked without listing them: ``N`` (one integer) is N
    seeds from ``first`` (hermetic.yaml's seed) on; ``0,1,2``, ``0-4`` (inclusive) and mixes like ``0-2,10``
    are the seeds themselves. UsageError when it is not that, a seed repeats, a seed is past SEED_MAX, or
    the group would hold fewer than 2 or more than MAX_GROUP_SEEDS seeds."""
    shown = text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."

    def bad(why: str) -> UsageError:
        return UsageError(f"--seeds {shown!r}: {why} (a count such as 5, or seeds such as 0,1,2 or 0-4)")

    def too_many(count: int | None) -> UsageError:
        many = f"{count} seeds" if count is not None else "far more seeds"
        return UsageError(f"--seeds {shown!r}: {many}; a group holds at most {MAX_GROUP_SEEDS} "
                          "(run a larger sweep as several groups)")

    def number(digits: str) -> int | None:
        """The integer, or None when it has more digits than any seed (int() of a huge string is slow)."""
        return int(digits) if len(digits) <= 20 else None

    text = text.strip()
    if text.isascii() and text.isdigit():
        count = number(text)
        if count is None or count > MAX_GROUP_SEEDS:
            raise too_many(count)
        if count < 2:
            raise bad("a group needs at least two seeds")
        if first + count - 1 > SEED_MAX:
            raise bad(f"{count} seeds from determinism.seed {first} on go past {SEED_MAX}")
        return [(first, first + count - 1)]
    ranges: list[tuple[int, int]] = []
    total = 0
    for part in (p.strip() for p in text.split(",")):
        lo, dash, hi = part.partition("-")
        if not (lo.isascii() and lo.isdigit()) or (dash and not (hi.isascii() and hi.isdigit())):
            raise bad(f"{part[:_SHOWN]!r} is not a seed or a range A-B")
        a, b = number(lo), number(hi) if dash else number(lo)
        if a is None or b is None or max(a, b) > SEED_MAX:
            raise bad(f"seeds go up to {SEED_MAX}")
        if b < a:
            raise bad(f"range {part} runs backwards")
        total += b - a + 1
        ranges.append((a, b))
    if total > MAX_GROUP_SEEDS:
        raise too_many(total)
    if total < 2:
        raise bad("a group needs at least two seeds")
    ordered = sorted(ranges)
    if any(nxt[0] <= prev[1] for prev, nxt in zip(ordered, ordered[1:])):
        raise bad("a seed is given twice")
    return ranges


def parse_seeds(text: str, first: int) -> list[int]:
    """The seeds of ``--seeds``, in the order given (see seed_ranges: at most MAX_GROUP_SEEDS of them)."""
    return [seed for a, b in seed_ranges(text, first) for seed in range(a, b + 1)]
