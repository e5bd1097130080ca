"""A pickle read as a structure without running it: ``pickle.Unpickler`` with every global a name.

``find_class`` returns stand-ins holding only the dotted name (Python docs, pickle, "Restricting Globals");
calls, BUILD state and SETITEMS/APPENDS are recorded on ``_Obj``s, never done. ``_scan`` walks the opcodes
first and bounds what the unpickler takes on trust (MAX_PICKLE_OPS, arguments complete, memo indexes, MARKs,
MAX_TUPLE_NESTING, no EXT codes, MAX_GLOBALS); ``_plain`` turns the result into dicts, lists and scalars
(MAX_VALUES nodes, MAX_DEPTH deep).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import pickle
import reprlib
import pickletools
from typing import Any, Callable, Iterable

from hermetic.diff.trees import MAX_DEPTH, MAX_VALUES, Unreadable
from hermetic.core.display import escape_controls

MAX_PICKLE_OPS = 4_000_000
MAX_TUPLE_NESTING = 10_000  # far below the ~100,000 at which hashing a nested tuple overflows the C stack
MAX_GLOBALS = 10_000  # distinct classes and functions one pickle names (each stand-in is a class, ~2 KB)

# What the unpickler raises on a pickle that parses but does not hold together (a SETITEM on a list, an odd
# DICT, an unhashable key) or that needs what a stand-in is not (NEWOBJ on a class the pickle builds itself,
# as cloudpickle writes one): compared as bytes.
_MALFORMED = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, LookupError, OverflowError)


def read_pickle(data: bytes) -> Any:
    """The structure a pickle describes, as plain data (the module's docstring says how), with nothing of
    it imported or called; Unreadable for what is not a pickle this reader takes."""
    _scan(data)
    try:
        root = _Reader(data).load()
    except _MALFORMED as e:
        why = escape_controls(str(e) or type(e).__name__, 80)
        raise Unreadable(f"a pickle this reader cannot rebuild ({why})") from None
    return _plain(root)


# ---------------------------------------------------------------- the opcodes, checked first


def _scan(data: bytes) -> None:
    """The bounds the module's docstring lists, checked on the opcodes alone; Unreadable naming the first
    one broken."""
    depths: list[int] = []  # the stack: per slot, how deeply tuples nest in it (0: not a tuple)
    marks: list[int] = []  # where the items of each open MARK start
    memo: dict[int, int] = {}
    try:
        for n, (op, arg, _pos) in enumerate(pickletools.genops(data), 1):
            if n > MAX_PICKLE_OPS:
                raise Unreadable(f"more than {MAX_PICKLE_OPS} pickle opcodes")
            name = op.name
            if name in _SPECIAL:
                if name == "STOP":
                    if len(depths) == (marks[-1] if marks else 0):
                        raise Unreadable("an empty pickle")
                    return
                _special(name, arg, depths, marks, memo)
                continue
            takes_mark, under, leaves = _EFFECTS[name]
            if takes_mark:
                if not marks:
                    raise Unreadable("a malformed pickle (no MARK)")
                del depths[marks.pop():]
            if under:
                if len(depths) - under < (marks[-1] if marks else 0):
                    raise Unreadable("a malformed pickle (short stack)")
                del depths[-under:]
            if leaves:  # one: every opcode that leaves more is in _SPECIAL
                depths.append(0)  # nothing but a tuple nests tuples, and hashing nothing else recurses
    except ValueError as e:  # genops: a truncated or corrupt pickle, an unknown opcode
        raise Unreadable(f"not a readable pickle ({str(e)[:80]})") from None
    raise Unreadable("a pickle without STOP")


# Per opcode, its effect on the stack (pickletools' stack_before and stack_after): whether it takes the items
# down to the last MARK, how many items under those (or under the top) it takes, how many it leaves.
_EFFECTS = {op.name: (pickletools.markobject in op.stack_before,
                      op.stack_before.index(pickletools.markobject) if pickletools.markobject in op.stack_before
                      else len(op.stack_before),
                      len(op.stack_after)) for op in pickletools.opcodes}
_SPECIAL = frozenset({"STOP", "MARK", "POP", "DUP", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET",
                      "LONG_BINGET", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EXT1", "EXT2", "EXT4"})


def _special(name: str, arg: Any, depths: list[int], marks: list[int], memo: dict[int, int]) -> None:
    """The opcodes that mark, copy, remember or nest (and the refused ones), as the unpickler applies them:
    nothing under the last MARK is reached but by an opcode that takes the MARK."""
    fence = marks[-1] if marks else 0
    if name in ("EXT1", "EXT2", "EXT4"):
        raise Unreadable(f"pickle opcode {name} is not read")
    if name == "MARK":
        marks.append(len(depths))
    elif name == "POP" and marks and len(depths) == fence:  # POP of a MARK
        marks.pop()
    elif name in ("GET", "BINGET", "LONG_BINGET"):
        if arg not in memo:
            raise Unreadable("a malformed pickle (unknown memo)")
        depths.append(memo[arg])
    elif len(depths) == fence and name != "EMPTY_TUPLE" and name != "TUPLE":
        raise Unreadable("a malformed pickle (empty stack)")
    elif name == "POP":
        depths.pop()
    elif name == "DUP":
        depths.append(depths[-1])
    elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
        index = len(memo) if name == "MEMOIZE" else arg
        if index > MAX_PICKLE_OPS:
            raise Unreadable(f"a malformed pickle (memo index {index})")
        memo[index] = depths[-1]
    else:  # a tuple: one deeper than the deepest it takes
        if name == "TUPLE":
            if not marks:
                raise Unreadable("a malformed pickle (no MARK)")
            taken = depths[marks.pop():]
        else:
            under = _EFFECTS[name][1]
            if len(depths) - under < fence:
                raise Unreadable("a malformed pickle (short stack)")
            taken = depths[len(depths) - under:]
        del depths[len(depths) - len(taken):]
        depth = max(taken, default=0) + 1
        if depth > MAX_TUPLE_NESTING:
            raise Unreadable(f"tuples nested more than {MAX_TUPLE_NESTING} deep")
        depths.append(depth)


# ---------------------------------------------------------------- the unpickler and its stand-ins


class _Reader(pickle.Unpickler):
    """The stdlib's unpickler with every global a stand-in and every persistent id a _Persistent."""

    def __init__(self, data: bytes):
        # latin1: a Python 2 str becomes text, as pickletools reads it; out-of-band buffers are not in a file
        super().__init__(io.BytesIO(data), fix_imports=False, encoding="latin1",
                         buffers=itertools.repeat(_OUT_OF_BAND))
        self._standins: dict[tuple[str, str], _Global] = {}

    def find_class(self, module: str, name: str) -> Any:
        standin = self._standins.get((module, name))
        if standin is None:
            if len(self._standins) >= MAX_GLOBALS:
                raise Unreadable(f"more than {MAX_GLOBALS} classes and functions named in the pickle")
            standin = _Global("standin", (_Standin,), {"module": module, "name": name})
            self._standins[module, name] = standin
        return standin

    def persistent_load(self, pid: Any) -> Any:
        return _Persistent(pid)


class _Global(type):
    """The metaclass of what ``find_class`` returns: a class (NEWOBJ takes nothing else) standing for the
    pickle's ``module.name``; calling it (REDUCE, INST, OBJ) records the call, BUILD on it is dropped."""

    module: str
    name: str

    def __call__(cls, *args: Any) -> _Obj:
        # copyreg._reconstructor(cls, base, state): how protocol 0/1 pickles an instance; the class is what matters
        if (cls.module, cls.name) == ("copyreg", "_reconstructor") and args:
            return _Obj(args[0], ())
        return _Obj(cls, args)

    def __setstate__(cls, state: Any) -> None:
        pass

    def __str__(cls) -> str:
        return f"{cls.module}.{cls.name}" if cls.module else cls.name


class _Standin:
    """The base of every stand-in class: its ``__new__`` (NEWOBJ, NEWOBJ_EX; INST and OBJ without
    arguments) records the call too."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> _Obj:  # type: ignore[misc]
        return _Obj(cls, args, [kwargs] if kwargs else [])


class _Inert:
    """A value the reader made, as the unpickler may use it: called (REDUCE), it records the call; BUILD's
    state is dropped (an _Obj keeps it)."""

    __slots__ = ()

    def __call__(self, *args: Any) -> _Obj:
        return _Obj(self, args)

    def __setstate__(self, state: Any) -> None:
        pass


class _Obj(_Inert):
    """What REDUCE, NEWOBJ, OBJ or INST would have made: the callable's stand-in and its arguments, the
    state BUILD would have set, the items SETITEMS/APPENDS would have added. Nothing is called."""

    __slots__ = ("cls", "args", "states", "items", "appended")

    def __init__(self, cls: Any, args: tuple[Any, ...] = (), states: list[Any] | None = None):
        self.cls = cls
        self.args = args
        self.states: list[Any] = states if states is not None else []  # one per BUILD
        self.items: dict[Any, Any] = {}
        self.appended: list[Any] = []

    def __setstate__(self, state: Any) -> None:
        self.states.append(state)

    @reprlib.recursive_repr("<cycle>")
    def __repr__(self) -> str:  # no address: a key's text (``_key``) is the same at every read
        return f"<{self.cls!r}{self.args!r} {self.states!r} {self.items!r} {self.appended!r}>"

    def __setitem__(self, key: Any, value: Any) -> None:  # SETITEMS on a dict subclass (OrderedDict)
        self.items[_key(key)] = value

    def append(self, value: Any) -> None:
        self.appended.append(value)

    def extend(self, values: list[Any]) -> None:  # APPEND(S) on a list subclass
        self.appended.extend(values)


class _Persistent(_Inert):
    __slots__ = ("pid",)

    def __init__(self, pid: Any):
        self.pid = pid

    def __repr__(self) -> str:
        return f"<persistent {self.pid!r}>"


class _OutOfBand(bytes):
    """What NEXT_BUFFER reads: a pickle's out-of-band buffers are not in its file (bytes: READONLY_BUFFER
    takes a buffer)."""

    __slots__ = ()


_OUT_OF_BAND = _OutOfBand(b"<out-of-band buffer>")


def _scalar(x: Any) -> Any:
    """The value a buffer stands for: the out-of-band mark as text, READONLY_BUFFER's view as its bytearray."""
    if isinstance(x, _OutOfBand):
        return "<out-of-band buffer>"
    return bytearray(x) if isinstance(x, memoryview) else x


