"""Run a function right after a module is first executed, without importing it now.

A meta-path finder that answers nothing itself: for the one name it watches it
asks the other finders, wraps the loader of the spec they return, and calls
the function with the fresh module once the loader has executed it, once; then
it answers nothing. Standard library only.

``_startup.py``'s seeding hook (random, numpy, torch) is the same finder, kept
apart on purpose: that file is imported at every interpreter start as
``_hermetic_startup``, alone, and must not import this package there.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ._io import warn


class _ThenLoader:
    def __init__(self, loader: Any, then: Callable[[Any], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # is_package, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class _AfterImport:
    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name = name
        self._then = then
        self.fired = False
        # lookups under way, per thread (another finder may ask sys.meta_path again; another thread's
        # find_spec probe must not make this one's import pass us by)
        self._finding: Set[Tuple[int, str]] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        key = (threading.get_ident(), fullname)
        if self.fired or fullname != self.name or key in self._finding:
            return None
        self._finding.add(key)
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
            self._finding.discard(key)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self._fire)
        return spec

    def _fire(self, module: Any) -> None:
        # Once: a second spec of ours executed later (a probe's) does nothing. The finder stays in
        # sys.meta_path, answering nothing: removing it could make another thread's import, iterating
        # the list, skip a finder.
        if self.fired:
            return
        self.fired = True
        _pending.pop(self.name, None)
        try:
            self._then(module)
        except Exception as e:  # never break the import (torch.compile's, say): say what was not done
            warn("after importing %s: %s: %s" % (self.name, type(e).__name__, e))


_pending: Dict[str, _AfterImport] = {}


def after_import(name: str, then: Callable[[Any], None]) -> None:
    """Call ``then(module)`` when ``name`` is next executed (once); at once if it is imported already.

    A second call for a name still waited for replaces the first's function."""
    module: Optional[Any] = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    hook = _pending.get(name)
    if hook is not None:
        hook._then = then
        return
    hook = _pending[name] = _AfterImport(name, then)
    sys.meta_path.insert(0, hook)
