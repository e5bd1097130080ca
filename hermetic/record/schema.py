"""The shape of run.json, checked strictly: every key present, nothing extra, right types.

A malformed record is refused with one line naming the key path; a valid one's model (``parse_record``) is the
typed view its readers use, beside the plain dict that was loaded.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, StrictFloat, ValidationError

from hermetic.core.canonical import is_sha256_hex
from hermetic.core.errors import DataError
from hermetic.core.paths import name_pattern
from hermetic.record.ids import RUN_ID_RE
from hermetic.config.secretnames import is_secret_name

SCHEMA_VERSION = 1
_ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|\+00:00)$")
_DATASET_FILE = re.compile(rf"^data/({name_pattern()})\.sha256$")


class RecordError(DataError):
    """run.json (or group.json) does not have the documented shape."""


def _checked(test: Any, must: str, shown: int = 80) -> AfterValidator:
    """A string check whose error says what the value ``must`` be and what it was (its first ``shown`` chars)."""
    def check(v: str) -> str:
        if not test(v):
            raise ValueError(f"must be {must} (got {v[:shown]!r})")
        return v

    return AfterValidator(check)


def _relpath(v: str) -> bool:
    return bool(v) and not v.startswith("/") and "\\" not in v and not {"", ".", ".."} & set(v.split("/"))


Hex64 = Annotated[str, _checked(is_sha256_hex, "64 lowercase hex characters")]
Digest = Annotated[str, _checked(lambda v: v.startswith("sha256:") and is_sha256_hex(v[7:]),
                                 "'sha256:' and 64 lowercase hex characters")]
IsoTime = Annotated[str, _checked(_ISO_UTC.match, "an ISO 8601 UTC time like 2026-11-29T21:45:00.000Z")]
RunId = Annotated[str, _checked(RUN_ID_RE.match, "a run ID like 20261129-214500-1a2b3c[-name]")]
RelPath = Annotated[str, _checked(_relpath, "a relative '/'-separated path without '.' or '..' parts", 120)]
NonNegInt = Annotated[int, Field(ge=0)]
FiniteFloat = Annotated[StrictFloat, Field(allow_inf_nan=False)]


def _number(v: Any) -> Any:
    if isinstance(v, bool) or not (isinstance(v, (int, float)) or v in ("NaN", "Infinity", "-Infinity")):
        raise ValueError(f"must be a number, or 'NaN', 'Infinity' or '-Infinity' (got {_json_type(v)})")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("must be finite; write non-finite values as 'NaN', 'Infinity' or '-Infinity'")
    return v


Number = Annotated[Union[int, float, str], PlainValidator(_number)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


M = TypeVar("M", bound=_Strict)


class RecordMeta(_Strict):
    schema_version: Literal[1]
    run_id: RunId
    tool: str
    started_at: IsoTime
    finished_at: Optional[IsoTime]
    status: Literal["succeeded", "failed", "interrupted", "refused"]
    exit_code: Optional[int]
    record_sha256: Union[Hex64, Literal[""]]
    # Why hermetic refused or failed the run itself (the script's own failure needs none): one line.
    reason: Optional[str] = None
    # What `hermetic run` returned when that was not the script's exit_code: hermetic's own (64-78) when it
    # refused or failed the run, 128+N when a signal interrupted it; absent when it passed the script's through.
    hermetic_exit_code: Optional[int] = None


class Limits(_Strict):
    """What the container was held to (hermetic.yaml run.pids, run.memory); None: no limit."""

    pids: Optional[Annotated[int, Field(ge=1)]]  # processes and threads together
    memory: Optional[str]  # a Docker size ("16g"), also the memory+swap limit


class ImageForm(_Strict):
    """What Charliecloud ran the image from: one SquashFS file (its path and sha256) or the layer directories."""

    form: Literal["squashfs", "directory"]
    path: str
    sha256: Optional[str]


class EngineUsed(_Strict):
    """What ran the container (hermetic.yaml run.engine, or --engine) and what it gave another way than Docker."""

    name: Literal["docker", "podman", "charliecloud"]
    version: str
    rootless: bool  # the engine ran as the invoking user, without root anywhere
    notes: list[str]  # hardening given another way (a pids limit as RLIMIT_NPROC, ...): in words
    image: Optional[ImageForm] = None


class Invocation(_Strict):
    argv: list[str]
    script: str
    args: list[str]  # as the script received them ({seed} substituted)
    args_template: Optional[list[str]] = None  # as typed, when they hold a placeholder such as {seed}
    config: dict[str, Any]
    config_sha256: Hex64
    name: Optional[str]
    replay_of: Optional[RunId]
    group: Optional[RunId]
    gpus: Optional[str]
    network: Literal["none", "host"]
    resume_from: Optional[RunId] = None  # the run whose outputs/ this run started from
    user: Optional[str] = None  # "UID:GID" the container ran the script as (absent in older records)
    limits: Optional[Limits] = None  # absent in older records (their containers had no limits)
    hostname: Optional[str] = None  # the container's host name ("hermetic"); None: the host's (--network host)
    engine: Optional[EngineUsed] = None  # absent in older records (their engine was the Docker Engine)


class Package(_Strict):
    name: str
    version: str
    sha256: Hex64
    filename: str


class Cuda(_Strict):
    runtime: Optional[str]
    cudnn: Optional[str]
    cublas: Optional[str]
    nccl: Optional[str]
    torch_variant: Optional[str]


class Image(_Strict):
    id: Digest
    manifest_digest: Digest
    repo_digests: list[str]
    base: str
    lock_sha256: Hex64
    packages: list[Package]
    cuda: Cuda
    labels: dict[str, str]


class Git(_Strict):
    commit: Optional[str]
    branch: Optional[str]
    dirty: bool
    diff_sha256: Optional[Hex64]
    diff_file: Optional[Literal["code/diff.patch"]]
    untracked: dict[RelPath, Hex64]


class Snapshot(_Strict):
    file: Literal["code/source.tar"]
    sha256: Hex64
    files: dict[RelPath, Hex64]


class Code(_Strict):
    git: Optional[Git]
    snapshot: Snapshot


class DataChangedDuringRun(_Strict):
    """What differed, after the run, from the dataset as it was verified (hermetic.data.identity): paths as
    the manifest writes them, at most 100 of each kind; ``count`` all of them."""

    changed: list[str]
    missing: list[str]
    added: list[str]
    count: NonNegInt
    error: Optional[str]  # the dataset could not be looked at again (gone, replaced, unreadable)


class Dataset(_Strict):
    path: str
    mount: Optional[str]  # hermetic.yaml's mount:, if any
    mounts: Optional[list[str]] = None  # every place the container saw it (its project path in the workdir, mount)
    manifest_file: str
    manifest_sha256: Hex64
    bytes: NonNegInt
    count: NonNegInt
    verify_mode: Literal["stat-cache", "full"]
    # Present only when the dataset changed after it was verified, while the run used it (the run failed).
    changed_during_run: Optional[DataChangedDuringRun] = None

    @property
    def seen_at(self) -> list[Optional[str]]:
        """Every path the container saw the dataset at (an older record names its ``mount`` only)."""
        return self.mounts or [self.mount]


class Seed(_Strict):
    value: NonNegInt
    policy: Literal["config", "cli", "group"]
    applied: dict[str, Any]
    # Generators hermetic seeded with ``value`` that the script then seeded otherwise (HF's set_seed,
    # Lightning's seed_everything): name -> the seed they ended with, or "entropy" (seed() with no
    # argument), "hash N of a <type>" (what random seeds a float with; on 3.10 any other hashable, marked
    # "(deprecated)") or "a <type>". Absent when the runtime reported no final state (older records too).
    reseeded: Optional[dict[str, Union[NonNegInt, str]]] = None


class Env(_Strict):
    determinism: dict[str, str]
    passed: dict[str, str]
    secrets: list[str]


class OutputFile(_Strict):
    sha256: Hex64
    size: NonNegInt
    symlink: Optional[str] = None  # only for symbolic links: the link's target, as written
    type: Optional[Literal["fifo", "socket", "chardev", "blockdev", "unknown"]] = None  # not a file: never opened


class WorkdirOutputs(_Strict):
    collected: list[RelPath]  # written by the script in its working directory, moved into outputs/
    deleted: list[RelPath]  # files of the code snapshot the script removed


class StdoutOutput(_Strict):
    """What the script printed, as a compared output (run.outputs.stdout: true)."""

    file: Literal["logs/stdout.log"]
    sha256: Hex64
    size: NonNegInt


class Outputs(_Strict):
    files: dict[RelPath, OutputFile]
    workdir: Optional[WorkdirOutputs] = None
    volatile: Optional[list[RelPath]] = None  # files kept but never compared (run.outputs.volatile)
    notes: Optional[list[str]] = None  # what collecting them noticed (a FIFO kept by kind, a link not read)
    stdout: Optional[StdoutOutput] = None  # run.outputs.stdout: logs/stdout.log compared as an output
    # path ('.': outputs/) -> the mode the script set (octal), whose world-write, setuid, setgid, sticky bits went
    modes_cleared: Optional[dict[str, Annotated[str, Field(pattern="^[0-7]{4}$")]]] = None


MetricSourceName = Literal["metrics.jsonl", "tensorboard", "lightning", "trainer"]


class MetricSource(_Strict):
    """Where a run's metrics came from (hermetic.record.metrics): one source's files and the names it gave."""

    files: list[RelPath]  # relative to outputs/
    metrics: list[str]  # the metrics of ``final`` it gave
    wall_clock: Optional[list[str]] = None  # its wall-clock figures (``metrics.wall_clock``)
    reader: Optional[Literal["image", "host"]] = None  # TensorBoard's: in the run's image, or on the host


class MetricSeries(_Strict):
    """runs/<id>/metrics/series.jsonl: every metric over its steps, written by hermetic from the sources."""

    file: Literal["metrics/series.jsonl"]
    sha256: Hex64
    size: NonNegInt
    metrics: NonNegInt
    points: NonNegInt


class Metrics(_Strict):
    final: dict[str, Number]
    steps: Optional[NonNegInt]
    file: Optional[Literal["outputs/metrics.jsonl"]]
    # Absent in older records (metrics.jsonl only, read from the outputs when drawn).
    sources: Optional[dict[MetricSourceName, MetricSource]] = None
    wall_clock: Optional[dict[str, Number]] = None  # kept, never compared (train_runtime, *_per_second)
    series: Optional[MetricSeries] = None
    # What the readers' caps left out (hermetic.record.metrics.Kept): points, other_names, values, columns, bytes.
    left_out: Optional[dict[Literal["points", "other_names", "values", "columns", "bytes"], NonNegInt]] = None


class SlurmJob(_Strict):
    """Where Slurm ran the task (`hermetic submit`), from the task's SLURM_* variables."""

    job_id: NonNegInt  # this task's own job ID (SLURM_JOB_ID)
    array_job_id: Optional[NonNegInt]  # SLURM_ARRAY_JOB_ID; None outside an array
    array_task_id: Optional[NonNegInt]  # SLURM_ARRAY_TASK_ID
    node: str  # SLURMD_NODENAME: the node this record's container ran on
    partition: str
    nodelist: str  # SLURM_JOB_NODELIST
    nnodes: Annotated[int, Field(ge=1)]
    node_rank: NonNegInt  # SLURM_NODEID
    cluster: Optional[str]
    container: Literal["docker", "pyxis"]
    submitted_from: str  # the submission directory (holding slurm/submit.json), relative to the runs dir
    image_pulled_from: Optional[str] = None  # the repo digest this node pulled the image by (its store lacked it)
    image_store: Optional[str] = None  # the store every node mounts that this node took the image from (no registry)


