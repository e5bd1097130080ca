"""Comparing two run records section by section, in causal order (pure functions).

Inputs (image, code, config, data, seed, env), then the machine (software, GPU, CPU), then the outputs. A change
is ``material`` when it can change what the program computes; one that restates another section or cannot
change results (a branch name, a GPU's UUID) is listed, not material.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from typing import Any, Callable

from hermetic.config.determinism import SEED_KEY
from hermetic.diff.distributed import compare_distributed
from hermetic.diff.manifests import compare_manifests
from hermetic.diff.model import Change, FileComparison, MetricComparison, OutputsDiff, SectionDiff
from hermetic.record.schema import Code, DataChangedDuringRun, Env, Image, Invocation, Record, Seed
from hermetic.config.seedargs import differ_only_by_seed, filled_template, has_placeholder

INPUT_SECTIONS = ("image", "code", "config", "data", "seed", "env")
TITLES = {
    "image": "image and packages", "code": "code", "config": "config and arguments", "data": "data",
    "seed": "seed", "env": "environment variables", "software": "software versions and flags",
    "gpu": "driver and GPU", "cpu": "CPU, BLAS and host",
}
# Config keys whose effect another section records exactly: the image ID covers the build,
# data manifests cover dataset paths, seed.value covers the seed, invocation.engine the engine.
_CONFIG_RESTATED = re.compile(
    r"^(name|base|lock|runs_dir|python(\..*)?|build(\..*)?|run\.engine|" + re.escape(SEED_KEY)
    + r"|datasets\[\d+\]\.(path|manifest))$"
)
# Keys that steer only hermetic's own comparison of outputs (which files diff compares, which metrics it reads):
# they change no byte the script computes, so they are listed and never a cause.
_COMPARISON_KEYS = re.compile(r"^run\.outputs\.volatile$|^run\.metrics(\..*|\[\d+\].*)?$")
# Arguments longer than this (both sides together) are shown as the tokens that changed, not whole.
ARGS_SHOWN_WHOLE = 80
# The container's limits (hermetic.yaml run.pids, run.memory): what it may use, not what it computes. A limit
# explains different outputs only when a run ended short of succeeding (killed for memory, out of processes).
_LIMIT_KEYS = frozenset({"run.pids", "run.memory"})
# Per-GPU keys that tell which card and how it was clocked, not how it computes.
_GPU_CONTEXT_KEYS = frozenset({"index", "uuid", "pci_bus_id", "clocks", "power_limit_w", "power_limit",
                               "sm_count_source", "memory_used", "temperature", "utilization"})
_GPU_TOP_CONTEXT_KEYS = frozenset({"gpu_note", "gpu_source", "gpu_sources_tried"})
_HOST_CONTEXT_KEYS = frozenset({"kernel", "os", "memory_bytes", "memory_limit_bytes", "hostname"})
_RESTATING_LABELS = frozenset(f"labels.{k}" for k in ("org.hermetic.config.sha256", "org.hermetic.lock.sha256",
                                                     "org.hermetic.base", "org.hermetic.base.digest"))
CUBLAS_NOTE = ("cuBLAS only promises identical bits on the same GPU architecture and the same SM count "
               "(a MIG slice has fewer SMs)")

Json = Any
Manifests = dict[str, dict[str, str] | None]


def short(value: Any, n: int = 12) -> str:
    """A compact rendering for notes: digests shortened, None as 'unset'."""
    if value is None:
        return "unset"
    if isinstance(value, str):
        if value.startswith("sha256:") and len(value) == 71:
            return value[: 7 + n]
        if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
            return value[:n]
        return value if len(value) <= 60 else value[:57] + "..."
    if isinstance(value, list):
        return "[" + ", ".join(short(v, n) for v in value) + "]" if len(value) <= 6 else f"[{len(value)} items]"
    return str(value)


def flatten(value: Json, prefix: str = "") -> dict[str, Json]:
    """Nested dicts and lists of dicts -> ``{"a.b[0].c": leaf}``; lists of scalars stay leaves."""
    out: dict[str, Json] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


def diff_flat(section: str, a: Json, b: Json, *, prefix: str = "",
              material: Callable[[str], bool] = lambda k: True) -> list[Change]:
    """Key-level changes between two nested values, dotted key paths, sorted by key."""
    fa, fb = flatten(a, prefix), flatten(b, prefix)
    changes = []
    for key in sorted(fa.keys() | fb.keys()):
        if key in fa and key in fb:
            if fa[key] == fb[key] and type(fa[key]) is type(fb[key]):
                continue
            kind, note = "changed", f"{key} {short(fa[key])} -> {short(fb[key])}"
            if isinstance(fa[key], list) and isinstance(fb[key], list) and len(fa[key]) + len(fb[key]) > 12:
                note = f"{key}: " + _set_note(fa[key], fb[key])
        elif key in fa:
            kind, note = "removed", f"{key} {short(fa[key])} -> unset"
        else:
            kind, note = "added", f"{key} unset -> {short(fb[key])}"
        changes.append(Change(section, key, kind, fa.get(key), fb.get(key), note, material(key)))
    return changes


def _set_note(a: list[Any], b: list[Any]) -> str:
    sa, sb = {str(x) for x in a}, {str(x) for x in b}
    plus, minus = sorted(sb - sa), sorted(sa - sb)
    parts = [f"+{x}" for x in plus[:5]] + [f"-{x}" for x in minus[:5]]
    more = len(plus) + len(minus) - len(parts)
    return " ".join(parts) + (f" (+{more} more)" if more > 0 else "") if parts else "same items, other order"


def files_changes(section: str, a: dict[str, str], b: dict[str, str], *, what: str = "", material: bool = True,
                  prefix: str = "") -> list[Change]:
    """Per-path changes between two ``{path: sha256}`` maps (added, removed, changed)."""
    only_a, only_b, changed = compare_manifests(a, b)
    out = [Change(section, prefix + p, "changed", a[p], b[p], f"{what}{p} changed", material) for p in changed]
    out += [Change(section, prefix + p, "added", None, b[p], f"{what}{p} added", material) for p in only_b]
    out += [Change(section, prefix + p, "removed", a[p], None, f"{what}{p} removed", material) for p in only_a]
    return out


# --- inputs ---------------------------------------------------------------------------------------

def compare_image(a: Image, b: Image) -> SectionDiff:
    s = SectionDiff("image", TITLES["image"], "input", same_as=short(a.id))
    pa = {p.name.lower(): p for p in a.packages}
    pb = {p.name.lower(): p for p in b.packages}
    for name in sorted(pa.keys() | pb.keys()):
        x, y = pa.get(name), pb.get(name)
        if x and y:
            if x.version != y.version:
                s.add(f"packages.{name}", "changed", x, y, f"{name} {x.version} -> {y.version}")
            elif x.sha256 != y.sha256 or x.filename != y.filename:
                s.add(f"packages.{name}", "changed", x, y, f"{name} {x.version} other "
                      f"wheel ({short(x.sha256, 8)} -> {short(y.sha256, 8)})")
        elif y:
            s.add(f"packages.{name}", "added", None, y, f"{name} {y.version} added")
        elif x:
            s.add(f"packages.{name}", "removed", x, None, f"{name} {x.version} removed")
    if a.base != b.base:
        s.add("base", "changed", a.base, b.base, f"base {short(a.base)} -> {short(b.base)}")
    if a.lock_sha256 != b.lock_sha256:
        s.add("lock_sha256", "changed", a.lock_sha256, b.lock_sha256,
              f"lock {short(a.lock_sha256)} -> {short(b.lock_sha256)}", headline=not s.changes)
    s.changes += diff_flat("image", a.cuda.model_dump(), b.cuda.model_dump(), prefix="cuda")
    # Labels that restate another section are listed, not causes: the config's hash (the config section
    # names the key that changed), the lock's and the base's digests (said above).
    s.changes += diff_flat("image", a.labels, b.labels, prefix="labels", material=lambda k: k not in _RESTATING_LABELS)
    same_id = a.id == b.id
    if not same_id:
        s.add("id", "changed", a.id, b.id, f"image {short(a.id)} -> {short(b.id)}", headline=False)
    if a.manifest_digest != b.manifest_digest:
        # Same config (ID) but another manifest: the same image stored another way (e.g. compressed).
        s.add("manifest_digest", "changed", a.manifest_digest, b.manifest_digest,
              f"manifest {short(a.manifest_digest)} -> {short(b.manifest_digest)}",
              material=not same_id, headline=False)
    if sorted(a.repo_digests) != sorted(b.repo_digests):
        s.add("repo_digests", "changed", a.repo_digests, b.repo_digests, "pushed under other names", material=False)
    if same_id:
        # The ID is the digest of the image config, which names every layer: equal IDs mean
        # equal images, whatever the package lists say.
        s.changes = [Change(c.section, c.key, c.kind, c.a, c.b, c.note, False, c.headline) for c in s.changes]
    elif _only_config_changed(s.changes):
        # hermetic.yaml's image part changed (threads, env...): the config section names the key; the new
        # image ID restates it, and is no cause of its own.
        s.changes = [dataclasses.replace(c, material=False, note=c.note + " (restates the config change)")
                     if c.key in ("id", "manifest_digest") else c for c in s.changes]
    return s


def _only_config_changed(changes: list[Change]) -> bool:
    keys = {c.key for c in changes if c.material}
    return "labels.org.hermetic.config.sha256" in {c.key for c in changes} and keys <= {"id", "manifest_digest"}


def compare_code(a: Code, b: Code, restated: frozenset[str] = frozenset()) -> SectionDiff:
    """``restated``: files in the tree whose content other sections judge (hermetic.yaml
    is the config section, the lock and hermetic.image.json are the image section)."""
    sa, sb = a.snapshot, b.snapshot
    s = SectionDiff("code", TITLES["code"], "input", same_as=f"source {short(sa.sha256)}")
    files = [dataclasses.replace(c, material=c.key not in restated)
             for c in files_changes("code", sa.files, sb.files, prefix="")]
    # The code differs when a file other sections do not judge differs (or the tree does, with no file
    # named): a commit that changed only hermetic.yaml's run.outputs.volatile is the config's change, not code.
    tree_differs = any(c.material for c in files) or (not files and sa.sha256 != sb.sha256)
    s.changes += files
    if sa.sha256 != sb.sha256:
        # The tree's digest restates its files: when only restated ones changed (hermetic.yaml's run.pids,
        # say), the config or image section names the change, not the code.
        restating = bool(files) and not any(c.material for c in files)
        s.add("snapshot.sha256", "changed", sa.sha256, sb.sha256,
              f"source tree {short(sa.sha256)} -> {short(sb.sha256)}", not restating, headline=False)
    # Git says where the bytes came from; the snapshot is the bytes. Git differences matter
    # only when the trees differ (an amended commit message changes nothing that runs).
    ga, gb = a.git, b.git
    if ga and ga.commit:
        s.same_as += f", commit {str(ga.commit)[:10]}"
    if ga is None or gb is None:
        if ga is not gb:
            s.add("git", "changed", ga, gb,
                  "git checkout -> no git" if gb is None else "no git -> git checkout", tree_differs)
        return s
    fields = (("commit", "commit", ga.commit, gb.commit), ("dirty", "uncommitted changes", ga.dirty, gb.dirty),
              ("diff_sha256", "patch", ga.diff_sha256, gb.diff_sha256), ("branch", "branch", ga.branch, gb.branch))
    for key, label, x, y in fields:
        if x != y:
            s.add(f"git.{key}", "changed", x, y, f"{label} {short(x, 10)} -> {short(y, 10)}",
                  tree_differs and key != "branch")
    s.changes += files_changes("code", ga.untracked, gb.untracked, what="untracked ", material=tree_differs,
                               prefix="git.untracked.")
    return s


def _restated_files(a: Record, b: Record) -> frozenset[str]:
    from hermetic.provenance import PROVENANCE_FILE

    names = {"hermetic.yaml", "hermetic.image.json", PROVENANCE_FILE}  # the provenance restates the image
    for rec in (a, b):
        lock = rec.invocation.config.get("lock")
        if isinstance(lock, str):
            names.add(lock)
    return frozenset(names)


def compare_config(a_inv: Invocation, b_inv: Invocation, seed_a: Any = None, seed_b: Any = None, *,
                   both_succeeded: bool = False) -> SectionDiff:
    """``seed_a``/``seed_b``: the runs' seeds. Arguments that are one template (``--seed {seed}``) filled in
    with each run's own seed are compared by the template: the seed section says how they differ.
    ``both_succeeded``: a changed limit (run.pids, run.memory) is then listed, not a cause."""
    s = SectionDiff("config", TITLES["config"], "input", same_as=f"config {short(a_inv.config_sha256)}")
    for c in diff_flat("config", a_inv.config, b_inv.config, material=lambda k: not _CONFIG_RESTATED.match(k)):
        if _COMPARISON_KEYS.match(c.key):
            c = dataclasses.replace(c, material=False, note=c.note + " (steers hermetic's comparison, not the script)")
        elif c.key in _LIMIT_KEYS:
            note = c.note.replace(" unset", " unset (no limit)")
            c = dataclasses.replace(c, material=not both_succeeded,
                                    note=note + (" (a limit: both runs succeeded within it)" if both_succeeded else
                                                 " (the container's limit)"))
        s.changes.append(c)
    if a_inv.args != b_inv.args and not differ_only_by_seed(_args(a_inv), seed_a, _args(b_inv), seed_b):
        def tokens(inv: Invocation, seed: Any) -> tuple[list[str], str]:  # as typed: `--seed {seed}`, not `--seed 0`
            template = filled_template(_args(inv), seed)
            if template is not None and has_placeholder(template):
                return list(template), " ".join(a if "{" in a else shlex.quote(a) for a in template)
            return list(inv.args), shlex.join(inv.args)

        (ta, whole_a), (tb, whole_b) = tokens(a_inv, seed_a), tokens(b_inv, seed_b)
        note = (f"arguments '{whole_a}' -> '{whole_b}'" if len(whole_a) + len(whole_b) <= ARGS_SHOWN_WHOLE
                else f"arguments: {changed_tokens(ta, tb)}")
        s.add("args", "changed", a_inv.args, b_inv.args, note)
    for key, x, y in (("script", a_inv.script, b_inv.script), ("network", a_inv.network, b_inv.network),
                      ("resume_from", a_inv.resume_from, b_inv.resume_from)):
        if x != y:
            s.add(key, "changed", x, y, f"{key} {short(x)} -> {short(y)}")
    if a_inv.config_sha256 != b_inv.config_sha256 and not s.changes:
        s.add("config_sha256", "changed", a_inv.config_sha256, b_inv.config_sha256, "config sha256 differs", False)
    return s


def _args(inv: Invocation) -> dict[str, Any]:
    """The arguments as hermetic.config.seedargs reads them."""
    return {"args": inv.args, "args_template": inv.args_template}


def _engine_change(a_inv: Invocation, b_inv: Invocation) -> list[Change]:
    """The engine that ran the container (invocation.engine; a record without one ran on the Docker Engine), as a
    difference of the host: another engine is one (the machine differs), another version of it is listed only."""
    ea, eb = a_inv.engine, b_inv.engine
    (an, av), (bn, bv) = [(str(e.name or "docker"), str(e.version or "?")) if e else ("docker", "?") for e in (ea, eb)]
    if (an, av) == (bn, bv) or (not ea and not eb) or ((not ea or not eb) and an == bn):
        return []  # the same, or an older record: Docker, version not recorded
    return [Change("cpu", "engine", "changed", ea, eb, f"engine {an} {av} -> {bn} {bv}", an != bn)]


def changed_tokens(a: list[str], b: list[str]) -> str:
    """Two long argument lists as what changed: ``added --full_determinism``, ``--lr 5e-4 -> 1e-3``,
    ``removed --fp16``, with the option a changed value belongs to, and how many tokens stayed the same."""
    import difflib

    parts = []
    same = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            same += i2 - i1
            continue
        first = a[i1] if tag != "insert" else b[j1]
        # a value without its option says little: name the option before it (``--lr 5e-4 -> 1e-3``)
        option = a[i1 - 1] + " " if i1 > 0 and a[i1 - 1].startswith("-") and not first.startswith("-") else ""
        if tag == "insert":
            parts.append(f"added {option}{shlex.join(b[j1:j2])}")
        elif tag == "delete":
            parts.append(f"removed {option}{shlex.join(a[i1:i2])}")
        else:
            parts.append(f"{option}{shlex.join(a[i1:i2])} -> {shlex.join(b[j1:j2])}")
    return "; ".join(parts) + f" (the other {same} token{'s' if same != 1 else ''} the same)"


def compare_data(a: Record, b: Record, manifests_a: Manifests, manifests_b: Manifests) -> SectionDiff:
    s = SectionDiff("data", TITLES["data"], "input", same_as=", ".join(
        f"{n} {short(d.manifest_sha256, 8)}" for n, d in sorted(a.data.items())) or "none")
    for name in sorted(a.data.keys() | b.data.keys()):
        x, y = a.data.get(name), b.data.get(name)
        if x is None or y is None:
            kind = "added" if x is None else "removed"
            # the dataset as recorded (without the optional keys an older record lacks)
            s.add(name, kind, x and x.model_dump(exclude_unset=True),
                  y and y.model_dump(exclude_unset=True), f"dataset {name} {kind}")
            continue
        if x.manifest_sha256 != y.manifest_sha256:
            ma, mb = manifests_a.get(name), manifests_b.get(name)
            if ma is not None and mb is not None:
                per_file = files_changes("data", ma, mb, what=f"{name}: ", prefix=f"{name}/")
                s.changes += per_file or [Change("data", f"{name}.manifest_sha256", "changed", x.manifest_sha256,
                                                 y.manifest_sha256, f"{name}: manifest differs (same files)")]
            else:
                s.add(f"{name}.manifest_sha256", "changed", x.manifest_sha256, y.manifest_sha256,
                      f"{name}: manifest {short(x.manifest_sha256, 8)} -> "
                      f"{short(y.manifest_sha256, 8)} ({x.count} -> {y.count} files; "
                      "manifest copies not found, no per-file detail)")
        for label, during in (("A", x.changed_during_run), ("B", y.changed_during_run)):
            if during:  # what that run read is not what its manifest says: a cause, whatever else differs
                s.add(f"{name}.changed_during_run", "changed", x.changed_during_run, y.changed_during_run,
                      f"{name} changed during run {label}: {during_run_text(during)}")
        if x.seen_at != y.seen_at:
            s.add(f"{name}.mounts", "changed", x.seen_at, y.seen_at,
                  f"{name} seen at {', '.join(map(str, x.seen_at))} -> {', '.join(map(str, y.seen_at))}")
        for key, p, q in (("path", x.path, y.path), ("verify_mode", x.verify_mode, y.verify_mode)):
            if p != q:
                s.add(f"{name}.{key}", "changed", p, q, f"{name}.{key} {p} -> {q}", material=False)
    return s


def during_run_text(during: DataChangedDuringRun) -> str:
    """A record's ``data.<name>.changed_during_run`` in words: ``1 changed (train-x.f32)``."""
    if during.error:
        return str(during.error)
    parts = []
    for kind, paths in (("changed", during.changed), ("missing", during.missing), ("added", during.added)):
        if paths:
            parts.append(f"{len(paths)} {kind} ({', '.join(paths[:3])}" + (", ..." if len(paths) > 3 else "") + ")")
    more = int(during.count or 0) - len(during.changed) - len(during.missing) - len(during.added)
    return "; ".join(parts) + (f"; +{more} more" if more > 0 else "")


