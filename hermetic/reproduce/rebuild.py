"""Rebuild an image from its provenance alone, in a scratch cache, with hermetic's own build.

Nothing is written to the user's store and nothing is loaded into an engine. The base comes by manifest digest
(the user's store, the image's repository, the base's registry), every wheel by its exact sha256; a provenance
of another hermetic version is refused before anything is built.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from hermetic.core.reference import ImageName, parse_base_reference
from hermetic.core.canonical import pretty_json
from hermetic.core.errors import HermeticError, IntegrityError
from hermetic.lock.model import LockedWheel
from hermetic.core.paths import CachePaths
from hermetic.provenance.statement import BuildFacts, WheelFact
from hermetic.store.oci import OciStore
from hermetic.store.wheels import WheelStore


class CannotReproduce(IntegrityError):
    """The rebuild cannot be attempted here as the provenance describes it (a refusal: IntegrityError's exit code)."""


@dataclass
class Rebuilt:
    manifest_digest: str
    project: Path
    paths: CachePaths
    notes: list[str] = field(default_factory=list)


def check_builder(facts: BuildFacts) -> list[str]:
    """Refuse a provenance this hermetic cannot reproduce; notes for what may still matter."""
    from hermetic import __version__
    from hermetic.builder.inputs import LAYER_FORMAT, runtime_sha256
    from hermetic.builder.layers import _installer_version

    if facts.hermetic_version != __version__:
        raise CannotReproduce(
            f"the provenance was made by hermetic {facts.hermetic_version}; this is hermetic {__version__}, which "
            f"labels and lays out images its own way, so a rebuild here cannot reproduce it",
            hint=f"verify with hermetic {facts.hermetic_version} (pip install hermetic=={facts.hermetic_version})")
    if facts.layer_format != LAYER_FORMAT:
        raise CannotReproduce(f"the provenance uses layer format {facts.layer_format}; this hermetic writes "
                              f"format {LAYER_FORMAT}")
    ours = runtime_sha256()
    if facts.runtime_sha256 != ours:
        last = facts.layers[-1] if facts.layers else None
        where = f"layer {last.index} ({last.contents})" if last else "the runtime layer"
        raise CannotReproduce(
            f"hermetic {__version__}'s runtime here hashes to {ours[:16]}…, the provenance's to "
            f"{facts.runtime_sha256[:16]}…: {where} would differ (a modified or development copy of hermetic?)")
    notes = []
    if facts.installer_version != _installer_version():
        notes.append(f"the image was built with installer {facts.installer_version}, this machine has "
                     f"{_installer_version()} (installed from another lock than hermetic's?)")
    return notes


def write_project(facts: BuildFacts, root: Path) -> Path:
    """hermetic.yaml and the lock, from the provenance; returns the hermetic.yaml path."""
    lock_rel = posixpath.normpath(facts.lock_path)
    if lock_rel.startswith(("/", "../")) or lock_rel == "..":
        lock_rel = posixpath.basename(lock_rel)  # only the file name decides the lock's format
    root.mkdir(parents=True, exist_ok=True)
    lock_file = root / lock_rel
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock_file.write_bytes(facts.lock_bytes)
    cfg = {**facts.config, "lock": lock_rel}
    path = root / "hermetic.yaml"
    path.write_text(pretty_json(cfg))  # JSON is YAML
    return path


def copy_image(src: OciStore, dst: OciStore, manifest_digest: str) -> None:
    """Manifest, config and layers from one store to another, each blob re-verified on the way."""
    for digest in [manifest_digest] + [d.digest for d in src.image_blobs(manifest_digest)]:
        if dst.has_blob(digest):
            continue
        with open(src.blob_path(digest), "rb") as f, dst.writer(digest) as w:
            while chunk := f.read(1 << 20):
                w.write(chunk)


def seed_base(facts: BuildFacts, store: OciStore, user_store: OciStore, sources: list[ImageName],
              notes: list[str]) -> None:
    try:
        ref = parse_base_reference(facts.config.get("base", ""))
    except ValueError as e:
        raise CannotReproduce(f"the provenance's base {facts.config.get('base')!r}: {e}") from None
    if ref.kind == "docker":
        raise CannotReproduce(f"the base {ref.raw} is an image of the builder's Docker Engine; verify needs a base "
                              "pinned by manifest digest (NAME@sha256:… or oci:PATH@sha256:…)")
    digest = facts.base_digest
    if user_store.has_image(digest):
        try:
            copy_image(user_store, store, digest)
            return
        except IntegrityError as e:
            notes.append(f"the local store's copy of the base is damaged ({e.message}); pulling it")
    if ref.kind == "name" and ref.name is not None and ref.name.has_host:
        sources = sources + [ImageName(ref.name.host, ref.name.repository, None, digest)]
    from hermetic.registry.pull import pull_image

    tried = []
    for name in sources:
        try:
            pull_image(store, ImageName(name.host, name.repository, None, digest))
            return
        except IntegrityError:
            raise
        except HermeticError as e:
            tried.append(f"{name.host}/{name.repository}: {e.message}")
    raise CannotReproduce(f"the base {digest} is not in the local store and could not be pulled "
                          f"({'; '.join(tried) or 'no registry to pull it from'})",
                          hint="hermetic push sends the base along with the image; push the image again")


def _layer_words(facts: BuildFacts, w: WheelFact) -> str:
    layer = facts.layer_of(w.filename)
    return f"layer {layer.index}: {layer.contents}" if layer else "no layer recorded"


def seed_wheels(facts: BuildFacts, lock_wheels: dict[str, LockedWheel], store: WheelStore, user_store: WheelStore,
                notes: list[str], log: Callable[[str], None] | None = None) -> None:
    """Every wheel the provenance names, by its exact sha256, into the scratch wheel store."""
    from hermetic.lock.indexes import PipSources, read_pip_sources
    from hermetic.lock.model import Lock, Target
    from hermetic.store.fetch import FetchError, SourceSet, fetch

    missing: list[WheelFact] = []
    for w in facts.wheels:
        if store.get(w.sha256) is not None:
            continue
        have = user_store.get(w.sha256)
        if have is not None:
            try:
                store.admit_file(have.path, {w.sha256}, what=f"{w.filename} (from the local wheel store)")
                continue
            except IntegrityError as e:
                notes.append(f"the local wheel store's copy is damaged, fetching it again: {e.message}")
        missing.append(w)
    if not missing:
        return
    if log:
        log(f"fetching {len(missing)} wheel(s) by hash ...")
    target = Target(python_version=facts.target_python, platform=facts.target_platform)
    pins = []
    for w in missing:
        locked = lock_wheels.get(w.name)
        if locked is None or w.sha256 not in locked.sha256s:
            raise IntegrityError(f"{w.filename} ({_layer_words(facts, w)}): the provenance names sha256 {w.sha256}, "
                                 "which its own lock does not allow")
        pins.append((w, replace(locked, sha256s=frozenset({w.sha256}))))
    sources = read_pip_sources()
    exact_lock = Lock(path="(provenance)", format=facts.lock_format, target=target,
                      wheels=tuple(p for _, p in pins), index_urls=facts.lock_indexes)
    srcs = SourceSet(sources, exact_lock)
    direct = []
    for w, pin in pins:
        found = None
        offered = []
        for label, cands in srcs.candidates(pin):
            same = [c for c in cands if c.filename == w.filename]
            offered += [f"{label} offers it with sha256 {c.sha256}" for c in same if c.sha256 not in (None, w.sha256)]
            found = next((c for c in same if c.sha256 in (None, w.sha256)), None)
            if found:
                break
        if found is None:
            tried = [*srcs.find_links, *srcs.indexes]
            why = "; ".join(offered) if offered else f"not found in {', '.join(tried) or 'any index or find-links'}"
            raise CannotReproduce(f"{w.filename} ({_layer_words(facts, w)}), sha256 {w.sha256}: no index has this "
                                  f"wheel any more: {why}",
                                  hint="put the file in a find-links directory (PIP_FIND_LINKS) and verify again")
        direct.append(replace(pin, urls=(found.url,)))
    try:
        fetch(replace(exact_lock, wheels=tuple(direct)), store, PipSources(no_index=True))
    except (FetchError, IntegrityError) as e:
        culprit = next((w for w, _ in pins if w.filename in e.message or f"{w.name}=={w.version}" in e.message), None)
        where = f"{culprit.filename} ({_layer_words(facts, culprit)}): " if culprit else ""
        raise IntegrityError(f"{where}{e.message}; refused before any layer was built", hint=e.hint) from None


def rebuild(facts: BuildFacts, scratch: Path, *, user_paths: CachePaths, base_sources: list[ImageName],
            log: Callable[[str], None] | None = None) -> Rebuilt:
    """Rebuild into ``scratch``; returns the rebuilt manifest digest (in ``scratch``'s store)."""
    from hermetic.builder.build import build, read_config_lock
    from hermetic.builder.key import build_key, image_config_part
    from hermetic.config.load import load_config

    notes = check_builder(facts)
    project = scratch / "project"
    cfg_path = write_project(facts, project)
    cfg = load_config(str(cfg_path))
    if image_config_part(cfg) != facts.config:
        raise CannotReproduce("this hermetic reads the provenance's config differently than the builder did "
                              "(the config schema changed)")
    lock = read_config_lock(cfg)
    key = build_key(cfg, lock)
    if key != facts.build_key:
        raise CannotReproduce(f"the build key here is {key[:16]}…, the provenance's {facts.build_key[:16]}…: "
                              "the inputs do not add up to the same build")
    paths = CachePaths(scratch / "cache")
    store = OciStore(paths.oci).ensure()
    if log:
        log(f"base {facts.base_digest[:19]} ...")
    seed_base(facts, store, OciStore(user_paths.oci), base_sources, notes)
    seed_wheels(facts, lock.by_name(), WheelStore(paths.wheels), WheelStore(user_paths.wheels), notes, log)
    if log:
        log("building in scratch ...")
    result = build(cfg, paths, offline=True, load=False, log=log)
    notes += [n for n in result.notes if not n.startswith("no provenance")]
    return Rebuilt(result.manifest_digest, project, paths, notes)