# ---------------------------------------------------------------- what was read, as plain data


def _key(k: Any) -> Any:
    k = _scalar(k)
    if isinstance(k, (str, int, float, bool, bytes)) or k is None:
        return k
    return _exact(k, 10_000) or f"<key {hashlib.sha256(repr(k).encode()).hexdigest()[:16]}>"


class _TooLong(Exception):
    pass


def _exact(node: Any, limit: int = 200) -> str | None:
    """The exact text of a node that stands for a value (an enum member, a class, a persistent id, a key),
    or None when it would be longer than ``limit``: two different nodes never get the same text (a set's
    members in sorted order, whatever order the pickle holds them in)."""
    size = 0

    def put(text: str) -> str:
        nonlocal size
        size += len(text)
        if size > limit:
            raise _TooLong
        return text

    def joined(left: str, items: Iterable[str], right: str) -> str:  # each item counted as it was made
        out = put(left)
        for i, item in enumerate(items):
            out += (put(", ") if i else "") + item
        return out + put(right)

    def emit(x: Any, depth: int) -> str:
        if depth > 8:
            raise _TooLong
        if isinstance(x, _Global):
            return put(str(x))
        if isinstance(x, _Obj):
            if x.states or x.items or x.appended:
                raise _TooLong
            return emit(x.cls, depth + 1) + joined("(", (emit(a, depth + 1) for a in _as_tuple(x.args)), ")")
        if isinstance(x, _Persistent):
            return put("<persistent ") + emit(x.pid, depth + 1) + put(">")
        if isinstance(x, (set, frozenset)):
            return joined("{", sorted([emit(a, depth + 1) for a in x]), "}")
        if isinstance(x, (list, tuple)):
            brackets = "()" if isinstance(x, tuple) else "[]"
            return joined(brackets[0], (emit(a, depth + 1) for a in x), brackets[1])
        if isinstance(x, dict):  # a key as the dict holds it: its text when it is not a scalar
            return joined("{", (emit(_key(k), depth + 1) + put(": ") + emit(v, depth + 1) for k, v in x.items()), "}")
        if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
            return put(f"0x{x:x}" if x.bit_length() < 4 * limit else "?" * (limit + 1))
        return put(repr(_scalar(x)))

    try:
        return emit(node, 0)
    except _TooLong:
        return None


