"""Seeding for scripts that never seed, at interpreter start; the training process's final state, at exit.

In the image this file is ``_hermetic_startup`` in the venv's site-packages,
imported at every interpreter start by ``hermetic-runtime.pth`` beside it.
It does nothing unless $HERMETIC_SEED is set (``hermetic run`` sets it;
the probe, pip and a plain ``docker run`` do not) or when
$HERMETIC_STARTUP_SEEDING is ``0``.

Nothing is imported eagerly: an import hook seeds Python's ``random``
(``random.seed``), numpy's global RNG (``numpy.random.seed``) and torch's
default generators (``torch.manual_seed``) right after their own first
import, so a script that never imports numpy pays nothing for it. For numpy
that is ``numpy.random``'s import: numpy 2 imports it lazily, on the first
``np.random`` attribute, and seeding at ``import numpy`` would import it for
every script that never draws (~10 ms), while nothing can draw from the
global RNG before its module exists (numpy 1.x imports it with numpy). And a
script's own seeding, which comes later, still wins.

The hook reacts to a module being *executed*, not to it being looked up: a
library that probes with ``importlib.util.find_spec("torch")`` before
importing it (``datasets`` does) gets a spec whose loader seeds, and the real
import, which asks again, gets one too; whichever runs seeds, once.

``random.seed`` and ``numpy.random.seed`` are wrapped so that the last seed
given to them is known at exit (torch keeps its own: ``torch.initial_seed()``):
for ``random``, the seed CPython applied (``random_seed_label``), which differs
by version for a value of another type than None, int, float, str, bytes or
bytearray: Python 3.10 seeds with its hash (deprecated since 3.9, and noted
so), 3.11+ raise TypeError (nothing noted).
At exit the main process writes into the runtime report what was seeded
(``startup``) and ``final``: the seed each generator ended with and a digest
of its state (``final.seeds``, so a script that reseeds, as Hugging Face's
``set_seed`` and Lightning's ``seed_everything`` do, is recorded as such)
and, when torch was imported, the determinism state it ended with, noting
every flag changed after ``enable_determinism()``.

Standard library only, Python 3.8+, and cheap: it runs before every script.
"""

import os
import sys

SEED_ENV = "HERMETIC_SEED"
SWITCH_ENV = "HERMETIC_STARTUP_SEEDING"
TARGETS = ("random", "numpy.random", "torch")  # modules watched
LABELS = {"numpy.random": "numpy"}  # what the record calls them
SEED_MAX = 2**32 - 1
# What random.seed takes. Python 3.10 seeds with the hash of anything else (with a DeprecationWarning);
# 3.11+ raise TypeError.
RANDOM_SEED_TYPES = (type(None), int, float, str, bytes, bytearray)


def _seed_value():
    text = os.environ.get(SEED_ENV)
    if text is None or os.environ.get(SWITCH_ENV, "1") == "0":
        return None
    try:
        value = int(text)
    except ValueError:
        return None  # hermetic_runtime names the bad value when the script asks for the seed
    return value if 0 <= value <= SEED_MAX else None


def seed_module(name, module, seed):
    """Seed one freshly imported module's global generator."""
    if name == "random":
        module.seed(seed)
    elif name == "numpy.random":
        module.seed(seed)
    elif name == "torch":
        module.manual_seed(seed)  # the CPU generator and, lazily, every CUDA device's


def seed_label(value):
    """What a seed call was given, as the record keeps it: an int, ``entropy`` (None: the OS's randomness),
    else the argument's type (a str, bytes, an array of ints)."""
    if value is None:
        return "entropy"
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    index = getattr(value, "__index__", None)  # numpy integers
    if index is not None:
        try:
            return int(index())
        except Exception:
            pass
    return "a %s" % type(value).__name__


def random_seed_label(value):
    """What ``random.seed(value)`` applied, as the record keeps it: an int without its sign (random.seed
    drops it), ``hash N of a <type>`` for a value CPython seeds with its hash (N, as the unsigned
    machine word it uses: a float; on Python 3.10 anything else it was given, marked ``(deprecated)``),
    else ``seed_label``'s."""
    if isinstance(value, int):  # bool too
        return abs(int(value))
    if isinstance(value, float) or not isinstance(value, RANDOM_SEED_TYPES):
        note = "" if isinstance(value, float) else " (deprecated)"
        return "hash %d of a %s%s" % (hash(value) & (sys.maxsize * 2 + 1), type(value).__name__, note)
    return seed_label(value)


