"""The verdict: one line that says whether two runs are the same and, if not, the likeliest why.

Every line and its exit code: docs/run-record.md, "Verdicts". A dataset that changed while read is the one
cause named; equal inputs give identical, identical but wall-clock, nothing compared, renamed files,
nondeterminism or other hardware; else "inputs differ", in causal order.
"""

from __future__ import annotations

from typing import Any

from hermetic.config.determinism import env_knobs_not_set
from hermetic.diff.compare import data_changed_during, flatten, short
from hermetic.diff.contents import names_text, volatile_globs_for, weights_first
from hermetic.core.errors import EXIT_DIFFERENT, EXIT_NOTHING_COMPARED
from hermetic.diff.model import OutputsDiff, SectionDiff, Verdict
from hermetic.record.schema import Record
from hermetic.config.seedargs import has_placeholder


def knobs_not_set(record: Record) -> list[str]:
    """The determinism settings this run lacked: CUBLAS_WORKSPACE_CONFIG, PYTHONHASHSEED, the BLAS/OpenMP
    threads; with torch, deterministic algorithms on and cudnn.benchmark off; any seeding at all."""
    missing = env_knobs_not_set({**record.env.passed, **record.env.determinism})
    torch = record.software.get("torch")
    applied = record.seed.applied
    final = applied.get("final") if isinstance(applied.get("final"), dict) else {}
    at_exit = final.get("torch") if isinstance(final.get("torch"), dict) else {}
    if isinstance(torch, dict):
        # The training process's own state wins over the probe's (a separate process that sees torch's
        # defaults): as it was at exit, else as enable_determinism() left it.
        if _torch_setting(at_exit.get("use_deterministic_algorithms"), applied, "deterministic",
                          torch.get("deterministic_algorithms")) is not True:
            missing.append("torch.use_deterministic_algorithms(True)")
        if _torch_setting(at_exit.get("cudnn.benchmark"), applied, "benchmark",
                          torch.get("cudnn_benchmark")) is not False:
            missing.append("torch.backends.cudnn.benchmark=False")
    changed = final.get("changed_after_enable_determinism") or {}
    missing += [f"{flag} changed after enable_determinism() ({short(a)} -> {short(b)})"
                for flag, (a, b) in sorted(changed.items())]
    if not applied:
        missing.append("in-process seeding (seed.applied is empty)")
    return missing


def _torch_setting(at_exit: Any, applied: dict[str, Any], word: str, probed: Any) -> Any:
    """A torch setting as the training process left it, else as seeding applied it (the first boolean
    whose key holds ``word``), else as the probe saw it; None when nothing says."""
    if at_exit is not None:
        return at_exit
    found = next((v for k, v in flatten(applied).items() if word in k and isinstance(v, bool)), None)
    return found if found is not None else probed


def ranked_inputs(sections: list[SectionDiff]) -> list[SectionDiff]:
    """The input sections that differ, in causal order, those whose every change the runtime reported (a
    consequence: which modules it seeded) after the real inputs."""
    inputs = [s for s in sections if s.role == "input" and s.differs]
    return [s for s in inputs if not s.only_effects] + [s for s in inputs if s.only_effects]