def data_changed_during(record: Record, label: str) -> list[str]:
    """``data changed during run A: logreg: 1 changed (x.f32)``: one per dataset that changed while the run
    read it."""
    return [f"data changed during run {label}: {name}: {during_run_text(ds.changed_during_run)}"
            for name, ds in sorted(record.data.items()) if ds.changed_during_run]


def compare_seed(a: Seed, b: Seed) -> SectionDiff:
    s = SectionDiff("seed", TITLES["seed"], "input", same_as=str(a.value))
    if a.value != b.value:
        s.add("value", "changed", a.value, b.value, f"seed {a.value} -> {b.value}")
    if a.policy != b.policy:
        s.add("policy", "changed", a.policy, b.policy, f"seed chosen by {a.policy} -> {b.policy}", material=False)
    # The seed the script set itself (HF's set_seed, Lightning's seed_everything) is the seed that was used.
    from hermetic.record.build import reseeded_text

    ra, rb = a.reseeded, b.reseeded
    if ra is not None and rb is not None and ra != rb:
        s.add("reseeded", "changed", ra, rb,
              f"{reseeded_text(ra) or 'the script kept seed ' + str(a.value)} -> "
              f"{reseeded_text(rb) or 'the script kept seed ' + str(b.value)}")
    elif ra and ra == rb:
        s.same_as += f" ({reseeded_text(ra)} in both)"
    # Only what the runtime applied as seeding or determinism can explain other outputs; the rest of its
    # report (the checkpoint the script wrote, versions, the env it saw) restates outputs or other sections,
    # and the generators' final states (applied.final.seeds) are an effect (their seeds are in `reseeded`).
    # And all of it is reported by the runtime as the script ran: which modules got seeded follows from
    # what the script imported (code, environment), the flags at exit from what it set. Consequences, so
    # ranked after every real input (Change.effect).
    s.changes += [dataclasses.replace(c, effect=True)
                  for c in diff_flat("seed", a.applied, b.applied, prefix="applied",
                                     material=lambda k: k.startswith(("applied.seed", "applied.determinism",
                                                                      "applied.dataloader", "applied.startup",
                                                                      "applied.final"))
                                     and not k.startswith("applied.final.seeds"))]
    return s


