"""Lowering a JAX function to StableHLO text: the only torchtpu module that imports jax.

Imported lazily, the first time a JAX kernel meets a signature whose lowered text is in
neither the memory nor the disk cache (``_lowered.py``), so a run with a warm cache, and
every run that uses no JAX kernel, never imports jax. jax is the optional extra
``torchtpu[jax]``, pinned to the XLA runtime version torchtpu runs on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..stablehlo.types import numpy_dtype
from ._core import Param, Spec, needs_x64

# torchtpu's runtime may block the imports the XLA runtime attempts for every array it creates
# (None entries in sys.modules, see runtime/pjrt.py); jax itself needs those modules
_blocked = [n for n, m in list(sys.modules.items()) if m is None and (n == "jax" or n.startswith("jax."))]
if "jax" not in sys.modules or sys.modules["jax"] is None:
    for _name in _blocked:
        del sys.modules[_name]
else:
    _blocked = []
try:
    import jax
except ImportError as e:  # pragma: no cover - depends on the environment
    for _name in _blocked:  # keep the runtime's fast path
        sys.modules[_name] = None  # type: ignore[assignment]
    raise ImportError(
        "torchtpu.kernels.jax needs jax: pip install 'torchtpu[jax]' (jax==0.10.2, matching the pinned XLA runtime)"
    ) from e


def lower(fn: Callable, params: Sequence[Param], specs: Sequence[Spec], statics: dict[str, Any], platform: str) -> str:
    """StableHLO text of ``jax.jit(fn)`` for these input shapes/dtypes and static arguments."""
    it = iter(specs)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    static_nums: list[int] = []
    static_names: list[str] = []
    for p in params:
        if p.kind == "Tensor":
            s = next(it)
            v: Any = jax.ShapeDtypeStruct(tuple(s.shape), numpy_dtype(s.dtype))
        else:
            v = statics[p.name]
        if p.keyword_only:
            kwargs[p.name] = v
            if p.kind != "Tensor":
                static_names.append(p.name)
        else:
            if p.kind != "Tensor":
                static_nums.append(len(args))
            args.append(v)
    jitted = jax.jit(fn, static_argnums=static_nums, static_argnames=static_names)
    with jax.enable_x64(needs_x64(specs)):
        lowered = jitted.trace(*args, **kwargs).lower(lowering_platforms=(platform,))
    return lowered.as_text()


def version() -> str:
    return jax.__version__
