"""Run PyTorch's OpInfo database (``op_db``: core, linalg, fft, special, ...) on tpu
against the CPU: forward outputs, gradients, in-place and ``out=`` variants, per dtype.

Shared by ``tests/test_opinfo.py`` (one pytest case per op x dtype x mode) and
``python -m torchtpu.coverage`` (the whole table, written as JSON/markdown).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import sys
import time
import traceback
import unittest
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..runner import checks
from . import expected_failures as xf
from . import extremal
from .observed import SampleFailure, judge

MODES = ("fwd", "grad", "inplace", "out", "errors", "extremal")
# The same forward and gradient comparisons with the op run through torch.compile(backend="tpu"):
# AOTAutograd decomposes and functionalizes before our lowering sees the graph, so a compiled
# op takes paths the eager run never does (tests/test_opinfo_compile.py; not in the full run).
COMPILE_MODES = ("compile", "compile-grad")
_EAGER_MODE_OF = {"compile": "fwd", "compile-grad": "grad"}  # the eager comparison each one repeats

# What the platforms support (complex and the storage-only unsigned types are switched off
# in expected_failures.SKIPPED_DTYPES).
PLATFORM_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)

TPU = torch.device("tpu")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def op_id(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def op_db() -> tuple[Any, ...]:
    """PyTorch's OpInfo entries (imported lazily: the import takes seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    _install_frame_walking_extract_test_fn()
    return tuple(db)


def _extract_test_fn() -> Callable[..., Any] | None:
    """``torch.testing._internal.common_utils.extract_test_fn`` without ``inspect.stack()``.

    PyTorch's version looks for the running ``unittest.TestCase`` test method through
    ``inspect.stack()``, which reads the source file of every frame; OpInfo calls it for
    every ``sample_inputs``/``error_inputs`` iterator. Under pytest (deep stacks, no
    TestCase) that was 80% of a conformance case's time (92.7 of 115.4 s for 441 uint8
    sweep cases), only to return None. Same search, same answer, over the frames alone."""
    frame = sys._getframe(1)
    try:
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
    except Exception:  # as PyTorch's: any surprise means "no test function"
        pass
    return None


_PYTORCHS_EXTRACT_TEST_FN: Callable[..., Any] | None = None  # kept for the equivalence test


def _install_frame_walking_extract_test_fn() -> None:
    global _PYTORCHS_EXTRACT_TEST_FN
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    if common_utils.extract_test_fn is not _extract_test_fn:
        _PYTORCHS_EXTRACT_TEST_FN = common_utils.extract_test_fn
    common_utils.extract_test_fn = _extract_test_fn  # TrackedInputIter, get_tracked_input
    core.extract_test_fn = _extract_test_fn  # OpInfo._sample_callback_fn (imported by name)


@dataclass(frozen=True)
class Case:
    op_id: str
    dtype: str
    mode: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.op_id, self.dtype, self.mode)

    @property
    def id(self) -> str:
        return f"{self.op_id}-{self.dtype}-{self.mode}"


@dataclass
class Result:
    op_id: str
    dtype: str
    mode: str
    status: str  # pass | fail | xfail | xpass | skip
    kind: str = ""  # the first failing sample's: missing | error | meta | mismatch
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0
    failures: list[dict[str, Any]] = field(default_factory=list)  # SampleFailure records
    refereed: list[dict[str, Any]] = field(default_factory=list)  # Refereed records


@dataclass
class Refereed:
    """A sample whose tpu result differs from the CPU's beyond the tolerance but is at least
    as close to the float64 result (summed absolute error, as PyTorch's ``_ref_test_helper``)."""

    index: int
    max_abs: float
    max_rel: float
    tpu_f64: float
    cpu_f64: float


@functools.cache
def _ops_by_id() -> dict[str, Any]:
    return {op_id(op): op for op in op_db()}


def platform_dtypes(op: Any) -> list[torch.dtype]:
    """The dtypes the op supports on the CPU that the platform has, in table order."""
    supported = op.supported_dtypes("cpu")
    return [d for d in PLATFORM_DTYPES if d in supported]


