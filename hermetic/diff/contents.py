"""What differs inside two output files whose bytes differ: JSON, YAML and pickles compared as structures.

Two runs of Hugging Face's Trainer differ in ``train_runtime`` and
``*_per_second`` (wall-clock figures in ``trainer_state.json`` and
``*_results.json``) and in ``training_args.bin`` (a pickle whose
``logging_dir`` holds the start time), while every weight is bitwise
identical. Comparing bytes alone says "6 files differ"; this module says which
keys, and which of them are wall-clock by nature, so the verdict can tell a
timing figure from a different computation.

A script wrote these files, so they are untrusted: each is opened only through
hermetic.safetree (regular files only, no link followed, at most
MAX_CONTENT_BYTES read), checked against the sha256 its record holds, and only
when that sha256 differs between the runs and its name says JSON, YAML or a
pickle. A pickle is never unpickled: ``pickletools.genops`` parses its opcodes
and a small stack machine here rebuilds the structure with every class and
function as its *name* (``transformers.training_args.TrainingArguments``),
nothing imported, nothing called. torch.save's zip archives (``data.pkl``
beside the tensors' storages) are opened with zipfile, bounded the same way.
Whatever cannot be read that way is compared as bytes, with a note saying why.

Wall-clock fields: a key whose last name says time (``*runtime*``,
``*_per_second``, ``timestamp``, ``*_time``, ``*_at``, ``duration``...) or a
host (``hostname``, ``host``, ``node``, ``pid``), or a string whose only
difference is a date, a time of day, an epoch time or a container host name
(``runs/Dec01_22-35-39_a09514e7ee3d``).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import math
import os
import pickletools
import posixpath
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

MAX_CONTENT_BYTES = 16 << 20  # a file larger than this is compared as bytes only
MAX_CONTENT_FILES = 256  # files read per diff; the rest compared as bytes
MAX_VALUES = 1_000_000  # values (nodes) walked per file: a YAML alias or pickle memo cannot make it explode
MAX_PICKLE_OPS = 4_000_000
MAX_LISTED = 50  # field changes kept per file (the counts cover them all)
MAX_DEPTH = 200  # nesting walked; deeper parts compared whole

STRUCTURED_SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".yaml": "yaml", ".yml": "yaml",
                       ".pkl": "pickle", ".pickle": "pickle", ".bin": "pickle?", ".pt": "pickle?",
                       ".pth": "pickle?", ".ckpt": "pickle?", ".joblib": "pickle?"}
# Weights and other model state, most telling first: the verdict names these first among identical files.
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".npy", ".npz", ".pkl", ".pickle", ".joblib",
                   ".h5", ".keras", ".onnx", ".gguf", ".msgpack")
# torch.save writes an id into its archives that restates the other entries: compared through them.
_TORCH_DERIVED_ENTRIES = frozenset({".data/serialization_id"})

_WALL_CLOCK_NAME = re.compile(
    r"runtime|per_?sec(ond)?s?$|throughput"
    r"|^_?(time|timestamp|wall_?time|walltime|date|datetime|elapsed|duration|created|modified|now)$"
    r"|_(time|timestamp|date|datetime|at|elapsed|duration|seconds|secs)$"
    r"|^(host|hostname|host_name|node|nodename|node_name|pid)$|_(host|hostname)$"
)
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME_IN_TEXT = re.compile("|".join([
    r"\d{4}-\d{2}-\d{2}(?:[T _]\d{2}[:\-]\d{2}(?:[:\-]\d{2}(?:[.,]\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?",  # ISO 8601
    r"\d{8}[T_-]?\d{6}",  # 20261129-214500
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)?,? ?" + _MONTH + r"\s?\d{1,2}(?:[_ ,]+\d{2}[:\-]\d{2}[:\-]\d{2})?(?: \d{4})?",
    r"\d{1,2}[:\-]\d{2}[:\-]\d{2}(?:[.,]\d+)?",  # 22-35-39, 22:35:39.5
    r"(?<!\d)1\d{9}(?:\d{3})?(?:\.\d+)?(?!\d)",  # epoch seconds (or ms) 2001-2286
]))
_PICKLED_TIMES = ("datetime.datetime(", "datetime.date(", "datetime.time(")
_HOST_IN_TEXT = re.compile(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])")  # a container's default host name


class _Unreadable(Exception):
    """The content cannot be compared as a structure: the message says why (then compared as bytes)."""


@dataclass(frozen=True)
class FieldChange:
    """One value that differs inside a file: ``key`` (``log_history[3].train_runtime``) from ``a`` to ``b``
    (shortened text); ``wall_clock`` says why it is harmless (``name``: the key is a timing or host field;
    ``value``: the value differs only in a date, time or host name), or "" when it is not."""

    key: str
    kind: str  # changed | added | removed
    a: str | None
    b: str | None
    wall_clock: str = ""

    @property
    def name(self) -> str:
        return last_name(self.key)

    def text(self) -> str:
        if self.kind == "added":
            return f"{self.key} added ({self.b})"
        if self.kind == "removed":
            return f"{self.key} removed (was {self.a})"
        return f"{self.key} {self.a} -> {self.b}"


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


def last_name(key: str) -> str:
    """The last named part of a dotted key path (``log_history[3].train_runtime`` -> ``train_runtime``);
    indices and numeric keys are skipped (``epoch_times.3`` -> ``epoch_times``)."""
    for part in reversed(re.split(r"[./:]", re.sub(r"\[\d+\]", "", key))):
        if part and not part.isdigit():
            return part
    return key


def is_wall_clock_name(key: str) -> bool:
    """A key (or metric) whose name says it measures time or names a host: ``train_runtime``,
    ``train_samples_per_second``, ``timestamp``, ``epoch_time``, ``created_at``, ``hostname``."""
    return bool(_WALL_CLOCK_NAME.search(last_name(key).lower()))


def _masked(text: str, *, times: bool, hosts: bool) -> str:
    if times:
        text = _TIME_IN_TEXT.sub("\0t", text)
    if hosts:
        text = _HOST_IN_TEXT.sub("\0h", text)
    return text


def value_wall_clock(a: Any, b: Any) -> str:
    """How two differing values differ only in a date, time or host name: ``a time``, ``a host name``, ``a time
    and a host name``; "" when they differ otherwise."""
    if isinstance(a, (datetime.date, datetime.time)) and isinstance(b, (datetime.date, datetime.time)):
        return "a time"
    if not (isinstance(a, str) and isinstance(b, str)):
        return ""
    if a.startswith(_PICKLED_TIMES) and b.startswith(_PICKLED_TIMES):  # read_pickle's text for a datetime
        return "a time"
    for times, hosts, what in ((True, False, "a time"), (False, True, "a host name"),
                               (True, True, "a time and a host name")):
        if _masked(a, times=times, hosts=hosts) == _masked(b, times=times, hosts=hosts):
            return what
    return ""


# ---------------------------------------------------------------- reading


def compare_contents(dir_a: Path, dir_b: Path, files_a: dict[str, Any], files_b: dict[str, Any],
                     paths: Iterable[str]) -> dict[str, ContentDiff]:
    """For each output path in ``paths`` (both runs wrote it, other bytes) whose name says JSON, YAML or a
    pickle: how the two versions differ inside. ``files_*``: the records' ``outputs.files`` (sha256 and
    size: a file larger than MAX_CONTENT_BYTES is not read; one whose bytes are not what its record says
    is compared as bytes). Other paths are left out of the answer."""
    from hermetic import safetree

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
    from hermetic import safetree

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
    try:
        fmt, tree_a, tree_b = _decode_pair(guess, data["A"], data["B"])
    except _Unreadable as e:
        return ContentDiff(path, guess.rstrip("?"), note=str(e))
    except RecursionError:
        return ContentDiff(path, guess.rstrip("?"), note="nested too deeply to compare")
    except Exception as e:  # noqa: BLE001 - a parser of untrusted bytes: whatever it raises, bytes it is
        return ContentDiff(path, guess.rstrip("?"), note=f"cannot be read ({type(e).__name__})")
    if fmt is None:
        return ContentDiff(path, "", note="not a pickle")
    try:
        changes = list(diff_trees(tree_a, tree_b))
    except _Unreadable as e:
        return ContentDiff(path, fmt, note=str(e))
    except RecursionError:
        return ContentDiff(path, fmt, note="nested too deeply to compare")
    except Exception as e:  # noqa: BLE001 - values an untrusted file made: compared as bytes rather than fail
        return ContentDiff(path, fmt, note=f"cannot be compared ({type(e).__name__})")
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
        raise _Unreadable("not a pickle this reader knows")
    return None, None, None


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _Unreadable(f"not UTF-8 {what}") from None


def _json(data: bytes) -> Any:
    try:
        return json.loads(_text(data, "JSON"))
    except ValueError as e:
        raise _Unreadable(f"not valid JSON ({str(e)[:80]})") from None


def _json_lines(data: bytes) -> list[Any]:
    out = []
    for n, line in enumerate(_text(data, "JSON lines").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise _Unreadable(f"line {n} is not valid JSON") from None
    return out


def _yaml(data: bytes) -> Any:
    import yaml

    try:
        docs = list(yaml.safe_load_all(_text(data, "YAML")))  # safe: plain data only, no object constructed
    except (yaml.YAMLError, ValueError) as e:  # ValueError: a timestamp such as 2026-13-45
        raise _Unreadable(f"not valid YAML ({(str(e).splitlines() or [''])[0][:80]})") from None
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
    try:
        return _read_archive(data)
    except _Unreadable:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile on corrupt bytes raises zlib.error, IndexError, ...
        raise _Unreadable(f"not a readable zip archive ({type(e).__name__})") from None


def _read_archive(data: bytes) -> dict[str, Any]:
    zf = zipfile.ZipFile(io.BytesIO(data))
    out: dict[str, Any] = {}
    total = 0
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = info.filename.partition("/")[2] or info.filename
            if name in _TORCH_DERIVED_ENTRIES:
                continue
            total += info.file_size
            if info.file_size > MAX_CONTENT_BYTES or total > 4 * MAX_CONTENT_BYTES:
                raise _Unreadable(f"archive entries larger than {MAX_CONTENT_BYTES >> 20} MiB")
            with zf.open(info) as f:
                raw = f.read(MAX_CONTENT_BYTES + 1)
            if len(raw) > MAX_CONTENT_BYTES:
                raise _Unreadable(f"archive entry {name} larger than {MAX_CONTENT_BYTES >> 20} MiB")
            if name == "data.pkl" or name.endswith("/data.pkl"):
                out[f"<{name}>"] = read_pickle(raw)
            else:
                out[f"<{name}>"] = "sha256:" + hashlib.sha256(raw).hexdigest()[:16]
    if not any(k.endswith("data.pkl>") for k in out):
        raise _Unreadable("a zip archive without data.pkl (not torch.save's)")
    return out


# ---------------------------------------------------------------- pickles, without unpickling


@dataclass(frozen=True)
class _Global:
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


@dataclass(eq=False)
class _Obj:
    """What REDUCE, NEWOBJ, OBJ or INST would have made: the callable's name and its arguments, the state
    BUILD would have set, the items SETITEMS/APPENDS would have added. Nothing is called."""

    cls: Any
    args: Any = ()
    states: list[Any] = field(default_factory=list)  # one per BUILD
    items: dict[Any, Any] = field(default_factory=dict)
    appended: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class _Set:
    items: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class _Persistent:
    pid: Any


_CONSTANTS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
                        "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
                        "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT"})


def read_pickle(data: bytes) -> Any:
    """The structure a pickle describes, as plain data (dicts, lists, strings, numbers), read from its opcodes
    (pickletools.genops) without unpickling: a class or function is its dotted name, an object the dict
    ``{"__class__": name, **its state}`` (or ``name(args)`` when it has no state), a persistent id (torch's
    storages) ``<persistent ...>``. _Unreadable for what is not a pickle."""
    stack: list[Any] = []
    marks: list[list[Any]] = []
    memo: dict[int, Any] = {}

    def pop_mark() -> list[Any]:
        nonlocal stack
        if not marks:
            raise _Unreadable("a malformed pickle (no MARK)")
        items, stack = stack, marks.pop()
        return items

    def top() -> Any:
        if not stack:
            raise _Unreadable("a malformed pickle (empty stack)")
        return stack[-1]

    def pop() -> Any:
        top()
        return stack.pop()

    def add_items(target: Any, pairs: list[Any]) -> None:
        if len(pairs) % 2:
            raise _Unreadable("a malformed pickle (odd SETITEMS)")
        for k, v in zip(pairs[::2], pairs[1::2]):
            (target.items if isinstance(target, _Obj) else target)[_key(k)] = v

    def append(target: Any, values: list[Any]) -> None:
        if isinstance(target, list):
            target.extend(values)
        elif isinstance(target, _Obj):
            target.appended.extend(values)
        else:
            raise _Unreadable("a malformed pickle (APPEND to a non-list)")

    ops = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            ops += 1
            if ops > MAX_PICKLE_OPS:
                raise _Unreadable(f"more than {MAX_PICKLE_OPS} pickle opcodes")
            name = op.name
            if name in _CONSTANTS:
                stack.append(arg)
            elif name in ("PROTO", "FRAME"):
                pass
            elif name == "STOP":
                break
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name == "NEXT_BUFFER":
                stack.append("<out-of-band buffer>")
            elif name == "READONLY_BUFFER":
                top()
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_SET":
                stack.append(_Set())
            elif name == "APPEND":
                v = pop()
                append(top(), [v])
            elif name == "APPENDS":
                items = pop_mark()
                append(top(), items)
            elif name == "LIST":
                items = pop_mark()  # first: pop_mark rebinds ``stack``
                stack.append(items)
            elif name == "TUPLE":
                items = pop_mark()
                stack.append(tuple(items))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise _Unreadable("a malformed pickle (short stack)")
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif name == "DICT":
                d: dict[Any, Any] = {}
                add_items(d, pop_mark())
                stack.append(d)
            elif name == "SETITEM":
                v = pop()
                k = pop()
                t = top()
                if not isinstance(t, (dict, _Obj)):
                    raise _Unreadable("a malformed pickle (SETITEM on a non-dict)")
                add_items(t, [k, v])
            elif name == "SETITEMS":
                items = pop_mark()
                t = top()
                if not isinstance(t, (dict, _Obj)):
                    raise _Unreadable("a malformed pickle (SETITEMS on a non-dict)")
                add_items(t, items)
            elif name == "ADDITEMS":
                items = pop_mark()
                t = top()
                if not isinstance(t, _Set):
                    raise _Unreadable("a malformed pickle (ADDITEMS on a non-set)")
                t.items.extend(items)
            elif name == "FROZENSET":
                items = pop_mark()
                stack.append(_Set(items))
            elif name == "POP":
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(top())
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise _Unreadable("a malformed pickle (unknown memo)")
                stack.append(memo[arg])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = top()
            elif name == "MEMOIZE":
                memo[len(memo)] = top()
            elif name in ("EXT1", "EXT2", "EXT4"):
                stack.append(_Global("<extension>", str(arg)))
            elif name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                g = _Global(module, attr)
                if name == "INST":
                    items = pop_mark()
                    stack.append(_Obj(g, tuple(items)))
                else:
                    stack.append(g)
            elif name == "STACK_GLOBAL":
                attr = pop()
                module = pop()
                stack.append(_Global(str(module), str(attr)))
            elif name == "REDUCE":
                args = pop()
                func = pop()
                stack.append(_reduced(func, args))
            elif name == "NEWOBJ":
                args = pop()
                cls = pop()
                stack.append(_Obj(cls, args))
            elif name == "NEWOBJ_EX":
                kwargs = pop()
                args = pop()
                cls = pop()
                stack.append(_Obj(cls, args, [kwargs] if kwargs else []))
            elif name == "OBJ":
                items = pop_mark()
                if not items:
                    raise _Unreadable("a malformed pickle (empty OBJ)")
                stack.append(_Obj(items[0], tuple(items[1:])))
            elif name == "BUILD":
                state = pop()
                t = top()
                if isinstance(t, _Obj):
                    t.states.append(state)
            elif name == "PERSID":
                stack.append(_Persistent(arg))
            elif name == "BINPERSID":
                stack.append(_Persistent(pop()))
            else:
                raise _Unreadable(f"pickle opcode {name} is not read")
        else:
            raise _Unreadable("a pickle without STOP")
    except ValueError as e:  # genops: a truncated or corrupt pickle
        raise _Unreadable(f"not a readable pickle ({str(e)[:80]})") from None
    if not stack:
        raise _Unreadable("an empty pickle")
    return _plain(stack[-1])


def _reduced(func: Any, args: Any) -> _Obj:
    # copyreg._reconstructor(cls, base, state): how protocol 0/1 pickles an instance; the class is what matters
    if isinstance(func, _Global) and (func.module, func.name) == ("copyreg", "_reconstructor") \
            and isinstance(args, tuple) and args:
        return _Obj(args[0], ())
    return _Obj(func, args)


def _key(k: Any) -> Any:
    if isinstance(k, (str, int, float, bool, bytes)) or k is None:
        return k
    return _exact(k, 10_000) or f"<key {hashlib.sha256(repr(k).encode()).hexdigest()[:16]}>"


class _TooLong(Exception):
    pass


def _exact(node: Any, limit: int = 200) -> str | None:
    """The exact text of a node that stands for a value (an enum member, a class, a persistent id, a key),
    or None when it would be longer than ``limit``: two different nodes never get the same text."""
    parts: list[str] = []
    size = [0]

    def put(text: str) -> None:
        size[0] += len(text)
        if size[0] > limit:
            raise _TooLong
        parts.append(text)

    def emit(x: Any, depth: int) -> None:
        if depth > 8:
            raise _TooLong
        if isinstance(x, _Global):
            put(str(x))
        elif isinstance(x, _Obj):
            if x.states or x.items or x.appended:
                raise _TooLong
            emit(x.cls, depth + 1)
            put("(")
            for i, a in enumerate(_as_tuple(x.args)):
                if i:
                    put(", ")
                emit(a, depth + 1)
            put(")")
        elif isinstance(x, _Persistent):
            put("<persistent ")
            emit(x.pid, depth + 1)
            put(">")
        elif isinstance(x, (list, tuple, _Set)):
            items = x.items if isinstance(x, _Set) else x
            put("(" if isinstance(x, tuple) else "{" if isinstance(x, _Set) else "[")
            for i, a in enumerate(items):
                if i:
                    put(", ")
                emit(a, depth + 1)
            put(")" if isinstance(x, tuple) else "}" if isinstance(x, _Set) else "]")
        elif isinstance(x, dict):
            put("{")
            for i, (k, v) in enumerate(x.items()):
                if i:
                    put(", ")
                emit(k, depth + 1)
                put(": ")
                emit(v, depth + 1)
            put("}")
        elif isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
            put(f"0x{x:x}" if x.bit_length() < 4 * limit else "?" * (limit + 1))
        else:
            put(repr(x))

    try:
        emit(node, 0)
    except _TooLong:
        return None
    return "".join(parts)


def _as_tuple(args: Any) -> tuple[Any, ...]:
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


def _plain(root: Any) -> Any:
    """The rebuilt nodes as plain, comparable data: no cycles (a container met again on its own path is
    ``<cycle>``), at most MAX_VALUES nodes, MAX_DEPTH deep."""
    budget = [MAX_VALUES]
    on_path: set[int] = set()

    def conv(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unreadable(f"more than {MAX_VALUES} values in the pickle")
        if isinstance(node, (str, int, float, bool, bytes, bytearray)) or node is None:
            return bytes(node) if isinstance(node, bytearray) else node
        if isinstance(node, _Global):
            return str(node)
        if isinstance(node, _Persistent):
            text = _exact(node, 10_000)
            return text if text is not None else {"__persistent__": conv(node.pid, depth + 1)}
        if depth > MAX_DEPTH:
            return f"<nested deeper than {MAX_DEPTH}>"
        if id(node) in on_path:
            return "<cycle>"
        on_path.add(id(node))
        try:
            if isinstance(node, (list, tuple)):
                return [conv(x, depth + 1) for x in node]
            if isinstance(node, _Set):
                return sorted((conv(x, depth + 1) for x in node.items), key=repr)
            if isinstance(node, dict):
                return {_key_text(k): conv(v, depth + 1) for k, v in node.items()}
            if isinstance(node, _Obj):
                return _plain_obj(node, lambda x: conv(x, depth + 1))
            return repr(node)
        finally:
            on_path.discard(id(node))

    return conv(root, 0)


def _key_text(k: Any) -> str:
    return k if isinstance(k, str) else repr(k)


def _plain_obj(node: _Obj, conv) -> Any:  # noqa: ANN001
    if not node.states and not node.items and not node.appended:
        text = _exact(node)  # an enum member, a datetime, a tensor rebuilt from its storage: a value
        if text is not None:
            return text
    cls = _exact(node.cls, 10_000)
    out: dict[str, Any] = {"__class__": cls if cls is not None else conv(node.cls)}
    if _as_tuple(node.args):
        out["__args__"] = conv(list(_as_tuple(node.args)))
    for state in node.states:
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, dict) or s is None for s in state):
            parts = [s for s in state if s]  # (__dict__, the __slots__' state)
        else:
            parts = [state]
        for part in parts:
            if isinstance(part, dict):
                for k, v in part.items():
                    out[_key_text(k)] = conv(v)
            elif part is not None:
                out["__state__"] = conv(part)
    for k, v in node.items.items():  # a dict subclass (OrderedDict: a state_dict): its items as keys
        key = _key_text(k)
        out[key if key not in out else f"[{key}]"] = conv(v)
    if node.appended:
        out["__items__"] = conv(node.appended)
    return out


# ---------------------------------------------------------------- comparing structures


def show(value: Any, n: int = 60) -> str:
    """A value as one short line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<{value.bit_length()}-bit integer>"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:12]}>" if len(value) > 24 \
            else repr(bytes(value))
    if isinstance(value, str):
        text = value
    elif isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    text = _printable(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _printable(text: str) -> str:
    """``text`` with every character that is not printable (an escape code, a newline) as ``\\xNN``."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (math.isnan(x) and math.isnan(y))
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def flatten_tree(tree: Any) -> dict[str, Any]:
    """``{"a.b[0].c": leaf}`` for a plain tree (dicts, lists); lists of scalars stay leaves, as do parts
    nested deeper than MAX_DEPTH. _Unreadable past MAX_VALUES nodes (a YAML alias bomb)."""
    out: dict[str, Any] = {}
    budget = [MAX_VALUES]

    def walk(value: Any, prefix: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unreadable(f"more than {MAX_VALUES} values")
        if isinstance(value, dict) and value and depth < MAX_DEPTH:
            for k, v in value.items():
                k = k if isinstance(k, str) else repr(k)
                walk(v, f"{prefix}.{k}" if prefix else k, depth + 1)
        elif isinstance(value, list) and depth < MAX_DEPTH and any(isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{prefix}[{i}]", depth + 1)
        else:
            out[prefix] = value

    walk(tree, "", 0)
    return out


def diff_trees(a: Any, b: Any) -> Iterator[FieldChange]:
    """Every leaf that differs between two plain trees, in key order of A then the keys only B has."""
    fa, fb = flatten_tree(a), flatten_tree(b)
    for key in list(fa) + [k for k in fb if k not in fa]:
        label = _printable(key) or "(the whole value)"  # a key is the script's text too: no escape codes
        if key in fa and key in fb:
            x, y = fa[key], fb[key]
            if _same(x, y):
                continue
            why = "name" if is_wall_clock_name(key) else value_wall_clock(x, y)
            yield FieldChange(label, "changed", show(x), show(y), why)
        elif key in fa:
            yield FieldChange(label, "removed", show(fa[key]), None)
        else:
            yield FieldChange(label, "added", None, show(fb[key]))


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
    from hermetic.containerpaths import glob_match

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
