"""hermetic diff reads what differs inside JSON, YAML and pickled outputs (never unpickling them) and tells
wall-clock fields (a Trainer's train_runtime, a time in logging_dir) from a different computation."""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pickle
import pickletools
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli

from hermetic.diff import contents, diff_runs, pickles, trees
from hermetic.diff.contents import compare_contents
from hermetic.diff.pickles import read_pickle
from hermetic.record.rundir import write_record
from synthetic_records import h, synthetic_record, write_synthetic_run

A = "20261129-214500-aaaaaa"
B = "20261129-220000-bbbbbb"
WEIGHTS = bytes(range(256)) * 64  # the same model in both runs


def hermetic(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)


def write_run(runs: Path, run_id: str, files: dict[str, bytes], *, minutes: int = 0, plant=None) -> Path:
    """A synthetic run whose outputs are these real files (the record hashed from them)."""
    rec = synthetic_record(run_id, minutes=minutes)
    rec["outputs"]["files"] = {p: {"sha256": h(p), "size": 1} for p in files}
    if plant:
        plant(rec)
    write_synthetic_run(runs, rec)
    run_dir = runs / run_id
    for p, data in files.items():
        (run_dir / "outputs" / p).write_bytes(data)
        rec["outputs"]["files"][p] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    write_record(run_dir, rec)
    return run_dir


@dataclass
class TrainingArgs:  # what transformers' TrainingArguments is to a pickle: a dataclass of settings
    output_dir: str
    logging_dir: str
    learning_rate: float
    seed: int


def trainer_files(runtime: float, minute: int, host: str, *, eval_loss: float = 2.3125) -> dict[str, bytes]:
    """What a Trainer run leaves: the weights, the results with wall-clock figures, its pickled arguments."""
    results = {"epoch": 1.0, "eval_loss": eval_loss, "train_loss": 2.5, "train_runtime": runtime,
               "train_samples_per_second": round(64 / runtime, 3), "train_steps_per_second": round(8 / runtime, 3)}
    state = {"global_step": 8, "log_history": [{"loss": 2.6, "step": 4}, {"loss": 2.4, "step": 8},
                                               {"step": 8, "train_runtime": runtime, "total_flos": 1234.0}]}
    args = TrainingArgs("out", f"runs/Dec01_22-{minute:02d}-39_{host}", 5e-4, 42)
    return {"model.safetensors": WEIGHTS, "config.json": b'{"n_layer": 2}\n',
            "all_results.json": json.dumps(results, indent=2).encode(),
            "trainer_state.json": json.dumps(state, indent=2).encode(),
            "training_args.bin": pickle.dumps(args, protocol=2)}


def trainer_pair(tmp_path, *, eval_loss_b: float = 2.3125, plant_b=None):
    runs = tmp_path / "runs"
    da = write_run(runs, A, trainer_files(12.25, 35, "a09514e7ee3d"))
    db = write_run(runs, B, trainer_files(13.5, 36, "093c9afaa36d", eval_loss=eval_loss_b), minutes=15, plant=plant_b)
    return runs, da, db


def test_only_wall_clock_fields_differ_is_its_own_verdict_with_exit_0(tmp_path):
    runs, da, db = trainer_pair(tmp_path)
    d = diff_runs(da, db)
    v = d.verdict
    assert v.kind == "wall_clock" and v.exit_code == 0, v
    assert v.line.startswith("identical except wall-clock fields: 2 files bitwise identical "
                             "(model.safetensors, config.json); in 3 files only timing fields differ ("), v.line
    for name in ("train_runtime", "train_samples_per_second", "logging_dir"):
        assert name in v.line
    assert not v.line.startswith("bitwise identical")  # bytes differ: never said of the whole run
    assert "nondeterminism" not in v.line and not v.knobs_not_set or "knobs" not in v.line
    # what differs, file by file
    inside = d.outputs.contents
    assert inside["all_results.json"].wall_names == ("train_runtime", "train_samples_per_second",
                                                     "train_steps_per_second")
    assert inside["trainer_state.json"].wall_names == ("train_runtime",)
    assert inside["training_args.bin"].format == "pickle"
    assert inside["training_args.bin"].wall_names == ("logging_dir (a time and a host name in its value)",)
    assert all(c.wall_clock_only for c in inside.values())
    # the exact line that would keep them without comparing them: the default first, then the three files
    assert v.suggested_volatile == ["**/events.out.tfevents.*", "all_results.json", "trainer_state.json",
                                    "training_args.bin"]
    assert 'volatile: ["**/events.out.tfevents.*", "all_results.json", "trainer_state.json", ' \
           '"training_args.bin"]' in v.notes[0]
    # the CLI: the same first line, exit 0, the timing fields under outputs
    r = hermetic("diff", str(da), str(db))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == v.line
    assert any("~ all_results.json  timing fields differ: train_runtime, train_samples_per_second, "
               "train_steps_per_second" in line for line in lines), r.stdout
    r = hermetic("diff", "--json", str(da), str(db))
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["verdict"]["kind"] == "wall_clock"
    assert doc["outputs"]["only_wall_clock_differs"] is True
    assert doc["outputs"]["contents"]["training_args.bin"]["changes"][0]["key"] == "logging_dir"


