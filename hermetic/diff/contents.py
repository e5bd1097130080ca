"""What differs inside two output files whose bytes differ: JSON, YAML and pickles compared as structures.

So the verdict can tell a wall-clock figure (``train_runtime``) from a different computation. The files are
untrusted: opened through hermetic.hostfs.safetree (regular, no link followed, MAX_CONTENT_BYTES), checked
against their recorded sha256; pickles by hermetic.diff.pickles, torch's zips by zipfile, trees by
hermetic.diff.trees. What cannot be read so is compared as bytes, with a note.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hermetic.diff.pickles import read_pickle
from hermetic.diff.trees import FieldChange, Unreadable, diff_trees

MAX_CONTENT_BYTES = 16 << 20  # a file larger than this is compared as bytes only
MAX_CONTENT_FILES = 256  # files read per diff; the rest compared as bytes
MAX_LISTED = 50  # field changes kept per file (the counts cover them all)

STRUCTURED_SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".yaml": "yaml", ".yml": "yaml",
                       ".pkl": "pickle", ".pickle": "pickle", ".bin": "pickle?", ".pt": "pickle?",
                       ".pth": "pickle?", ".ckpt": "pickle?", ".joblib": "pickle?"}
# Weights and other model state, most telling first: the verdict names these first among identical files.
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".npy", ".npz", ".pkl", ".pickle", ".joblib",
                   ".h5", ".keras", ".onnx", ".gguf", ".msgpack")
# torch.save writes an id into its archives that restates the other entries: compared through them.
_TORCH_DERIVED_ENTRIES = frozenset({".data/serialization_id"})


@dataclass(frozen=True)
class ContentDiff:
    """How two versions of one output file differ inside (``note``: why it was compared as bytes only)."""

    path: str
    format: str  # json | jsonl | yaml | pickle | torch archive | "" (not read)
    changes: tuple[FieldChange, ...] = ()  # the first MAX_LISTED real changes, then the first wall-clock ones
    real: int = 0  # how many values differ that are not wall-clock
    wall: int = 0  # how many differ only as wall-clock fields
    wall_names: tuple[str, ...] = ()  # the wall-clock fields' names, as summaries show them
    note: str = ""

    @property
    def compared(self) -> bool:
        return not self.note

    @property
    def wall_clock_only(self) -> bool:
        """Read, and every value that differs is a wall-clock field."""
        return self.compared and self.wall > 0 and self.real == 0

    def summary(self, limit: int = 3) -> str:
        """``timing fields differ: train_runtime, train_samples_per_second``, ``values differ: eval_loss 2.31 ->
        2.35``, or why it was compared as bytes."""
        if not self.compared:
            return f"compared as bytes: {self.note}"
        if not self.real and not self.wall:
            return f"the same {self.format} values, other bytes (formatting, order or encoding)"
        parts = []
        if self.real:
            shown = [c.text() for c in self.changes if not c.wall_clock][:limit]
            more = self.real - len(shown)
            parts.append("values differ: " + "; ".join(shown) + (f"; +{more} more" if more > 0 else ""))
        if self.wall:
            parts.append("timing fields differ: " + names_text(self.wall_names, 6))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "real": self.real, "wall": self.wall,
                "wall_clock_only": self.wall_clock_only, "wall_names": list(self.wall_names), "note": self.note,
                "summary": self.summary(99),
                "changes": [{"key": c.key, "kind": c.kind, "a": c.a, "b": c.b, "wall_clock": c.wall_clock}
                            for c in self.changes]}


def names_text(names: Iterable[str], limit: int) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f", +{len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------- reading


def compare_contents(dir_a: Path, dir_b: Path, files_a: dict[str, Any], files_b: dict[str, Any],
                     paths: Iterable[str]) -> dict[str, ContentDiff]:
    """For each output path in ``paths`` (both runs wrote it, other bytes) whose name says JSON, YAML or a
    pickle: how the two versions differ inside. ``files_*``: the records' ``outputs.files`` (sha256 and
    size: a file larger than MAX_CONTENT_BYTES is not read; one whose bytes are not what its record says
    is compared as bytes). Other paths are left out of the answer."""
    from hermetic.hostfs import safetree

    wanted = [p for p in paths if structured_format(p)]
    if not wanted:
        return {}
    out: dict[str, ContentDiff] = {}
    roots: dict[str, int] = {}
    try:
        for label, d in (("A", dir_a), ("B", dir_b)):
            try:
                roots[label] = safetree.open_root(Path(d) / "outputs")
            except OSError as e:
                return {p: ContentDiff(p, "", note=f"run {label}'s outputs/ cannot be opened ({e.strerror})")
                        for p in wanted}
        for i, path in enumerate(wanted):
            if i >= MAX_CONTENT_FILES:
                out[path] = ContentDiff(path, "", note=f"more than {MAX_CONTENT_FILES} such files differ; "
                                                         "the rest are compared as bytes")
                continue
            out[path] = _compare_one(path, roots, files_a.get(path) or {}, files_b.get(path) or {})
    finally:
        for fd in roots.values():
            os.close(fd)
    return out


def structured_format(path: str) -> str:
    """``json``, ``jsonl``, ``yaml``, ``pickle`` or ``pickle?`` (a name torch and others use for pickles and
    other binaries alike: the bytes decide) by the file's suffix; "" for anything else."""
    return STRUCTURED_SUFFIXES.get(os.path.splitext(path)[1].lower(), "")