def decide(sections: list[SectionDiff], outputs: OutputsDiff, a: Record, b: Record) -> Verdict:
    inputs = ranked_inputs(sections)
    machine = [s for s in sections if s.role == "environment" and s.differs]
    warnings = [w for s in sections for w in s.warnings]
    knobs = _union(knobs_not_set(a), knobs_not_set(b))
    notes = []
    if machine:
        notes.append("machine differs: " + "; ".join(f"{s.name} ({s.summary(2)})" for s in machine))
    notes += warnings
    causes = [s.name for s in inputs + machine]
    during = data_changed_during(a, "A") + data_changed_during(b, "B")
    if during:
        # Not nondeterminism, not the inputs as recorded: that run read other bytes than its manifest says.
        line = "; ".join(during)
        others = [f"{s.name} ({s.summary(2)})" for s in inputs if s.name != "data"]
        if others:
            line += "; inputs differ too: " + "; then ".join(others)
        notes.insert(0, "a dataset that changes while a run reads it makes that run's outputs those of unknown "
                        "data; run it again on data that stays put (docs/data.md, \"While a run reads it\")")
        return Verdict("data_changed", line, causes or ["data"], knobs, notes, EXIT_DIFFERENT)
    if not inputs and outputs.identical and not outputs.compared:
        line = ("nothing to compare: neither run has an output file or a metric (hermetic looks in /outputs, "
                "in what the script writes in its working directory, and in /outputs/metrics.jsonl)")
        return Verdict("nothing_compared", line, causes, knobs, notes, EXIT_NOTHING_COMPARED)
    if not inputs and outputs.identical:
        if knobs:  # dcgan sets cudnn.benchmark = True itself: equal here, on this machine, but not promised
            notes.append(f"identical although knobs were not set ({', '.join(knobs)}): on another machine, "
                         "or a GPU, the same inputs may not give the same bits")
        return Verdict("identical", f"bitwise identical ({outputs.compared_names()})", causes, knobs, notes, 0)
    suggested = suggested_volatile(outputs, a, b)
    if not inputs and outputs.only_wall_clock_differs:
        # A run's duration, its throughput, a time in a path: not the computation, and no knob would help.
        if suggested:
            notes.insert(0, volatile_note(outputs, suggested))
        return Verdict("wall_clock", f"identical except wall-clock fields: {wall_clock_text(outputs)}", causes,
                       knobs, notes, 0, suggested)
    if not inputs:
        knob_text = f"knobs not set: {', '.join(knobs)}" if knobs else "all known determinism knobs were set"
        if not machine and outputs.only_unpaired_files_differ:
            # Not the computation: a file name that carries a time, a host or a PID. No knob would help.
            line = f"same inputs, outputs differ: {unpaired_text(outputs)}"
            notes.insert(0, "a file written under another name each run is usually a log named by time, host or "
                            "PID; keep such files without comparing them: run.outputs.volatile in hermetic.yaml "
                            "(docs/your-script.md, \"Where hermetic finds what the script produced\")")
            return Verdict("nondeterminism", line, causes, knobs, notes, EXIT_DIFFERENT)
        if not machine:
            line = f"same inputs, outputs differ: nondeterminism ({knob_text})"
            return Verdict("nondeterminism", line, causes, knobs, notes, EXIT_DIFFERENT)
        first = machine[0]
        line = f"same inputs on different hardware, outputs differ: {first.title} ({first.summary(2)})"
        if len(machine) > 1:
            line += "; also " + ", ".join(s.title for s in machine[1:])
        if knobs:
            line += f"; and knobs not set: {', '.join(knobs)}"
        return Verdict("environment", line, causes, knobs, notes, EXIT_DIFFERENT)
    real = [s for s in inputs if not s.only_effects]
    effects = [s for s in inputs if s.only_effects]
    named = [f"{s.name} ({s.summary() if i == 0 else s.summary(2)})" for i, s in enumerate(real)]
    line = "inputs differ: " + "; then ".join(named) if named else "inputs differ"
    if effects:
        reported = "; ".join(f"{s.name} ({s.summary(2)})" for s in effects)
        line += f"; and what the runtime reported: {reported}" if named else f": what the runtime reported: {reported}"
    if (outputs.identical and outputs.compared) or outputs.only_wall_clock_differs:
        line += ("; outputs bitwise identical all the same" if outputs.identical else
                 "; outputs identical all the same, wall-clock fields aside")
        if [s.name for s in inputs] == ["seed"]:
            notes.insert(0, seed_had_no_effect(a, b))
    elif not outputs.compared:
        line += "; and nothing to compare (no output files, no metrics)"
    return Verdict("inputs", line, causes, knobs, notes, EXIT_DIFFERENT)


def unpaired_text(outputs: OutputsDiff) -> str:
    """``2 files are in one run only (x in A, y in B); the 1 file both runs wrote is identical (model.pt)``."""
    files = outputs.compared_files
    unpaired = [f for f in files if f.status in ("only_a", "only_b")]
    both = weights_first(f.path for f in files if f.status == "equal")
    clock = [f.path for f in outputs.wall_clock_files]
    named = ", ".join(f"{f.path} in {'A' if f.status == 'only_a' else 'B'}" for f in unpaired[:2])
    named += f", +{len(unpaired) - 2} more" if len(unpaired) > 2 else ""
    n = len(unpaired)
    text = f"{n} file{'s are' if n != 1 else ' is'} in one run only ({named})"
    if both:
        shown = ", ".join(both[:3]) + (f", +{len(both) - 3} more" if len(both) > 3 else "")
        text += (f"; the {len(both)} file{'s' if len(both) != 1 else ''} both runs wrote "
                 f"{'are' if len(both) != 1 else 'is'} identical ({shown})")
        if clock:
            text += f", {len(clock)} more differ{'s' if len(clock) == 1 else ''} only in wall-clock fields " \
                    f"({names_text(clock, 3)})"
    elif clock:
        text += f"; the {len(clock)} both runs wrote differ only in wall-clock fields ({names_text(clock, 3)})"
    elif not any(f.status == "changed" for f in files):
        text += "; none is in both runs, so nothing was compared byte for byte"
    if outputs.metrics:
        text += f"; all {len(outputs.metrics)} metrics equal"
    return text + outputs.not_compared_note()


