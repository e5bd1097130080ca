"""The GPU base catalog (images/catalog.yaml): loads, lists tags only, fits the real torch locks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hermetic.core.reference import parse_image_name
from hermetic.builder.catalog import catalog_path, load_catalog
from hermetic.core.errors import HermeticError
from hermetic.gpu.wheels import check_glibc

LOCKS = Path(__file__).parent / "fixtures" / "locks"


def test_catalog_loads_and_lists_tags_never_digests():
    entries = load_catalog()
    assert len(entries) >= 5
    assert len({e.name for e in entries}) == len(entries)
    for e in entries:
        ref = parse_image_name(e.ref)
        assert ref.tag and not ref.digest, e.ref
        assert e.kind in ("registry", "bootstrap")
        assert set(e.provides) == {"python", "glibc", "cuda"}
        assert e.notes and e.how
    refs = {e.ref for e in entries}
    assert "docker.io/nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04" in refs
    assert "docker.io/library/python:3.11-slim-bookworm" in refs


def test_bootstrap_entry_matches_the_recipe():
    (entry,) = [e for e in load_catalog() if e.kind == "bootstrap"]
    recipe_dir = catalog_path().parent / entry.name
    recipe = yaml.safe_load((recipe_dir / "recipe.yaml").read_text())
    assert entry.ref == f"{recipe['name']}:{recipe['tag']}"
    assert entry.python == recipe["python"]["version"]
    assert entry.how == f"hermetic base bootstrap {entry.name} --pin ."


@pytest.mark.parametrize("lock", ["torch-2.9.1-cu12", "torch-2.11.0-cuda-toolkit"])
def test_every_catalog_glibc_runs_the_real_torch_wheels(lock):
    files = [v["filename"] for v in json.loads((LOCKS / f"{lock}.wheels.json").read_text()).values()]
    for e in load_catalog():
        assert e.glibc is not None
        assert check_glibc(files, e.glibc) == [], e.name


def write(tmp_path: Path, entries: list[dict]) -> Path:
    p = tmp_path / "catalog.yaml"
    p.write_text(yaml.safe_dump({"entries": entries}))
    return p


GOOD = {"name": "x", "ref": "docker.io/library/python:3.11-slim", "kind": "registry",
        "provides": {"python": "3.11", "glibc": "2.36", "cuda": "from wheels"}, "notes": "n", "how": "h"}


@pytest.mark.parametrize("change,message", [
    ({"ref": "docker.io/library/python@sha256:" + "a" * 64}, "carries a digest"),
    ({"ref": "library/python:3.11-slim"}, "must name its registry host"),
    ({"ref": "docker.io/library/python"}, "has no tag"),
    ({"kind": "mirror"}, "kind 'mirror' is not one of registry, bootstrap"),
    ({"provides": {"glibc": "two"}}, "provides.glibc 'two' is not MAJOR.MINOR"),
    ({"extra": 1}, "unknown key(s) extra"),
])
def test_bad_entries_are_refused_naming_the_entry(tmp_path, change, message):
    with pytest.raises(HermeticError) as e:
        load_catalog(write(tmp_path, [{**GOOD, **change}]))
    assert message in str(e.value)
    assert str(tmp_path / "catalog.yaml") in str(e.value)


def test_duplicate_names_are_refused(tmp_path):
    with pytest.raises(HermeticError, match="duplicate name 'x'"):
        load_catalog(write(tmp_path, [GOOD, GOOD]))