def test_the_suggested_volatile_line_silences_it(tmp_path):
    runs, da, db = trainer_pair(tmp_path)
    suggested = diff_runs(da, db).verdict.suggested_volatile
    from hermetic.record.outputs import volatile_paths

    for d in (da, db):
        rec = json.loads((d / "run.json").read_text())
        rec["outputs"]["volatile"] = volatile_paths(rec["outputs"]["files"], suggested)
        write_record(d, rec)
    v = diff_runs(da, db).verdict
    assert v.kind == "identical" and v.line == (
        "bitwise identical (2 files and 2 metrics compared: config.json, model.safetensors, accuracy, loss; "
        "3 files kept but not compared (run.outputs.volatile))")


def test_a_value_that_differs_is_named_and_stays_nondeterminism(tmp_path):
    runs, da, db = trainer_pair(tmp_path, eval_loss_b=2.3126)
    d = diff_runs(da, db)
    assert d.verdict.kind == "nondeterminism" and d.verdict.exit_code == 1
    assert d.verdict.suggested_volatile == []
    res = d.outputs.contents["all_results.json"]
    assert not res.wall_clock_only and res.real == 1
    assert res.summary().startswith("values differ: eval_loss 2.3125 -> 2.3126; timing fields differ: train_runtime")
    assert "1 of 5 files both runs wrote differ (all_results.json); 2 of 5 differ only in wall-clock fields" \
        in d.outputs.summary()
    r = hermetic("diff", str(da), str(db))
    assert r.returncode == 1
    assert "~ all_results.json  values differ: eval_loss 2.3125 -> 2.3126" in r.stdout


def test_same_seed_change_with_only_wall_clock_outputs_says_so(tmp_path):
    def other_seed(rec):
        rec["seed"].update(value=1, policy="cli")

    _, da, db = trainer_pair(tmp_path, plant_b=other_seed)
    v = diff_runs(da, db).verdict
    assert v.kind == "inputs" and v.exit_code == 1
    assert v.line == "inputs differ: seed (seed 0 -> 1); outputs identical all the same, wall-clock fields aside"
    assert v.notes[0].startswith("the seed did not change the outputs")


def test_a_pickle_is_read_without_unpickling(tmp_path):
    canary = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(canary),))

    data = pickle.dumps({"payload": Evil(), "logging_dir": "runs/x"}, protocol=4)
    tree = read_pickle(data)
    assert not canary.exists()
    assert tree == {"payload": f"posix.mkdir({str(canary)!r})", "logging_dir": "runs/x"}
    # and a class nobody can import is a name, nothing more
    data = pickle.dumps(TrainingArgs("out", "runs/y", 1e-3, 0), protocol=2).replace(
        b"test_verdicts_contents", b"no_such_module_zz_xx_1")
    tree = read_pickle(data)
    assert tree["__class__"] == "no_such_module_zz_xx_1.TrainingArgs" and tree["logging_dir"] == "runs/y"
    assert "no_such_module_zz_xx_1" not in sys.modules


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_every_pickle_protocol_names_the_field(protocol):
    a = pickle.dumps(TrainingArgs("out", "runs/Dec01_22-35-39_hermetic", 5e-4, 42), protocol=protocol)
    b = pickle.dumps(TrainingArgs("out", "runs/Dec01_22-36-02_hermetic", 5e-4, 43), protocol=protocol)
    changes = list(trees.diff_trees(read_pickle(a), read_pickle(b)))
    assert [(c.key, c.wall_clock) for c in changes] == [("logging_dir", "a time"), ("seed", "")]


