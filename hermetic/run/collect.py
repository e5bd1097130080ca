"""After the container: outputs/, the working directory and the runtime's directory collected in one step by a
child running as the container's user, through hermetic.hostfs.safetree, as JSON the record step seals.
A link, a FIFO or a malformed file is a note, never a lost exit code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermetic.core.paths import inside
from hermetic.hostfs import safetree
from hermetic.hostfs.privdrop import call_as
from hermetic.record import metrics as mx
from hermetic.record.outputs import clear_unsafe_modes_at, hash_outputs_at
from hermetic.run.workdir import WorkdirResult, collect_at

RUNTIME_REPORT_NAME = "runtime.json"
RUNTIME_REPORT_LIMIT = 1 << 20  # bytes: a report is a few KB; a bigger one is not read
STDOUT_LOG = "logs/stdout.log"  # what the script printed (run.outputs.stdout: a compared output)
READER_MOUNT = "/run/hermetic-metrics"  # where tb_scalars.py's directory is mounted in the reader container
READER_OUTPUTS = "/outputs"
READER_LABEL = "org.hermetic.metrics-reader"
READER_TIMEOUT = 300  # seconds: reading a gigabyte of event files takes a fraction of it
READER_ANSWER_LIMIT = 16 << 20  # bytes of JSON the reader may print (MAX_TOTAL_POINTS of them fit)


@dataclass(frozen=True)
class CollectPlan:
    run_dir: str
    runtime_dir: str | None  # runs/<id>/.runtime; None when there is none (a pyxis task's report is elsewhere)
    workspace: str | None  # the working directory's scratch copy; None: nothing to collect from it
    snapshot_files: dict[str, str] = field(default_factory=dict)
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)  # dataset mount points inside the working directory
    ranks: dict[str, int] | None = None  # {"node_rank", "nproc_per_node"}: torchrun's files to collect
    # run.metrics and run.outputs.stdout; None: as the run's own record (its early run.json) says
    metrics: list[str] | None = None
    stdout: bool | None = None


@dataclass
class Collected:
    workdir: WorkdirResult
    outputs: dict[str, Any]  # {"files": {...}}, as hash_outputs records it
    metrics: dict[str, Any]  # the record's metrics section
    runtime_report: dict[str, Any]
    rank_logs: dict[str, dict[str, str]] | None
    notes: list[str]
    full_disk: str | None = None  # runs/'s or the working directory's filesystem full as the script ended


def record_plan(run_dir: Path, rec: dict[str, Any], workspace: Path | None, runtime_dir: Path,
                ranks: dict[str, int] | None = None) -> CollectPlan:
    """What to collect, as the run's early record says: its config's working directory and outputs, its
    datasets' mount points there (skipped), its code snapshot; the directories given only where they are."""
    config = rec["invocation"].get("config") or {}
    workdir = (config.get("build") or {}).get("workdir") or "/workspace"
    outputs = (config.get("run") or {}).get("outputs") or {}
    skip = [posixpath.relpath(m, workdir) for d in (rec.get("data") or {}).values()
            for m in (d.get("mounts") or []) if inside(m, workdir)]
    include = outputs.get("include")
    return CollectPlan(run_dir=str(run_dir), runtime_dir=str(runtime_dir) if runtime_dir.is_dir() else None,
                       workspace=str(workspace) if workspace is not None and workspace.is_dir() else None,
                       snapshot_files=((rec.get("code") or {}).get("snapshot") or {}).get("files") or {},
                       include=list(["**"] if include is None else include),
                       exclude=list(outputs.get("exclude") or []), skip=skip, ranks=ranks)


def collect_run(plan: CollectPlan, *, uid: int, gid: int) -> Collected:
    """Everything the record needs from the script's trees, gathered as ``uid:gid`` (module doc)."""
    settings = RunSettings.of(plan.run_dir)
    plan = dataclasses.replace(plan, metrics=list(settings.metrics) if plan.metrics is None else plan.metrics,
                               stdout=settings.stdout if plan.stdout is None else plan.stdout)
    dirs = [plan.run_dir, *(d for d in (plan.workspace, plan.runtime_dir) if d is not None)]
    doc = call_as(uid, gid, _collect, asdict(plan), open_dirs=dirs)
    notes: list[str] = doc["notes"]
    parts = doc["metric_parts"]
    left_out = doc["left_out"]
    readers: dict[str, str] = {}
    if doc["events"]:
        tb = read_event_files(plan.run_dir, doc["events"], settings, mx.Kept(parts, left_out), uid=uid, gid=gid)
        parts += tb["parts"]
        notes += tb["notes"]
        left_out = tb["left_out"]
        if tb["reader"]:
            readers[mx.TENSORBOARD] = tb["reader"]
    assembled = mx.assemble(parts, readers=readers, left_out=left_out)
    metrics = assembled.section
    notes += assembled.notes
    if assembled.series:
        try:
            metrics["series"] = mx.write_series(plan.run_dir, assembled.series)
        except (OSError, safetree.UnsafePath) as e:
            notes.append(f"the metric series was not written ({mx.SERIES_FILE}): "
                         f"{getattr(e, 'message', None) or getattr(e, 'strerror', None) or e}")
    return Collected(WorkdirResult.from_json(doc["workdir"]), doc["outputs"], metrics,
                     doc["runtime_report"], doc["rank_logs"], notes)


