"""Run an unchanged app against an SDK whose module, as loaded, lacks one hook.

Simulates an SDK release that removed a method: ``DRIFT_REMOVE`` names it as
``module:Class.method``; the method is deleted right after the module's code
runs and before any post-import hook (the zero-code instrumentation) sees it.
Then ``DRIFT_APP`` runs as ``__main__``.
"""

import importlib.abc
import importlib.util
import os
import runpy
import sys

MODULE, _, TARGET = os.environ["DRIFT_REMOVE"].partition(":")
OWNER, _, METHOD = TARGET.partition(".")


class _Drifted(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        delattr(getattr(module, OWNER), METHOD)


class _Finder(importlib.abc.MetaPathFinder):
    """Sits after wrapt's hook finder, which wraps our loader: ours runs first."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(_position(), self)
        spec.loader = _Drifted(spec.loader)
        return spec


def _position():
    for i, finder in enumerate(sys.meta_path):
        if type(finder).__name__ == "ImportHookFinder":  # wrapt's post-import hooks
            return i + 1
    return 0


assert MODULE not in sys.modules, f"{MODULE} was imported before the shim"
sys.meta_path.insert(_position(), _Finder())
runpy.run_path(os.environ["DRIFT_APP"], run_name="__main__")