class RankPlacement(_Strict):
    rank: NonNegInt
    local_rank: NonNegInt
    node_rank: NonNegInt
    seed: NonNegInt  # the runtime's rule (distributed.seed_rule)
    device: str  # "cpu" or "cuda:N"
    gpu: Optional[dict[str, Any]]  # name, uuid, pci_bus_id of the GPU the device is, when known
    reported: Optional[dict[str, Any]]  # what the runtime reported this rank applied


class Rendezvous(_Strict):
    backend: Literal["c10d", "static"]
    endpoint: str


class Distributed(_Strict):
    """A multi-process run (torchrun): `hermetic run --nproc-per-node N`, `hermetic submit --nodes M`."""

    launcher: Literal["torchrun"]
    world_size: Annotated[int, Field(ge=1)]
    nnodes: Annotated[int, Field(ge=1)]
    nproc_per_node: Annotated[int, Field(ge=1)]
    node_rank: NonNegInt  # the node this record's container was
    backend: Literal["gloo", "nccl"]
    backend_version: Optional[str]
    rendezvous: Rendezvous
    seed_rule: str
    ranks: list[RankPlacement]
    env: dict[str, str]  # every NCCL_*/GLOO_*/TORCH_NCCL_*/TORCH_DISTRIBUTED_* variable the container had
    outputs_from: NonNegInt  # the rank whose outputs are the run's outputs
    logs: dict[str, dict[str, str]]  # rank -> {"stdout": path, "stderr": path} in the run dir


