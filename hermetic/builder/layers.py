"""Which wheels go in which layer, and the layer cache.

One layer per wheel of 64 MB or more, the small ones grouped, biggest first (an engine reuses a layer
only when every layer below it is the same), the hermetic layer (venv + runtime) last. A layer's key
covers all that decides its bytes; each layer built enters the cache as it is finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermetic import __version__
from hermetic.builder.bytecode import BytecodeSpec, add_bytecode
from hermetic.builder.inputs import LAYER_FORMAT, STARTUP_MODULE, runtime_files
from hermetic.builder.install import VenvLayout, venv_files, wheel_files
from hermetic.builder.tarlayer import DirAttrs, Entry, complete_parents, write_layer
from hermetic.core.canonical import canonical_sha256
from hermetic.core.errors import IntegrityError
from hermetic.core.workers import available_cpus
from hermetic.hostfs.fsutil import atomic_write_bytes, sha256_file
from hermetic.lock.model import ResolvedWheel
from hermetic.store.oci import MT_LAYER, MT_LAYER_GZIP, Descriptor, OciStore

BIG_WHEEL_BYTES = 64 * 1024 * 1024
MAX_LAYERS = 100


@dataclass
class LayerSpec:
    kind: str  # "wheel" | "wheels" | "hermetic"
    wheels: list[ResolvedWheel]
    description: str
    key: str = ""
    files: dict[str, bytes | str] = field(default_factory=dict)  # for kind "hermetic": path -> bytes | symlink target


@dataclass
class BuiltLayer:
    spec: LayerSpec
    descriptor: Descriptor
    cached: bool
    seconds: float


def _group_small(small: list[ResolvedWheel], max_groups: int) -> list[list[ResolvedWheel]]:
    """Small wheels in name order, cut where a wheel's name hashes into the lower half.

    Content-defined boundaries (rsync's idea, over names): adding, removing or
    upgrading one package changes only the group it falls in, and the other
    groups keep their bytes and digests. About two wheels per group; over the
    layer budget, equal-count chunks instead.
    """
    groups: list[list[ResolvedWheel]] = []
    for w in small:
        if not groups or hashlib.sha256(w.locked.name.encode()).digest()[0] < 128:
            groups.append([])
        groups[-1].append(w)
    if len(groups) > max_groups:
        n = max(1, max_groups)
        per = -(-len(small) // n)
        groups = [small[i:i + per] for i in range(0, len(small), per)]
    return groups


def plan_layers(wheels: list[ResolvedWheel], hermetic_files: dict[str, bytes | str], *, max_layers: int) -> list[LayerSpec]:
    big = sorted((w for w in wheels if (w.size or 0) >= BIG_WHEEL_BYTES), key=lambda w: (-(w.size or 0), w.locked.name))
    small = sorted((w for w in wheels if (w.size or 0) < BIG_WHEEL_BYTES), key=lambda w: w.locked.name)
    # Respect the layer budget: beyond it, the smallest "big" wheels join the groups.
    room = max(0, max_layers - 2)
    if len(big) > room:
        small = sorted(small + big[room:], key=lambda w: w.locked.name)
        big = big[:room]
    specs = [LayerSpec("wheel", [w], f"{w.locked.name}=={w.locked.version}") for w in big]
    groups = _group_small(small, max(1, max_layers - 1 - len(big)))
    # Biggest group first here too: a package added or upgraded lands in a small group, high in the
    # image, so the engine applies again only the few small layers above it (its chain changed).
    groups.sort(key=lambda g: (-sum(w.size or 0 for w in g), g[0].locked.name))
    for group in groups:
        if len(group) == 1:
            desc = f"{group[0].locked.name}=={group[0].locked.version}"
        else:
            names = ", ".join(w.locked.name for w in group[:4]) + (f", +{len(group) - 4} more" if len(group) > 4 else "")
            desc = f"{len(group)} wheels: {names}"
        specs.append(LayerSpec("wheels", group, desc))
    specs.append(LayerSpec("hermetic", [], "hermetic runtime + venv", files=hermetic_files))
    return specs


def layer_key(spec: LayerSpec, layout: VenvLayout, parents: dict[str, DirAttrs], mtime: int,
              bytecode: BytecodeSpec | None = None) -> str:
    return canonical_sha256({
        "format": LAYER_FORMAT,
        "kind": spec.kind,
        "wheels": sorted(w.sha256 for w in spec.wheels),
        "files": {p: ("link:" + v) if isinstance(v, str) else hashlib.sha256(v).hexdigest()
                  for p, v in sorted(spec.files.items())},
        "prefix": layout.prefix, "python": layout.python_version, "base_python": layout.base_python,
        "parents": {k: [v.mode, v.uid, v.gid] for k, v in sorted(parents.items())},
        "mtime": mtime,
        "installer": _installer_version(),
        "bytecode": {"mode": bytecode.mode, "compiler": bytecode.interpreter.identity} if bytecode else None,
    })


def _installer_version() -> str:
    try:
        from importlib.metadata import version

        return version("installer")
    except Exception:
        return "unknown"


def relevant_parents(prefix: str, base_dirs: dict[str, DirAttrs]) -> dict[str, DirAttrs]:
    """Attributes of the base's directories that our layers' paths pass through."""
    parts = prefix.strip("/").split("/")
    ancestors = ("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {p: base_dirs[p] for p in ancestors if p in base_dirs}


class LayerCache:
    def __init__(self, root: Path, store: OciStore):
        self.root = root
        self.store = store

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> Descriptor | None:
        try:
            entry = json.loads(self._path(key).read_text())
            desc = Descriptor.from_json(entry["descriptor"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return desc if self.store.blob_intact(desc.digest, desc.size) else None

    def put(self, key: str, desc: Descriptor, meta: dict) -> None:
        entry = {"descriptor": desc.to_json(), "meta": meta}
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self._path(key), json.dumps(entry, sort_keys=True).encode(), fsync=False)


class _Stoppable:
    """A layer's sink that ends the layer at its next write once ``stop`` is set (the build failed elsewhere,
    or was interrupted: Ctrl-C does not wait for the torch layer's tar)."""

    def __init__(self, sink: Any, stop: threading.Event) -> None:
        self.sink, self.stop = sink, stop

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise InterruptedError("the build ended before this layer")
        return self.sink.write(data)


def build_layer(spec: LayerSpec, layout: VenvLayout, parents: dict[str, DirAttrs], mtime: int,
                store: OciStore, bytecode: BytecodeSpec | None = None,
                stop: threading.Event | None = None) -> Descriptor:
    """Install (as entries, straight from the zips), compile, normalize, tar and hash one layer into the store."""
    entries: list[Entry] = []
    with contextlib.ExitStack() as stack:
        for w in spec.wheels:
            actual = sha256_file(w.url or "")  # a stored wheel must still hash to its name before it goes in
            if actual != w.sha256:
                raise IntegrityError(f"{w.locked.name}=={w.locked.version}: stored wheel {w.filename} is corrupt "
                                     f"(expected sha256 {w.sha256}, found {actual})",
                                     hint="run `hermetic cache verify --repair`, then `hermetic fetch`")
            zf, files = wheel_files(Path(w.url), layout)
            stack.enter_context(zf)
            for path, f in files.items():
                opener = ((lambda zf=zf, m=f.member: zf.open(m)) if f.member is not None
                          else (lambda d=f.data: io.BytesIO(d or b"")))
                entries.append(Entry(path.lstrip("/"), "file", 0o755 if f.executable else 0o644, size=f.size,
                                     open=opener))
        for path, value in spec.files.items():  # the hermetic layer's
            if isinstance(value, str):
                entries.append(Entry(path.strip("/"), "symlink", 0o777, linkname=value))
            else:
                entries.append(Entry(path.strip("/"), "file", 0o644, size=len(value),
                                     open=(lambda d=value: io.BytesIO(d))))
        if bytecode is not None:
            entries = add_bytecode(entries, layout.site_packages, bytecode)
        entries = complete_parents(entries, parents)
        with store.writer(needed=sum(e.size for e in entries)) as w:  # (for a full disk's message)
            size = write_layer(entries, _Stoppable(w, stop) if stop is not None else w, mtime=mtime)
            digest = w.commit()
    return Descriptor(MT_LAYER, digest, size)


def hermetic_layer_files(layout: VenvLayout) -> dict[str, bytes | str]:
    """The venv skeleton and the in-image runtime package ``hermetic_runtime``."""
    files = venv_files(layout)
    for rel, data in runtime_files().items():
        if rel == STARTUP_MODULE:  # imported at every interpreter start by the .pth: a module of its own
            files[f"{layout.site_packages}/_hermetic_startup.py"] = data
        elif rel.endswith(".pth"):
            files[f"{layout.site_packages}/{rel}"] = data
        else:
            files[f"{layout.site_packages}/hermetic_runtime/{rel}"] = data
    files[f"{layout.site_packages}/hermetic_runtime-{__version__}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: hermetic-runtime\nVersion: {__version__}\n".encode())
    files[f"{layout.site_packages}/hermetic_runtime-{__version__}.dist-info/INSTALLER"] = b"hermetic\n"
    return files


def build_layers(specs: list[LayerSpec], layout: VenvLayout, base_dirs: dict[str, DirAttrs], mtime: int,
                 store: OciStore, cache: LayerCache,
                 on_layer: Callable[[BuiltLayer], None] | None = None, bytecode: BytecodeSpec | None = None,
                 on_ready: Callable[[int, Descriptor, bool], None] | None = None,
                 on_planned: Callable[[], None] | None = None) -> list[BuiltLayer]:
    """Reuse cached layers; build the others, bottom-up (the engine applies them in that order).

    ``on_ready(i, descriptor, built_now)`` is called as soon as layer ``i``'s
    blob is in the store (cached ones first), so a caller can start loading it
    while the others are still being built (``on_planned()`` once the cached
    ones are all reported).
    """
    parents = relevant_parents(layout.prefix, base_dirs)
    out: list[BuiltLayer | None] = []
    for i, spec in enumerate(specs):
        spec.key = layer_key(spec, layout, parents, mtime, bytecode)
        desc = cache.get(spec.key)
        out.append(None if desc is None else BuiltLayer(spec, desc, True, 0.0))
        if desc is not None and on_ready:
            on_ready(i, desc, False)
    if on_planned:
        on_planned()

    stop = threading.Event()

    def timed(spec: LayerSpec) -> tuple[Descriptor, float]:
        t0 = time.monotonic()
        return build_layer(spec, layout, parents, mtime, store, bytecode, stop), time.monotonic() - t0

    # The layers are independent: built side by side, one per core (inflating, hashing and the bytecode
    # compiler, most of a layer's time, run outside the GIL; docs/benchmarks.md), each reported as it ends
    # (the engine's feed loads them in order).
    todo = [i for i, layer in enumerate(out) if layer is None]
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), available_cpus()))) as pool:
        futures = {pool.submit(timed, specs[i]): i for i in todo}
        try:
            for future in as_completed(futures):
                i, spec = futures[future], specs[futures[future]]
                desc, seconds = future.result()
                out[i] = BuiltLayer(spec, desc, False, seconds)
                cache.put(spec.key, desc, {"description": spec.description,
                                           "wheels": [w.filename for w in spec.wheels]})
                if on_ready:
                    on_ready(i, desc, True)
        except BaseException:  # the first failure ends the build: no new layer starts, those under way stop
            stop.set()
            pool.shutdown(cancel_futures=True)
            raise
    layers = [layer for layer in out if layer is not None]
    for layer in layers if on_layer else ():
        on_layer(layer)
    return layers


def gzip_layer(desc: Descriptor, store: OciStore, cache: LayerCache, level: int = 6) -> Descriptor:
    """The gzip form of a layer blob: fixed header (no name, mtime 0), cached by input.

    The bytes depend on the zlib build, so this is a recorded transform, never
    the identity: the image's diff_ids stay the uncompressed digests.
    """
    import gzip
    import zlib

    key = canonical_sha256({"gzip": desc.digest, "level": level, "zlib": zlib.ZLIB_RUNTIME_VERSION})
    hit = cache.get(key)
    if hit is not None:
        return hit
    with open(store.blob_path(desc.digest), "rb") as src, store.writer() as w:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=w, mtime=0) as gz:
            shutil.copyfileobj(src, gz, 1 << 20)
        digest = w.commit()
        size = w.size
    out = Descriptor(MT_LAYER_GZIP, digest, size)
    cache.put(key, out, {"description": f"gzip of {desc.digest}"})
    return out