def _compare_one(path: str, roots: dict[str, int], fa: dict[str, Any], fb: dict[str, Any]) -> ContentDiff:
    from hermetic.hostfs import safetree

    guess = structured_format(path)
    if fa.get("symlink") is not None or fb.get("symlink") is not None or fa.get("type") or fb.get("type"):
        return ContentDiff(path, "", note="not a regular file in both runs")
    for f in (fa, fb):
        if int(f.get("size") or 0) > MAX_CONTENT_BYTES:
            return ContentDiff(path, "", note=f"larger than {MAX_CONTENT_BYTES >> 20} MiB")
    data = {}
    for label, f in (("A", fa), ("B", fb)):
        try:
            raw = safetree.read_limited(roots[label], safetree.fs_name(path), MAX_CONTENT_BYTES)
        except safetree.UnsafePath as e:
            return ContentDiff(path, "", note=f"run {label}: {e}")
        except OSError as e:
            return ContentDiff(path, "", note=f"run {label}: cannot be read ({e.strerror})")
        if hashlib.sha256(raw).hexdigest() != f.get("sha256"):
            return ContentDiff(path, "", note=f"run {label}'s copy is not what its record says")
        data[label] = raw
    fmt, doing = guess.rstrip("?"), "read"
    try:
        fmt, tree_a, tree_b = _decode_pair(guess, data["A"], data["B"])
        if fmt is None:
            return ContentDiff(path, "", note="not a pickle")
        doing = "compared"
        changes = list(diff_trees(tree_a, tree_b))
    except Unreadable as e:
        return ContentDiff(path, fmt, note=str(e))
    except RecursionError:
        return ContentDiff(path, fmt, note="nested too deeply to compare")
    except Exception as e:  # noqa: BLE001 - untrusted bytes, or the values they made: then compared as bytes
        return ContentDiff(path, fmt, note=f"cannot be {doing} ({type(e).__name__})")
    return summarize(path, fmt, changes)


def summarize(path: str, fmt: str, changes: Iterable[FieldChange]) -> ContentDiff:
    """A ContentDiff from every FieldChange of one file (kept: the first MAX_LISTED of each kind)."""
    real: list[FieldChange] = []
    wall: list[FieldChange] = []
    n_real = n_wall = 0
    names: dict[str, None] = {}
    for c in changes:
        if c.wall_clock:
            n_wall += 1
            names.setdefault(c.name if c.wall_clock == "name" else f"{c.name} ({c.wall_clock} in its value)")
            if len(wall) < MAX_LISTED:
                wall.append(c)
        else:
            n_real += 1
            if len(real) < MAX_LISTED:
                real.append(c)
    return ContentDiff(path, fmt, tuple(real + wall), n_real, n_wall, tuple(names))


def _decode_pair(guess: str, a: bytes, b: bytes) -> tuple[str | None, Any, Any]:
    if guess == "json":
        return "json", _json(a), _json(b)
    if guess == "jsonl":
        return "jsonl", _json_lines(a), _json_lines(b)
    if guess == "yaml":
        return "yaml", _yaml(a), _yaml(b)
    kinds = {_pickle_kind(a), _pickle_kind(b)}
    if kinds == {"pickle"} or (guess == "pickle" and kinds <= {"pickle", "pickle0"}):
        return "pickle", read_pickle(a), read_pickle(b)
    if kinds == {"zip"}:
        return "torch archive", _torch_archive(a), _torch_archive(b)
    if guess == "pickle":
        raise Unreadable("not a pickle this reader knows")
    return None, None, None


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Unreadable(f"not UTF-8 {what}") from None


def _json(data: bytes) -> Any:
    try:
        return json.loads(_text(data, "JSON"))
    except ValueError as e:
        raise Unreadable(f"not valid JSON ({str(e)[:80]})") from None


