"""The Docker Engine's images: loaded from hermetic's OCI store, tagged, listed, removed, saved.

A load is a docker-archive stream made from the store on the fly (the engine keeps the config digest as the
image ID); each layer is hashed on its way unless its store note vouches for it, and a mismatch stops the
stream before manifest.json, so the engine keeps nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from typing import TYPE_CHECKING, Iterator

from hermetic.engines.dockerclient import engine_client, said
from hermetic.core.errors import EngineError, IntegrityError, NotFound

if TYPE_CHECKING:
    from hermetic.store.oci import OciStore


@contextlib.contextmanager
def _engine_errors() -> Iterator[None]:
    """docker-py's APIError as hermetic's EngineError, in the engine's words."""
    from docker.errors import APIError

    try:
        yield
    except APIError as e:
        raise EngineError(f"Docker Engine error: {said(e)}") from None


def _inspect(ref: str) -> dict | None:
    """The engine's document of the image ``ref`` (an ID or a name); None when it has none."""
    from docker.errors import NotFound

    with _engine_errors():
        try:
            return engine_client().api.inspect_image(ref)
        except NotFound:
            return None


def engine_has_image(image_id: str) -> bool:
    """Whether the engine holds an image of this ID (or name)."""
    return _inspect(image_id) is not None


def layers_engine_has(diff_ids: list[str], candidates: list[str] = (),  # type: ignore[assignment]
                      prefer: str | None = None) -> int:
    """How many leading layers of this image the engine already holds.

    Docker reuses a layer only with the same chain below it, so what counts is
    the longest common prefix with an image the engine has: ``candidates``,
    ``prefer`` (the tag this image replaces), then the 20 newest hermetic images
    (by label); the search stops at the first image that shares all of ``diff_ids``.
    """
    from docker.errors import APIError

    client = engine_client()

    def images() -> Iterator[str]:
        yield from [*candidates, *([prefer] if prefer else [])]
        try:  # asked only if need be; the Engine lists the newest first
            yield from (img["Id"] for img in client.api.images(filters={"label": ["org.hermetic.version"]})[:20])
        except APIError:
            return

    best = 0
    for image_id in images():
        try:
            have = client.api.inspect_image(image_id).get("RootFS", {}).get("Layers") or []
        except APIError:
            continue
        best = max(best, len(os.path.commonprefix([have, diff_ids])))
        if best == len(diff_ids):
            break
    return best


def load_image(store: "OciStore", manifest_digest: str, repo_tag: str | None = None,
               candidates: list[str] = ()) -> str:  # type: ignore[assignment]
    """Stream the image into the engine; returns the image ID the engine reports.

    Layer files the engine already holds (same chain) are left out of the
    stream; the engine skips a layer it has without reading its file (Docker
    20.10, measured: a reload that differs in one small layer sends only that
    layer's bytes). If the engine refuses the short stream, the
    full one is sent.
    """
    manifest = store.read_json(manifest_digest)
    config_bytes = store.read_blob(manifest["config"]["digest"])
    config = json.loads(config_bytes)
    skip = layers_engine_has(list(config.get("rootfs", {}).get("diff_ids", [])), list(candidates), prefer=repo_tag)
    layers = [(layer["digest"], int(layer["size"])) for layer in manifest["layers"]]
    try:
        return load_layers(store, config_bytes, layers, repo_tag, skip)
    except EngineError:
        if skip == 0:
            raise
        return load_layers(store, config_bytes, layers, repo_tag, 0)


_CHUNK = 1 << 20


class _HashingReader:
    """A file's bytes as tarfile reads them, hashed on the way."""

    def __init__(self, f) -> None:
        import hashlib

        self._f = f
        self.sha256 = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha256.update(data)
        return data


def _corrupt_layer(digest: str, path, what: str) -> IntegrityError:
    from hermetic.store.intact import REPAIR

    return IntegrityError(f"layer blob {digest} in the store ({path}) {what}; nothing was loaded into the engine; "
                          f"run `{REPAIR}`, then build or pull the image again")


