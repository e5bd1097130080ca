"""The diff for a terminal: verdict first, one line per section, details where they differ.

What the records say is escaped (hermetic.core.escape) before it is styled; click.echo drops the styles when stdout
is not a terminal.
"""

from __future__ import annotations

from typing import Any

import click

from hermetic.core.escape import shown
from hermetic.diff.compare import short
from hermetic.diff.groups import GroupDiff, fmt_stats
from hermetic.diff.model import RunDiff, SectionDiff

DETAIL_LIMIT = 12  # change lines shown per section; --json has them all
_VERDICT_COLOUR = {"identical": "green", "wall_clock": "green", "within_noise": "green", "nondeterminism": "yellow",
                   "environment": "yellow", "undetermined": "yellow", "nothing_compared": "yellow"}
_KIND_MARK = {"added": "+", "removed": "-", "changed": "~"}


def render(result: RunDiff | GroupDiff) -> str:
    return render_groups(result) if isinstance(result, GroupDiff) else render_runs(result)


def _verdict(v: Any) -> str:
    return click.style(shown(v.line), fg=_VERDICT_COLOUR.get(v.kind, "red"), bold=True)


def render_runs(d: RunDiff) -> str:
    lines = [_verdict(d.verdict), f"  A {shown(d.a)}", f"  B {shown(d.b)}", ""]
    width = max(len(s.title) for s in d.sections)
    for s in d.sections:
        lines += _section_lines(s, width)
    lines += _outputs_lines(d, width)
    if d.logs is not None:
        lines.append(f"  {'logs'.ljust(width)}  {click.style(shown(d.logs.summary()), dim=True)}  (context, not the verdict)")
    printed = {w for s in d.sections for w in s.warnings}  # already under their section
    notes = [n for n in d.verdict.notes if n not in printed]
    if notes:
        lines.append("")
        lines += [click.style(f"note: {shown(n)}", fg="yellow") for n in notes]
    return "\n".join(lines)


def _section_lines(s: SectionDiff, width: int) -> list[str]:
    title = s.title.ljust(width)
    if s.differs:
        colour = "red" if s.role == "input" else "yellow"
        head = f"  {title}  {click.style('differs', fg=colour, bold=True)}  {shown(s.summary(2))}"
        if s.only_effects:  # which modules the runtime seeded: follows from the inputs above
            head += click.style("  (reported by the runtime: a consequence)", dim=True)
    else:
        extra = f"  {click.style(f'({len(s.changes)} immaterial)', dim=True)}" if s.changes else ""
        head = f"  {title}  {click.style('same   ', fg='green')}  {shown(s.same_as)}{extra}"
    out = [head]
    if s.differs:
        listed = s.changes[:DETAIL_LIMIT]
        for c in listed:
            text = f"      {_KIND_MARK[c.kind]} {shown(c.note)}"
            out.append(text if c.material else click.style(text + "  (immaterial)", dim=True))
        if len(s.changes) > len(listed):
            out.append(f"      ... {len(s.changes) - len(listed)} more (--json lists all)")
    for w in s.warnings:
        out.append(click.style(f"      ! {shown(w)}", fg="yellow"))
    return out


def _outputs_lines(d: RunDiff, width: int) -> list[str]:
    o = d.outputs
    title = "outputs".ljust(width)
    if o.identical:
        return [f"  {title}  {click.style('same   ', fg='green')}  {shown(o.summary())}"]
    colour = ("yellow", False) if o.only_wall_clock_differs else ("red", True)
    out = [f"  {title}  {click.style('differ ', fg=colour[0], bold=colour[1])}  {shown(o.summary())}"]
    # what differs inside a file first (a real value before a timing field), then the rest
    files = sorted((f for f in o.compared_files if f.status != "equal"), key=o.wall_clock_only)
    for f in files[:DETAIL_LIMIT]:
        inside = o.contents.get(f.path)
        if f.status == "changed" and inside is not None:
            text = f"      ~ {shown(f.path)}  {shown(inside.summary())}"
            out.append(click.style(text, dim=True) if inside.wall_clock_only else text)
        elif f.status == "changed":
            out.append(f"      ~ {shown(f.path)}  {shown(short(f.a, 8))} -> {shown(short(f.b, 8))}")
        else:
            out.append(f"      {'-' if f.status == 'only_a' else '+'} {shown(f.path)}  only in {'A' if f.status == 'only_a' else 'B'}")
    if len(files) > DETAIL_LIMIT:
        out.append(f"      ... {len(files) - DETAIL_LIMIT} more files (--json lists all)")
    for m in o.metrics:
        if m.status == "equal":
            continue
        label = {"close": "within tolerance", "different": "different", "only_a": "only in A",
                 "only_b": "only in B"}[m.status]
        delta = f", |Δ| {m.abs_diff:.3g}" if m.abs_diff is not None else ""
        rel = f", rel {m.rel_diff:.3g}" if m.rel_diff is not None else ""
        colour = "yellow" if m.status == "close" else "red"
        out.append(f"      {shown(m.name)} {shown(short(m.a))} -> {shown(short(m.b))}  "
                   + click.style(label, fg=colour) + f"{delta}{rel}")
    if o.metrics:  # the tolerance is for metrics; files are equal or not
        tol = d.tolerance
        out.append(click.style(f"      (metric tolerance: rtol {tol['rtol']:g}, atol {tol['atol']:g})", dim=True))
    return out


def render_groups(d: GroupDiff) -> str:
    lines = [_verdict(d.verdict), f"  A {shown(d.a)}", f"  B {shown(d.b)}", ""]
    width = max([len(shown(m.name)) for m in d.metrics] + [6])
    lines.append(f"  {'metric'.ljust(width)}  {'A: mean ± sd (n)':<28}  {'B: mean ± sd (n)':<28}  verdict")
    for m in d.metrics:
        label = {"within_noise": ("within seed noise", "green"), "beyond_noise": ("beyond seed noise", "red"),
                 "undetermined": ("too few seeds", "yellow"), "only_a": ("only in A", "red"),
                 "only_b": ("only in B", "red")}[m.status]
        extra = ""
        if m.test and m.test.get("t") is not None:
            extra = f"  (t={m.test['t']:.3g}, df={m.test['df']:.3g}, crit {m.test['t_crit']:.3g})"
        lines.append(f"  {shown(m.name).ljust(width)}  {fmt_stats(m.a):<28}  {fmt_stats(m.b):<28}  "
                     + click.style(label[0], fg=label[1]) + extra)
    if d.inputs:
        lines.append("")
        lines.append("  inputs (first member of each group; seeds left out):")
        w = max(len(s.title) for s in d.inputs)
        for s in d.inputs:
            lines += _section_lines(s, w)
    if d.notes:
        lines.append("")
        lines += [click.style(f"note: {shown(n)}", fg="yellow") for n in d.notes]
    return "\n".join(lines)