def test_a_cycle_and_a_memo_bomb_stay_bounded(monkeypatch):
    loop: list = []
    loop.append(loop)
    assert read_pickle(pickle.dumps(loop)) == ["<cycle>"]
    shared = ["x" * 10]
    for _ in range(30):  # 2**30 leaves by reference, a few hundred bytes of pickle
        shared = [shared, shared]
    monkeypatch.setattr(pickles, "MAX_VALUES", 10_000)
    with pytest.raises(trees.Unreadable, match="more than 10000 values"):
        read_pickle(pickle.dumps(shared))


def _ops(value) -> bytes:
    """The opcodes that push ``value`` (protocol 2, no memo), to splice into a pickle written by hand."""
    return pickletools.optimize(pickle.dumps(value, protocol=2))[2:-1]


def _calls_pickle(logging_dir: str, calls: list[tuple[str, str, tuple]]) -> bytes:
    """``{"logging_dir": ..., "payload": [module.name(*args), ...]}``: each call a GLOBAL and a REDUCE, what a
    plain pickle.loads imports and runs."""
    payload = b"".join(b"c" + f"{module}\n{name}\n".encode() + _ops(args) + b"R" for module, name, args in calls)
    return (b"\x80\x02}(" + _ops("logging_dir") + _ops(logging_dir) + _ops("payload") + b"(" + payload + b"lu.")


def test_nothing_in_a_pickle_runs_or_is_imported(tmp_path, monkeypatch):
    marker = tmp_path / "RAN"
    # a module a plain pickle.loads would import (it is on the path): importing it writes the marker too
    (tmp_path / "hermetic_marker_zz.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef boom():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = [("os", "system", (f"touch {marker}",)),
             ("subprocess", "call", (["touch", str(marker)],)),
             ("builtins", "exec", (f"open({str(marker)!r}, 'w').close()",)),
             ("builtins", "eval", (f"open({str(marker)!r}, 'w').close()",)),
             ("hermetic_marker_zz", "boom", ())]
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"model.safetensors": WEIGHTS, "args.pkl": _calls_pickle("runs/Dec01_22-35-39_x", calls)})
    db = write_run(runs, B, {"model.safetensors": WEIGHTS, "args.pkl": _calls_pickle("runs/Dec01_22-41-07_x", calls)},
                   minutes=15)
    assert "hermetic_marker_zz" not in sys.modules
    d = diff_runs(da, db)
    assert not marker.exists()
    assert "hermetic_marker_zz" not in sys.modules
    # and the verdict is made all the same: only the time in logging_dir differs
    inside = d.outputs.contents["args.pkl"]
    assert inside.format == "pickle" and inside.wall_clock_only, inside
    assert d.verdict.kind == "wall_clock"
    assert read_pickle((da / "outputs" / "args.pkl").read_bytes())["payload"] == [
        f"os.system('touch {marker}')", f"subprocess.call(['touch', '{marker}'])",
        f"builtins.exec(\"open('{marker}', 'w').close()\")", f"builtins.eval(\"open('{marker}', 'w').close()\")",
        "hermetic_marker_zz.boom()"]
    assert not marker.exists()
    # the same bytes through a plain pickle.loads (another process) do run: the payload is live
    subprocess.run([sys.executable, "-c", "import pickle, sys; sys.path.insert(0, sys.argv[1]); "
                    "pickle.loads(open(sys.argv[2], 'rb').read())", str(tmp_path), str(da / "outputs" / "args.pkl")],
                   check=True, capture_output=True)
    assert marker.exists()


def test_every_opcode_that_would_build_or_call_is_recorded():
    # protocol 0/1's INST and OBJ, NEWOBJ_EX (protocol 4), BUILD with __dict__ and __slots__ state, SETITEMS
    # and APPENDS on what a call made: the names and arguments, nothing built
    assert read_pickle(b"(S'x'\nimymod\nKlass\n.") == "mymod.Klass('x')"
    assert read_pickle(b"(cmymod\nKlass\nS'x'\no.") == "mymod.Klass('x')"
    newobj_ex = b"\x80\x04\x8c\x05mymod\x8c\x05Klass\x93)}\x8c\x01b\x94K\x03s\x92}\x8c\x01z\x94K\x01sb."
    assert read_pickle(newobj_ex) == {"__class__": "mymod.Klass", "b": 3, "z": 1}
    slots = b"\x80\x02cmymod\nKlass\n)\x81N}X\x01\x00\x00\x00aK\x01s\x86b."
    assert read_pickle(slots) == {"__class__": "mymod.Klass", "a": 1}
    items = b"\x80\x02cmymod\nD\n)R(X\x01\x00\x00\x00kK\x01ucmymod\nL\n)R(K\x01K\x02e\x86."
    assert read_pickle(items) == [{"__class__": "mymod.D", "k": 1}, {"__class__": "mymod.L", "__items__": [1, 2]}]