class _RecordingSeed:
    """``module.seed`` in place of the original: calls it, then notes the seed it applied."""

    def __init__(self, module_name, label, original, last_seed):
        self._module_name = module_name
        self._label = label
        self._last_seed = last_seed
        self.__wrapped__ = original
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, *args, **kwargs):
        given = args[0] if args else kwargs.get("a", kwargs.get("seed"))
        if self._label == "random" and not isinstance(given, RANDOM_SEED_TYPES):
            return self._hashed(given, args, kwargs)
        result = self.__wrapped__(*args, **kwargs)  # a bad argument raises as it always did, and is not noted
        self._last_seed[self._label] = random_seed_label(given) if self._label == "random" else seed_label(given)
        return result

    def _hashed(self, given, args, kwargs):
        """random.seed given another type: Python 3.10 seeds with its hash and warns (deprecated) at the
        line that called it, in this module, where the default filters would hide what the script's own
        line shows; caught here, the warning is given again there. 3.11+ raise TypeError, as always."""
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.__wrapped__(*args, **kwargs)
        self._last_seed[self._label] = random_seed_label(given)
        for w in caught:
            warnings.warn(w.message, w.category, stacklevel=3)  # 3: the caller of __call__
        return result

    def __getattr__(self, name):  # __name__, __qualname__, ...: the original's
        return getattr(self.__dict__["__wrapped__"], name)

    def __reduce__(self):  # pickled (a spawn worker's target, say) as "that module's seed", wherever unpickled
        return (module_seed, (self._module_name,))


def module_seed(module_name):
    import importlib

    return importlib.import_module(module_name).seed


def record_seed_calls(name, label, module, last_seed):
    """Replace ``module.seed`` with one that notes in ``last_seed[label]`` what it was last given."""
    original = getattr(module, "seed", None)
    if original is None or isinstance(original, _RecordingSeed):
        return
    module.seed = _RecordingSeed(name, label, original, last_seed)


class _SeedingLoader:
    """Runs the real loader, then seeds the module it made."""

    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._loader, name)


class SeedOnImport:
    """A meta-path finder that answers nothing itself: it wraps the loader of random, numpy and torch."""

    def __init__(self, seed):
        self.seed = seed
        self.pending = set(TARGETS)
        self.seeded = []
        self.last_seed = {}  # "random"/"numpy" -> what its seed() was last given (seed_label)
        self._finding = set()  # names being looked up by the other finders (one of them may ask us again)

    def find_spec(self, fullname, path=None, target=None):
        # Nothing is crossed off here: a find_spec probe is not an import (the module is crossed off
        # when it is executed, in after_import), so each lookup gets a loader that seeds.
        if fullname not in self.pending or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding.discard(fullname)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _SeedingLoader(spec.loader, lambda m, n=fullname: self.after_import(n, m))
        return spec

    def after_import(self, name, module):
        if name not in self.pending:
            return  # seeded already (a module executed twice, by a second spec)
        self.pending.discard(name)
        label = LABELS.get(name, name)
        try:
            seed_module(name, module, self.seed)
            self.seeded.append(label)
        except Exception as e:  # a module without the call we expect: say so at exit, never break the import
            self.seeded.append("%s failed: %s" % (label, type(e).__name__))
        else:
            if name != "torch":  # torch remembers its own (torch.initial_seed())
                self.last_seed[label] = self.seed
                try:
                    record_seed_calls(name, label, module, self.last_seed)
                except Exception:
                    pass
        if not self.pending and self in sys.meta_path:
            # Nothing left to watch: later imports no longer pass through here. (Not done inside
            # find_spec: the import system is iterating sys.meta_path there.)
            sys.meta_path.remove(self)


def _main_process():
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None  # DataLoader workers started by spawn report nothing


def report_at_exit(hook):
    if not _main_process() or not os.environ.get("HERMETIC_RUNTIME_REPORT"):
        return
    # What the script left, taken before the imports below (tempfile imports random, for one).
    seeded = list(hook.seeded)
    modules = {name: sys.modules[name] for name in TARGETS if name in sys.modules}
    last_seed = dict(hook.last_seed)
    try:
        from hermetic_runtime.report import record
        from hermetic_runtime.seeding import final_seeds
    except ImportError:  # the runtime package is not beside us (a copy of this file alone)
        return
    final = {"seeds": final_seeds(modules, last_seed)}
    torch = modules.get("torch")
    if torch is not None:
        from hermetic_runtime.determinism import changed_since_enable, torch_flags

        try:
            flags = torch_flags(torch)
        except Exception as e:
            final["error"] = "%s: %s" % (type(e).__name__, e)
        else:
            final.update(torch=flags, changed_after_enable_determinism=changed_since_enable(flags))
    record(startup={"seed": hook.seed, "seeded": seeded}, final=final)


def install():
    seed = _seed_value()
    if seed is None:
        return None
    hook = SeedOnImport(seed)
    for name in TARGETS:  # already imported (by another .pth, say): seed it now
        if name in sys.modules:
            hook.after_import(name, sys.modules[name])
    if hook.pending:
        sys.meta_path.insert(0, hook)
    import atexit

    atexit.register(report_at_exit, hook)
    return hook


_hook = install()
