"""Run a callback right after the training script imports torch, without importing it ourselves."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


def when_torch_imported(callback: Callable[[], None]) -> None:
    """Call `callback()` once `import torch` has finished (now, if torch is already imported)."""
    if "torch" in sys.modules:
        callback()
        return
    sys.meta_path.insert(0, _TorchFinder(callback))


class _TorchFinder(importlib.abc.MetaPathFinder):
    def __init__(self, callback: Callable[[], None]):
        self.callback = callback
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            from importlib.util import find_spec

            spec = find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        sys.meta_path.remove(self)
        spec.loader = _AfterExec(spec.loader, self.callback)
        return spec


class _AfterExec(importlib.abc.Loader):
    def __init__(self, loader, callback):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def __getattr__(self, name):  # everything else (resources, is_package, ...) is the real loader's
        return getattr(self.loader, name)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        try:
            self.callback()
        except Exception as exc:  # never break the user's import of torch
            print(f"bprof: capture disabled: {exc}", file=sys.stderr)