def mode_applies(op: Any, dtype: torch.dtype, mode: str) -> bool:
    mode = _EAGER_MODE_OF.get(mode, mode)
    if mode == "fwd":
        return True
    if mode == "grad":
        return (
            op.supports_autograd
            and dtype in op.supported_backward_dtypes("cpu")
            and (dtype.is_floating_point or dtype.is_complex)
        )
    if mode == "inplace":
        return op.inplace_variant is not None
    if mode == "out":
        return bool(op.supports_out)
    if mode == "errors":  # error inputs build their own dtypes: one case per op, named by its first dtype
        return op.error_inputs_func is not None and platform_dtypes(op)[:1] == [dtype]
    if mode == "extremal":
        return extremal.kind(op) is not None and dtype != torch.bool
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES + COMPILE_MODES}")


def cases(dtypes: Iterable[torch.dtype] | None = None, modes: Iterable[str] = MODES) -> list[Case]:
    """Every (op, dtype, mode) the database defines for the platform dtypes, in a stable order."""
    wanted = list(dtypes) if dtypes is not None else None
    modes = list(modes)
    out = []
    for op in op_db():
        for dtype in platform_dtypes(op):
            if wanted is not None and dtype not in wanted:
                continue
            for mode in modes:
                if mode_applies(op, dtype, mode):
                    out.append(Case(op_id(op), dtype_name(dtype), mode))
    return out


# ---------------------------------------------------------------------------
# OpInfo's own markings for cross-device comparison (TestCommon.test_compare_cpu)
# ---------------------------------------------------------------------------
def _opinfo_skip(op: Any, dtype: torch.dtype) -> str | None:
    """OpInfo skips test_compare_cpu for ops whose outputs are random or uninitialised:
    honour it, with OpInfo's own reason."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    for d in op.decorators:
        if not (
            isinstance(d, DecorateInfo)
            and d.test_name == "test_compare_cpu"
            and d.is_active("TestCommon", "test_compare_cpu", "tpu", dtype, {})
        ):
            continue
        for deco in d.decorators:
            try:
                wrapped = deco(lambda: None)
                if callable(wrapped):
                    wrapped()
            except unittest.SkipTest as e:
                return f"OpInfo skips the CPU comparison: {e}"
            except Exception:  # noqa: BLE001 - decorators that are not skips
                continue
    return None


def _tolerance(op: Any, dtype: torch.dtype) -> Tolerance | None:
    """OpInfo's own loosening for the cross-device comparison: the ``toleranceOverride`` and
    ``precisionOverride`` decorators active for ``TestCommon.test_compare_cpu``. As in
    PyTorch's ``assertEqual``, an override only loosens: each bound is the larger of the
    override and the dtype's default."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    atol = rtol = 0.0
    for d in op.decorators:
        if isinstance(d, DecorateInfo) and d.is_active("TestCommon", "test_compare_cpu", "tpu", dtype, {}):
            for deco in d.decorators:
                tolerances = getattr(deco, "d", None)
                if not isinstance(tolerances, dict) or dtype not in tolerances:
                    continue
                bound = tolerances[dtype]
                if hasattr(bound, "atol"):  # toleranceOverride: tol(atol, rtol)
                    atol, rtol = max(atol, bound.atol), max(rtol, bound.rtol)
                else:  # precisionOverride: an absolute tolerance
                    atol = max(atol, float(bound))
    return Tolerance(atol, rtol) if atol or rtol else None


@dataclass(frozen=True)
class Tolerance:
    """An OpInfo override; each comparison uses max(this, the dtype's default)."""

    atol: float
    rtol: float


# ---------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------
class _CpuRefused(Exception):
    """The CPU refuses this sample too: nothing to compare."""