@dataclass(frozen=True)
class RunSettings:
    """What the collection needs from the run's early record (hermetic wrote it before the container):
    the engine, image and Python of the reader container, run.metrics, run.outputs.stdout."""

    image_id: str | None = None
    python: str | None = None
    run_id: str | None = None
    metrics: tuple[str, ...] = mx.SOURCES
    stdout: bool = False
    engine: str | None = None  # the run's (invocation.engine.name); None: the default engine
    manifest_digest: str | None = None

    @classmethod
    def of(cls, run_dir: str) -> "RunSettings":
        from hermetic.record.index import RUN_JSON

        try:
            with open(os.path.join(run_dir, RUN_JSON), "rb") as f:
                rec = json.loads(f.read(16 << 20))
            config = rec["invocation"].get("config") or {}
            run = config.get("run") or {}
            prefix = (config.get("build") or {}).get("prefix") or "/opt/venv"
            image = (rec.get("image") or {}).get("id")
            manifest = (rec.get("image") or {}).get("manifest_digest")
            engine = (rec["invocation"].get("engine") or {}).get("name")
            return cls(image if isinstance(image, str) else None, f"{prefix}/bin/python", rec["record"]["run_id"],
                       mx.enabled_sources(run.get("metrics")), bool((run.get("outputs") or {}).get("stdout")),
                       engine if isinstance(engine, str) else None, manifest if isinstance(manifest, str) else None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return cls()


def _collect(fds: dict[str, int], plan_doc: dict[str, Any]) -> dict[str, Any]:
    plan = CollectPlan(**plan_doc)
    runfd = fds[plan.run_dir]
    notes: list[str] = []
    report: dict[str, Any] = {}
    rank_logs = None
    if plan.runtime_dir is not None:
        rtfd = fds[plan.runtime_dir]
        report = read_runtime_report_at(rtfd, notes)
        if plan.ranks is not None:
            from hermetic.run.distributed import DistributedPlan, collect_rank_files_at

            dist = DistributedPlan(nproc_per_node=plan.ranks["nproc_per_node"], backend="gloo",
                                   node_rank=plan.ranks["node_rank"])
            rank_logs = collect_rank_files_at(rtfd, runfd, dist)
    outfd = safetree.open_dir(runfd, "outputs")
    try:
        kept = WorkdirResult()
        if plan.workspace is not None:
            kept = collect_at(fds[plan.workspace], plan.snapshot_files, outfd, include=plan.include,
                              exclude=plan.exclude, skip=plan.skip)
        modes = clear_unsafe_modes_at(outfd, notes)
        outputs = hash_outputs_at(outfd, notes)
        if modes:
            outputs["modes_cleared"] = modes
        for rel, f in outputs["files"].items():
            if f.get("type"):
                notes.append(f"outputs/{rel}: a {f['type']}, recorded by kind (never opened)")
        found = mx.find_sources(outputs["files"], plan.metrics if plan.metrics is not None else mx.SOURCES)
        parts, metric_notes, left_out = mx.read_file_parts(outfd, found)
    finally:
        os.close(outfd)
    notes += found.notes + metric_notes
    events = [{"file": rel, "size": outputs["files"][rel]["size"]} for rel in found.files.get(mx.TENSORBOARD, [])]
    if plan.stdout:
        stdout = stdout_entry_at(runfd, notes)
        if stdout is not None:
            outputs["stdout"] = stdout
    return {"workdir": kept.to_json(), "outputs": outputs, "metric_parts": parts, "left_out": left_out,
            "events": events,
            "runtime_report": report, "rank_logs": rank_logs, "notes": notes}


def give_back(run_dir: str | Path, skip: Callable[[str], bool] | None = None) -> None:
    """The run directory given back to hermetic's user after the collection (root only: the child wrote as the
    container's); ``skip`` as safetree.lchown_tree's."""
    if os.getuid() != 0:
        return
    fd = safetree.open_root(Path(run_dir))
    try:
        safetree.lchown_tree(fd, os.getuid(), os.getgid(), skip=skip)
    finally:
        os.close(fd)


def stdout_entry_at(run_fd: int, notes: list[str] | None = None) -> dict[str, Any] | None:
    """``outputs.stdout``: logs/stdout.log (what the script printed; hermetic wrote the file) as a compared
    output, ``{"file", "sha256", "size"}``; None when there is none."""
    try:
        fd = safetree.open_regular(run_fd, STDOUT_LOG)
    except FileNotFoundError:
        return None
    except (OSError, safetree.UnsafePath) as e:
        if notes is not None:
            notes.append(f"{STDOUT_LOG} was not recorded as an output: {getattr(e, 'message', None) or e}")
        return None
    try:
        digest, size = safetree.hash_fd(fd)
    finally:
        os.close(fd)
    return {"file": STDOUT_LOG, "sha256": digest, "size": size}


# ---------------------------------------------------------------- TensorBoard's event files


def read_event_files(run_dir: str, events: list[dict[str, Any]], settings: RunSettings, kept: mx.Kept, *,
                     uid: int, gid: int) -> dict[str, Any]:
    """The scalars of the run's event files: ``{"parts", "reader": "image" | "host" | None, "notes", "left_out"}``,
    within what ``kept`` leaves: in a container of the run's image, else on the host as ``uid:gid``, else a note.
    """
    notes: list[str] = []
    files, total = [], 0
    for e in events:
        if e["size"] > mx.MAX_EVENT_FILE_BYTES or total + e["size"] > mx.MAX_EVENT_BYTES:
            notes.append(f"outputs/{e['file']}: {e['size']} bytes, past the {mx.MAX_EVENT_FILE_BYTES >> 20} MiB "
                         f"per event file ({mx.MAX_EVENT_BYTES >> 30} GiB in all) read: its scalars were not read")
            continue
        total += e["size"]
        files.append(e["file"])
    if not files:
        return {"parts": [], "reader": None, "notes": notes, "left_out": kept.left_out}
    budget = max(mx.MAX_TOTAL_POINTS - kept.points, 0)
    answer, why_not = reader_container(run_dir, files, settings, budget, uid=uid, gid=gid)
    host_reads = answer is None or answer.lstrip().startswith(b'{"unavailable"')
    if host_reads and (uid != 0 or os.geteuid() != 0):  # the child may then read them with the host's tensorboard
        from hermetic.inimage import tb_scalars

        tb_scalars.available()  # imported here: the child may not be allowed to read where Python keeps it
    doc = call_as(uid, gid, _event_parts, run_dir, files, answer, why_not, budget, open_dirs=[run_dir])
    parts = [mx.event_part(rel, d, kept) for rel, d in doc["docs"].items()]
    return {"parts": parts, "reader": doc["reader"], "notes": notes + doc["notes"] + kept.notes(),
            "left_out": kept.left_out}


def reader_request(files: list[str], root: str = READER_OUTPUTS, max_points: int = mx.MAX_TOTAL_POINTS) -> dict:
    return {"root": root, "files": files, "max_bytes": mx.MAX_EVENT_FILE_BYTES, "max_points": max_points}


def reader_container(run_dir: str, files: list[str], settings: RunSettings, max_points: int, *, uid: int,
                     gid: int) -> tuple[bytes | None, str | None]:
    """(what tb_scalars printed, None) from a locked-down container of the run's image (the probe's, outputs
    read-only, ``python -I``), or (None, why not).
    """
    if settings.image_id is None or settings.python is None:
        return None, "the run's record names no image"
    from hermetic.engines import get_engine
    from hermetic.engines.base import ContainerSpec, Mount
    from hermetic.core.errors import HermeticError
    from hermetic.inimage import tb_scalars
    from hermetic.record.liveness import driver_token

    script = Path(tb_scalars.__file__).resolve()
    spec = ContainerSpec(
        image_id=settings.image_id,
        command=[settings.python, "-I", "-B", f"{READER_MOUNT}/{script.name}",
                 json.dumps(reader_request(files, max_points=max_points))],
        mounts=[Mount(script.parent, READER_MOUNT, True), Mount(Path(run_dir) / "outputs", READER_OUTPUTS, True)],
        env={}, user=f"{uid}:{gid}", workdir="/tmp",
        labels={READER_LABEL: settings.run_id or ""}, manifest_digest=settings.manifest_digest,
        driver=driver_token(),
    )
    try:
        code, out, err = get_engine(settings.engine).run_capture(spec, timeout=READER_TIMEOUT)
    except TimeoutError:
        return None, f"the reader container did not finish within {READER_TIMEOUT} s"
    except HermeticError as e:  # no engine answers (a pyxis node), the engine refused
        return None, f"no reader container: {e.message}"
    except Exception as e:
        return None, f"the reader container failed: {' '.join(str(e).split())[:200]}"
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        return None, f"the reader container failed (exit {code}): " + \
            safetree.display((lines[-1:] or ["no message"])[0])[:300]
    if len(out) > READER_ANSWER_LIMIT:
        return None, f"the reader container printed more than {READER_ANSWER_LIMIT >> 20} MiB"
    return out, None


def _event_parts(fds: dict[str, int], run_dir: str, files: list[str], answer: bytes | None, why_not: str | None,
                 budget: int) -> dict[str, Any]:
    """In the collection child: the reader container's answer (``{"docs", "reader", "notes"}``), or the files
    read here with the host's tensorboard (never as root), or a note saying why they were not read."""
    from hermetic.inimage import tb_scalars

    if answer is not None:
        try:
            doc = json.loads(answer.decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError, UnicodeDecodeError, RecursionError):
            doc, why_not = None, "the reader container printed no JSON"
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
            docs = {rel: doc["files"].get(rel) or {} for rel in files}
            return {"docs": docs, "reader": "image", "notes": _file_notes(docs, files)}
        if isinstance(doc, dict) and isinstance(doc.get("unavailable"), str):
            why_not = f"the run's image has no tensorboard ({safetree.display(doc['unavailable'])[:200]})"
    n = len(files)
    what = f"{n} TensorBoard event file{'s' if n != 1 else ''} ({', '.join(files[:2])}{', ...' if n > 2 else ''})"
    if os.geteuid() == 0:
        return {"docs": {}, "reader": None,
                "notes": [f"{what} not read: {why_not}; hermetic does not parse them on the host as root"]}
    if tb_scalars.available() is not None:
        return {"docs": {}, "reader": None, "notes": [f"{what} not read: {why_not}, and this host has no tensorboard "
                                                      "either (pip install 'hermetic[tensorboard]')"]}
    outfd = safetree.open_dir(fds[run_dir], "outputs")
    docs: dict[str, Any] = {}
    try:
        for rel in files:
            try:
                fd = safetree.open_regular(outfd, safetree.fs_name(rel))
            except (OSError, safetree.UnsafePath) as e:
                docs[rel] = {"error": f"not opened: {getattr(e, 'message', None) or e.strerror}"}
                continue
            try:
                if os.fstat(fd).st_size > mx.MAX_EVENT_FILE_BYTES:
                    docs[rel] = {"error": "grew past the size allowed"}
                    continue
                docs[rel] = tb_scalars.read_scalars(f"/proc/self/fd/{fd}", max(budget, 0))
            finally:
                os.close(fd)
            budget -= sum(len(v) for v in docs[rel].get("tags", {}).values())
    finally:
        os.close(outfd)
    return {"docs": docs, "reader": "host", "notes": _file_notes(docs, files)}


def _file_notes(docs: dict[str, Any], files: list[str]) -> list[str]:
    notes = []
    for rel in files:
        d = docs.get(rel)
        if not isinstance(d, dict):
            notes.append(f"outputs/{rel}: the event reader said nothing of it")
            continue
        if isinstance(d.get("error"), str):
            notes.append(f"outputs/{rel}: read up to an error: {safetree.display(d['error'])[:300]}")
        if isinstance(d.get("truncated"), list) and d["truncated"]:
            notes.append(f"outputs/{rel}: more scalars than the {mx.MAX_TOTAL_POINTS} points kept; the last value "
                         "of each tag is kept")
    return notes


def read_runtime_report_at(runtime_fd: int, notes: list[str] | None = None) -> dict[str, Any]:
    """What the in-image runtime wrote (seeds applied, determinism set); {} when it wrote nothing.

    The container can write there too: a link, a FIFO or an oversized file is not read (a note says so)."""
    try:
        data = safetree.read_limited(runtime_fd, RUNTIME_REPORT_NAME, RUNTIME_REPORT_LIMIT)
    except FileNotFoundError:
        return {}
    except (safetree.UnsafePath, OSError) as e:
        if notes is not None:
            notes.append(f"the runtime's report was not read: {getattr(e, 'message', e)}")
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        if notes is not None:
            notes.append("the runtime's report is not JSON: not read")
        return {}
    return doc if isinstance(doc, dict) else {}