def compare_env(a: Env, b: Env) -> SectionDiff:
    s = SectionDiff("env", TITLES["env"], "input", same_as=f"{len(a.determinism)} determinism, {len(a.passed)} passed")
    s.changes += diff_flat("env", a.determinism, b.determinism)
    s.changes += diff_flat("env", a.passed, b.passed)
    sa, sb = set(a.secrets), set(b.secrets)
    for name in sorted(sa ^ sb):
        s.add(f"secrets.{name}", "added" if name in sb else "removed", name in sa, name in sb,
              f"secret {name} {'passed' if name in sb else 'not passed'}", material=False)
    return s


# --- the machine --------------------------------------------------------------------------------

def compare_software(a: Json, b: Json) -> SectionDiff:
    a = {k: v for k, v in a.items() if k != "blas"}
    b = {k: v for k, v in b.items() if k != "blas"}
    s = SectionDiff("software", TITLES["software"], "environment", same_as=_software_line(a))
    # software.env is the probe's view of the environment variables: the env section judges them
    s.changes += diff_flat("software", a, b, material=lambda k: not k.startswith("env."))
    return s


def _software_line(sw: Json) -> str:
    parts = []
    python = sw.get("python")
    if isinstance(python, dict):
        python = python.get("version")
    if python:
        parts.append(f"python {short(python)}")
    torch = sw.get("torch")
    if isinstance(torch, dict) and torch.get("version"):
        parts.append(f"torch {torch['version']}")
    return ", ".join(parts) or "-"