def _to_tpu(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return t.detach().to(TPU).requires_grad_(t.requires_grad)
    return t


def _to_float64(t: Any) -> Any:
    """A floating or complex tensor in float64/complex128 on the CPU (others unchanged)."""
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
        return t
    wide = torch.complex128 if t.is_complex() else torch.float64
    # a copy even when t is float64 already: the CPU run may write its inputs afterwards
    return t.detach().to(wide, copy=True).requires_grad_(t.requires_grad)


def _device_arg(v: Any) -> Any:
    if (isinstance(v, torch.device) and v.type == "cpu") or (isinstance(v, str) and v == "cpu"):
        return TPU
    return v


# Positional arguments PyTorch requires on the CPU whatever the input's device (the
# samples build them there): tensor_split's tensor_indices_or_sections.
_CPU_ARGS: dict[str, tuple[int, ...]] = {"tensor_split": (0,)}


def _on_tpu(sample: Any, op: Any = None) -> Any:
    """The sample with its tensors on tpu (except the arguments PyTorch wants on the CPU),
    and factory ``device=`` arguments pointing at tpu."""
    moved = sample.transform(_to_tpu)
    args = [_device_arg(a) for a in moved.args]
    for i in _CPU_ARGS.get(op_id(op), ()) if op is not None else ():
        if i < len(args) and isinstance(sample.args[i], torch.Tensor):
            args[i] = sample.args[i]
    moved.args = tuple(args)
    moved.kwargs = {k: _device_arg(v) if k == "device" else v for k, v in moved.kwargs.items()}
    if op is not None and op.name in _FACTORIES:
        moved.kwargs.setdefault("device", TPU)  # some samples leave it out: the default is the CPU
    return moved


# Factory ops whose result lands on the default device unless told otherwise.
_FACTORIES = {"arange", "linspace", "logspace"}


def _check_devices(out: Any) -> None:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.device.type != "tpu":
            raise AssertionError(f"an output is on {t.device}, not tpu")


def _cpu(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the reference refuses this sample
        raise _CpuRefused(str(e)) from e


@dataclass
class Outputs:
    """What one sample produced on tpu and on the CPU, and how to compute it in float64
    on the CPU (None where a wider reference means nothing, e.g. integer results)."""

    actual: Any
    expected: Any
    precise: Callable[[], Any] | None


def _forward(op: Any, sample: Any) -> Any:
    return sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))


def _compiled_forward(op: Any, sample: Any) -> Any:
    """``_forward`` through torch.compile(backend="tpu"), compiled afresh for each sample: a
    function recompiled past Dynamo's cache limit would run eagerly and compare nothing new."""
    torch._dynamo.reset()

    def call(inp: Any, *args: Any, **kwargs: Any) -> Any:
        return op(inp, *args, **kwargs)

    return _forward(torch.compile(call, backend="tpu"), sample)


def _run_fwd(op: Any, sample: Any, forward: Callable[[Any, Any], Any] = _forward) -> Outputs:
    tpu = _on_tpu(sample, op)
    # the float64 inputs are taken before the CPU runs: an op may write its inputs
    # (embedding's max_norm renormalises the weight in place), and the reference must
    # start from what tpu and the CPU were given
    wide = sample.transform(_to_float64)
    expected = _cpu(lambda: _forward(op, sample))
    actual = forward(op, tpu)
    _check_devices(actual)
    return Outputs(actual, expected, lambda: _forward(op, wide))