@pytest.mark.parametrize("data, note", [
    # a tuple nested 200,000 deep as a dict key: hashing it would overflow the C stack
    (b"\x80\x04}" + b")" + b"\x85" * 200_000 + b"Ns.", "tuples nested more than 10000 deep"),
    (b"\x80\x04Nr\xff\xff\xff\xff.", "a malformed pickle (memo index 4294967295)"),  # a 64 GiB memo array
    (b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b"abc.", "not a readable pickle (expected 1099511627776"),
    (b"\x80\x02\x82\x01.", "pickle opcode EXT1 is not read"),  # copyreg's registry is the process's
    (b"\x80\x02cm\nf\n)R)\x81.", "a pickle this reader cannot rebuild (NEWOBJ class argument"),
    (b"\x80\x02K\x01)R.", "a pickle this reader cannot rebuild ('int' object is not callable)"),
    (b"\x80\x02h\x05.", "a malformed pickle (unknown memo)"),
    (b"\x80\x02(.", "an empty pickle"),
    (b"\x80\x02N", "not a readable pickle (pickle exhausted before seeing STOP)"),
])
def test_what_the_reader_refuses_is_named(data, note):
    with pytest.raises(trees.Unreadable) as e:
        read_pickle(data)
    assert str(e.value).startswith(note)


def test_opcodes_and_stand_ins_are_bounded(monkeypatch):
    monkeypatch.setattr(pickles, "MAX_PICKLE_OPS", 1000)
    with pytest.raises(trees.Unreadable, match="more than 1000 pickle opcodes"):
        read_pickle(pickle.dumps(list(range(2000)), protocol=0))
    monkeypatch.setattr(pickles, "MAX_GLOBALS", 10)
    many = b"\x80\x02(" + b"".join(b"cm\nf%d\n" % i for i in range(11)) + b"l."
    with pytest.raises(trees.Unreadable, match="more than 10 classes and functions"):
        read_pickle(many)


class FloatStorage:  # torch.FloatStorage, by name only once written
    pass


def _rebuild_tensor_v2(*args):  # torch._utils._rebuild_tensor_v2, by name only once written
    raise AssertionError("never called")


@dataclass(frozen=True)
class _Storage:
    key: str
    numel: int


class _Tensor:
    def __init__(self, storage: _Storage, offset: int, shape: tuple[int, int]):
        self.storage, self.offset, self.shape = storage, offset, shape

    def __reduce__(self):
        return _rebuild_tensor_v2, (self.storage, self.offset, self.shape, (self.shape[1], 1), False,
                                    collections.OrderedDict())