def _gpu_part(hw: Json) -> dict[str, Any]:
    return {k: v for k, v in hw.items() if k.startswith("gpu") or "driver" in k or k.startswith("cuda")}


def _gpu_key_material(key: str) -> bool:
    if key in _GPU_TOP_CONTEXT_KEYS or key.split(".")[0] in _GPU_TOP_CONTEXT_KEYS:
        return False
    m = re.match(r"^gpus\[\d+\]\.(mig_parent\.)?([^.\[]+)", key)
    return not (m and m.group(2) in _GPU_CONTEXT_KEYS)


def compare_gpu(a_hw: Json, b_hw: Json, a_option: str | None, b_option: str | None) -> SectionDiff:
    """``*_option``: the runs' --gpus (invocation.gpus)."""
    ga, gb = _gpu_part(a_hw), _gpu_part(b_hw)
    gpus_a, gpus_b = ga.get("gpus") or [], gb.get("gpus") or []
    s = SectionDiff("gpu", TITLES["gpu"], "environment", same_as=_gpu_line(gpus_a, ga.get("gpu_note")))
    s.changes += diff_flat("gpu", ga, gb, material=_gpu_key_material)
    if len(gpus_a) != len(gpus_b):
        # The extra GPUs' every key would show as added/removed: one count change says it.
        common = min(len(gpus_a), len(gpus_b))
        s.changes = [c for c in s.changes if c.key != "gpus" and not _gpu_index_at_least(c.key, common)]
        s.changes.insert(0, Change("gpu", "gpus", "changed", len(gpus_a), len(gpus_b),
                                   f"{len(gpus_a)} GPU(s) -> {len(gpus_b)} GPU(s)"))
    if a_option != b_option:
        s.add("invocation.gpus", "changed", a_option, b_option, f"--gpus {a_option} -> {b_option}", material=False)
    for i, (x, y) in enumerate(zip(gpus_a, gpus_b, strict=False)):  # extra GPUs: counted above
        if not (isinstance(x, dict) and isinstance(y, dict)):
            continue
        what = [k for k in ("name", "compute_capability", "sm_count", "mig_mode") if x.get(k) != y.get(k)]
        if what:
            detail = ", ".join(f"{k} {short(x.get(k))} vs {short(y.get(k))}" for k in what)
            s.warnings.append(f"GPU {i}: {detail}: {CUBLAS_NOTE}; bitwise equality is not expected")
    return s