def _as_tuple(args: Any) -> tuple[Any, ...]:
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


def _plain(root: Any) -> Any:
    """What was read as plain, comparable data: no cycles (a container met again on its own path is
    ``<cycle>``), at most MAX_VALUES nodes, MAX_DEPTH deep."""
    budget = [MAX_VALUES]
    on_path: set[int] = set()

    def conv(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise Unreadable(f"more than {MAX_VALUES} values in the pickle")
        if isinstance(node, (str, int, float, bool, bytes, bytearray, memoryview)) or node is None:
            node = _scalar(node)
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
            if isinstance(node, (set, frozenset)):
                return sorted((conv(x, depth + 1) for x in node), key=repr)
            if isinstance(node, dict):
                return {_key_text(_key(k)): conv(v, depth + 1) for k, v in node.items()}
            if isinstance(node, _Obj):
                return _plain_obj(node, lambda x: conv(x, depth + 1))
            return repr(node)
        finally:
            on_path.discard(id(node))

    return conv(root, 0)


def _key_text(k: Any) -> str:
    return k if isinstance(k, str) else repr(k)


def _plain_obj(node: _Obj, conv: Callable[[Any], Any]) -> Any:
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
                    out[_key_text(_key(k))] = conv(v)
            elif part is not None:
                out["__state__"] = conv(part)
    for k, v in node.items.items():  # a dict subclass (OrderedDict: a state_dict): its items as keys
        key = _key_text(k)
        out[key if key not in out else f"[{key}]"] = conv(v)
    if node.appended:
        out["__items__"] = conv(node.appended)
    return out
