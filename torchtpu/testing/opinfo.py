"""Run PyTorch's OpInfo database (``op_db``: core, linalg, fft, special, ...) on tpu
against the CPU: forward outputs, gradients, in-place and ``out=`` variants, per dtype.

Shared by ``tests/test_opinfo.py`` (one pytest case per op x dtype x mode) and
``python -m torchtpu.coverage`` (the whole table, written as JSON/markdown).
"""

from __future__ import annotations

import functools
import itertools
import json
import time
import traceback
import unittest
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..eager import checks
from . import expected_failures as xf

MODES = ("fwd", "grad", "inplace", "out")

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

    return tuple(db)


@dataclass(frozen=True)
class Case:
    op_id: str
    dtype: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.op_id}-{self.dtype}-{self.mode}"


@dataclass
class Result:
    op_id: str
    dtype: str
    mode: str
    status: str  # pass | fail | xfail | xpass | skip
    kind: str = ""  # for failures: missing | mismatch | error
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0


def _ops_by_id() -> dict[str, Any]:
    return {op_id(op): op for op in op_db()}


def platform_dtypes(op: Any) -> list[torch.dtype]:
    """The dtypes the op supports on the CPU that the platform has, in table order."""
    supported = op.supported_dtypes("cpu")
    return [d for d in PLATFORM_DTYPES if d in supported]


def mode_applies(op: Any, dtype: torch.dtype, mode: str) -> bool:
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
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


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


