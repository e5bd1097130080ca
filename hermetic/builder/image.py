"""Image config and manifest: pure functions from inputs to canonical JSON (sorted keys, compact).

The image ID is the sha256 of the config; layers are uncompressed by default, so a layer's digest is
its diff_id and the manifest digest is the same on any machine (design.md, "Identity").
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermetic.config.determinism import knob_env
from hermetic.store.oci import MT_CONFIG, MT_MANIFEST, Descriptor

if TYPE_CHECKING:  # annotations only: reading an image back (image_record) must not import pydantic
    from hermetic.config.load import HermeticConfig

# Labels the image describes itself with (read back by hermetic.builder.image_record).
PACKAGES_LABEL = "org.hermetic.packages"  # [[name, version, filename, sha256], ...] of the installed wheels
BASE_LAYERS_LABEL = "org.hermetic.base.layers"  # how many of the layers are the base's


def rfc3339(epoch: int) -> str:
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_env(cfg: HermeticConfig, base_env: list[str], venv_bin: str, venv_prefix: str) -> list[str]:
    """Base env, then the venv, then determinism knobs, then user env; sorted by name."""
    env: dict[str, str] = {}
    for item in base_env:
        k, _, v = item.partition("=")
        env[k] = v
    path = env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["PATH"] = f"{venv_bin}:{path}" if venv_bin not in path.split(":") else path
    env["VIRTUAL_ENV"] = venv_prefix
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # root fs is read-only at run time
    env["PYTHONUNBUFFERED"] = "1"  # logs stream as they happen
    # Older NVIDIA container toolkits inject only `utility` when unset: no libcuda.
    env.setdefault("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
    d = cfg.determinism  # the knobs for the configured mode (hermetic.config.determinism); hermetic.yaml's env wins
    env.update(knob_env(d.mode, d.threads, cfg.build.source_date_epoch, d.env))
    env.update(cfg.env)
    return [f"{k}={env[k]}" for k in sorted(env)]


@dataclass(frozen=True)
class LayerRef:
    """A layer of the image: its blob's descriptor, its uncompressed digest, the step that made it."""

    descriptor: Descriptor
    diff_id: str
    created_by: str


def image_config(
    *, base_config: dict[str, Any], cfg: HermeticConfig, layers: list[LayerRef], base_layer_count: int,
    labels: dict[str, str], venv_bin: str, venv_prefix: str,
) -> dict[str, Any]:
    created = rfc3339(cfg.build.source_date_epoch)
    bc = base_config.get("config") or {}
    base_diff_ids = list((base_config.get("rootfs") or {}).get("diff_ids", []))[:base_layer_count]
    history = [h for h in base_config.get("history", [])]
    for layer in layers:
        history.append({"created": created, "created_by": layer.created_by})
    config: dict[str, Any] = {
        "Env": image_env(cfg, list(bc.get("Env") or []), venv_bin, venv_prefix),
        "User": cfg.build.user,
        "WorkingDir": cfg.build.workdir,
        "Labels": dict(sorted({**(bc.get("Labels") or {}), **labels}.items())),
        "Cmd": [f"{venv_bin}/python"],
    }
    return {
        "architecture": base_config.get("architecture", "amd64"),
        "os": base_config.get("os", "linux"),
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": base_diff_ids + [layer.diff_id for layer in layers]},
        "history": history,
    }


def image_manifest(config_digest: str, config_size: int, layers: list[Descriptor]) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [d.to_json() for d in layers],
    }