def _json_lines(data: bytes) -> list[Any]:
    out = []
    for n, line in enumerate(_text(data, "JSON lines").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise Unreadable(f"line {n} is not valid JSON") from None
    return out


def _yaml(data: bytes) -> Any:
    import yaml

    try:
        docs = list(yaml.safe_load_all(_text(data, "YAML")))  # safe: plain data only, no object constructed
    except (yaml.YAMLError, ValueError) as e:  # ValueError: a timestamp such as 2026-13-45
        raise Unreadable(f"not valid YAML ({(str(e).splitlines() or [''])[0][:80]})") from None
    return docs[0] if len(docs) == 1 else docs


def _pickle_kind(data: bytes) -> str:
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return "pickle"
    if data[:4] == b"PK\x03\x04":
        return "zip"
    if data[:1] in (b"(", b"}", b"]", b"c", b"I", b"S", b"V", b"N"):  # protocol 0/1: trusted only by name
        return "pickle0"
    return "other"


def _torch_archive(data: bytes) -> dict[str, Any]:
    """torch.save's zip: ``<name>/data.pkl`` (the structure) read as a pickle, every other entry (a tensor's
    storage, the format version) by its sha256, names without the archive's top directory."""
    out: dict[str, Any] = {}
    total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                name = info.filename.partition("/")[2] or info.filename
                if info.is_dir() or name in _TORCH_DERIVED_ENTRIES:
                    continue
                total += info.file_size
                if info.file_size > MAX_CONTENT_BYTES or total > 4 * MAX_CONTENT_BYTES:
                    raise Unreadable(f"archive entries larger than {MAX_CONTENT_BYTES >> 20} MiB")
                with zf.open(info) as f:
                    raw = f.read(MAX_CONTENT_BYTES + 1)
                if len(raw) > MAX_CONTENT_BYTES:
                    raise Unreadable(f"archive entry {name} larger than {MAX_CONTENT_BYTES >> 20} MiB")
                structure = name == "data.pkl" or name.endswith("/data.pkl")
                out[f"<{name}>"] = read_pickle(raw) if structure else f"sha256:{hashlib.sha256(raw).hexdigest()[:16]}"
    except Unreadable:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile on corrupt bytes raises zlib.error, IndexError, ...
        raise Unreadable(f"not a readable zip archive ({type(e).__name__})") from None
    if not any(k.endswith("data.pkl>") for k in out):
        raise Unreadable("a zip archive without data.pkl (not torch.save's)")
    return out


def weights_first(paths: Iterable[str]) -> list[str]:
    """Paths with model weights and state first (WEIGHT_SUFFIXES order; a name with ``args`` in it is not
    weights), then the rest, each in the given order."""
    paths = list(paths)

    def rank(p: str) -> int:
        suffix = os.path.splitext(p)[1].lower()
        if suffix in WEIGHT_SUFFIXES and "args" not in os.path.basename(p).lower():
            return WEIGHT_SUFFIXES.index(suffix)
        return len(WEIGHT_SUFFIXES)

    return sorted(paths, key=rank)  # stable: the given order within a rank


def volatile_globs_for(paths: Iterable[str], keep_apart: Iterable[str]) -> list[str]:
    """Globs (run.outputs.volatile's dialect) that name ``paths``: one file name in several directories
    (``out/trainer_state.json``, ``out/checkpoint-20/trainer_state.json``) becomes ``out/**/trainer_state.json``,
    and paths that differ only in their numbers one glob with ``*`` for them, unless the glob would also name
    a path of ``keep_apart`` (files that are compared and must stay so); the rest as they are."""
    from hermetic.config.containerpaths import glob_match

    paths = list(paths)
    keep = list(keep_apart)
    out: list[str] = []
    done: set[str] = set()

    def take(glob: str, members: list[str]) -> bool:
        if len(members) < 2 or any(glob_match(glob, k) for k in keep) or not all(glob_match(glob, m) for m in members):
            return False
        out.append(glob)
        done.update(members)
        return True

    by_name: dict[str, list[str]] = {}
    for p in paths:
        by_name.setdefault(posixpath.basename(p), []).append(p)
    for name, members in by_name.items():
        top = posixpath.commonpath([posixpath.dirname(m) for m in members]) if len(members) > 1 else ""
        take(f"{top}/**/{name}" if top else f"**/{name}", members)
    by_digits: dict[str, list[str]] = {}
    for p in paths:
        if p not in done:
            by_digits.setdefault(re.sub(r"\d+", "*", p), []).append(p)
    for glob, members in by_digits.items():
        if not take(glob, members):
            out += members
    return out
