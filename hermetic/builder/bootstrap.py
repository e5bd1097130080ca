"""``hermetic base bootstrap``: minimal Debian bases with Python, built by mmdebstrap from a recipe.

The root filesystem's tar is normalized like our own layers (ownership and setuid bits kept) and
enters the OCI store as a one-layer image.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermetic.builder.libc import installed_packages
from hermetic.builder.image import image_manifest, rfc3339
from hermetic.builder.tarlayer import Entry, complete_parents, write_layer
from hermetic.core.canonical import canonical_json
from hermetic.config.load import format_key_path
from hermetic.core.resources import images_dir
from hermetic.core.errors import ConfigError, DataError, NotFound, Unavailable, disk_full
from hermetic.hostfs.filesystems import naming_full_disk
from hermetic.hostfs.fsutil import atomic_write_bytes, owned_temp_dir
from hermetic.store.inuse import writing
from hermetic.store.oci import MT_LAYER, MT_MANIFEST, Descriptor, OciStore

class RecipePython(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    version: str


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    tag: str
    tool: str = "mmdebstrap"
    suite: str
    variant: str = "minbase"
    mirror: str
    components: list[str] = Field(default_factory=lambda: ["main"])
    include: list[str] = Field(default_factory=list)
    python: RecipePython
    env: dict[str, str] = Field(default_factory=dict)


def find_recipe(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.is_dir() and (p / "recipe.yaml").is_file():
        return p / "recipe.yaml"
    cand = images_dir() / name_or_path / "recipe.yaml"
    if cand.is_file():
        return cand
    known = sorted(d.name for d in images_dir().iterdir() if (d / "recipe.yaml").is_file()) if images_dir().is_dir() else []
    raise NotFound(f"no base recipe {name_or_path!r} (known: {', '.join(known) or 'none'})")


def load_recipe(path: Path) -> Recipe:
    try:
        data = yaml.safe_load(path.read_text())
        return Recipe.model_validate(data)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{path}: {format_key_path(tuple(err['loc']))}: {err['msg']}") from None


@dataclass
class BootstrapResult:
    reference: str  # name@sha256:… (what goes into hermetic.yaml)
    manifest_digest: str
    image_id: str
    layer_digest: str
    size: int
    packages: dict[str, str] = field(default_factory=dict)


def rootfs_entries(tf: tarfile.TarFile) -> list[Entry]:
    """Entries of an mmdebstrap tar, ownership kept, hardlinks resolved, devices dropped."""
    members = tf.getmembers()
    by_name = {m.name: m for m in members}
    entries: list[Entry] = []
    for m in members:
        name = m.name[2:] if m.name.startswith("./") else m.name.lstrip("/")
        name = name.rstrip("/")
        if not name or name == ".":
            continue
        if name == "dev" or name.startswith("dev/"):
            # The engine provides /dev; a base ships only the empty directory.
            if m.isdir() and name == "dev":
                entries.append(Entry(name, "dir", m.mode & 0o7777, m.uid, m.gid))
            continue
        mode = m.mode & 0o7777
        if m.isdir():
            entries.append(Entry(name, "dir", mode, m.uid, m.gid))
        elif m.issym():
            entries.append(Entry(name, "symlink", 0o777, m.uid, m.gid, linkname=m.linkname))
        elif m.isreg() or m.islnk():
            src = m
            if m.islnk():
                src = by_name.get(m.linkname) or by_name.get("./" + m.linkname.lstrip("./")) or by_name.get(m.linkname.lstrip("./"))
                if src is None or not src.isreg():
                    raise DataError(f"rootfs hardlink {m.name} -> {m.linkname}: target missing")
            entries.append(Entry(name, "file", mode, m.uid, m.gid, size=src.size,
                                 open=(lambda s=src: tf.extractfile(s))))  # type: ignore[arg-type,return-value]
        # character/block devices, FIFOs: dropped
    return entries


def bootstrap(recipe_path: Path, store: OciStore, *, source_date_epoch: int = 0,
              log=None) -> BootstrapResult:
    # gc waits for it (its blobs are named by no ref until the end); a full disk ends in one line.
    with naming_full_disk(store.root, f"the base of {recipe_path}"), writing(store):
        return _bootstrap(recipe_path, store, source_date_epoch=source_date_epoch, log=log)


def _bootstrap(recipe_path: Path, store: OciStore, *, source_date_epoch: int, log) -> BootstrapResult:
    recipe = load_recipe(recipe_path)
    if recipe.tool != "mmdebstrap":
        raise ConfigError(f"{recipe_path}: tool {recipe.tool!r} is not supported (mmdebstrap)")
    exe = shutil.which("mmdebstrap")
    if not exe:
        raise Unavailable("mmdebstrap is not installed", hint="apt-get install mmdebstrap (Debian package)")
    store.ensure()
    with owned_temp_dir(store.tmp, "bootstrap.") as tmp:  # a killed bootstrap's rootfs goes with its lock
        rootfs_tar = Path(tmp) / "rootfs.tar"
        cmd = [exe, f"--variant={recipe.variant}", f"--components={','.join(recipe.components)}",
               "--mode=root" if os.geteuid() == 0 else "--mode=unshare", "--format=tar"]
        if recipe.include:
            cmd.append("--include=" + ",".join(recipe.include))
        cmd += [recipe.suite, str(rootfs_tar), recipe.mirror]
        env = {"SOURCE_DATE_EPOCH": str(source_date_epoch), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
        if log:
            log(f"mmdebstrap {recipe.suite} ({recipe.variant}, +{', '.join(recipe.include)}) from {recipe.mirror} ...")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = [ln for ln in proc.stderr.splitlines() if ln.startswith("E:")] or proc.stderr.splitlines()[-3:]
            full = [e for e, text in ((errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "Disk quota exceeded"))
                    if text in proc.stderr]
            if full:  # its own words name the file; the same one line and exit code as ours
                raise disk_full(OSError(full[0], os.strerror(full[0])),
                                what=f"the root filesystem of {recipe.name} (mmdebstrap: {' | '.join(tail)})")
            raise Unavailable(f"mmdebstrap failed for {recipe_path}: {' | '.join(tail)}")
        with tarfile.open(rootfs_tar) as tf:
            status_member = tf.getmember("./var/lib/dpkg/status")
            f = tf.extractfile(status_member)
            packages = installed_packages(f.read().decode() if f else "")
            entries = complete_parents(rootfs_entries(tf))
            with store.writer() as w:
                size = write_layer(entries, w, mtime=source_date_epoch)
                layer_digest = w.commit()
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **recipe.env}
    recipe_sha = hashlib.sha256(recipe_path.read_bytes()).hexdigest()
    config: dict[str, Any] = {
        "architecture": "amd64", "os": "linux", "created": rfc3339(source_date_epoch),
        "config": {"Env": [f"{k}={v}" for k, v in sorted(env.items())], "Cmd": ["/bin/bash"],
                   "Labels": {"org.hermetic.bootstrap.recipe": recipe.name,
                              "org.hermetic.bootstrap.recipe.sha256": recipe_sha,
                              "org.hermetic.bootstrap.suite": recipe.suite,
                              "org.hermetic.python": recipe.python.version}},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": rfc3339(source_date_epoch),
                     "created_by": f"hermetic base bootstrap {recipe.name} (mmdebstrap {recipe.suite} {recipe.variant})"}],
    }
    config_digest, config_size, _ = store.put_json(config)
    manifest = image_manifest(config_digest, config_size, [Descriptor(MT_LAYER, layer_digest, size)])
    manifest_digest, manifest_size, _ = store.put_json(manifest)
    store.set_ref(f"{recipe.name}:{recipe.tag}", Descriptor(MT_MANIFEST, manifest_digest, manifest_size))
    (store.root / "bootstrap").mkdir(exist_ok=True)
    atomic_write_bytes(store.root / "bootstrap" / f"{manifest_digest.split(':')[1]}.packages.json", canonical_json(packages))
    return BootstrapResult(f"{recipe.name}@{manifest_digest}", manifest_digest, config_digest, layer_digest, size, packages)
