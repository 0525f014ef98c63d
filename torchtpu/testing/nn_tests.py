"""Run the module and criterion tests of PyTorch's ``common_nn`` on tpu against the CPU.

``torch.testing._internal.common_nn`` describes 282 tests as dicts (``module_tests``,
``get_new_module_tests()``, ``criterion_tests``): a module's constructor and arguments, an
input (a size or a function) and for a loss its target. PyTorch's test_nn.py runs each on
CUDA against the CPU. They reach cases ModuleInfo has no sample for: its first run here
found an empty batch that nearest upsampling refused, a multi-margin loss of one sample
in the wrong shape, and, compiled, ``multilabel_margin_loss`` counting the targets after
a -1 (PyTorch's decomposition; see docs/conformance.md).

Per test and way (``eager``, ``defer``, ``compile``, as in ``moduleinfo``) the module is
built on the CPU from seed 0 and copied to each device; compared are every output, the
gradients of the floating inputs (not a loss's target) and the parameters for fixed
random cotangents, and the buffers after the call, in float32, with PyTorch's
tolerances and the float64 referee of ``opinfo.compare``. Complex inputs are skipped
(the tpu device has no complex dtypes).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..runner import checks
from .moduleinfo import WAYS, Expected, Result, run_module
from .observed import Observed, SampleFailure, judge
from .opinfo import TPU, Outputs, _failure, compare


@dataclass(frozen=True)
class Case:
    test: str  # common_nn's test name, e.g. "test_Conv2d_dilated"
    way: str  # "eager" | "defer" | "compile"

    @property
    def key(self) -> tuple[str, str]:
        return (self.test, self.way)

    @property
    def id(self) -> str:
        return f"{self.test}-{self.way}"


@dataclass(frozen=True)
class NnTest:
    """One common_nn test, built: the module (on the CPU, float32), its inputs and, for a
    loss, its target (None for a module test)."""

    module: torch.nn.Module
    inputs: tuple[Any, ...]
    target: Any


# Modules that draw random numbers in training mode: on tpu they draw from the device's
# generator (as on CUDA), so their values are not the CPU's; tests/test_factories_rng.py
# checks their distributions.
RANDOM = {"test_RReLU", "test_RReLU_with_up_down", "test_RReLU_no_batch_dim"}

_SPARSE = (
    "unsupported, with the error PyTorch's other backends without sparse kernels give: the tpu "
    "device has no sparse layouts, and the message says to use dense gradients (sparse=False)"
)
EXPECTED: dict[tuple[str, str], Expected] = {
    **{
        ("test_EmbeddingBag_sparse", way): Expected(
            Observed("missing", (0,), "torchtpu: embedding_bag(sparse=True) gradients are not supported; use sparse=False"), _SPARSE
        )
        for way in WAYS
    },
    **{
        ("test_Embedding_sparse", way): Expected(Observed("missing", (0,), "torchtpu: "), _SPARSE)
        for way in WAYS
    },
}


def _descriptions() -> list[tuple[dict[str, Any], type]]:
    from torch.testing._internal import common_nn

    modules = [(d, common_nn.NewModuleTest) for d in (*common_nn.module_tests, *common_nn.get_new_module_tests())]
    return modules + [(d, common_nn.CriterionTest) for d in common_nn.criterion_tests]


@functools.cache
def nn_tests() -> dict[str, Callable[[], NnTest]]:
    """Each test's builder by name (as test_nn.py names it), complex-valued tests left out."""
    builders: dict[str, Callable[[], NnTest]] = {}
    for description, kind in _descriptions():
        d = dict(description)
        if "constructor" not in d:  # as test_nn.py does: the module class by its name
            d["constructor"] = getattr(torch.nn, d.pop("module_name"))
        test = kind(**d)
        builders[test.get_name()] = functools.partial(_build, test, kind.__name__ == "CriterionTest")
    return builders


def criterion_names() -> set[str]:
    """The loss tests' names (``criterion_tests`` and the ``*Loss*`` module tests)."""
    return {name for name in nn_tests() if "Loss" in name or "loss" in name}


def _build(test: Any, criterion: bool) -> NnTest:
    from torch.testing._internal.common_utils import set_default_dtype

    with set_default_dtype(test.default_dtype):
        torch.manual_seed(0)
        given = test._get_input()
        target = test._get_target() if criterion else None
        torch.manual_seed(0)
        module = test.constructor(*test.constructor_args)
    inputs = given if isinstance(given, tuple) else (given,)
    return NnTest(module, inputs, target)


def _complex(t: NnTest) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_complex() for x in tree_flatten((t.inputs, t.target))[0])


def cases(ways: tuple[str, ...] = WAYS) -> list[Case]:
    return [Case(name, way) for name in nn_tests() for way in ways]


def _run(t: NnTest, device: str, dtype: torch.dtype, way: str) -> list[Any]:
    """The test's results on ``device`` in ``dtype``: a copy of the CPU module, floating
    inputs as fresh leaves that require a gradient (a loss's target does not)."""
    module = copy.deepcopy(t.module).to(dtype).to(device)

    def moved(x: Any, leaf: bool) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        out = x.detach().to(device)
        if not out.is_floating_point():
            return out
        return out.to(dtype).requires_grad_(leaf)

    args = tree_map(lambda x: moved(x, True), t.inputs)
    if t.target is not None:
        args = (*args, tree_map(lambda x: moved(x, False), t.target))
    return run_module(module, args, {}, way)


def run_case(case: Case) -> Result:
    t0 = time.perf_counter()
    if case.test in RANDOM:
        return Result(case, "skip", "draws random numbers: tpu uses the device's generator, as CUDA does")
    t = nn_tests()[case.test]()
    if _complex(t):
        return Result(case, "skip", "complex inputs: the tpu device has no complex dtypes")
    try:
        expected = _run(t, "cpu", torch.float32, "eager")
    except Exception:  # noqa: BLE001 - a test the CPU refuses in float32 is not compared
        return Result(case, "skip", "the CPU refuses it in float32")
    checks.clear()  # a device-side error an earlier case left is not this one's
    try:
        actual = _run(t, TPU, torch.float32, case.way)
        outcome = compare(0, Outputs(actual, expected, lambda: _run(t, "cpu", torch.float64, "eager")), torch.float32, None)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the run
        outcome = _failure(0, e)
    failures = [outcome] if isinstance(outcome, SampleFailure) else []
    entry = EXPECTED.get(case.key)
    verdict = judge(failures, range(1), entry.observed if entry else None, entry.reason if entry else None)
    return Result(case, verdict.status, verdict.detail, samples=1, seconds=round(time.perf_counter() - t0, 3))
