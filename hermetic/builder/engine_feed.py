"""Loading into the engine while the build goes on.

Docker applies an image's layers in order, each on the one below it, and a
``docker load`` registers nothing until its stream ends. So instead of one
load after the whole image is built, the layers are fed to the engine as
*prefix images*: as soon as layers 0..j are all in the store and some layer
after j is still being built, a throwaway image made of those layers alone
(a minimal config, labelled ``org.hermetic.partial``) is loaded, carrying only
the layers the engine lacks. While the engine unpacks and registers them, the
other layers are still being built. When the image is complete, its real load
finds every layer already there (or sends the few that are not), and the
prefix images are removed (their layers stay: the image holds them).

A prefix load that the engine refuses stops the feed: the final load then
sends whatever the engine still lacks, as without the feed. Loads run in one
thread of the build process, one at a time, in layer order.
"""

from __future__ import annotations

import threading
from typing import Any

from hermetic.canonical import canonical_json
from hermetic.store.oci import Descriptor, OciStore

PARTIAL_LABEL = "org.hermetic.partial"


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
        self.trusted: set[str] = set()  # blobs this build wrote (and hashed) itself
        self._base = len(base_layers)
        self._engine_has = -1  # leading layers the engine holds (-1: not asked yet)
        self._partials: list[str] = []
        self._closed = False
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.loads: list[tuple[int, int]] = []  # (first layer sent, layers in the prefix), for tests and notes
        self._thread = threading.Thread(target=self._run, name="engine-feed", daemon=True)
        self._thread.start()

    def layer_ready(self, i: int, desc: Descriptor, fresh: bool = False) -> None:
        """Our layer ``i`` (0 = the first above the base) is in the store (``fresh``: written by this build)."""
        with self._cond:
            self._ready[self._base + i] = desc
            if fresh:
                self.trusted.add(desc.digest)
            self._cond.notify_all()

    def _contiguous(self) -> int:
        n = 0
        while n in self._ready:
            n += 1
        return n

    def _run(self) -> None:
        from hermetic.engine import layers_engine_has, load_layers

        try:
            while True:
                with self._cond:
                    while True:
                        if self._closed:
                            return
                        n = self._contiguous()
                        # Load a prefix only while something after it is still being built: once all
                        # layers are there, the real image's own load is as quick.
                        if n >= self._total:
                            return
                        if n > max(self._engine_has, 0):
                            break
                        self._cond.wait()
                    layers = [self._ready[k] for k in range(n)]
                diff_ids = [d.digest for d in layers]
                if self._engine_has < 0:  # asked once; later layers are this build's own
                    self._engine_has = layers_engine_has(diff_ids, prefer=self._repo_tag)
                    if self._engine_has >= n:
                        continue
                config = canonical_json({
                    "architecture": self._arch, "os": self._os,
                    "config": {"Labels": {PARTIAL_LABEL: "1"}},
                    "rootfs": {"type": "layers", "diff_ids": diff_ids},
                })
                image_id = load_layers(self._store, config, [(d.digest, d.size) for d in layers], None,
                                       self._engine_has, frozenset(self.trusted))
                self.loads.append((self._engine_has, n))
                self._partials.append(image_id)
                self._engine_has = n
        except BaseException as e:  # the final load sends what the engine still lacks
            self.error = e

    def close(self) -> None:
        """Stop feeding (waits for a load in flight)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    @property
    def partial_images(self) -> list[str]:
        return list(self._partials)

    def remove_partials(self) -> None:
        from hermetic.engine import remove_image

        for image_id in reversed(self._partials):
            remove_image(image_id)
        self._partials.clear()
