"""``hermetic replay RUN``: re-execute a recorded run with exactly its recorded inputs.

Image by digest, recorded snapshot, config, seed, script, args, devices, network and verified data; an input
that can no longer be had, or an original whose outputs changed, refuses the replay and says which.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

from hermetic.config.load import HermeticConfig, LoadedConfig, refuse_outside
from hermetic.core.errors import DataError, HermeticError, IntegrityError, NotFound
from hermetic.hostfs.fsutil import sha256_file
from hermetic.core.paths import CachePaths
from hermetic.run.plan import RunRequest
from hermetic.store.oci import OciStore


class ReplayRefused(DataError):
    """What the run recorded is no longer here as it was (image, snapshot, data, secrets): no replay."""


def _project_root(run_dir: Path, runs_dir: str) -> Path:
    root = run_dir.parent
    if not PurePosixPath(runs_dir).is_absolute():
        for part in PurePosixPath(runs_dir).parts:
            if part not in (".", ""):
                root = root.parent
    return root


def ensure_recorded_image(store: OciStore, manifest_digest: str, repo_digests: list[str], *,
                          image_id: str | None = None) -> str | None:
    """The image in the local store: already there (None), or pulled by one of its repo digests and
    verified (that repo digest); else ReplayRefused naming where it was looked for. Also what a Slurm
    task does on a node whose store lacks the submitted image (hermetic.slurm.task)."""
    if store.has_image(manifest_digest):
        return None
    from hermetic.registry import ensure_image

    for rd in repo_digests:
        try:
            ensure_image(store, rd)
            return rd
        except HermeticError:
            continue
    where = ", ".join(repo_digests) or "no registry (never pushed)"
    what = f"image {manifest_digest}" + (f" (id {image_id})" if image_id else "")
    raise ReplayRefused(f"{what} is gone from the local store and could not be pulled from {where}")


def replay_distributed(record: dict[str, Any]):  # -> DistributedPlan | None
    """The recorded process layout (one node), to run again; a multi-node run is refused here."""
    from hermetic.run.distributed import DistributedPlan

    d = record.get("distributed")
    if not d:
        return None
    if d["nnodes"] > 1:
        raise ReplayRefused(f"run {record['record']['run_id']} ran on {d['nnodes']} nodes; replay runs on one "
                            "machine (submit it again with hermetic submit --nodes)")
    return DistributedPlan(int(d["nproc_per_node"]), d["backend"])


def _recorded_path(run_dir: Path, model: HermeticConfig, root: Path, name: str, path: str) -> str:
    """A dataset's recorded place, read again only where the recorded hermetic.yaml leads (a link in the project
    may lead anywhere) or a place HERMETIC_ALLOW_PATHS allows: a record is untrusted, as hermetic.yaml is."""
    from hermetic.config.load import ALLOW_PATHS_ENV, allowed_places
    from hermetic.core.errors import ConfigError
    from hermetic.core.paths import inside

    ds = next((c for c in model.datasets if c.name == name), None)
    leads = os.path.realpath(root / ds.path) if ds is not None else None
    full = os.path.realpath(os.path.join(root, path))  # records hold it absolute
    if full == leads or any(inside(full, a) for a in allowed_places(str(root))[1]):
        return path
    raise ConfigError(f"{run_dir / 'run.json'}: data.{name}.path: {path} is not where the recorded hermetic.yaml's "
                      f"dataset {name} leads ({leads or 'no such dataset'}); pass --data {name}=PATH, or allow the "
                      f"place: {ALLOW_PATHS_ENV}=/abs/dir in the environment")


def replay_request(run_dir: Path, record: dict[str, Any], paths: CachePaths, *, echo: bool,
                   argv: list[str], data_paths: dict[str, str] | None = None) -> tuple[LoadedConfig, RunRequest]:
    """The run again, as recorded. ``data_paths``: NAME -> where that dataset is on this machine
    (``--data``), when it is not at its recorded path; verified against the run's own manifest copy."""
    from hermetic.config.secretnames import is_secret_name
    from hermetic.record.verify import require_as_recorded

    # What the replay will be compared with: the original's outputs as its record says (stat-cached rehash)
    require_as_recorded(run_dir, record, what="hermetic replay")
    inv = record["invocation"]
    try:
        model = HermeticConfig.model_validate(inv["config"])
    except Exception as e:
        raise ReplayRefused(f"{run_dir}: the recorded config no longer validates: {e}") from None
    root = _project_root(run_dir, model.runs_dir)
    refuse_outside(model, None, root / "hermetic.yaml", source=f"{run_dir / 'run.json'}: invocation.config")
    # the data: recorded paths (or --data), verified against the run's own manifest copies
    recorded = record.get("data") or {}
    moved = dict(data_paths or {})
    unknown = sorted(set(moved) - set(recorded))
    if unknown:
        from hermetic.core.errors import UsageError

        raise UsageError(f"--data {unknown[0]}=...: run {record['record']['run_id']} read no dataset {unknown[0]!r} "
                         f"(its datasets: {', '.join(sorted(recorded)) or 'none'})")
    data_paths, manifests = {}, {}
    for name, d in recorded.items():
        data_paths[name] = (str(Path(moved[name]).resolve()) if name in moved
                            else _recorded_path(run_dir, model, root, name, str(d.get("path"))))
        manifests[name] = mf = run_dir / d["manifest_file"]
        if not mf.is_file() or hashlib.sha256(mf.read_bytes()).hexdigest() != d["manifest_sha256"]:
            raise ReplayRefused(f"dataset {name}: the run's manifest copy {mf} is missing or altered")
    cfg = LoadedConfig(model=model, path=root / "hermetic.yaml")

    # the image
    image = record["image"]
    store = OciStore(paths.oci)
    ensure_recorded_image(store, image["manifest_digest"], image.get("repo_digests") or [], image_id=image["id"])

    # the code
    snap = record["code"]["snapshot"]
    tar = run_dir / snap["file"]
    if not tar.is_file():
        raise ReplayRefused(f"{tar}: the recorded source snapshot is missing")
    if sha256_file(tar) != snap["sha256"]:
        raise IntegrityError(f"{tar}: the source snapshot does not match its recorded sha256 {snap['sha256'][:12]}")

    # env: values as recorded; secrets by name from today's environment
    env_sec = record.get("env") or {}
    env = [f"{k}={v}" for k, v in (env_sec.get("passed") or {}).items()]
    # Knobs the original run was given with --env (recorded among the determinism knobs, where they took
    # effect): every one whose value is not the image's own is passed again.
    from hermetic.builder.image_record import ImageInfo

    image_env = ImageInfo.from_store(store, image["manifest_digest"]).env_map()
    env += [f"{k}={v}" for k, v in (env_sec.get("determinism") or {}).items() if image_env.get(k) != v]
    missing = [k for k in env_sec.get("secrets", []) if k not in os.environ]
    if missing:
        raise ReplayRefused(f"secret variable(s) {', '.join(missing)} were passed to the original run; "
                            "set them in the environment (their values are never recorded)")
    env += [k for k in env_sec.get("secrets", []) if is_secret_name(k)]

    resume_dir = None
    if inv.get("resume_from"):
        resume_dir = run_dir.parent / inv["resume_from"]
        if not (resume_dir / "outputs").is_dir():  # gone: not found (66); changed: refused by run.resume (65)
            raise NotFound(f"the original run started from the outputs of run {inv['resume_from']}, "
                           f"which are gone ({resume_dir})")
    req = RunRequest(
        script=inv["script"], args=list(inv["args"]), argv=argv, gpus=inv.get("gpus"),
        data_paths=data_paths, manifest_paths=manifests, seed=int(record["seed"]["value"]),
        seed_policy=record["seed"].get("policy", "config"), network=inv.get("network") or "none", env=env,
        name=inv.get("name"), echo=echo, replay_of=record["record"]["run_id"], group=None,
        image_manifest=image["manifest_digest"], source_tar=tar, replay_git=record["code"].get("git"),
        resume_from=resume_dir, distributed=replay_distributed(record),
    )
    return cfg, req