def load_layers(store: "OciStore", config_bytes: bytes, layer_blobs: list[tuple[str, int]], repo_tag: str | None,
                skip: int) -> str:
    """Load one image (its config's bytes, its layer blobs in the store as (digest, size)) into the engine,
    leaving out the first ``skip`` layers, which it holds with the same chain. Returns the image ID."""
    import hashlib
    import time

    from hermetic.store import intact

    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    layers = [d for d, _ in layer_blobs]
    sizes = [n for _, n in layer_blobs]
    rfd, wfd = os.pipe()
    try:  # a 1 MiB pipe: the stream goes to the engine in 1 MiB chunks, not 8 KiB ones
        import fcntl

        fcntl.fcntl(wfd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _CHUNK)
    except OSError:
        pass
    errors: list[BaseException] = []

    import tarfile  # here, not at the module's top: a run's start, which loads nothing, does not need it

    def writer() -> None:
        try:
            with os.fdopen(wfd, "wb", buffering=1 << 20) as out:
                with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                    def add_bytes(name: str, data: bytes) -> None:
                        ti = tarfile.TarInfo(name)
                        ti.size = len(data)
                        tf.addfile(ti, io.BytesIO(data))

                    cfg_name = config_digest.split(":")[1] + ".json"
                    add_bytes(cfg_name, config_bytes)
                    names = []
                    for i, d in enumerate(layers):
                        name = d.split(":")[1] + "/layer.tar"
                        names.append(name)
                        if i < skip:
                            continue  # the engine has this layer (same chain): not sent
                        p = store.blob_path(d)
                        ti = tarfile.TarInfo(name)
                        ti.size = p.stat().st_size
                        if ti.size != sizes[i]:
                            raise _corrupt_layer(d, p, f"is {ti.size} bytes, not {sizes[i]}")
                        hexdigest = d.split(":", 1)[1]
                        with open(p, "rb") as f:
                            if intact.noted_intact(store.root, p, hexdigest, sizes[i]):
                                tf.addfile(ti, f)  # hashed since it last changed (the store's note)
                                continue
                            noted_ns = time.time_ns()
                            before = os.fstat(f.fileno())
                            hashed = _HashingReader(f)
                            tf.addfile(ti, hashed)  # type: ignore[arg-type]
                            after = os.fstat(f.fileno())
                        if hashed.sha256.hexdigest() != hexdigest:
                            # Raised before manifest.json is written: the engine loads nothing.
                            raise _corrupt_layer(d, p, f"is corrupt (its content hashes to "
                                                       f"sha256:{hashed.sha256.hexdigest()})")
                        intact.note_hashed(store.root, hexdigest, before, after, noted_ns)
                    doc = [{"Config": cfg_name, "RepoTags": [repo_tag] if repo_tag else None, "Layers": names}]
                    add_bytes("manifest.json", json.dumps(doc).encode())
        except BaseException as e:  # surfaced by the caller
            errors.append(e)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    reader = os.fdopen(rfd, "rb", buffering=0)
    try:  # ~1 MiB pieces: requests sends a generator as chunked transfer, one chunk each
        refused = _send_archive(iter(lambda: reader.read(_CHUNK), b""))
    finally:
        reader.close()
        t.join()
    corrupt = [e for e in errors if isinstance(e, IntegrityError)]
    if corrupt:
        raise corrupt[0]  # what made the engine refuse (or would have)
    if refused is not None:
        raise EngineError(f"the Docker Engine refused the image: {refused}")
    if errors and not isinstance(errors[0], BrokenPipeError):
        raise errors[0]
    if not engine_has_image(config_digest):
        raise EngineError(f"the Docker Engine did not keep image {config_digest} after loading it")
    return config_digest


def _send_archive(chunks: Iterator[bytes]) -> str | None:
    """``POST /images/load`` of a docker-archive stream: None when the engine took it, else why not in words
    (its error status, an error inside its progress stream, or the connection it broke)."""
    from docker.errors import APIError, DockerException

    try:
        for doc in engine_client().api.load_image(chunks, quiet=True):
            if isinstance(doc, dict) and doc.get("error"):
                return str(doc["error"])
    except APIError as e:
        return said(e)
    except (DockerException, OSError) as e:  # the engine closed the stream before reading it all
        return f"the connection broke while the image was sent ({type(e).__name__}: {e})"
    return None


def ensure_tag(image_id: str, repo_tag: str) -> None:
    """Point ``repo_tag`` at ``image_id`` when it names another image (or none)."""
    if (_inspect(repo_tag) or {}).get("Id") != image_id:
        repo, _, tag = repo_tag.rpartition(":")
        with _engine_errors():
            engine_client().api.tag(image_id, repo, tag)


def remove_image(image_id: str) -> None:
    """Remove an image by ID if nothing uses it (its layers stay while another image holds them)."""
    from docker.errors import APIError

    client = engine_client()
    try:
        client.api.remove_image(image_id, noprune=False)
    except APIError:
        pass


def save_image(image_id: str) -> Iterator[bytes]:
    """``docker save`` of one image: the docker-archive tar, as it arrives; NotFound (hermetic's) when the
    engine has no such image, EngineError when it fails on the way."""
    if _inspect(image_id) is None:
        raise NotFound(f"the Docker Engine has no image {image_id}")

    def chunks() -> Iterator[bytes]:
        with _engine_errors():
            yield from engine_client().api.get_image(image_id)

    return chunks()

