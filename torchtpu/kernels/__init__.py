"""Custom kernels for the tpu device: hand-written StableHLO, or a JAX (Pallas) function.

Each kernel becomes a real PyTorch op (``torch.library.custom_op`` in the
``torchtpu_kernels`` namespace) that runs in eager mode, fuses into DeferAndFuse graphs
and stays one node in ``torch.compile(backend="tpu")`` graphs (no graph break). Give it
a backward with ``kernel.register_autograd(backward, setup_context=...)`` (or the
``backward=``/``setup_context=`` arguments), as for any custom op.

StableHLO text, one text for every input signature (the function receives a
:class:`Spec` per tensor argument, whose ``.type`` is its MLIR type)::

    @torchtpu.kernels.stablehlo(shape=lambda x: x)
    def double(x):
        return f'''func.func @main(%x: {x.type}) -> {x.type} {{
          %0 = stablehlo.add %x, %x : {x.type}
          return %0 : {x.type}
        }}'''

or one fixed text: ``torchtpu.kernels.stablehlo(TEXT, name="double")``.

A JAX function, lowered once per input signature (and cached on disk, so that a warm run
never imports jax)::

    @torchtpu.kernels.jax
    def double(x):  # x is a jax array; jax.numpy is imported inside the function when needed
        return x * 2

Parameters without a default are tensors; those annotated or defaulting to bool, int,
float or str are static arguments (part of the kernel's text, one text per value).
To add a tpu lowering to an op of your own library instead, see
:func:`torchtpu.library.register_lowering`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._core import NAMESPACE, Kernel, Param, Spec, define, params_of
from ._mlir import KernelError, KernelModule, parse

__all__ = ["NAMESPACE", "KernelError", "Spec", "jax", "parse", "stablehlo"]


def stablehlo(
    text: str | Callable[..., str] | None = None,
    *,
    shape: Callable[..., Any] | None = None,
    name: str | None = None,
    num_outputs: int | None = None,
    entry: str = "main",
    cpu: Callable[..., Any] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    verify: bool = True,
) -> Any:
    """A kernel written in StableHLO text; returns the op (a ``torch.library`` CustomOpDef).

    ``text``: the text (a ``func.func @main`` taking and returning tensors, bare or in a
    ``module``, with any private helper functions), or a function returning it for the
    given argument :class:`Spec` s and static arguments (decorator form: omit ``text``).
    ``shape``: called like the kernel with Specs for tensors, returns the output Spec(s)
    (an input's Spec, ``Spec(shape, dtype)`` or a ``(shape, dtype)`` pair); without it the
    output shapes come from the text's signature. ``num_outputs``: how many tensors the
    kernel returns (default: read from a fixed text, else 1). ``entry``: the function to
    call. ``cpu``: a CPU reference implementation (without it the op refuses CPU
    tensors). ``verify``: compile each new text on its own first, so that XLA's complaints
    about it are raised at the call that used it.
    """

    def deco(source: str | Callable[..., str]) -> Any:
        if isinstance(source, str):
            return _fixed_text(source, shape, name, num_outputs, entry, cpu, backward, setup_context, verify)
        if not callable(source):
            raise KernelError(
                f"torchtpu.kernels.stablehlo: expected the text or a function returning it, got {type(source).__name__}"
            )
        kname = name or source.__name__
        params = params_of(source, f"kernel {kname!r}")
        n_out = num_outputs or 1

        def kernel_of(final: str) -> Kernel:
            k: Kernel

            def text_for(specs: tuple[Spec, ...], statics: dict[str, Any]) -> KernelModule:
                try:
                    text = k.call_user(source, specs, statics)
                except KernelError:
                    raise
                except Exception as e:
                    raise KernelError(f"{k.what}: its text function raised {type(e).__name__}: {e}") from e
                return parse(text, k.what, entry)

            k = Kernel(final, params, n_out, text_for, shape, verify)
            return k

        return define(kernel_of, kname, name is not None, cpu, backward, setup_context)

    return deco if text is None else deco(text)


def _fixed_text(
    text: str,
    shape: Callable | None,
    name: str | None,
    num_outputs: int | None,
    entry: str,
    cpu: Callable | None,
    backward: Callable | None,
    setup_context: Callable | None,
    verify: bool,
) -> Any:
    kname = name or "stablehlo_kernel"
    km = parse(text, f"kernel {kname!r}", entry)
    params = [Param(_arg_name(ssa, i), "Tensor") for i, (ssa, _) in enumerate(km.entry.args)]
    if not params:
        raise KernelError(f"kernel {kname!r}: @{km.entry.name} takes no arguments; a kernel needs at least one tensor argument")
    km.arg_types()  # a fixed text's signature must be one the kernel can be called with
    km.result_types()
    n_out = len(km.entry.results)
    if num_outputs is not None and num_outputs != n_out:
        raise KernelError(f"kernel {kname!r}: num_outputs={num_outputs} but @{km.entry.name} returns {n_out} tensors")

    def kernel_of(final: str) -> Kernel:
        return Kernel(final, params, n_out, lambda specs, statics: km, shape, verify)

    return define(kernel_of, kname, name is not None, cpu, backward, setup_context)


def _arg_name(ssa: str, i: int) -> str:
    name = ssa.lstrip("%")
    return name if name.isidentifier() and not name.startswith("_") else f"arg{i}"


def jax(
    fn: Callable[..., Any] | None = None,
    *,
    shape: Callable[..., Any] | None = None,
    name: str | None = None,
    num_outputs: int = 1,
    cpu: Callable[..., Any] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    cache_key: str = "",
) -> Any:
    """A kernel written as a JAX function (``jax.numpy``, ``lax``, Pallas with
    ``interpret=True`` on the cpu platform); returns the op. Usable as ``@jax`` or
    ``@jax(...)``.

    The function is lowered with ``jax.jit(fn).trace(...).lower(lowering_platforms=
    (platform,))`` once per input signature, with jax's 64-bit mode on exactly when an
    input is 64-bit, and the text cached on disk under ``TORCHTPU_CACHE_DIR``. The cache
    key covers the function's code, defaults, closure, the globals it reads and the
    functions of its own module it calls; pass ``cache_key=`` (say, a version string) when
    it depends on anything else. ``shape``: as for :func:`stablehlo`; without it the
    output shapes come from lowering (so dynamic shapes under torch.compile need it).
    """

    def deco(f: Callable[..., Any]) -> Any:
        from ._lowered import JaxSource

        kname = name or f.__name__
        params = params_of(f, f"kernel {kname!r}")

        def kernel_of(final: str) -> Kernel:
            source = JaxSource(f, params, f"kernel {final!r}", cache_key)
            return Kernel(final, params, num_outputs, source, shape, verify=False)

        return define(kernel_of, kname, name is not None, cpu, backward, setup_context)

    return deco if fn is None else deco(fn)
