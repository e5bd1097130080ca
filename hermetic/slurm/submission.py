"""``slurm/submit.json``: everything decided at submit time, read back by every task on its node (the checkout
may change meanwhile): the config, script and arguments, seeds, the image by digest, datasets with the manifests
as verified, the code snapshot, the prepared run directories. A task turns it into the RunRequest a replay
would build.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic.builder.image_record import ImageInfo
from hermetic.config.load import HermeticConfig, LoadedConfig, refuse_outside
from hermetic.core.errors import DataError, EXIT_NOINPUT
from hermetic.hostfs.fsutil import atomic_write_text
from hermetic.run.distributed import DistributedPlan
from hermetic.run.plan import RunRequest

SCHEMA = "hermetic-submit/1"
SUBMISSION_FILE = "slurm/submit.json"
SOURCE_TAR = "slurm/code/source.tar"
DIFF_PATCH = "slurm/code/diff.patch"


class SubmissionError(DataError):
    """A submit.json that cannot be read or trusted (the file, not the run, is wrong)."""


@dataclass(frozen=True)
class Member:
    index: int  # the array task ID (0 for a single run)
    seed: int
    run_id: str  # the run directory prepared for it, under the runs directory


@dataclass
class Submission:
    kind: str  # "run" or "group"
    submission_id: str  # the run ID (kind run) or group ID: the directory holding slurm/
    project_root: Path
    runs_dir: Path
    config: dict[str, Any]  # resolved hermetic.yaml at submit time
    request: dict[str, Any]  # the RunRequest's fields (paths relative to the submission dir where inside it)
    members: list[Member]
    image: dict[str, Any]  # ImageInfo's fields
    repo_digests: list[str]
    container: str  # "docker" or "pyxis"
    partition: str
    nnodes: int
    node_cache: str | None  # HERMETIC_CACHE on the nodes; {node} is the node's name
    python: str  # the interpreter the tasks run hermetic with
    seed_policy: str  # "group" for --seeds; "cli" / "config" for one run
    job_id: int | None = None  # filled in once sbatch answered
    summary_job_id: int | None = None
    engine: str = "docker"  # what runs the container on the nodes (hermetic.engines)
    shared_store: str | None = None  # a cache every node mounts, the image in it (hermetic.slurm.shared)
    squashfs: dict[str, str] | None = None  # the image as one file there: {"path", "sha256"} (engines.squashfs)

    @property
    def dir(self) -> Path:
        return self.runs_dir / self.submission_id

    def run_dir(self, member: Member) -> Path:
        return self.runs_dir / member.run_id

    def member(self, index: int) -> Member:
        for m in self.members:
            if m.index == index:
                return m
        raise SubmissionError(f"{self.dir / SUBMISSION_FILE}: no member for array task {index}")

    def loaded_config(self) -> LoadedConfig:
        try:
            model = HermeticConfig.model_validate(self.config)
        except Exception as e:  # pydantic's ValidationError: the recorded config no longer validates
            raise SubmissionError(f"{self.dir / SUBMISSION_FILE}: the submitted config no longer validates "
                                  f"with this hermetic: {e}") from None
        refuse_outside(model, None, self.project_root / "hermetic.yaml", source=f"{self.dir / SUBMISSION_FILE}: config")
        return LoadedConfig(model=model, path=self.project_root / "hermetic.yaml")

    def image_info(self) -> ImageInfo:
        return ImageInfo(**self.image)

    def run_request(self, member: Member, *, slurm: dict[str, Any] | None,
                    distributed: DistributedPlan | None) -> RunRequest:
        """The RunRequest for one member: the snapshot and image of the submission, its prepared directory."""
        r = self.request
        return RunRequest(
            script=r["script"], args=list(r["args"]), argv=list(r["argv"]), gpus=r["gpus"],
            data_paths=dict(r["data_paths"]), seed=member.seed, seed_policy=self.seed_policy,
            network=r["network"], env=list(r["env"]), name=r["name"], echo=True,
            group=self.submission_id if self.kind == "group" else None,
            image_manifest=self.image["manifest_digest"], source_tar=self.dir / SOURCE_TAR,
            replay_git=r["git"], manifest_paths={k: self.dir / v for k, v in r["manifests"].items()},
            resume_from=Path(r["resume_from"]) if r["resume_from"] else None,
            distributed=distributed, run_dir=self.run_dir(member), slurm=slurm, engine=self.engine,
        )

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "schema": SCHEMA, "project_root": str(self.project_root),
                "runs_dir": str(self.runs_dir)}

    def write(self) -> Path:
        path = self.dir / SUBMISSION_FILE
        atomic_write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        return path


def request_fields(req: RunRequest, *, script: str, git: dict[str, Any] | None, manifests: dict[str, str],
                   data_paths: dict[str, str]) -> dict[str, Any]:
    """What a task needs of the submitted RunRequest (the member's seed and directory come per task)."""
    return {
        "script": script, "args": list(req.args), "argv": list(req.argv), "gpus": req.gpus,
        "data_paths": data_paths, "network": req.network, "env": list(req.env), "name": req.name,
        "git": git, "manifests": manifests,
        "resume_from": str(req.resume_from) if req.resume_from is not None else None,
        "distributed": req.distributed.to_json() if req.distributed is not None else None,
    }


def _squashfs(doc: Any) -> dict[str, str] | None:
    if doc is None:
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("path"), str) and isinstance(doc.get("sha256"), str)):
        raise TypeError("squashfs: want {path, sha256}")
    return {"path": doc["path"], "sha256": doc["sha256"]}


def load_submission(path: Path) -> Submission:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SubmissionError(f"{path}: no such submission (was the run directory moved or deleted?)",
                              exit_code=EXIT_NOINPUT) from None
    except (OSError, ValueError) as e:
        raise SubmissionError(f"{path}: cannot read the submission: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SubmissionError(f"{path}: not a {SCHEMA} document")
    try:
        return Submission(
            kind=doc["kind"], submission_id=doc["submission_id"], project_root=Path(doc["project_root"]),
            runs_dir=Path(doc["runs_dir"]), config=doc["config"], request=doc["request"],
            members=[Member(int(m["index"]), int(m["seed"]), str(m["run_id"])) for m in doc["members"]],
            image=doc["image"], repo_digests=list(doc["repo_digests"]), container=doc["container"],
            partition=doc["partition"], nnodes=int(doc["nnodes"]), node_cache=doc["node_cache"],
            python=doc["python"], seed_policy=doc["seed_policy"], job_id=doc.get("job_id"),
            summary_job_id=doc.get("summary_job_id"), engine=str(doc.get("engine") or "docker"),
            shared_store=doc.get("shared_store"), squashfs=_squashfs(doc.get("squashfs")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SubmissionError(f"{path}: malformed submission ({e})") from None