class Hardware(_Strict):
    """What the probe found (hermetic/inimage/probe/probe.py): typed where readers index into it, the rest kept."""

    model_config = ConfigDict(extra="allow", strict=True)
    gpus: Optional[list[dict[str, Any]]] = None


class Record(_Strict):
    record: RecordMeta
    invocation: Invocation
    image: Image
    code: Code
    data: dict[str, Dataset]
    seed: Seed
    env: Env
    software: dict[str, Any]
    hardware: Hardware
    outputs: Outputs
    metrics: Metrics
    # Optional sections (absent in records of runs that had neither).
    slurm: Optional[SlurmJob] = None
    distributed: Optional[Distributed] = None


def _check_shape(model: type[M], doc: Any, source: str) -> M:
    """``doc`` as ``model``; RecordError, naming ``source`` and the first wrong field, unless it is an object
    ``model`` accepts."""
    if not isinstance(doc, dict):
        raise RecordError(f"{source}: top level must be a JSON object (got {type(doc).__name__})")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise RecordError(_first_error(e, doc, source)) from None


def parse_record(record: Any, *, source: str = "run.json", sealed: bool = True) -> Record:
    """``record`` as its model if it has the documented shape; else RecordError. ``sealed=False`` accepts an
    empty ``record.record_sha256`` (a record about to be sealed)."""
    model = _check_shape(Record, record, source)
    _check_cross_fields(record, source, sealed)
    return model


