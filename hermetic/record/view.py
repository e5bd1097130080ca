"""run.json as types: frozen dataclasses built from a checked record by ``view`` (no pydantic imported).

A key the schema makes optional reads as its default (None unless said); free-form parts (config, software,
hardware, metric values, Slurm) stay JSON.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Meta:
    """The ``record`` section."""

    schema_version: int
    run_id: str
    tool: str
    started_at: str
    finished_at: str | None
    status: str
    exit_code: int | None
    record_sha256: str
    reason: str | None = None
    hermetic_exit_code: int | None = None


@dataclass(frozen=True)
class Limits:
    pids: int | None
    memory: str | None


@dataclass(frozen=True)
class ImageForm:
    form: str  # "squashfs" | "directory"
    path: str
    sha256: str | None


@dataclass(frozen=True)
class Engine:
    name: str
    version: str
    rootless: bool
    notes: list[str]
    image: ImageForm | None = None


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    script: str
    args: list[str]
    config: dict[str, Any]
    config_sha256: str
    name: str | None
    replay_of: str | None
    group: str | None
    gpus: str | None
    network: str
    args_template: list[str] | None = None
    resume_from: str | None = None
    user: str | None = None
    limits: Limits | None = None
    hostname: str | None = None
    engine: Engine | None = None


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str
    filename: str


@dataclass(frozen=True)
class Image:
    id: str
    manifest_digest: str
    repo_digests: list[str]
    base: str
    lock_sha256: str
    packages: list[Package]
    cuda: dict[str, str | None]
    labels: dict[str, str]


@dataclass(frozen=True)
class Git:
    commit: str | None
    branch: str | None
    dirty: bool
    diff_sha256: str | None
    diff_file: str | None
    untracked: dict[str, str]


@dataclass(frozen=True)
class Snapshot:
    file: str
    sha256: str
    files: dict[str, str]


@dataclass(frozen=True)
class Code:
    git: Git | None
    snapshot: Snapshot


@dataclass(frozen=True)
class DataChanged:
    """``data.<name>.changed_during_run``: what differed from the dataset as verified, after the run."""

    changed: list[str]
    missing: list[str]
    added: list[str]
    count: int
    error: str | None


@dataclass(frozen=True)
class Dataset:
    path: str
    mount: str | None
    manifest_file: str
    manifest_sha256: str
    bytes: int
    count: int
    verify_mode: str
    mounts: list[str] | None = None
    changed_during_run: DataChanged | None = None

    @property
    def seen_at(self) -> list[str | None]:
        """Every path the container saw the dataset at (an older record names its ``mount`` only)."""
        return self.mounts or [self.mount]


@dataclass(frozen=True)
class Seed:
    value: int
    policy: str
    applied: dict[str, Any]
    reseeded: dict[str, int | str] | None = None


@dataclass(frozen=True)
class Env:
    determinism: dict[str, str]
    passed: dict[str, str]
    secrets: list[str]


@dataclass(frozen=True)
class OutputFile:
    sha256: str
    size: int
    symlink: str | None = None  # a symbolic link's target
    type: str | None = None  # not a regular file: fifo, socket, ...


@dataclass(frozen=True)
class StdoutOutput:
    file: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Outputs:
    files: dict[str, OutputFile]
    volatile: list[str] | None = None
    notes: list[str] | None = None
    stdout: StdoutOutput | None = None
    workdir: dict[str, list[str]] | None = None


@dataclass(frozen=True)
class Metrics:
    final: dict[str, Any]
    steps: int | None
    file: str | None
    sources: dict[str, dict[str, Any]] | None = None
    wall_clock: dict[str, Any] | None = None
    series: dict[str, Any] | None = None


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int
    node_rank: int
    seed: int
    device: str | None
    gpu: dict[str, Any] | None = None
    reported: dict[str, Any] | None = None


@dataclass(frozen=True)
class Rendezvous:
    backend: str
    endpoint: str


@dataclass(frozen=True)
class Distributed:
    launcher: str | None  # None: one plain process (hermetic.diff.distributed.ONE_PROCESS)
    world_size: int
    nnodes: int
    nproc_per_node: int
    node_rank: int
    backend: str | None
    backend_version: str | None
    rendezvous: Rendezvous | None
    seed_rule: str
    ranks: list[Rank]
    env: dict[str, str]
    outputs_from: int
    logs: dict[str, dict[str, str]]


@dataclass(frozen=True)
class Run:
    record: Meta
    invocation: Invocation
    image: Image
    code: Code
    data: dict[str, Dataset]
    seed: Seed
    env: Env
    software: dict[str, Any]
    hardware: dict[str, Any]
    outputs: Outputs
    metrics: Metrics
    slurm: dict[str, Any] | None = None
    distributed: Distributed | None = None
    json: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the record as loaded


def view(record: dict[str, Any]) -> Run:
    """The typed view of a record schema.py has checked; another dict may fail here in any way (a damaged
    record is refused by its loader, with one line naming the key)."""
    return _build(Run, record, json=record)


class _Plan(NamedTuple):
    names: frozenset[str]  # the view's fields
    nested: tuple[tuple[str, Callable[[Any], Any]], ...]  # the fields that hold views, and how to build them


_PLANS: dict[type, _Plan] = {}


def _build(cls: type[T], doc: dict[str, Any], **extra: Any) -> T:
    plan = _PLANS.get(cls) or _PLANS.setdefault(cls, _plan(cls))
    values = dict(doc) if plan.nested else doc
    for name, convert in plan.nested:
        if values.get(name) is not None:
            values[name] = convert(values[name])
    if not values.keys() <= plan.names:  # keys this view does not know: left out
        values = {k: v for k, v in values.items() if k in plan.names}
    return cls(**values, **extra)


def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "json"]
    nested = ((name, _converter(hints[name])) for name in fields)
    return _Plan(frozenset(fields), tuple((name, c) for name, c in nested if c is not None))


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """How a JSON value becomes ``hint``: a view from its object, a list or map of views item by item;
    None where the JSON is kept as it is."""
    args = typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: _build(hint, v)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None
        inner = [a for a in args if a is not type(None)]
        return _converter(inner[0]) if len(inner) == 1 else None
    item = args[-1] if origin in (list, dict) else None
    if not (isinstance(item, type) and dataclasses.is_dataclass(item)):
        return None
    if origin is list:
        return lambda v: [_build(item, x) for x in v]
    return lambda v: {k: _build(item, x) for k, x in v.items()}