def _gpu_index_at_least(key: str, n: int) -> bool:
    m = re.match(r"^gpus\[(\d+)\]", key)
    return bool(m) and int(m.group(1)) >= n


def _gpu_line(gpus: list[Any], note: Any) -> str:
    if not gpus:
        return str(note or "no GPU")
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)})
    drivers = sorted({str(g.get("driver_version")) for g in gpus if isinstance(g, dict) and g.get("driver_version")})
    return f"{len(gpus)}x {', '.join(names)}" + (f", driver {', '.join(drivers)}" if drivers else "")


def compare_cpu(a_hw: Json, b_hw: Json, a_sw: Json, b_sw: Json) -> SectionDiff:
    gpu_keys = set(_gpu_part(a_hw)) | set(_gpu_part(b_hw))
    ha = {k: v for k, v in a_hw.items() if k not in gpu_keys}
    hb = {k: v for k, v in b_hw.items() if k not in gpu_keys}
    cpu = ha.get("cpu") if isinstance(ha.get("cpu"), dict) else {}
    s = SectionDiff("cpu", TITLES["cpu"], "environment", same_as=str(cpu.get("model") or "-"))
    s.changes += diff_flat("cpu", ha, hb, material=lambda k: k.split(".")[0] not in _HOST_CONTEXT_KEYS)
    s.changes += diff_flat("cpu", a_sw.get("blas"), b_sw.get("blas"), prefix="blas")
    return s