def _ints_to_float64(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        return t.to(torch.float64)
    return _to_float64(t)


def _run_extremal(op: Any, sample: Any) -> Outputs:
    """The forward on extremal values; subnormal samples against the CPU flushing them.
    The float64 reference of an elementwise op on integers (cosh of an int64 tensor is
    computed in float32) takes the integers as float64."""
    with extremal.cpu_flushing_like_xla(sample):
        wide = sample.transform(_ints_to_float64)  # before the CPU run (see _run_fwd)
        out = _run_fwd(op, sample)
        try:
            precise = _forward(op, wide)
        except Exception:  # noqa: BLE001 - no float64 reference for this sample
            return Outputs(out.actual, out.expected, None)
    return Outputs(out.actual, out.expected, lambda: precise)


def _run_inplace(op: Any, sample: Any) -> Outputs:
    fn = op.inplace_variant

    def run(s: Any) -> tuple[Any, Any]:
        target = s.input.clone() if isinstance(s.input, torch.Tensor) and s.input.device.type == "cpu" else s.input
        return fn(target, *s.args, **s.kwargs), target  # the result, and the write in the input

    tpu = _on_tpu(sample, op)
    wide = sample.transform(_to_float64)  # before the CPU run (see _run_fwd)
    expected = _cpu(lambda: run(sample))
    actual = run(tpu)
    _check_devices(actual)
    return Outputs(actual, expected, lambda: run(wide))


def _run_out(op: Any, sample: Any) -> Outputs:
    tpu = _on_tpu(sample, op)
    wide = sample.transform(_to_float64)  # before the CPU run (see _run_fwd)
    functional = _cpu(lambda: op(sample.input, *sample.args, **sample.kwargs))
    flat = tree_flatten(functional)[0]
    if not all(isinstance(t, torch.Tensor) for t in flat):
        raise _CpuRefused("non-tensor outputs")

    def run(s: Any, device: torch.device | None) -> Any:
        outs = [torch.empty(0, dtype=t.dtype, device=device) for t in flat]
        ret = op(s.input, *s.args, out=outs[0] if len(outs) == 1 else tuple(outs), **s.kwargs)
        if device is not None:
            _check_devices(ret)
        # the sample's own normalisation (e.g. singular/eigen vector signs), as for fwd
        return s.output_process_fn_grad(_shaped_like(functional, outs))

    try:
        expected = run(sample, None)
    except Exception as e:  # noqa: BLE001 - this sample's out= form is not valid on the CPU
        raise _CpuRefused(str(e)) from e
    actual = run(tpu, TPU)

    def precise() -> Any:  # an out= result's float64 reference: the functional result in float64
        return _forward(op, wide)

    return Outputs(actual, expected, precise)


def _shaped_like(template: Any, values: list[torch.Tensor]) -> Any:
    """``values`` (the out= tensors) in the structure the functional op returns, so the
    sample's ``output_process_fn_grad`` can read them (svd's U, S, V by name)."""
    if not isinstance(template, tuple):
        return values[0]
    if type(template).__module__ == "torch.return_types":
        return type(template)(tuple(values))
    return tuple(values)


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [
        t
        for t in tree_flatten(out)[0]
        if isinstance(t, torch.Tensor) and t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)
    ]


