"""The build key, and the parts of hermetic.yaml that reach the image (the attestations restate them)."""

from __future__ import annotations

from typing import Any

from hermetic import __version__
from hermetic.builder.inputs import COMPILER_FORMAT, LAYER_FORMAT, runtime_sha256
from hermetic.core.canonical import canonical_sha256
from hermetic.config.load import LoadedConfig
from hermetic.config.determinism import identity_part
from hermetic.lock.model import Lock
from hermetic.core.reference import parse_base_reference


def image_config_part(cfg: LoadedConfig) -> dict[str, Any]:
    """The parts of hermetic.yaml that decide the image (not datasets, runs_dir, seed)."""
    m = cfg.model
    return {
        "name": m.name, "base": m.base, "python": m.python.model_dump(mode="json"),
        "determinism": identity_part(m.determinism.mode, m.determinism.threads, m.determinism.env),
        "env": dict(m.env), "build": m.build.model_dump(mode="json"),
    }


def image_config_sha256(cfg: LoadedConfig) -> str:
    return canonical_sha256(image_config_part(cfg))


def build_key(cfg: LoadedConfig, lock: Lock) -> str:
    """One sha256 over every input that decides the image.

    The pins (name, version, allowed hashes) decide which wheel file each
    package installs for the target, so the key is computable with an empty
    store and no network: a CI runner can look the key up in a registry
    before fetching anything.
    """
    return canonical_sha256({
        "hermetic": __version__, "layer_format": LAYER_FORMAT, "compiler_format": COMPILER_FORMAT,
        "base": parse_base_reference(cfg.model.base).digest,
        "lock_sha256": lock.sha256, "pins": lock.normalized(),
        "target": [lock.target.platform, lock.target.python_version],
        "config": image_config_part(cfg), "runtime": runtime_sha256(),
    })