# --- outputs ------------------------------------------------------------------------------------

def compare_outputs(a: Record, b: Record, *, rtol: float, atol: float) -> OutputsDiff:
    fa, fb = a.outputs.files, b.outputs.files
    # Volatile in either run (run.outputs.volatile: a TensorBoard event file, say): listed, never compared.
    volatile = set(a.outputs.volatile or []) | set(b.outputs.volatile or [])
    files = []
    for path in sorted(fa.keys() | fb.keys()):
        x, y = fa.get(path), fb.get(path)
        files.append(FileComparison(path, "not_compared" if path in volatile else _file_status(x, y),
                                    x and x.sha256, y and y.sha256))
    sa, sb = a.outputs.stdout, b.outputs.stdout
    if sa or sb:  # run.outputs.stdout: what the script printed is an output too
        files.append(FileComparison((sa or sb).file, _file_status(sa, sb), sa and sa.sha256, sb and sb.sha256))
    # Every metric's final value, whatever its source (a volatile event file's scalars are compared here
    # although its bytes are not); wall-clock figures (metrics.wall_clock) never.
    ma, mb = a.metrics.final, b.metrics.final
    metrics = [compare_metric(name, ma.get(name), mb.get(name), rtol=rtol, atol=atol,
                              present=(name in ma, name in mb)) for name in sorted(ma.keys() | mb.keys())]
    return OutputsDiff(files=files, metrics=metrics,
                       status=((a.record.status, a.record.exit_code), (b.record.status, b.record.exit_code)),
                       steps=(a.metrics.steps, b.metrics.steps))