def wall_clock_text(outputs: OutputsDiff) -> str:
    """``17 files bitwise identical (out/model.safetensors, ...); in 6 files only timing fields differ
    (train_runtime, train_samples_per_second, ...)``: the weights named first."""
    files = outputs.compared_files
    same = weights_first(f.path for f in files if f.status == "equal")
    clock = outputs.wall_clock_files
    names: dict[str, None] = {}
    for f in clock:
        for n in outputs.contents[f.path].wall_names:
            names.setdefault(n.split(" (")[0])
    parts = []
    if same:
        parts.append(f"{len(same)} file{'s' if len(same) != 1 else ''} bitwise identical ({names_text(same, 3)})")
    if clock:
        parts.append(f"in {len(clock)} file{'s' if len(clock) != 1 else ''} only timing fields differ "
                     f"({names_text(names, 4)})")
    metrics = outputs.metrics
    if metrics:
        timing = [m.name for m in outputs.wall_clock_metrics]
        equal = len(metrics) - len(timing)
        text = f"{equal} metric{'s' if equal != 1 else ''} equal"
        if timing:
            text += f", timing metrics aside ({names_text(timing, 3)})"
        parts.append(text)
    return "; ".join(parts) + outputs.not_compared_note()


def suggested_volatile(outputs: OutputsDiff, a: Record, b: Record) -> list[str]:
    """run.outputs.volatile that would keep the files differing only in wall-clock fields without comparing
    them: the run's own globs (B's, the later run's, else A's; the default for records without), then globs
    for those files (numbered directories folded into one glob where no compared file would match it)."""
    from hermetic.record.outputs import volatile_globs

    clock = [f.path for f in outputs.wall_clock_files]
    if not clock:
        return []
    current = volatile_globs(b.invocation.config) or volatile_globs(a.invocation.config)
    if not current and "run" not in b.invocation.config:
        from hermetic.config.load import DEFAULT_VOLATILE

        current = list(DEFAULT_VOLATILE)
    others = [f.path for f in outputs.compared_files if f.path not in clock]
    return current + [g for g in volatile_globs_for(clock, others) if g not in current]


def volatile_note(outputs: OutputsDiff, suggested: list[str]) -> str:
    """The note that offers ``suggested`` as the exact line for hermetic.yaml."""
    import json

    n = len(outputs.wall_clock_files)
    return (f"{'these ' + str(n) + ' files differ' if n != 1 else 'this file differs'} only in wall-clock fields; "
            "to keep them without comparing them, set in hermetic.yaml, under run: outputs: (the list replaces "
            f"the default)  volatile: {json.dumps(suggested)}")


def seed_had_no_effect(a: Record, b: Record) -> str:
    """The note for two runs that differ in the seed alone and came out bitwise identical: the verdict is
    still "inputs differ" (exit 1, as diff(1): they do), but a seed that changes nothing never reached
    what the script draws -- the usual reason being a script that seeds itself with a constant."""
    template = next((r.invocation.args_template for r in (a, b) if has_placeholder(r.invocation.args_template or [])),
                    None)
    reseeds = a.seed.reseeded
    if reseeds and reseeds == b.seed.reseeded:
        from hermetic.record.build import reseeded_text

        return (f"the seed did not change the outputs: {reseeded_text(reseeds)} in both runs, so the run's seed "
                "never reached what it draws; give it the run's seed with `--seed {seed}` in its arguments, or "
                "have it read $HERMETIC_SEED (docs/your-script.md, \"Seeds\")")
    if template is not None:
        return (f"the seed did not change the outputs, although it reached the script's arguments "
                f"({' '.join(template)}): the script ignores that argument or seeds itself with a fixed value "
                "(docs/your-script.md, \"Seeds\")")
    return ("the seed did not change the outputs: the script probably seeds itself with a fixed value (such as "
            "torch.manual_seed(args.seed) with a default); give it the run's seed with `--seed {seed}` in its "
            "arguments, or have it read $HERMETIC_SEED (docs/your-script.md, \"Seeds\")")


def _union(a: list[str], b: list[str]) -> list[str]:
    return a + [x for x in b if x not in a]
