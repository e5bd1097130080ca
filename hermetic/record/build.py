"""Helpers that assemble a record section by section (``hermetic run`` fills the rest): ``begin_record``, then
``seed_section``, ``env_section``, an early ``write_record`` (status ``interrupted``), and ``finish_record``.
"""

from __future__ import annotations

import copy
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from hermetic import __version__
from hermetic.config.secretnames import is_secret_name
from hermetic.record.ids import iso_utc


def begin_record(run_id: str, *, argv: Sequence[str], script: str, args: Sequence[str],
                 config: dict[str, Any], config_sha256: str, started_at: datetime | None = None,
                 name: str | None = None, replay_of: str | None = None, group: str | None = None,
                 gpus: str | None = None, network: str = "none",
                 resume_from: str | None = None) -> dict[str, Any]:
    """A record with ``record`` and ``invocation`` filled and status ``interrupted`` (so an early record that
    never finishes says so); write_record refuses it until the caller has set the other sections.
    """
    return {
        "record": {"schema_version": 1, "run_id": run_id, "tool": f"hermetic {__version__}",
                   "started_at": iso_utc(started_at), "finished_at": None, "status": "interrupted",
                   "exit_code": None, "record_sha256": ""},
        "invocation": {"argv": list(argv), "script": script, "args": list(args), "config": copy.deepcopy(config),
                       "config_sha256": config_sha256, "name": name, "replay_of": replay_of, "group": group,
                       "gpus": gpus, "network": network, "resume_from": resume_from},
        "image": None,
        "code": None,
        "data": {},
        "seed": None,
        "env": None,
        "software": {},
        "hardware": {},
        "outputs": {"files": {}},
        "metrics": {"final": {}, "steps": None, "file": None},
    }


def env_section(determinism: Mapping[str, str], passed: Mapping[str, str]) -> dict[str, Any]:
    """The ``env`` section: secret-named variables keep only their names (in ``secrets``)."""
    secrets = sorted({k for k in (*determinism, *passed) if is_secret_name(k)})
    return {"determinism": {k: str(v) for k, v in sorted(determinism.items()) if not is_secret_name(k)},
            "passed": {k: str(v) for k, v in sorted(passed.items()) if not is_secret_name(k)},
            "secrets": secrets}