def _tolerance(op: Any, dtype: torch.dtype) -> dict[str, float]:
    """Tolerance overrides OpInfo gives for comparisons against the CPU (else PyTorch's defaults)."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    for d in op.decorators:
        if isinstance(d, DecorateInfo) and d.is_active("TestCommon", "test_compare_cpu", "tpu", dtype, {}):
            for deco in d.decorators:
                tol = getattr(deco, "d", None)
                if isinstance(tol, dict) and dtype in tol:
                    return {"atol": tol[dtype].atol, "rtol": tol[dtype].rtol}
    return {}


# ---------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------
class _CpuRefused(Exception):
    """The CPU refuses this sample too: nothing to compare."""


def _to_tpu(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return t.detach().to(TPU).requires_grad_(t.requires_grad)
    return t


def _to_cpu(x: Any) -> Any:
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


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


def _compare(actual: Any, expected: Any, tol: dict[str, float]) -> None:
    torch.testing.assert_close(_to_cpu(actual), _to_cpu(expected), equal_nan=True, **tol)


def _cpu(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the reference refuses this sample
        raise _CpuRefused(str(e)) from e


def _run_fwd(op: Any, sample: Any, tol: dict[str, float]) -> None:
    tpu = _on_tpu(sample, op)
    expected = _cpu(lambda: sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs)))
    actual = tpu.output_process_fn_grad(op(tpu.input, *tpu.args, **tpu.kwargs))
    _check_devices(actual)
    _compare(actual, expected, tol)


def _run_inplace(op: Any, sample: Any, tol: dict[str, float]) -> None:
    fn = op.inplace_variant
    tpu = _on_tpu(sample, op)
    cpu_in = sample.input.clone() if isinstance(sample.input, torch.Tensor) else sample.input
    expected = _cpu(lambda: fn(cpu_in, *sample.args, **sample.kwargs))
    actual = fn(tpu.input, *tpu.args, **tpu.kwargs)
    _check_devices(actual)
    _compare(actual, expected, tol)
    _compare(tpu.input, cpu_in, tol)  # the write landed in the input


def _run_out(op: Any, sample: Any, tol: dict[str, float]) -> None:
    tpu = _on_tpu(sample, op)
    expected = _cpu(lambda: op(sample.input, *sample.args, **sample.kwargs))
    flat, spec = tree_flatten(expected)
    if not all(isinstance(t, torch.Tensor) for t in flat):
        raise _CpuRefused("non-tensor outputs")
    outs = [torch.empty(0, dtype=t.dtype) for t in flat]
    try:
        op(sample.input, *sample.args, out=outs[0] if len(outs) == 1 else tuple(outs), **sample.kwargs)
    except Exception as e:  # noqa: BLE001 - this sample's out= form is not valid on the CPU
        raise _CpuRefused(str(e)) from e
    tpu_outs = [torch.empty(0, dtype=t.dtype, device=TPU) for t in flat]
    ret = op(tpu.input, *tpu.args, out=tpu_outs[0] if len(tpu_outs) == 1 else tuple(tpu_outs), **tpu.kwargs)
    _check_devices(ret)
    _compare(tpu_outs, outs, tol)


def _grad_pairs(cpu_out: Any, tpu_out: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    e_flat, a_flat = tree_flatten(cpu_out)[0], tree_flatten(tpu_out)[0]
    e_outs, a_outs = [], []
    for e, a in zip(e_flat, a_flat):
        if isinstance(e, torch.Tensor) and e.requires_grad and (e.dtype.is_floating_point or e.dtype.is_complex):
            if not isinstance(a, torch.Tensor) or not a.requires_grad:
                raise AssertionError("a tpu output that should be differentiable does not require grad")
            e_outs.append(e)
            a_outs.append(a)
    return e_outs, a_outs


def _run_grad(op: Any, sample: Any, tol: dict[str, float]) -> None:
    tpu = _on_tpu(sample, op)
    cpu_out = _cpu(lambda: sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs)))
    tpu_out = tpu.output_process_fn_grad(op(tpu.input, *tpu.args, **tpu.kwargs))
    e_outs, a_outs = _grad_pairs(cpu_out, tpu_out)
    e_leaves = [
        t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    a_leaves = [t for t in tree_flatten((tpu.input, tpu.args, tpu.kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not e_outs or not e_leaves:
        raise _CpuRefused("nothing differentiable")
    gen = torch.Generator().manual_seed(1234)
    cot = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in e_outs]
    expected = _cpu(lambda: torch.autograd.grad(e_outs, e_leaves, cot, allow_unused=True))
    actual = torch.autograd.grad(a_outs, a_leaves, [c.to(TPU) for c in cot], allow_unused=True)
    # an unused input: PyTorch gives None on one side and possibly zeros on the other
    pairs = [(a, e) for a, e in zip(actual, expected) if not (a is None and e is None)]
    actual = [torch.zeros_like(e) if a is None else a for a, e in pairs]
    expected = [torch.zeros_like(a.cpu()) if e is None else e for a, e in pairs]
    _check_devices(actual)
    _compare(actual, expected, tol)


_RUNNERS = {"fwd": _run_fwd, "grad": _run_grad, "inplace": _run_inplace, "out": _run_out}


def _samples(op: Any, dtype: torch.dtype, mode: str, max_samples: int | None) -> Iterator[Any]:
    gen = op.sample_inputs("cpu", dtype, requires_grad=(mode == "grad"))
    return itertools.islice(gen, max_samples) if max_samples else iter(gen)


def _classify(e: BaseException) -> tuple[str, str]:
    if isinstance(e, NotImplementedError):
        return "missing", _first_line(e)
    if isinstance(e, AssertionError):
        return "mismatch", _first_lines(e)
    return "error", f"{type(e).__name__}: {_first_line(e)}"


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


def run_case(case: Case, max_samples: int | None = None) -> Result:
    """Run one case and classify it against the expected-failure data."""
    op = _ops_by_id()[case.op_id]
    dtype = getattr(torch, case.dtype)
    t0 = time.perf_counter()
    res = Result(case.op_id, case.dtype, case.mode, "pass")
    reason = skip_reason(op, dtype, case.mode)
    if reason:
        res.status, res.detail = "skip", reason
        return res
    tol = _tolerance(op, dtype)
    runner = _RUNNERS[case.mode]
    ran = 0
    checks.clear()  # a device-side error left by an earlier case is not this case's
    try:
        for sample in _samples(op, dtype, case.mode, max_samples):
            try:
                runner(op, sample, tol)
                ran += 1
            except _CpuRefused:
                continue
    except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the run
        res.status = "fail"
        res.kind, res.detail = _classify(e)
        if res.kind == "error":
            res.detail += " @ " + _where(e)
    res.samples = ran
    res.seconds = round(time.perf_counter() - t0, 3)
    expected = xf.lookup(xf.XFAIL, case.op_id, case.dtype, case.mode)
    if res.status == "pass" and ran == 0:
        res.status, res.detail = "skip", "no sample the CPU accepts for this mode"
    elif expected and res.status == "fail":
        res.status, res.detail = "xfail", f"{expected} [{res.kind}: {res.detail}]"
    elif expected and res.status == "pass":
        res.status, res.detail = "xpass", expected
    return res


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if "torchtpu" in f.filename] or list(tb)
    f = frames[-1]
    return f"{f.filename.split('/')[-1]}:{f.lineno}"


def run_all(
    selected: Iterable[Case], max_samples: int | None = None, progress: Callable[[Result], None] | None = None
) -> list[Result]:
    out = []
    for case in selected:
        torch.manual_seed(0)
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
