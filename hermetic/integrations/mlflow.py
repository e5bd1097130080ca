"""hermetic runs as MLflow runs: ``hermetic runs export --mlflow`` and ``hermetic run --mlflow``.

A run is one MLflow run (params, metric series, tags, datasets, run.json, README.md, the figure); a seed group a
parent run with its members as children (docs/integrations.md, "MLflow"). Keyed by the tag ``hermetic.run_id``,
so exporting again adds only what is missing; a run left behind is never RUNNING. Only ``mlflow.entities``
and the tracking client are used (mlflow-skinny, no numpy).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.core.errors import DataError, HermeticError, MissingExtra, NotFound, Unavailable, UsageError
from hermetic.core.escape import shown
from hermetic.record.outputs import nan_key

if TYPE_CHECKING:
    from hermetic.record.schema import Dataset as DatasetRecord, Record as Run

RUN_ID_TAG = "hermetic.run_id"
KIND_TAG = "hermetic.kind"
PARENT_TAG = "mlflow.parentRunId"
DEFAULT_EXPERIMENT = "hermetic"
# MLflow's limits (mlflow.utils.validation): param values 6000 characters, tag values 8000
# (5000 on older servers), dataset digests 36. log_batch splits what is over its per-request limits itself.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
MAX_DIGEST = 36
SEARCH_PAGE = 1000
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "refused": "FAILED"}
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow accepts in a key


@dataclass
class Exported:
    """One hermetic run or group and the MLflow run it is now."""

    id: str
    kind: str  # "run" | "group"
    mlflow_run_id: str
    experiment_id: str
    created: bool  # False: an earlier export was found and updated
    metrics_logged: int  # metric points logged by this export (0 when all were there)
    url: str | None
    children: list["Exported"] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tracking_uri(value: str | None) -> str:
    """``--mlflow URI``, else $MLFLOW_TRACKING_URI; a usage error when neither is set."""
    uri = value or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise UsageError("no MLflow tracking server: pass --mlflow URI or set MLFLOW_TRACKING_URI")
    return uri


def require(feature: str = "exporting to MLflow") -> None:
    """MissingExtra naming ``hermetic[mlflow]`` when mlflow is not installed (checked without importing it)."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise MissingExtra(feature, "mlflow", "mlflow")


# -- what a record says, as MLflow params, tags and metrics (pure) --------------------------------

def safe_key(key: str) -> str:
    return _KEY_UNSAFE.sub("_", key)


