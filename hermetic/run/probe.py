"""Run the hardware/software probe inside the training image, with the same devices.

Cached per image, device flags, boot_id, engine and NVIDIA driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hermetic.core.canonical import canonical_sha256
from hermetic.core.errors import Unavailable
from hermetic.hostfs.fsutil import atomic_write_bytes
from hermetic.config.containerpaths import PROBE_MOUNT
from hermetic.inimage.probe import PROBE_DIR, PROBE_PATH, probe_digest
from hermetic.record import liveness
from hermetic.engines.base import PROBE_LABEL, ContainerSpec, Mount

NVIDIA_VERSION_PATH = Path("/proc/driver/nvidia/version")  # the loaded kernel module's version banner


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _nvidia_driver() -> str:
    try:
        return NVIDIA_VERSION_PATH.read_text().strip()
    except OSError:
        return ""


def probe_key(engine, image_id: str, gpus: str | None, env: dict[str, str] | None = None) -> str:
    """``engine``: the run's (hermetic.engines); Docker's key is its daemon's ID, as before engines were three."""
    try:
        engine_id = engine.engine_id()
    except Exception:
        engine_id = ""
    key = {"image": image_id, "gpus": gpus or "", "boot": _boot_id(), "engine": engine_id,
           "driver": _nvidia_driver(), "probe": probe_digest()}
    if env:  # what the run passed changes what the probe sees (thread counts, visible devices)
        key["env"] = dict(sorted(env.items()))
    return canonical_sha256(key)


def run_probe(engine, *, image_id: str, python: str, user: str, gpus: str | None, cache_dir: Path,
              refresh: bool = False, env: dict[str, str] | None = None,
              manifest_digest: str | None = None) -> tuple[dict[str, Any], bool]:
    """(probe document, from_cache), on the run's engine. ``env``: what the training run passes (secrets left
    out by the caller)."""
    key = probe_key(engine, image_id, gpus, env)
    cached = cache_dir / f"{key}.json"
    if not refresh:
        try:
            return json.loads(cached.read_text()), True
        except (FileNotFoundError, ValueError):
            pass
    spec = ContainerSpec(
        image_id=image_id, command=[python, f"{PROBE_MOUNT}/{PROBE_PATH.name}"],
        mounts=[Mount(PROBE_DIR, PROBE_MOUNT, True)], env=dict(env or {}), user=user, gpus=gpus,
        labels={PROBE_LABEL: "1"}, manifest_digest=manifest_digest,
        driver=liveness.driver_token(),  # this process: a probe it leaves behind is an orphan
    )
    code, out, err = engine.run_capture(spec)
    if code != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(no output)"]
        raise Unavailable(f"the hardware probe failed in image {image_id[:19]} (exit {code}): {tail[0]}")
    try:
        doc = json.loads(out.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Unavailable("the hardware probe printed no JSON") from None
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(cached, json.dumps(doc, sort_keys=True).encode(), fsync=False)
    return doc, False