def validate_record(record: Any, *, source: str = "run.json", sealed: bool = True) -> dict[str, Any]:
    """Return ``record`` unchanged if it has the documented shape (parse_record); else raise RecordError."""
    parse_record(record, source=source, sealed=sealed)
    return record


def _check_cross_fields(record: dict[str, Any], source: str, sealed: bool) -> None:
    meta = record["record"]
    if sealed and not meta["record_sha256"]:
        raise RecordError(f"{source}: record.record_sha256: is empty (the record was never sealed)")
    for name, ds in record["data"].items():
        m = _DATASET_FILE.match(ds["manifest_file"])
        if not m or m.group(1) != name:
            raise RecordError(f"{source}: data.{name}.manifest_file: must be 'data/{name}.sha256' "
                              f"(got {ds['manifest_file']!r})")
    for name in record["env"]["passed"]:
        if is_secret_name(name):
            raise RecordError(f"{source}: env.passed.{name}: looks like a secret; only its name may be "
                              "recorded, in env.secrets")
    git = record["code"]["git"]
    if git is not None and git["dirty"] and git["diff_sha256"] is not None and git["diff_file"] is None:
        raise RecordError(f"{source}: code.git.diff_file: must be 'code/diff.patch' when diff_sha256 is set")


def _first_error(e: ValidationError, data: Any, source: str) -> str:
    errors = e.errors()
    err = errors[0]
    key = _key_path(err["loc"], data)
    kind = err["type"]
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "required key is missing"
    elif kind in ("model_type", "dict_type"):
        msg = f"must be an object (got {_json_type(err.get('input'))})"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
        if kind == "literal_error":
            msg += f" (got {err.get('input')!r})"
        elif kind.endswith("_type"):
            msg += f" (got {_json_type(err.get('input'))})"
    # Union members each report the same failure; count distinct keys instead.
    distinct = {_key_path(x["loc"], data) for x in errors} - {key}
    tail = f" (and {len(distinct)} more)" if distinct else ""
    return f"{source}: {key}: {msg}{tail}" if key else f"{source}: {msg}{tail}"