def _file_status(x: Any, y: Any) -> str:
    if x and y:
        return "equal" if x.sha256 == y.sha256 else "changed"
    return "only_a" if x else "only_b"


def compare_metric(name: str, a: Any, b: Any, *, rtol: float, atol: float,
                   present: tuple[bool, bool] = (True, True)) -> MetricComparison:
    """Equal (same value, bit for bit), close (numpy.isclose: |a-b| <= atol + rtol*|b|) or different."""
    from hermetic.record.outputs import decode_number

    if not present[0] or not present[1]:
        return MetricComparison(name, "only_a" if present[0] else "only_b", a, b)
    x, y = float(decode_number(a)), float(decode_number(b))
    if x == y or (math.isnan(x) and math.isnan(y)):
        return MetricComparison(name, "equal", a, b, 0.0, 0.0)
    if not (math.isfinite(x) and math.isfinite(y)):
        return MetricComparison(name, "different", a, b)
    diff = abs(x - y)
    rel = diff / abs(y) if y else math.inf
    status = "close" if diff <= atol + rtol * abs(y) else "different"
    return MetricComparison(name, status, a, b, diff, rel if math.isfinite(rel) else None)


def compare_sections(a: Record, b: Record, manifests_a: Manifests, manifests_b: Manifests) -> list[SectionDiff]:
    """All sections, in causal order."""
    hw_a, hw_b = (r.hardware.model_dump(exclude_unset=True) for r in (a, b))  # the probe's keys, as recorded
    host = compare_cpu(hw_a, hw_b, a.software, b.software)
    host.changes += _engine_change(a.invocation, b.invocation)  # hermetic.engines: docker, podman, charliecloud
    return [
        compare_image(a.image, b.image),
        compare_code(a.code, b.code, _restated_files(a, b)),
        compare_config(a.invocation, b.invocation, a.seed.value, b.seed.value,
                       both_succeeded=a.record.status == b.record.status == "succeeded"),
        compare_distributed(a, b),  # world size, backend, rank map (hermetic.diff.distributed)
        compare_data(a, b, manifests_a, manifests_b),
        compare_seed(a.seed, b.seed),
        compare_env(a.env, b.env),
        compare_software(a.software, b.software),
        compare_gpu(hw_a, hw_b, a.invocation.gpus, b.invocation.gpus),
        host,
    ]