def _text(value: Any, limit: int) -> str:
    """A param's or tag's value as the MLflow page shows it: escaped (hermetic.core.escape), cut to MLflow's limit."""
    s = shown(value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def flatten(node: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts and lists as dotted keys: ``config.datasets.0.mount``."""
    if not isinstance(node, (dict, list)) or not node:
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items() if isinstance(node, dict) else enumerate(node):
        out.update(flatten(v, f"{prefix}.{k}"))
    return out


def run_params(r: Run, *, without_seed: bool = False) -> dict[str, str]:
    """The resolved config (flattened), script, arguments and seed; ``without_seed`` for a group's parent."""
    inv = r.invocation
    params: dict[str, Any] = {"script": inv.script, "args": shlex.join(inv.args), "network": inv.network}
    if inv.gpus:
        params["gpus"] = inv.gpus
    config = flatten(inv.config or {}, "config")
    if without_seed:
        config.pop("config.determinism.seed", None)
    else:
        params["seed"] = r.seed.value
    params.update(config)
    return {safe_key(k): _text(v, MAX_PARAM_VALUE) for k, v in params.items()}


def run_tags(r: Run, *, verdict: Any = None) -> dict[str, str]:
    """What identifies the run's inputs and result; ``verdict`` is a replay's diff verdict (hermetic.diff)."""
    meta, inv, image, git = r.record, r.invocation, r.image, r.code.git
    tags: dict[str, Any] = {
        RUN_ID_TAG: meta.run_id,
        KIND_TAG: "run",
        "hermetic.version": meta.tool,
        "hermetic.status": meta.status,
        "hermetic.exit_code": "" if meta.exit_code is None else str(meta.exit_code),
        "hermetic.record_sha256": meta.record_sha256,
        "hermetic.image.id": image.id,
        "hermetic.image.manifest_digest": image.manifest_digest,
        "hermetic.image.repo_digests": ", ".join(image.repo_digests),
        "hermetic.image.base": image.base,
        "hermetic.lock_sha256": image.lock_sha256,
        "hermetic.config_sha256": inv.config_sha256,
        "hermetic.code.sha256": r.code.snapshot.sha256,
        "hermetic.git.commit": (git and git.commit) or "",
        "hermetic.git.dirty": "" if not git else str(bool(git.dirty)).lower(),
        "hermetic.seed": str(r.seed.value),
        "mlflow.source.name": inv.script,
        "mlflow.note.content": (f"hermetic run `{meta.run_id}`: {meta.status}. Reproduce it with "
                                f"`hermetic replay runs/{meta.run_id}` (README.md and run.json are artifacts)."),
    }
    if git and git.commit:
        tags["mlflow.source.git.commit"] = git.commit
    for name, ds in sorted(r.data.items()):
        tags[f"hermetic.data.{name}.manifest_sha256"] = ds.manifest_sha256
    gpus = [g.get("name") for g in (r.hardware.gpus or []) if isinstance(g, dict)]
    if gpus:
        tags["hermetic.hardware.gpus"] = ", ".join(str(g) for g in gpus)
    for key, value in (("replay_of", inv.replay_of), ("group", inv.group), ("name", inv.name)):
        if value:
            tags[f"hermetic.{key}"] = value
    if verdict is not None:
        tags["hermetic.verdict"] = verdict.line
        tags["hermetic.verdict.kind"] = verdict.kind
    return {safe_key(k): _text(v, MAX_TAG_VALUE) for k, v in tags.items()}


def group_tags(group: dict[str, Any]) -> dict[str, str]:
    meta, inputs = group["group"], group["inputs"]
    tags = {
        RUN_ID_TAG: meta["group_id"],
        KIND_TAG: "group",
        "hermetic.version": meta["tool"],
        "hermetic.status": meta["status"],
        "hermetic.group_sha256": meta["group_sha256"],
        "hermetic.group.members": ", ".join(m["run_id"] for m in group["members"]),
        "hermetic.group.seeds": ", ".join(str(m["seed"]) for m in group["members"]),
        "hermetic.group.method": group["method"],
        "hermetic.image.id": inputs["image"],
        "hermetic.config_sha256": inputs["config_sha256"],
        "hermetic.code.sha256": inputs["code_sha256"],
        "mlflow.note.content": (f"hermetic seed group `{meta['group_id']}` ({len(group['members'])} seeds): "
                                f"{meta['status']}. Each metric's mean, sd and 95% interval are this run's "
                                "metrics; the members are its child runs."),
    }
    for name, digest in sorted(inputs["data"].items()):
        tags[f"hermetic.data.{name}.manifest_sha256"] = digest
    if inputs["mixed"]:
        tags["hermetic.group.mixed_inputs"] = ", ".join(inputs["mixed"])
    return {safe_key(k): _text(v, MAX_TAG_VALUE) for k, v in tags.items()}


def group_summary_metrics(group: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """``loss.mean``, ``loss.sd``, ``loss.ci95_low``, ``loss.ci95_high``, ``loss.n`` at step 0."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name, s in group["metrics"].items():
        values = {"n": s["n"], "mean": s["mean"], "sd": s["sd"]}
        if s["ci95"]:
            values["ci95_low"], values["ci95_high"] = s["ci95"]
        for stat, v in values.items():
            if v is not None:
                out[f"{name}.{stat}"] = [(0, float(v))]
    return out


def millis(iso: str | None) -> int | None:
    """``2026-11-29T21:45:00.123Z`` -> milliseconds since the epoch."""
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def run_figure(run_dir: Path, into: Path) -> Path | None:
    """The run's figure as ``hermetic runs plot RUN`` draws it, written to ``into``/metrics.png; None when
    matplotlib (hermetic[plots]) is not installed or there is nothing to draw."""
    from hermetic.figures import render
    from hermetic.figures.runs import plot
    from hermetic.record.readme import FIGURE_NAME

    if not render.available():
        return None
    try:
        return plot([run_dir], into / FIGURE_NAME).path
    except NotFound:  # no metric values (all of them wall-clock times, say)
        return None


# -- the exporter (talks to the tracking server) -------------------------------------------------

class MlflowExporter:
    """Export run and group directories to one MLflow tracking server."""

    def __init__(self, uri: str, *, experiment: str | None = None):
        require()
        # MLflow retries a refused connection 7 times with doubling waits (minutes); a CLI
        # that exports after a run should say "unreachable" in seconds. The user's settings win.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.experiment_name = experiment
        self.client = MlflowClient(tracking_uri=uri)
        self._experiments: dict[str, str] = {}
        self._exported: dict[str, dict[str, Any]] = {}  # experiment ID -> hermetic ID -> its MLflow run

    def export(self, path: str | os.PathLike[str], *, experiment: str | None = None) -> Exported:
        """A run directory or a group directory (its members become child runs)."""
        from hermetic.record.index import is_group_dir

        p = Path(path)
        with self._mlflow_errors():
            if is_group_dir(p):
                return self._export_group(p, experiment)
            return self._export_run(p, experiment)

    @contextlib.contextmanager
    def _mlflow_errors(self):
        """MLflow's exceptions as one-line HermeticErrors; its own chatter (run links) to stderr."""
        from mlflow.exceptions import MlflowException

        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its "View run at" lines: we print our own
                yield
        except MlflowException as e:
            first = str(e.message if hasattr(e, "message") else e).strip().splitlines()[0]
            raise Unavailable(f"MLflow at {self.uri}: {first}") from None
        except OSError as e:  # an artifact store the client writes itself (a file: location)
            raise Unavailable(f"MLflow at {self.uri}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")) from None

    @contextlib.contextmanager
    def _ends_failed(self, run):  # noqa: ANN001 - a Run
        """Whatever goes wrong while ``run`` is filled, it is not left RUNNING: ended FAILED (best effort:
        the server may be what failed), then the error goes on."""
        try:
            yield
        except BaseException:
            if run.info.status == "RUNNING":
                with contextlib.suppress(Exception):
                    self.client.set_terminated(run.info.run_id, "FAILED")
            raise

    # -- runs and groups

    def _export_run(self, run_dir: Path, experiment: str | None, *, parent: str | None = None,
                    exp_id: str | None = None, loaded: tuple[dict[str, Any], Run] | None = None) -> Exported:
        """``loaded``: the run's record and model when the caller loaded them already (a group's first member)."""
        from hermetic.record.metrics import load_series
        from hermetic.record.rundir import README_NAME, load_run

        rec, r = loaded or load_run(run_dir)
        meta, config = r.record, r.invocation.config or {}
        series = load_series(run_dir, rec).series  # checked against the record before MLflow hears of the run
        datasets = [(name, ds, manifest_dataset(name, ds, project_dir(run_dir, config)))
                    for name, ds in sorted(r.data.items())]
        exp_id = exp_id or self._experiment(experiment or self.experiment_name or config.get("name"))
        tags = run_tags(r, verdict=self._replay_verdict(run_dir, r))
        if parent is None and r.invocation.group:
            found = self._index(exp_id).get(r.invocation.group)
            parent = found.info.run_id if found is not None else None
        if parent is not None:
            tags[PARENT_TAG] = parent
        run, created = self._find_or_create(exp_id, meta.run_id, meta.started_at, tags)
        with self._ends_failed(run), tempfile.TemporaryDirectory(prefix="hermetic-figure-") as tmp:
            logged = self._log(run, created, run_params(r), tags, series, millis(meta.started_at) or 0)
            self._log_datasets(run, datasets)
            figure = run_figure(run_dir, Path(tmp)) if series else None
            self._log_artifacts(run, created, [run_dir / "run.json", run_dir / README_NAME, *filter(None, [figure])])
            self.client.set_terminated(run.info.run_id, STATUS.get(meta.status, "FAILED"),
                                       end_time=millis(meta.finished_at) or millis(meta.started_at))
        return Exported(meta.run_id, "run", run.info.run_id, exp_id, created, logged, self._url(exp_id, run))

    def _export_group(self, gdir: Path, experiment: str | None) -> Exported:
        from hermetic.record.group import load_group
        from hermetic.record.rundir import load_run

        group = load_group(gdir)
        meta = group["group"]
        members = [gdir.parent / m["run_id"] for m in group["members"]]
        first = load_run(members[0])  # loaded once: the parent's params, then the first child
        first_run = first[1]
        exp_id = self._experiment(experiment or self.experiment_name or first_run.invocation.config.get("name"))
        tags = group_tags(group)
        run, created = self._find_or_create(exp_id, meta["group_id"], meta["started_at"], tags)
        with self._ends_failed(run):
            params = run_params(first_run, without_seed=True)
            params["seeds"] = ",".join(str(m["seed"]) for m in group["members"])
            logged = self._log(run, created, params, tags, group_summary_metrics(group),
                               millis(meta["written_at"]) or 0)
            self._log_artifacts(run, created, [gdir / "group.json"])
            children = [self._export_run(m, None, parent=run.info.run_id, exp_id=exp_id,
                                         loaded=first if i == 0 else None) for i, m in enumerate(members)]
            self.client.set_terminated(run.info.run_id, STATUS.get(meta["status"], "FAILED"),
                                       end_time=millis(meta["written_at"]))
        return Exported(meta["group_id"], "group", run.info.run_id, exp_id, created, logged,
                        self._url(exp_id, run), children)

    # -- MLflow calls

    def _experiment(self, name: str | None) -> str:
        name = name or DEFAULT_EXPERIMENT
        if name not in self._experiments:
            exp = self.client.get_experiment_by_name(name)
            self._experiments[name] = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        return self._experiments[name]

    def _index(self, exp_id: str) -> dict[str, Any]:
        """Every run of the experiment that an export made, by hermetic ID (the oldest, should an outside tool
        have made a second): one search, in pages, per experiment and exporter."""
        if exp_id not in self._exported:
            found: dict[str, Any] = {}
            token = None
            while True:
                page = self.client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` LIKE '%'",
                                               max_results=SEARCH_PAGE, order_by=["attributes.start_time ASC"],
                                               page_token=token)
                for r in page:
                    found.setdefault(r.data.tags.get(RUN_ID_TAG), r)
                token = getattr(page, "token", None)
                if not token:
                    break
            self._exported[exp_id] = found
        return self._exported[exp_id]

    def _find_or_create(self, exp_id: str, hermetic_id: str, started_at: str, tags: dict[str, str]):
        run = self._index(exp_id).get(hermetic_id)
        if run is not None:
            return run, False
        run = self.client.create_run(exp_id, start_time=millis(started_at), tags={**tags, RUN_ID_TAG: hermetic_id},
                                     run_name=hermetic_id)
        self._index(exp_id)[hermetic_id] = run
        return run, True

    def _log(self, run, created: bool, params: dict[str, str], tags: dict[str, str],  # noqa: ANN001 - a Run
             series: dict[str, list[tuple[int, float]]], timestamp: int) -> int:
        """Params not yet there, every tag (tags may be updated; a new run got them when it was created),
        metric points not yet logged: in as few requests as MLflow's limits allow (log_batch splits them)."""
        from mlflow.entities import Metric, Param, RunTag

        rid = run.info.run_id
        have_params = {} if created else run.data.params
        for key, value in params.items():
            if key in have_params and have_params[key] != value:
                raise DataError(f"MLflow run {rid} ({tags[RUN_ID_TAG]}): param {key} is {have_params[key]!r} "
                                    f"there but {value!r} in the record; MLflow never changes a param")
        new_params = [Param(k, v) for k, v in params.items() if k not in have_params]
        new_tags = [] if created else [RunTag(k, v) for k, v in tags.items() if run.data.tags.get(k) != v]
        metrics = []
        for name, points in series.items():
            key = safe_key(name)
            seen = set()
            if not created and key in run.data.metrics:
                seen = {(m.step, nan_key(m.value)) for m in self.client.get_metric_history(rid, key)}
            for step, value in points:
                if (step, nan_key(value)) not in seen:
                    seen.add((step, nan_key(value)))
                    metrics.append(Metric(key, value, timestamp, step))
        self.client.log_batch(rid, metrics=metrics, params=new_params, tags=new_tags)  # nothing sent when empty
        return len(metrics)

    def _log_datasets(self, run, datasets: list[tuple[str, DatasetRecord, Any]]) -> None:  # noqa: ANN001 - a Run
        from mlflow.entities import DatasetInput, InputTag

        have = {(d.dataset.name, d.dataset.digest) for d in (run.inputs.dataset_inputs if run.inputs else [])}
        inputs = []
        for name, ds, entity in datasets:
            if (entity.name, entity.digest) in have:
                continue
            tags = [InputTag("mlflow.data.context", name), InputTag("hermetic.manifest_sha256", ds.manifest_sha256)]
            if ds.mount:  # hermetic.yaml's mount:, when it has one (`hermetic init` writes none)
                tags.append(InputTag("hermetic.mount", shown(ds.mount)))
            inputs.append(DatasetInput(entity, tags=tags))
        if inputs:
            self.client.log_inputs(run.info.run_id, datasets=inputs)

    def _log_artifacts(self, run, created: bool, paths: list[Path]) -> None:  # noqa: ANN001 - a Run
        """The files that are there, except those an earlier export uploaded already (same name and size)."""
        have: dict[str, int | None] = {}
        if not created:
            have = {a.path: a.file_size for a in self.client.list_artifacts(run.info.run_id)}
        for path in paths:
            if path.is_file() and have.get(path.name, -1) != path.stat().st_size:
                self.client.log_artifact(run.info.run_id, str(path))

    def _replay_verdict(self, run_dir: Path, r: Run):  # -> hermetic.diff.model.Verdict | None
        """A replay's verdict against its original, when the original is still beside it."""
        original = r.invocation.replay_of
        if not original or not (run_dir.parent / original).is_dir():
            return None
        from hermetic.diff import diff_runs

        try:
            return diff_runs(run_dir.parent / original, run_dir).verdict
        except HermeticError:
            return None

    def _url(self, exp_id: str, run) -> str | None:  # noqa: ANN001 - a Run
        if not self.uri.startswith(("http://", "https://")):
            return None
        return f"{self.uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run.info.run_id}"


def manifest_dataset(name: str, ds: DatasetRecord, project_dir: Path | None):  # -> mlflow.entities.Dataset
    """A dataset of the record as an MLflow dataset entity (mlflow.entities alone: mlflow.data needs numpy): its
    source the local path as MLflow's ``local`` source writes it, its digest the manifest sha256 cut to 36."""
    from mlflow.entities import Dataset

    path = Path(ds.path)
    if not path.is_absolute() and project_dir is not None:
        path = project_dir / path
    profile = {"files": ds.count, "bytes": ds.bytes, "manifest_sha256": ds.manifest_sha256}
    return Dataset(name=name, digest=ds.manifest_sha256[:MAX_DIGEST], source_type="local",
                   source=shown(json.dumps({"uri": str(path)}), "json"), profile=json.dumps(profile, sort_keys=True))


def project_dir(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """The directory hermetic.yaml was in (dataset paths are relative to it), from the run dir and
    the recorded runs_dir; None when that cannot be told."""
    runs_dir = config.get("runs_dir") or "runs"
    parts = Path(runs_dir).parts
    runs_root = run_dir.resolve().parent
    if Path(runs_dir).is_absolute() or ".." in parts or runs_root.parts[-len(parts):] != parts:
        return None
    return runs_root.parents[len(parts) - 1]


def export_paths(paths: list[Path], uri: str, *, experiment: str | None = None) -> list[Exported]:
    exporter = MlflowExporter(uri, experiment=experiment)
    return [exporter.export(p) for p in paths]