def _torch_checkpoint(storages: dict[str, bytes], shapes: dict[str, tuple[int, int]], saved_at: str) -> bytes:
    """What torch.save writes, by hand: a zip whose data.pkl (protocol 2) names each storage by a persistent id
    ("storage", torch.FloatStorage, key, location, numel), the storages beside it as data/<key>."""
    class Saver(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", FloatStorage, obj.key, "cpu", obj.numel) if isinstance(obj, _Storage) else None

    state = collections.OrderedDict((name, _Tensor(_Storage(str(i), 6), 0, shape))
                                    for i, (name, shape) in enumerate(shapes.items()))
    buf = io.BytesIO()
    Saver(buf, protocol=2).dump({"state_dict": state, "epoch": 3, "saved_at": saved_at})
    pkl = buf.getvalue()
    for name, module in ((b"_rebuild_tensor_v2", b"torch._utils"), (b"FloatStorage", b"torch")):
        pkl = pkl.replace(b"c" + __name__.encode() + b"\n" + name + b"\n", b"c" + module + b"\n" + name + b"\n")
    assert __name__.encode() not in pkl
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        for key, data in storages.items():
            zf.writestr(f"archive/data/{key}", data)
        zf.writestr("archive/version", b"3\n")
    return out.getvalue()


def test_a_torch_checkpoint_with_persistent_ids_is_compared_inside(tmp_path):
    storages = {"0": b"\x00" * 24, "1": b"\x01" * 24}
    shapes = {"weight": (2, 3), "bias": (1, 6)}
    ckpt = _torch_checkpoint(storages, shapes, "2026-11-29 21:45:00")
    tree = read_pickle(zipfile.ZipFile(io.BytesIO(ckpt)).read("archive/data.pkl"))
    assert tree["state_dict"] == {
        "__class__": "collections.OrderedDict",
        "weight": "torch._utils._rebuild_tensor_v2(<persistent ('storage', torch.FloatStorage, '0', 'cpu', 6)>, "
                  "0, (2, 3), (3, 1), False, collections.OrderedDict())",
        "bias": "torch._utils._rebuild_tensor_v2(<persistent ('storage', torch.FloatStorage, '1', 'cpu', 6)>, "
                "0, (1, 6), (6, 1), False, collections.OrderedDict())"}
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"model.pt": ckpt})
    db = write_run(runs, B, {"model.pt": _torch_checkpoint(storages, shapes, "2026-11-29 22:01:13")}, minutes=15)
    d = diff_runs(da, db)
    inside = d.outputs.contents["model.pt"]
    assert inside.format == "torch archive" and inside.wall_clock_only, inside
    assert [c.key for c in inside.changes] == ["<data.pkl>.saved_at"] and d.verdict.kind == "wall_clock"
    # a storage's bytes, or a tensor's shape over the same bytes: the computation, never the clock
    for i, (other_storages, other_shapes, says) in enumerate((
            ({**storages, "1": b"\x02" * 24}, shapes, "values differ: <data/1> sha256:"),
            (storages, {**shapes, "bias": (2, 3)}, "values differ: <data.pkl>.state_dict.bias torch._utils."))):
        dc = write_run(tmp_path / f"other{i}", B, {"model.pt": _torch_checkpoint(other_storages, other_shapes,
                                                                                 "2026-11-29 21:45:00")})
        d = diff_runs(da, dc)
        assert d.verdict.kind == "nondeterminism" and d.outputs.contents["model.pt"].real == 1
        assert d.outputs.contents["model.pt"].summary().startswith(says), d.outputs.contents["model.pt"].summary()


