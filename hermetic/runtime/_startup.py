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
script's own seeding, which comes later, still wins. At exit the main
process writes into the runtime report what was seeded (``startup``) and,
when torch was imported, the determinism state it ended with (``final``),
noting every flag changed after ``enable_determinism()``.

Standard library only, Python 3.8+, and cheap: it runs before every script.
"""

import os
import sys

SEED_ENV = "HERMETIC_SEED"
SWITCH_ENV = "HERMETIC_STARTUP_SEEDING"
TARGETS = ("random", "numpy.random", "torch")  # modules watched
LABELS = {"numpy.random": "numpy"}  # what the record calls them
SEED_MAX = 2**32 - 1


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

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _SeedingLoader(spec.loader, lambda m, n=fullname: self.after_import(n, m))
        return spec

    def after_import(self, name, module):
        try:
            seed_module(name, module, self.seed)
            self.seeded.append(LABELS.get(name, name))
        except Exception as e:  # a module without the call we expect: say so at exit, never break the import
            self.seeded.append("%s failed: %s" % (LABELS.get(name, name), type(e).__name__))
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
    try:
        from hermetic_runtime.report import record
    except ImportError:  # the runtime package is not beside us (a copy of this file alone)
        return
    sections = {"startup": {"seed": hook.seed, "seeded": list(hook.seeded)}}
    torch = sys.modules.get("torch")
    if torch is not None:
        from hermetic_runtime.determinism import changed_since_enable, torch_flags

        try:
            flags = torch_flags(torch)
        except Exception as e:
            sections["final"] = {"error": "%s: %s" % (type(e).__name__, e)}
        else:
            sections["final"] = {"torch": flags, "changed_after_enable_determinism": changed_since_enable(flags)}
    record(**sections)


def install():
    seed = _seed_value()
    if seed is None:
        return None
    hook = SeedOnImport(seed)
    for name in TARGETS:  # already imported (by another .pth, say): seed it now
        if name in sys.modules:
            hook.pending.discard(name)
            hook.after_import(name, sys.modules[name])
    if hook.pending:
        sys.meta_path.insert(0, hook)
    import atexit

    atexit.register(report_at_exit, hook)
    return hook


_hook = install()