def _key_path(loc: tuple[Any, ...], data: Any) -> str:
    """pydantic's error location as a key path through the *data* (``a.b[0]["odd/key"]``): parts that do
    not index into the data (union tags, ``'[key]'``) are dropped.
    """
    out = ""
    node = data
    for part in loc:
        if part == "[key]":
            break
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str):
            out += _key_part(part, out)  # a missing or unknown key: name it, then stop
            break
        else:
            break
        out += f"[{part}]" if isinstance(part, int) else _key_part(str(part), out)
    return out


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key_part(key: str, so_far: str) -> str:
    if _PLAIN_KEY.match(key):
        return f".{key}" if so_far else key
    return f"[{json.dumps(key, ensure_ascii=False)}]"


def _json_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


# --- group.json -------------------------------------------------------------------------------

class GroupMeta(_Strict):
    schema_version: Literal[1]
    group_id: RunId
    tool: str
    name: Optional[str]
    started_at: IsoTime
    written_at: IsoTime
    # interrupted: the sweep stopped before its last seed (older group.json files say failed for that)
    status: Literal["succeeded", "failed", "interrupted"]
    group_sha256: Hex64
    seeds: Optional[list[NonNegInt]] = None  # every seed asked for; members are those that ran (absent before)


class GroupMember(_Strict):
    run_id: RunId
    seed: NonNegInt
    status: Literal["succeeded", "failed", "interrupted", "refused"]
    record_sha256: Hex64


class GroupInputs(_Strict):
    image: Digest
    config_sha256: Hex64
    code_sha256: Hex64
    data: dict[str, Hex64]
    mixed: list[str]


class MetricStats(_Strict):
    n: NonNegInt
    mean: Optional[FiniteFloat]
    sd: Optional[FiniteFloat]
    ci95: Optional[list[FiniteFloat]]
    t: Optional[FiniteFloat]
    values: list[Optional[Number]]
    nonfinite: NonNegInt


class SlurmTask(_Strict):
    index: NonNegInt  # array task ID
    seed: NonNegInt
    run_id: RunId  # the run directory prepared for it
    state: str  # Slurm's final state (COMPLETED, FAILED, CANCELLED, ...) or hermetic's note
    exit_code: Optional[int]
    node: Optional[str]
    reason: Optional[str]  # why it has no record or failed, when known


class GroupSlurm(_Strict):
    """The array behind a submitted group, as the dependent summary job saw it."""

    array_job_id: NonNegInt
    partition: str
    total: NonNegInt
    succeeded: NonNegInt
    summary: str  # "2 of 3 tasks succeeded; ..."
    tasks: list[SlurmTask]


class Group(_Strict):
    group: GroupMeta
    members: list[GroupMember]
    inputs: GroupInputs
    metrics: dict[str, MetricStats]
    method: str
    flags: list[str] = []  # what makes the summary suspect (e.g. every member's outputs identical)
    slurm: Optional[GroupSlurm] = None  # a group submitted as a Slurm array


def validate_group(doc: Any, *, source: str = "group.json") -> dict[str, Any]:
    """Return ``doc`` unchanged if it has the shape write_group writes; else raise RecordError."""
    _check_shape(Group, doc, source)
    return doc