def _leaves(s: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten((s.input, s.args, s.kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]


def _gradients(
    op: Any, s: Any, cotangents: list[torch.Tensor], forward: Callable[[Any, Any], Any] = _forward
) -> list[torch.Tensor | None]:
    outs, leaves = _differentiable(forward(op, s)), _leaves(s)
    if len(outs) != len(cotangents):
        raise AssertionError(f"{len(outs)} differentiable outputs, the CPU has {len(cotangents)}")
    device = leaves[0].device if leaves else None
    cot = [c.to(device=device, dtype=o.dtype) for c, o in zip(cotangents, outs)]
    return list(torch.autograd.grad(outs, leaves, cot, allow_unused=True))


def _run_grad(op: Any, sample: Any, forward: Callable[[Any, Any], Any] = _forward) -> Outputs:
    cpu_outs = _differentiable(_cpu(lambda: _forward(op, sample)))
    if not cpu_outs or not _leaves(sample):
        raise _CpuRefused("nothing differentiable")
    gen = torch.Generator().manual_seed(1234)
    cot = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in cpu_outs]
    expected = _cpu(lambda: _gradients(op, sample, cot))
    actual = _gradients(op, _on_tpu(sample, op), cot, forward)
    # an unused input: PyTorch gives None on one side and possibly zeros on the other
    pairs = [(a, e) for a, e in zip(actual, expected) if not (a is None and e is None)]
    actual = [torch.zeros_like(e, device=TPU) if a is None else a for a, e in pairs]
    expected = [torch.zeros_like(a, device="cpu") if e is None else e for a, e in pairs]
    _check_devices(actual)

    def precise() -> list[torch.Tensor]:
        wide = _gradients(op, sample.transform(_to_float64), cot)
        return [torch.zeros_like(_to_float64(e)) if w is None else w for w, e in zip(wide, expected)]

    return Outputs(actual, expected, precise)


_RUNNERS: dict[str, Callable[[Any, Any], Outputs] | None] = {
    "fwd": _run_fwd,
    "grad": _run_grad,
    "inplace": _run_inplace,
    "out": _run_out,
    "errors": None,  # _check_error_input
    "extremal": _run_extremal,
    "compile": functools.partial(_run_fwd, forward=_compiled_forward),
    "compile-grad": functools.partial(_run_grad, forward=_compiled_forward),
}


# ---------------------------------------------------------------------------
# error inputs: the same exception as the CPU
# ---------------------------------------------------------------------------
def _raised(fn: Callable[[], Any]) -> BaseException | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return e
    return None


def _run_to_completion(op: Any, sample: Any) -> None:
    """Call the op on tpu and wait for it: a device-side check raises at the wait."""
    from ..eager import dispatch

    _host(op(sample.input, *sample.args, **sample.kwargs))
    dispatch.synchronize()


def _error_input_pairs(op: Any) -> Iterator[tuple[Any, Any]]:
    """Each error input built for the CPU and, from the same seed, for tpu. Built on the
    device, not moved there: an error input's point is often its layout (an expanded
    ``out=``, an ``out=`` that is an input), which a copy to tpu would not keep."""
    torch.manual_seed(0)
    cpu = list(op.error_inputs("cpu"))
    torch.manual_seed(0)
    try:
        tpu = list(op.error_inputs("tpu"))  # a string, as PyTorch's tests pass it (some generators call .startswith)
    except Exception:  # noqa: BLE001 - a generator that cannot build on tpu: move the CPU's
        tpu = []
    # some generators add CPU-only inputs: pair each CPU input with the next tpu input
    # expecting the same error (none left: the CPU's, moved)
    pending = list(tpu)
    for ei in cpu:
        match = next((i for i, t in enumerate(pending) if (t.error_type, t.error_regex) == (ei.error_type, ei.error_regex)), None)
        yield ei, None if match is None else pending.pop(match)


def _check_error_input(index: int, op: Any, pair: tuple[Any, Any]) -> SampleFailure | None:
    """PyTorch's ``test_errors`` on tpu: the op must raise ``error_type`` with a message
    matching ``error_regex``, as it does on the CPU (an input the CPU does not refuse that
    way is not compared)."""
    error_input, on_tpu = pair
    sample, expected, regex = error_input.sample_input, error_input.error_type, error_input.error_regex
    cpu = _raised(lambda: op(sample.input, *sample.args, **sample.kwargs))
    if not isinstance(cpu, expected) or not re.search(regex, str(cpu)):
        raise _CpuRefused(f"the CPU does not raise {expected.__name__} matching {regex!r}")
    checks.clear()
    tpu_sample = _on_tpu(sample, op) if on_tpu is None else on_tpu.sample_input
    got = _raised(lambda: _run_to_completion(op, tpu_sample))
    cpu_says = f"the CPU raises {type(cpu).__name__}: {_first_line(cpu)}"
    if got is None:
        return SampleFailure(index, "accepted", f"tpu returns a result; {cpu_says}")
    if isinstance(got, NotImplementedError) and not issubclass(expected, NotImplementedError):
        return SampleFailure(index, "missing", _first_line(got), _where(got))
    if not isinstance(got, expected):
        return SampleFailure(index, "error", f"{type(got).__name__}: {_first_line(got)}; {cpu_says}", _where(got))
    if not re.search(regex, str(got)):
        return SampleFailure(index, "message", f"{_first_line(got)}; {cpu_says}", _where(got))
    return None


# ---------------------------------------------------------------------------
# comparing, with a float64 referee
# ---------------------------------------------------------------------------
def _host(x: Any) -> list[Any]:
    return [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in tree_flatten(x)[0]]


def _tolerances(t: torch.Tensor, override: Tolerance | None) -> tuple[float, float]:
    from torch.testing._comparison import default_tolerances

    rtol, atol = default_tolerances(t)
    if override is not None:
        rtol, atol = max(rtol, override.rtol), max(atol, override.atol)
    return rtol, atol


def _abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float64: zero where both are equal (infinities included) or both NaN,
    infinite where only one is NaN (a NaN is as wrong as a value can be)."""
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    a, b = a.to(wide), b.to(wide)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.nan_to_num((a - b).abs().to(torch.float64), nan=math.inf, posinf=math.inf)
    return torch.where(same, 0.0, diff)


def summed_error(result: list[Any], reference: list[Any]) -> float:
    """The summed absolute error of ``result`` against ``reference`` (PyTorch's
    ``_ref_test_helper`` in test/test_ops.py judges a reference implementation this way)."""
    total = 0.0
    for a, b in zip(result, reference):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape:
                return math.inf
            if a.dtype == torch.bool or b.dtype == torch.bool:
                total += float((a.to(torch.bool) ^ b.to(torch.bool)).sum())
            else:
                total += float(_abs_diff(a, _overflowed_alike(a, b)).sum())
        elif a != b:
            return math.inf
    return total


def _overflowed_alike(result: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``reference`` with each element that overflows ``result``'s dtype, where ``result``
    holds that infinity, replaced by it: the correctly rounded result is not infinitely far
    (float16 matrix_exp's 1.2e5 is inf in float16; the CPU's whole result was NaN)."""
    if not (result.is_floating_point() and reference.is_floating_point()) or reference.dtype == result.dtype:
        return reference
    result, rounded = result.cpu(), reference.to(result.dtype)
    same_infinity = rounded.isinf() & (result == rounded)
    return torch.where(same_infinity, result.to(reference.dtype), reference)


def _mismatch(index: int, actual: list[Any], expected: list[Any], override: Tolerance | None, message: str) -> SampleFailure:
    """How far apart two results with the same structure are."""
    mismatched = total = 0
    max_abs = max_rel = 0.0
    for a, e in zip(actual, expected):
        if not isinstance(e, torch.Tensor) or e.numel() == 0:
            continue
        if e.dtype == torch.bool:
            bad = a != e
            mismatched, total, max_abs = mismatched + int(bad.sum()), total + e.numel(), max(max_abs, float(bad.any()))
            max_rel = max(max_rel, float(bad.any()))
            continue
        rtol, atol = _tolerances(e, override)
        diff = _abs_diff(a, e)
        scale = e.to(torch.complex128 if e.is_complex() else torch.float64).abs()
        bad = (diff > 0) & ~(diff <= atol + rtol * scale)  # a NaN on one side counts
        rel = torch.where(diff == 0, 0.0, torch.nan_to_num(diff / scale, nan=math.inf, posinf=math.inf))
        mismatched, total = mismatched + int(bad.sum()), total + e.numel()
        max_abs, max_rel = max(max_abs, float(diff.max())), max(max_rel, float(rel.max()))
    detail = f"{mismatched} of {total} elements differ from the CPU (max abs {max_abs:.3g}, max rel {max_rel:.3g})"
    if not mismatched:
        detail = message
    return SampleFailure(index, "mismatch", detail, mismatched=mismatched, total=total, max_abs=max_abs, max_rel=max_rel)


def _same_structure(actual: list[Any], expected: list[Any]) -> str | None:
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, the CPU has {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(a, torch.Tensor) != isinstance(e, torch.Tensor):
            return f"output {i} is {type(a).__name__}, on the CPU {type(e).__name__}"
        if isinstance(a, torch.Tensor) and (a.shape != e.shape or a.dtype != e.dtype):
            return f"output {i} is {a.dtype} {list(a.shape)}, on the CPU {e.dtype} {list(e.shape)}"
    return None


# Dtypes whose results a float64 run on the CPU can referee (float64 itself is the reference).
_REFEREED = {torch.float32, torch.float16, torch.bfloat16, torch.complex64}


def compare(index: int, out: Outputs, dtype: torch.dtype, override: Tolerance | None) -> SampleFailure | Refereed | None:
    """None when the tpu result matches the CPU's (PyTorch's tolerances for the dtype,
    loosened where OpInfo says so); ``Refereed`` when it does not but is at least as close
    to the float64 result as the CPU's is; else the failure."""
    actual, expected = _host(out.actual), _host(out.expected)
    structure = _same_structure(actual, expected)
    if structure:
        return SampleFailure(index, "meta", structure)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False, **_kwargs(override))
        return None
    except AssertionError as e:
        failure = _mismatch(index, actual, expected, override, _first_lines(e))
    if out.precise is not None and (dtype in _REFEREED or _inexact(expected)):
        try:
            precise = _host(out.precise())
        except Exception:  # noqa: BLE001 - no float64 reference for this sample: the mismatch stands
            return failure
        if len(precise) == len(expected):
            failure.tpu_f64, failure.cpu_f64 = summed_error(actual, precise), summed_error(expected, precise)
            if _no_farther(failure.tpu_f64, failure.cpu_f64, actual, expected, precise):
                return Refereed(index, failure.max_abs, failure.max_rel, failure.tpu_f64, failure.cpu_f64)
            failure.detail += f"; summed error against float64: tpu {failure.tpu_f64:.3g}, CPU {failure.cpu_f64:.3g}"
    return failure


def _no_farther(tpu: float, cpu: float, actual: list[Any], expected: list[Any], precise: list[Any]) -> bool:
    """Is the tpu result no farther from float64 than the CPU's? An infinite summed error
    cannot be compared (inf <= inf held for any tpu result: a NaN, an integer that differs),
    so then only the elements where tpu and the CPU differ are summed (an overflow both
    have counts for neither), and tpu's sum over them must be finite."""
    if math.isfinite(tpu) and math.isfinite(cpu):
        return tpu <= cpu
    a, e, p = _where_they_differ(actual, expected, precise)
    tpu, cpu = summed_error(a, p), summed_error(e, p)
    return math.isfinite(tpu) and tpu <= cpu


def _where_they_differ(actual: list[Any], expected: list[Any], precise: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """The three results restricted to the tensor elements where tpu and the CPU differ
    (numbers that differ stay; equal ones, and equal tensor elements, are left out)."""
    out: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    for a, e, p in zip(actual, expected, precise):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and isinstance(p, torch.Tensor) and a.shape == e.shape == p.shape:
            differ = _abs_diff(a, e) != 0
            a, e, p = a[differ], e[differ], p[differ]
        elif not isinstance(a, torch.Tensor) and a == e:
            continue
        for group, v in zip(out, (a, e, p)):
            group.append(v)
    return out


def _inexact(outputs: list[Any]) -> bool:
    """Whether every output is a float32/16-bit/complex64 tensor (an integer op's float result)."""
    return all(isinstance(t, torch.Tensor) and t.dtype in _REFEREED for t in outputs)


def _kwargs(override: Tolerance | None) -> dict[str, Any]:
    return {} if override is None else {"atol": override.atol, "rtol": override.rtol}


def _samples(op: Any, dtype: torch.dtype, mode: str, max_samples: int | None) -> Iterator[Any]:
    if mode == "errors":
        gen = _error_input_pairs(op)
    elif mode == "extremal":
        gen = extremal.samples(op, dtype)
    else:
        gen = op.sample_inputs("cpu", dtype, requires_grad=_EAGER_MODE_OF.get(mode, mode) == "grad")
    return itertools.islice(gen, max_samples) if max_samples else iter(gen)


def _failure(index: int, e: BaseException) -> SampleFailure:
    if isinstance(e, NotImplementedError):
        return SampleFailure(index, "missing", _first_line(e), _where(e))
    if isinstance(e, AssertionError):
        return SampleFailure(index, "meta", _first_lines(e), _where(e))
    return SampleFailure(index, "error", f"{type(e).__name__}: {_first_line(e)}", _where(e))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _first_lines(e: BaseException, n: int = 4) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:400]


def skip_reason(op: Any, dtype: torch.dtype, mode: str) -> str | None:
    reason = xf.SKIPPED_DTYPES.get(dtype)
    if reason:
        return reason
    reason = xf.lookup(xf.SKIP, op_id(op), dtype_name(dtype), mode)
    if reason:
        return reason
    return _opinfo_skip(op, dtype)


@dataclass
class SampleRun:
    """Every sample of one case: the failures, the samples the float64 referee passed, and
    how many samples were compared (those the CPU refuses are not)."""

    failures: list[SampleFailure]
    refereed: list[Refereed]
    compared: int


def run_samples(case: Case, max_samples: int | None = None) -> SampleRun:
    """Run every sample of the case (up to ``max_samples``)."""
    op = _ops_by_id()[case.op_id]
    dtype = getattr(torch, case.dtype)
    override, runner = _tolerance(op, dtype), _RUNNERS[case.mode]  # None: an error-input case
    run = SampleRun([], [], 0)
    torch.manual_seed(0)  # the same samples whatever ran before (entries name samples by index)
    for index, sample in enumerate(_samples(op, dtype, case.mode, max_samples)):
        checks.clear()  # a device-side error left by an earlier sample is not this one's
        try:
            if runner is None:
                outcome = _check_error_input(index, op, sample)
            else:
                outcome = compare(index, runner(op, sample), dtype, override)
        except _CpuRefused:
            continue
        except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the run
            outcome = _failure(index, e)
        run.compared += 1
        if isinstance(outcome, SampleFailure):
            run.failures.append(outcome)
        elif isinstance(outcome, Refereed):
            run.refereed.append(outcome)
    return run


def run_case(case: Case, max_samples: int | None = None) -> Result:
    """Run one case and hold it to its expected failure, if it has one."""
    op = _ops_by_id()[case.op_id]
    dtype = getattr(torch, case.dtype)
    t0 = time.perf_counter()
    res = Result(case.op_id, case.dtype, case.mode, "pass")
    reason = skip_reason(op, dtype, case.mode)
    if reason:
        res.status, res.detail = "skip", reason
        return res
    run = run_samples(case, max_samples)
    res.seconds = round(time.perf_counter() - t0, 3)
    res.samples = run.compared
    res.failures = [asdict(f) for f in run.failures]
    res.refereed = [asdict(r) for r in run.refereed]
    if run.failures:
        res.kind = run.failures[0].kind
    if run.compared == 0:
        res.status, res.detail = "skip", "no sample the CPU accepts for this mode"
        return res
    ran = range(max_samples if max_samples else 1 << 30)
    verdict = judge(run.failures, ran, xf.OBSERVED.get(case.key), xf.lookup(xf.XFAIL, *case.key))
    res.status, res.detail = verdict.status, verdict.detail
    return res


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if "torchtpu" in f.filename] or list(tb)
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('/')[-1]}:{f.lineno}"


def run_all(
    selected: Iterable[Case], max_samples: int | None = None, progress: Callable[[Result], None] | None = None
) -> list[Result]:
    out = []
    for case in selected:
        r = run_case(case, max_samples)
        out.append(r)
        if progress is not None:
            progress(r)
    return out


def shard(cases: list[Case], spec: str | None) -> list[Case]:
    """The ``i/N`` shard of ``cases``: whole ops, contiguous, so a shard is one process
    running a slice of op_db (``python -m torchtpu.testing.shards`` runs them all)."""
    if not spec:
        return cases
    i, n = (int(x) for x in spec.split("/"))
    ops = list(dict.fromkeys(c.op_id for c in cases))
    per = -(-len(ops) // n)
    mine = set(ops[i * per : (i + 1) * per])
    return [c for c in cases if c.op_id in mine]


def write_json(results: list[Result], path: str, meta: dict[str, Any] | None = None) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta or {}, "results": [asdict(r) for r in results]}, f, indent=0)


def read_json(path: str) -> tuple[dict[str, Any], list[Result]]:
    with open(path) as f:
        data = json.load(f)
    return data.get("meta", {}), [Result(**r) for r in data["results"]]
