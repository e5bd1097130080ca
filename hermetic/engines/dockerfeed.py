"""Loading into the Docker Engine while the build goes on (``DockerEngine.build_feed``).

As soon as layers 0..j are in the store, a throwaway *prefix image* of them (labelled
``org.hermetic.partial``) is loaded with the layers the engine lacks, while later layers are still built;
the real image's load (``finish``, as soon as its config exists) then finds them there, and the prefix
images are removed. Loads run one at a time, in layer order; a refused load stops the feed and leaves the
rest to the caller's own load.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import Any

from hermetic.core.canonical import canonical_json
from hermetic.core.workers import pid_alive
from hermetic.store.oci import Descriptor, OciStore

PARTIAL_LABEL = "org.hermetic.partial"  # its value: "HOST:PID" of the build that loaded it


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _is_stale(owner: str) -> bool:
    """Whether a prefix image's build is gone: one of this host whose process has ended, or one that does
    not say (loaded before prefix images named their build). Another host's are left alone."""
    host, _, pid = owner.rpartition(":")
    if not host or not pid.isdigit():
        return True
    return host == socket.gethostname() and not pid_alive(int(pid))


def sweep_stale_partials() -> list[str]:
    """Remove the prefix images of builds that were killed before they could (their layers stay while a
    real image holds them; otherwise the engine frees them). Returns the IDs removed."""
    from hermetic.engines.dockerclient import engine_client
    from hermetic.engines.dockerimages import remove_image

    removed = []
    for row in engine_client().api.images(filters={"label": [PARTIAL_LABEL]}):
        if _is_stale((row.get("Labels") or {}).get(PARTIAL_LABEL, "")):
            remove_image(row["Id"])
            removed.append(row["Id"])
    return removed


class EngineFeed:
    """Layers in, prefix images out; ``finish`` loads the real image."""

    def __init__(self, store: OciStore, base_config: dict[str, Any], base_layers: list[Descriptor],
                 total_layers: int, repo_tag: str | None) -> None:
        self._store = store
        self._arch = base_config.get("architecture", "amd64")
        self._os = base_config.get("os", "linux")
        self._total = total_layers  # base + ours
        self._repo_tag = repo_tag
        self._ready: dict[int, Descriptor] = dict(enumerate(base_layers))
        self.fresh: set[str] = set()  # layers this build made: new to the engine, and so is every layer above
        self._base = len(base_layers)
        self._engine_has = -1  # leading layers the engine is known to hold (-1: not asked yet)
        self._partials: list[str] = []
        self._closed = False
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.loads: list[tuple[int, int]] = []  # (first layer sent, layers in the prefix), for tests and notes
        self.timeline: list[dict[str, Any]] = []  # each load: layers sent, from/to (time.monotonic())
        self._final: tuple[str, bytes] | None = None  # the image's ID and config, once it has them
        self.final_loaded: bool | None = None  # None: not loaded by the feed (not asked, or it failed)
        self._thread = threading.Thread(target=self._run, name="engine-feed", daemon=True)

    def start(self) -> None:
        """Begin, once the layers found in the cache are reported (the engine is asked about them once)."""
        if self._thread.ident is None:
            self._thread.start()

    def layer_ready(self, i: int, desc: Descriptor, fresh: bool = False) -> None:
        """Our layer ``i`` (0 = the first above the base) is in the store (``fresh``: written by this build)."""
        with self._cond:
            self._ready[self._base + i] = desc
            if fresh:
                self.fresh.add(desc.digest)
            self._cond.notify_all()

    def finish(self, image_id: str, config_bytes: bytes) -> None:
        """Every layer is ready and this is the image: load it (in the feed's thread)."""
        with self._cond:
            self._final = (image_id, config_bytes)
            self._cond.notify_all()
        self.start()

    def _run(self) -> None:
        try:
            sweep_stale_partials()  # a killed build's prefix images (GBs of layers) go with the next build
        except Exception:  # never a reason for this build to fail
            pass
        try:
            self._prefixes()
        except BaseException as e:  # the final load sends what the engine still lacks
            self.error = e
        with self._cond:
            while self._final is None and not self._closed:
                self._cond.wait()
            final = self._final
        if final is not None:
            try:
                self.final_loaded = self._load_final(*final)
            except BaseException:  # left to the caller's own load (final_loaded stays None)
                pass

    def _prefixes(self) -> None:
        from hermetic.engines.dockerimages import layers_engine_has, load_layers

        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    n = next(k for k in itertools.count() if k not in self._ready)  # ready in a row
                    # Load a prefix only while something after it is still being built: once all
                    # layers are there, the real image's own load is as quick.
                    if n >= self._total:
                        return
                    if n > max(self._engine_has, 0):
                        break
                    self._cond.wait()
                layers = [self._ready[k] for k in range(n)]
            diff_ids = [d.digest for d in layers]
            if self._worth_asking(layers):
                self._engine_has = max(self._engine_has, layers_engine_has(diff_ids, prefer=self._repo_tag))
                if self._engine_has >= n:
                    continue
            config = canonical_json({
                "architecture": self._arch, "os": self._os,
                "config": {"Labels": {PARTIAL_LABEL: _owner()}},
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
            })
            t = time.monotonic()
            image_id = load_layers(self._store, config, [(d.digest, d.size) for d in layers], None,
                                   self._engine_has)
            self._note("prefix", layers[self._engine_has:], t)
            self.loads.append((self._engine_has, n))
            self._partials.append(image_id)
            self._engine_has = n

    def _worth_asking(self, layers: list[Descriptor]) -> bool:
        """Whether the engine may hold more of these layers than we know: only if the first one not
        known to be there came from the cache. A layer this build just made is new to the engine, and
        so is every layer above it (their chain is new)."""
        k = max(self._engine_has, 0)
        return k < len(layers) and layers[k].digest not in self.fresh

    def _load_final(self, image_id: str, config_bytes: bytes) -> bool:
        from hermetic.engines.dockerimages import engine_has_image, layers_engine_has, load_layers

        if engine_has_image(image_id):
            return False
        layers = [self._ready[k] for k in range(self._total)]
        skip = self._engine_has
        if self.error is not None or self._worth_asking(layers):
            skip = layers_engine_has([d.digest for d in layers], self._partials, prefer=self._repo_tag)
        t = time.monotonic()
        load_layers(self._store, config_bytes, [(d.digest, d.size) for d in layers], self._repo_tag, skip)
        self._note("image", layers[skip:], t)
        return True

    def _note(self, kind: str, sent: list[Descriptor], started: float) -> None:
        self.timeline.append({"load": kind, "layers": len(sent), "bytes": sum(d.size for d in sent),
                              "from": started, "to": time.monotonic()})

    def close(self) -> None:
        """Stop feeding (waits for a load in flight, and for the image's own load once asked for)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.ident is not None:
            self._thread.join()

    @property
    def partial_images(self) -> list[str]:
        return list(self._partials)

    def remove_partials(self) -> None:
        from hermetic.engines.dockerimages import remove_image

        for image_id in reversed(self._partials):
            remove_image(image_id)
        self._partials.clear()
