"""The lowered text of JAX kernels, cached in memory and on disk, found without jax.

A JAX kernel is lowered once per input signature. The text is stored under the executable
disk cache's directory (``TORCHTPU_CACHE_DIR``, see runtime/cache.py), in ``kernels/``,
keyed by everything that decides it: the function's code (its bytecode, constants,
defaults, closure values, and the functions of its own module it calls, recursively), the
signature, the static arguments, the jax and XLA runtime versions, the platform and the user's
``cache_key``. Computing the key needs no jax, so a run whose kernels are all cached never
imports it. What the key cannot see (a helper in another module, a global value the
function reads) is what ``cache_key=`` is for.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._core import Param, Spec, needs_x64
from ._mlir import KernelError, KernelModule, parse

FORMAT = "1"  # bump when what a cached entry holds changes


class JaxSource:
    """``source(specs, statics)`` of a JAX kernel: the lowered text as a KernelModule."""

    def __init__(self, fn: Callable, params: list[Param], what: str, cache_key: str):
        self.fn = fn
        self.params = params
        self.what = what
        self.cache_key = cache_key
        self._fingerprint: str | None = None

    def __call__(self, specs: tuple[Spec, ...], statics: dict[str, Any]) -> KernelModule:
        from ..runtime import pjrt

        platform = pjrt.get().platform
        key = self.key(specs, statics, platform)
        path = _entry_path(key)
        if path is not None:
            km = _read(path, self.what)
            if km is not None:
                return km
        text = self.lower(specs, statics, platform)
        km = parse(text, self.what)
        if path is not None:
            _write(path, text)
        return km

    def key(self, specs: tuple[Spec, ...], statics: dict[str, Any], platform: str) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.fn)
        parts = [
            FORMAT,
            self._fingerprint,
            repr([(tuple(s.shape), str(s.dtype)) for s in specs]),
            repr(sorted(statics.items())),
            f"x64={needs_x64(specs)}",
            platform,
            _version("jax"),
            _runtime_version(),
            sys.version,
            self.cache_key,
        ]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def lower(self, specs: tuple[Spec, ...], statics: dict[str, Any], platform: str) -> str:
        from . import _jax

        try:
            return _jax.lower(self.fn, self.params, specs, statics, platform)
        except Exception as e:
            shapes = ", ".join(s.type for s in specs)
            raise KernelError(
                f"{self.what}: jax could not lower the function for ({shapes}) {statics or ''}: {type(e).__name__}: {e}"
            ) from e


def _runtime_version() -> str:
    """The XLA runtime's version, as the runtime adapter reports it (a lowering made for
    another runtime is not reused)."""
    from ..runtime import pjrt

    return pjrt.get().runtime_version


@functools.cache
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _entry_path(key: str) -> Path | None:
    from ..runtime import cache

    directory = cache.cache_dir()
    return None if directory is None else directory / "kernels" / f"{key}.mlir"


def _read(path: Path, what: str) -> KernelModule | None:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return parse(text, what)
    except KernelError:  # a damaged entry: lower again and overwrite it
        return None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)  # readers see the old entry or the whole new one
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only or full disk only costs the cache


# ----------------------------------------------------------------------------------------
# what a function's lowering depends on
# ----------------------------------------------------------------------------------------
def fingerprint(fn: Callable) -> str:
    """A hash of ``fn``'s code and of the values and same-module functions it closes over."""
    h = hashlib.sha256()
    _Walker(h, getattr(fn, "__module__", None)).value(fn)
    return h.hexdigest()


class _Walker:
    MAX_DEPTH = 12

    def __init__(self, h: Any, module: str | None):
        self.h = h
        self.module = module  # the user's module: its functions are read, a library's are named
        self.seen: set[int] = set()

    def put(self, *parts: Any) -> None:
        for p in parts:
            self.h.update(str(p).encode())
            self.h.update(b"\0")

    def value(self, v: Any, depth: int = 0) -> None:
        if depth > self.MAX_DEPTH:
            self.put("deep")
            return
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            self.put(type(v).__name__, repr(v))
        elif isinstance(v, (tuple, list)):
            self.put(type(v).__name__, len(v))
            for x in v:
                self.value(x, depth + 1)
        elif isinstance(v, (set, frozenset)):
            self.put("set", sorted(repr(x) for x in v))
        elif isinstance(v, dict):
            self.put("dict", len(v))
            for k in sorted(v, key=repr):
                self.put(repr(k))
                self.value(v[k], depth + 1)
        elif isinstance(v, functools.partial):
            self.put("partial")
            self.value(v.func, depth + 1)
            self.value(v.args, depth + 1)
            self.value(v.keywords, depth + 1)
        elif isinstance(v, types.FunctionType):
            self.function(v, depth)
        elif isinstance(v, types.MethodType):
            self.value(v.__func__, depth + 1)
        elif isinstance(v, types.ModuleType):
            self.put("module", v.__name__)
        elif hasattr(v, "__array__") and hasattr(v, "dtype"):  # a numpy or jax array constant
            self.array(v)
        else:  # an object whose state we cannot see: its type only (cache_key= covers the rest)
            self.put("object", type(v).__module__, type(v).__qualname__)

    def array(self, v: Any) -> None:
        import numpy as np

        try:
            a = np.asarray(v)
        except Exception:  # noqa: BLE001 - not readable on the host (a device tensor): its type only
            self.put("object", type(v).__module__, type(v).__qualname__)
            return
        self.put("array", a.dtype, a.shape)
        self.h.update(a.tobytes())

    def function(self, fn: types.FunctionType, depth: int) -> None:
        if fn.__module__ != self.module and self.seen:  # a library's function: its version is in the key
            self.put("function", fn.__module__, fn.__qualname__)
            return
        if id(fn) in self.seen:
            self.put("seen", fn.__qualname__)
            return
        self.seen.add(id(fn))
        self.put("function", fn.__module__, fn.__qualname__)
        self.code(fn.__code__, fn.__globals__, depth)
        self.value(fn.__defaults__, depth + 1)
        self.value(fn.__kwdefaults__, depth + 1)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                self.put("empty cell")

    def code(self, code: types.CodeType, globs: dict[str, Any], depth: int) -> None:
        self.h.update(code.co_code)
        self.put(code.co_names, code.co_varnames)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, globs, depth)
            else:
                self.value(c, depth + 1)
        for name in code.co_names:  # the globals it reads: helpers (a Pallas kernel body), constants
            if name in globs:
                self.put("global", name)
                self.value(globs[name], depth + 1)
