"""Extend a module of another library when it is first imported (or at once, if it is
loaded already), without importing it ourselves: torchtpu loads with ``import torch``, and
importing accelerate, transformers or flex attention then would cost every user the time."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

Extension = Callable[[Any], None]  # called with the loaded module


def extend_on_import(extensions: dict[str, Extension]) -> None:
    """Apply ``extensions`` (module name -> extension) to the modules loaded already, and
    to the others when they are imported."""
    for name, extend in extensions.items():
        if name in sys.modules:
            extend(sys.modules[name])
    pending = {name: extend for name, extend in extensions.items() if name not in sys.modules}
    if not pending:
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _ExtendOnImport)), None)
    if finder is None:
        finder = _ExtendOnImport()
        sys.meta_path.insert(0, finder)
    finder.extensions.update(pending)


class _ExtendOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules it extends through the other finders and extends each once loaded."""

    def __init__(self) -> None:
        self.extensions: dict[str, Extension] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        extend = self.extensions.get(fullname)
        if extend is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_extend(module: Any) -> None:
            exec_module(module)
            extend(module)

        loader.exec_module = exec_and_extend  # this spec's loader only
        return spec