def _torch_like_archive(logging_dir: str, serialization_id: str, storage: bytes = b"\x00" * 64) -> bytes:
    """The layout torch.save writes (a zip: <name>/data.pkl, version, a storage, .data/serialization_id)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("training_args/data.pkl", pickle.dumps(TrainingArgs("out", logging_dir, 5e-4, 42), protocol=2))
        zf.writestr("training_args/data/0", storage)
        zf.writestr("training_args/version", b"3\n")
        zf.writestr("training_args/.data/serialization_id", serialization_id)
    return buf.getvalue()


def test_a_torch_save_archive_is_compared_inside(tmp_path):
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"model.pt": WEIGHTS, "training_args.bin": _torch_like_archive(
        "runs/Dec01_22-35-39_hermetic", "1234")})
    db = write_run(runs, B, {"model.pt": WEIGHTS, "training_args.bin": _torch_like_archive(
        "runs/Dec01_22-41-07_hermetic", "5678")}, minutes=15)
    d = diff_runs(da, db)
    inside = d.outputs.contents["training_args.bin"]
    assert inside.format == "torch archive" and inside.wall_clock_only, inside
    assert [c.key for c in inside.changes] == ["<data.pkl>.logging_dir"]
    assert d.verdict.kind == "wall_clock"
    assert d.verdict.line.startswith("identical except wall-clock fields: 1 file bitwise identical (model.pt); "
                                     "in 1 file only timing fields differ (logging_dir)")
    # a storage that differs is the computation, not the clock
    archive = _torch_like_archive("runs/Dec01_22-41-07_hermetic", "5678", b"\x01" * 64)
    (db / "outputs" / "training_args.bin").write_bytes(archive)
    rec = json.loads((db / "run.json").read_text())
    rec["outputs"]["files"]["training_args.bin"] = {"sha256": hashlib.sha256(archive).hexdigest(),
                                                    "size": len(archive)}
    write_record(db, rec)
    d = diff_runs(da, db)
    assert d.verdict.kind == "nondeterminism"
    assert "values differ: <data/0> sha256:" in d.outputs.contents["training_args.bin"].summary()


def test_yaml_jsonl_and_what_cannot_be_read(tmp_path):
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"hparams.yaml": b"lr: 0.001\nstarted: 2026-11-29 21:45:00\n",
                             "log.jsonl": b'{"step": 1, "loss": 0.5, "time": 1796123715.25}\n',
                             "broken.json": b'{"a": 1', "blob.bin": b"\x00\x01binary"})
    db = write_run(runs, B, {"hparams.yaml": b"lr: 0.001\nstarted: 2026-11-29 22:01:13\n",
                             "log.jsonl": b'{"step": 1, "loss": 0.5, "time": 1796124673.5}\n',
                             "broken.json": b'{"a": 2', "blob.bin": b"\x00\x02binary"}, minutes=15)
    d = diff_runs(da, db)
    inside = d.outputs.contents
    assert inside["hparams.yaml"].wall_names == ("started (a time in its value)",)  # a YAML timestamp
    assert inside["log.jsonl"].wall_clock_only and inside["log.jsonl"].wall_names == ("time",)
    assert inside["broken.json"].note.startswith("not valid JSON")
    assert inside["blob.bin"].note == "not a pickle"
    assert d.verdict.kind == "nondeterminism"  # two files could only be compared as bytes
    assert "~ broken.json  compared as bytes: not valid JSON" in hermetic("diff", str(da), str(db)).stdout


def test_malformed_files_are_compared_as_bytes_with_a_note(tmp_path):
    good = pickle.dumps({"a": 1}, protocol=4)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x/data.pkl", good)
        zf.writestr("x/data/0", b"\0" * 500)
    archive = bytearray(buf.getvalue())
    archive[archive.index(b"x/data/0") + 12] ^= 0xFF  # inside the deflated storage
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"t.pkl": good[:-5], "z.pt": bytes(archive), "h.yaml": b"when: 2026-13-45\n"})
    db = write_run(runs, B, {"t.pkl": good[:-4], "z.pt": buf.getvalue(), "h.yaml": b"when: 2026-11-29\n"},
                   minutes=15)
    inside = diff_runs(da, db).outputs.contents
    assert inside["t.pkl"].note.startswith(("not a readable pickle", "a pickle without STOP"))
    assert inside["z.pt"].note.startswith("not a readable zip archive")
    assert inside["h.yaml"].note.startswith("not valid YAML")


def test_only_regular_small_files_are_read_and_links_never_followed(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    secret = tmp_path / "host-secret.json"
    secret.write_text('{"token": "host"}')
    da = write_run(runs, A, {"a.json": b'{"x": 1}', "big.json": b'{"x": "' + b"1" * 200 + b'"}'})
    db = write_run(runs, B, {"a.json": b'{"x": 2}', "big.json": b'{"x": "' + b"2" * 200 + b'"}'}, minutes=15)
    files_a = json.loads((da / "run.json").read_text())["outputs"]["files"]
    files_b = json.loads((db / "run.json").read_text())["outputs"]["files"]
    # a link put where B's file was (after its record was sealed): refused, never followed
    os.unlink(db / "outputs" / "a.json")
    os.symlink(secret, db / "outputs" / "a.json")
    monkeypatch.setattr(contents, "MAX_CONTENT_BYTES", 100)
    out = compare_contents(da, db, files_a, files_b, ["a.json", "big.json", "weights.safetensors"])
    assert out["a.json"].note.startswith("run B: ") and "link" in out["a.json"].note
    assert not out["a.json"].changes
    assert out["big.json"].note == "larger than 0 MiB"  # the record's size says so: not opened at all
    assert "weights.safetensors" not in out  # neither JSON, YAML nor a pickle: bytes only


def test_a_file_that_is_not_what_its_record_says_is_compared_as_bytes(tmp_path):
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"a.json": b'{"x": 1}'})
    db = write_run(runs, B, {"a.json": b'{"x": 2}'}, minutes=15)
    files_a = json.loads((da / "run.json").read_text())["outputs"]["files"]
    files_b = json.loads((db / "run.json").read_text())["outputs"]["files"]
    (db / "outputs" / "a.json").write_bytes(b'{"x": 3}')
    out = compare_contents(da, db, files_a, files_b, ["a.json"])
    assert out["a.json"].note == "run B's copy is not what its record says"


def test_a_yaml_alias_bomb_is_bounded(tmp_path, monkeypatch):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    runs = tmp_path / "runs"
    da = write_run(runs, A, {"b.yaml": bomb.encode()})
    db = write_run(runs, B, {"b.yaml": bomb.replace("[x,", "[y,").encode()}, minutes=15)
    monkeypatch.setattr(trees, "MAX_VALUES", 50_000)
    d = diff_runs(da, db)
    assert d.outputs.contents["b.yaml"].note == "more than 50000 values"


def test_unpaired_files_beside_wall_clock_ones(tmp_path):
    runs = tmp_path / "runs"
    files = {"model.safetensors": WEIGHTS}
    da = write_run(runs, A, {**files, "out.log.0a1b": b"x", "res.json": b'{"train_runtime": 1.5}'})
    db = write_run(runs, B, {**files, "out.log.9f8e": b"x", "res.json": b'{"train_runtime": 1.75}'}, minutes=15)
    v = diff_runs(da, db).verdict
    assert v.kind == "nondeterminism" and "knobs" not in v.line
    assert v.line == ("same inputs, outputs differ: 2 files are in one run only (out.log.0a1b in A, out.log.9f8e in "
                      "B); the 1 file both runs wrote is identical (model.safetensors), 1 more differs only in "
                      "wall-clock fields (res.json); all 2 metrics equal")


def test_a_timing_metric_is_wall_clock(tmp_path):
    def slower(rec):
        rec["metrics"]["final"]["train_runtime"] = 13.5

    def faster(rec):
        rec["metrics"]["final"]["train_runtime"] = 12.25

    runs = tmp_path / "runs"
    da = write_run(runs, A, {"model.safetensors": WEIGHTS}, plant=faster)
    db = write_run(runs, B, {"model.safetensors": WEIGHTS}, minutes=15, plant=slower)
    v = diff_runs(da, db).verdict
    assert v.kind == "wall_clock" and v.exit_code == 0
    assert v.line == ("identical except wall-clock fields: 1 file bitwise identical (model.safetensors); "
                      "2 metrics equal, timing metrics aside (train_runtime)")


def test_none_compared_byte_for_byte_is_said_so(tmp_path):
    from hermetic.diff import diff_records

    a, b = synthetic_record(A), synthetic_record(B)
    a["outputs"]["files"] = {f"a{i}.log": {"sha256": h(f"a{i}"), "size": 1} for i in range(4)}
    b["outputs"]["files"] = {f"b{i}.log": {"sha256": h(f"b{i}"), "size": 1} for i in range(4)}
    d = diff_records(a, b)
    assert "8 files in one run only (4 in A, 4 in B), none in both runs to compare byte for byte" in \
        d.outputs.summary()
    assert "of 8" not in d.outputs.summary()
    assert "none is in both runs, so nothing was compared byte for byte" in d.verdict.line


def test_kept_but_not_compared_is_counted_per_run():
    from hermetic.diff import diff_records

    a, b = synthetic_record(A), synthetic_record(B)
    for rec, tag in ((a, "a"), (b, "b")):
        logs = {f"events.out.tfevents.{tag}{i}": {"sha256": h(f"{tag}{i}"), "size": 1} for i in range(3)}
        rec["outputs"]["files"].update(logs)
        rec["outputs"]["volatile"] = sorted(logs)
    d = diff_records(a, b)
    assert d.verdict.line.endswith("; 3 files in each run kept but not compared (run.outputs.volatile))")
    b["outputs"]["files"].pop("events.out.tfevents.b2")
    b["outputs"]["volatile"].remove("events.out.tfevents.b2")
    assert diff_records(a, b).verdict.line.endswith(
        "; files kept but not compared: 3 in A, 2 in B (run.outputs.volatile))")


# --- on the real engine ---------------------------------------------------------------------------

# What Hugging Face's Trainer leaves, from a plain numpy script: the same weights every run, its duration and
# throughput in JSON, its settings pickled with the start time and the host name in logging_dir.
TRAINER_LIKE = '''import json, os, pickle, socket, time
from dataclasses import dataclass

import numpy as np

@dataclass
class TrainingArguments:
    output_dir: str
    logging_dir: str
    seed: int

t0 = time.time()
os.makedirs("out/checkpoint-2", exist_ok=True)
rng = np.random.default_rng(1234)
w = rng.standard_normal(64).astype(np.float32)
for d in ("out", "out/checkpoint-2"):
    with open(f"{d}/model.safetensors", "wb") as f:
        f.write(w.tobytes())
time.sleep(0.05)
runtime = time.time() - t0
stamp = time.strftime("%b%d_%H-%M-%S", time.localtime(t0))
args = TrainingArguments("out", f"out/runs/{stamp}_{socket.gethostname()}", 42)
for d in ("out", "out/checkpoint-2"):
    with open(f"{d}/training_args.bin", "wb") as f:
        pickle.dump(args, f, protocol=2)
    with open(f"{d}/trainer_state.json", "w") as f:
        json.dump({"global_step": 2, "log_history": [{"loss": float(w.sum()), "step": 2},
                   {"step": 2, "train_runtime": runtime, "train_samples_per_second": 8 / runtime}]}, f, indent=2)
with open("out/all_results.json", "w") as f:
    json.dump({"epoch": 1.0, "train_loss": float(w.mean()), "train_runtime": runtime,
               "train_samples_per_second": 8 / runtime}, f, indent=2)
with open("out/host.txt", "w") as f:
    f.write(socket.gethostname() + "\\n" + os.environ.get("HOSTNAME", "") + "\\n")
'''


@pytest.mark.docker
def test_a_trainer_like_rerun_is_identical_except_wall_clock_fields(project):
    from conftest import run_cli
    from run_support import hermetic_run, run_dir_of

    (project / "trainer_like.py").write_text(TRAINER_LIKE)
    _, a = hermetic_run(project, "trainer_like.py")
    # a second apart at least, as two training runs are: the Trainer names its logging_dir by the second
    time.sleep(1.0 - time.time() % 1.0 + 0.01)
    _, b = hermetic_run(project, "trainer_like.py")
    da, db = run_dir_of(project, a), run_dir_of(project, b)
    # the container's host name is fixed and recorded: what names files by host names them alike
    assert a["invocation"]["hostname"] == b["invocation"]["hostname"] == "hermetic"
    assert (da / "outputs" / "out/host.txt").read_text() == "hermetic\nhermetic\n"
    assert a["outputs"]["files"]["out/host.txt"] == b["outputs"]["files"]["out/host.txt"]
    assert "--hostname hermetic" in (da / "README.md").read_text()  # the by-hand command says so too
    proc = run_cli("diff", str(da), str(db))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    line = proc.stdout.splitlines()[0]
    assert line.startswith("identical except wall-clock fields: 3 files bitwise identical (out/checkpoint-2/"
                           "model.safetensors, out/model.safetensors, out/host.txt); in 5 files only timing fields "
                           "differ (train_runtime, train_samples_per_second, logging_dir)"), line
    assert "nondeterminism" not in proc.stdout
    proc = run_cli("diff", "--json", str(da), str(db))
    doc = json.loads(proc.stdout)
    assert doc["verdict"]["kind"] == "wall_clock" and doc["verdict"]["exit_code"] == 0
    assert doc["outputs"]["contents"]["out/training_args.bin"]["wall_names"] == ["logging_dir (a time in its value)"]
    suggested = doc["verdict"]["suggested_volatile"]
    # the default kept first; one name in several directories folded into one glob, the weights never matched
    assert suggested == ["**/events.out.tfevents.*", "out/**/trainer_state.json", "out/**/training_args.bin",
                         "out/all_results.json"]
    assert f"volatile: {json.dumps(suggested)}" in doc["verdict"]["notes"][0]
    # the offered line, put in hermetic.yaml, makes the next pair bitwise identical
    cfg = project / "hermetic.yaml"
    cfg.write_text(cfg.read_text() + f"run:\n  outputs:\n    volatile: {json.dumps(suggested)}\n")
    _, c = hermetic_run(project, "trainer_like.py")
    _, e = hermetic_run(project, "trainer_like.py")
    proc = run_cli("diff", str(run_dir_of(project, c)), str(run_dir_of(project, e)))
    assert proc.returncode == 0, proc.stdout
    # the metrics read from trainer_state.json (its log_history) are compared, its timing fields left out
    assert proc.stdout.startswith("bitwise identical (3 files and 3 metrics compared: "), proc.stdout
    # and the earlier run against this one: the config change steers the comparison only, no cause
    proc = run_cli("diff", str(db), str(run_dir_of(project, e)))
    assert proc.returncode == 0 and proc.stdout.startswith("bitwise identical (3 files and 3 metrics compared: "), \
        proc.stdout


class _LongKey:  # a dict key whose text is too long to keep: named by a hash of its rendering
    def __init__(self, text: str) -> None:
        self.text = text

    def __hash__(self) -> int:
        return hash(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LongKey) and other.text == self.text

    def __reduce__(self):
        return (_LongKey, (self.text,))


def test_a_key_too_long_to_keep_reads_the_same_every_time():
    """Its hash is of a rendering with no object address in it: one pickle read twice is one tree (before,
    two reads of the same bytes named the key differently, and diff said the file changed)."""
    data = pickle.dumps({_LongKey("x" * 20_000): 1, _LongKey("y" * 20_000): 2})
    first, again = read_pickle(data), read_pickle(data)
    assert first == again and len(first) == 2 and all(k.startswith("<key ") for k in first)