def seed_section(value: int, policy: str, applied: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``seed`` section; ``applied`` is what the in-image runtime reported (may be empty). ``reseeded``:
    the generators hermetic seeded with ``value`` whose final seed is another (the script seeded itself).
    """
    section: dict[str, Any] = {"value": value, "policy": policy, "applied": dict(applied or {})}
    reseeds = reseeded(value, section["applied"])
    if reseeds is not None:
        section["reseeded"] = reseeds
    return section


# seed_everything's names for the generators the start-up hook calls random, numpy, torch
_SEED_EVERYTHING_NAMES = {"python": "random", "numpy": "numpy", "torch": "torch"}


def reseeded(value: int, applied: Mapping[str, Any]) -> dict[str, Any] | None:
    """{generator: final seed} for each one hermetic seeded with ``value`` that ended with another seed;
    None when the runtime reported no final seeds. (The report is the script's process's: read defensively.)"""
    final = applied.get("final")
    seeds = final.get("seeds") if isinstance(final, Mapping) else None
    if not isinstance(seeds, Mapping):
        return None
    def names(section: Any) -> set[str]:
        listed = section.get("seeded") if isinstance(section, Mapping) else None
        return {n for n in listed if isinstance(n, str)} if isinstance(listed, list) else set()

    by_hermetic = names(applied.get("startup"))
    by_hermetic |= {_SEED_EVERYTHING_NAMES[n] for n in names(applied.get("seed")) if n in _SEED_EVERYTHING_NAMES}
    out: dict[str, Any] = {}
    for name in ("random", "numpy", "torch"):
        entry = seeds.get(name)
        seed = entry.get("seed") if isinstance(entry, Mapping) else None
        if name not in by_hermetic or seed is None or isinstance(seed, bool) or seed == value:
            continue
        if (isinstance(seed, int) and seed >= 0) or isinstance(seed, str):
            out[name] = seed if isinstance(seed, int) else seed[:80]
    return out


def reseeded_text(reseeds: Mapping[str, Any]) -> str:
    """``the script reseeded random, numpy and torch to 42`` (one phrase per distinct seed); "" for none."""
    by_seed: dict[str, list[str]] = {}
    order = {"random": 0, "numpy": 1, "torch": 2}  # as the start-up hook names them (the record sorts keys)
    for name, seed in sorted(reseeds.items(), key=lambda kv: (order.get(kv[0], 3), kv[0])):
        text = "from the OS's entropy (not repeatable)" if seed == "entropy" else (
            f"to {seed}" if isinstance(seed, int) else f"with {seed}")
        by_seed.setdefault(text, []).append(name)
    parts = [(", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]) + " " + text
             for text, names in by_seed.items()]
    return "the script reseeded " + "; ".join(parts) if parts else ""


def finish_record(record: dict[str, Any], run_dir: str | Path, *, status: str, exit_code: int | None,
                  finished_at: datetime | None = None, reason: str | None = None,
                  hermetic_exit_code: int | None = None, workdir: dict[str, Any] | None = None,
                  outputs: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
                  notes: Sequence[str] = ()) -> dict[str, Any]:
    """A copy of ``record`` with status, exit code, end time, output hashes and metrics filled in.

    ``outputs``/``metrics``/``notes``: what hermetic.run.collect found (without them, hashed and read here);
    ``reason``/``hermetic_exit_code``: why and with what code hermetic failed or refused the run; ``workdir``: what
    was collected from the working directory.
    """
    # (the outputs' hashing, with safetree's ctypes, imported here: a run begins its record beside its
    # container's start, and imports what its end needs while the script runs)
    from hermetic.record.outputs import hash_outputs, volatile_globs, volatile_paths

    rec = copy.deepcopy(record)
    run_dir = Path(run_dir)
    rec["record"].update(status=status, exit_code=exit_code, finished_at=iso_utc(finished_at))
    if reason is not None:
        rec["record"]["reason"] = reason
    if hermetic_exit_code is not None:
        rec["record"]["hermetic_exit_code"] = hermetic_exit_code
    rec["outputs"] = copy.deepcopy(outputs) if outputs is not None else hash_outputs(run_dir / "outputs")
    if workdir is not None:
        rec["outputs"]["workdir"] = workdir
    volatile = volatile_paths(rec["outputs"]["files"], volatile_globs(rec["invocation"].get("config") or {}))
    if volatile:  # kept and hashed, not compared (run.outputs.volatile)
        rec["outputs"]["volatile"] = volatile
    if notes:
        rec["outputs"]["notes"] = list(notes)
    if metrics is None:
        setting = ((rec["invocation"].get("config") or {}).get("run") or {}).get("metrics")
        metrics = summarize_metrics(run_dir, rec["outputs"]["files"], setting)[0]
    rec["metrics"] = dict(metrics)
    return rec


def summarize_metrics(run_dir: str | Path, files: dict[str, Any] | None = None,
                      setting: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The ``metrics`` section from ``run_dir/outputs`` read in this process (every source but TensorBoard's,
    whose event files only the collection reads), and notes; the series file written. For a record finished
    without a collection: ``files`` as hash_outputs_at records them (hashed here when not given), ``setting``
    is ``run.metrics``. No link is read.
    """
    from hermetic.hostfs import safetree
    from hermetic.record import metrics as mx
    from hermetic.record.outputs import hash_outputs_at

    run_dir = Path(run_dir)
    try:
        fd = safetree.open_root(run_dir / "outputs")
    except OSError:
        return {"final": {}, "steps": None, "file": None}, []
    try:
        found = mx.find_sources(files if files is not None else hash_outputs_at(fd)["files"],
                                mx.enabled_sources(setting))
        parts, notes, left_out = mx.read_file_parts(fd, found)
    finally:
        os.close(fd)
    events = found.files.get(mx.TENSORBOARD) or []
    if events:
        notes.append(f"{len(events)} TensorBoard event file(s) not read: only a run's collection reads them")
    assembled = mx.assemble(parts, left_out=left_out)
    section, notes = assembled.section, found.notes + notes + assembled.notes
    if assembled.series:
        try:
            section["series"] = mx.write_series(run_dir, assembled.series)
        except (OSError, safetree.UnsafePath) as e:
            notes.append(f"the metric series was not written ({mx.SERIES_FILE}): {getattr(e, 'message', None) or e}")
    return section, notes
