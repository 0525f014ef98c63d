"""Run PyTorch's ModuleInfo database (``module_db``: every ``torch.nn`` module with its
sample constructor arguments and forward inputs) on tpu against the CPU.

OpInfo samples call one function; a module sample builds the module (its own
``reset_parameters``, buffers, options such as ``padding_mode``, ``proj_size``,
``batch_first``, key padding masks), calls it and differentiates through it, so it reaches
paths no op sample does. Its first run found NaN gradients for a batch whose targets are all
``ignore_index`` (``nn.CrossEntropyLoss``), ``nn.MultiLabelMarginLoss``'s unbatched shape,
``nn.LinearCrossEntropyLoss`` failing after a 1-d upload's length had varied,
``nn.FractionalMaxPool3d``'s extra samples and softmax's backward losing digits (see
docs/conformance.md). Per sample the harness compares, against the CPU running the same
module from the same weights: every output, the gradients of the inputs and parameters
for fixed random cotangents, and the buffers after the call (BatchNorm's running
statistics), with PyTorch's tolerances and the float64 referee of ``opinfo.compare``.

A case is one module in one mode (train or eval) run one way: ``eager``, ``defer``
(DeferAndFuse) or ``compile`` (``torch.compile(module, backend="tpu")``, compiled afresh
per sample), in float32 or float64 (parameters and floating inputs; float64 found the
fused attention computing in float32). ``tests/test_moduleinfo.py`` runs them.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..runner import checks
from .observed import Entry, Observed, SampleFailure, judge
from .opinfo import TPU, Outputs, Refereed, _CpuRefused, _failure, compare

WAYS = ("eager", "defer", "compile")
TRAINING = {"train": True, "eval": False}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Case:
    module: str  # ModuleInfo name, e.g. "nn.Conv2d"
    training: str  # "train" | "eval"
    way: str  # "eager" | "defer" | "compile"
    dtype: str = "float32"  # a key of DTYPES: the module's parameters and floating inputs

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.module, self.training, self.way, self.dtype)

    @property
    def id(self) -> str:
        return f"{self.module}-{self.training}-{self.way}" + ("" if self.dtype == "float32" else f"-{self.dtype}")


@dataclass(frozen=True)
class Expected:
    """An expected failure: what fails (the recorded signature) and why, measured."""

    observed: Entry
    reason: str


_TRANSFORMER = (
    "rounding, not a wrong value: 2 of the decoder self-attention's in_proj_weight gradient "
    "elements differ from the CPU by 1.4e-5 (tolerance 1e-5); over all 420 result elements the "
    "summed error against float64 is 1.42e-4 on the CPU (MKL) and 1.42e-4 to 1.44e-4 on tpu, and "
    "the CPU itself, with every matrix product summed in another correct float32 order, gives "
    "9.1e-5 to 1.8e-4 (20 random orders; reversed 1.24e-4, correctly rounded 1.70e-4): the "
    "sample's attention saturates, so its gradients hang on the order of 4-term dot products"
)
_DECODER_LAYER = (
    "rounding, not a wrong value: norm1's weight and bias gradients differ from the CPU by up to "
    "2.7e-5 in 3 of 296 elements; summed error against float64: CPU (MKL) 2.4e-4, tpu 5.3e-4, and "
    "the CPU with every matrix product summed in another correct float32 order 1.9e-4 to 1.04e-3 "
    "(20 random orders; with fused multiply-adds 1.4e-4 to 6.4e-4; correctly rounded 3.2e-4)"
)
_MULTIHEAD_FUSED = (
    "rounding, not a wrong value: sample #41 (embed_dim 3, 3 heads, add_bias_kv) has saturated "
    "attention rows (scores up to 64), so its q, k and in_proj_weight gradients hang on the last "
    "bit of single probabilities. Fused with the score product, XLA's softmax rounds 21 of 36 "
    "probabilities differently from the CPU's, every one within 1 ulp of float64 (summed error "
    "2.8e-7; the CPU's 3.9e-7); the one at head 2, row 1, column 0 (0.92750388, float64 "
    "0.92750384) alone takes the summed error from 3.4e-5 to 1.09e-4 (1.26e-4 with all 21). "
    "The CPU itself, its softmax replaced by float64's rounded down or up at random (40 draws, "
    "each probability within 1 ulp), gives 3.3e-5 to 1.35e-4; eager tpu, whose softmax is bitwise "
    "the CPU's, passes"
)
_CONV3D = (
    "rounding, not a wrong value: the weight gradient sums 120 products per element (2 inputs x 60 "
    "positions); tpu adds them in one float32 pass: summed error against the exact sum 2.23e-3 "
    "(largest 3.6e-5 on an element of 133: 2.4 ulp), where oneDNN's blocked sums reach 1.39e-3 and "
    "PyTorch's CPU kernel without oneDNN 1.91e-3; one float32 pass over the same exact products in "
    "40 random orders, with and without fused multiply-add, gives 2.17e-3 to 2.72e-3"
)
_CONV_TRANSPOSE3D = (
    "rounding, not a wrong value: the weight gradient sums 120 products per element; summed error "
    "against the exact sum of the float32 run's products: tpu 3.66e-3, the CPU (oneDNN or not) "
    "3.30e-3, one float32 pass in 40 random orders 4.1e-3 to 4.9e-3; 6 of 3125 elements exceed "
    "the tolerance, by up to 4.1e-5"
)

def _everywhere(module: str, observed: Observed, reason: str) -> dict[tuple[str, str, str, str], Expected]:
    """The same expected failure in train and eval, eagerly, under DeferAndFuse and compiled."""
    return {(module, training, way, "float32"): Expected(observed, reason) for training in TRAINING for way in WAYS}


def _mismatch(index: int, max_abs: float, max_rel: float) -> Observed:
    return Observed("mismatch", (index,), max_abs=max_abs, max_rel=max_rel)


# Recorded with torch.manual_seed(0) before each case's samples are made (the sample index
# names the same inputs on every machine).
EXPECTED: dict[tuple[str, str, str, str], Expected] = {
    **_everywhere("nn.Transformer", _mismatch(29, 1.41e-05, 0.00296), _TRANSFORMER),
    **_everywhere("nn.TransformerDecoderLayer", _mismatch(45, 7.25e-05, 3.0), _DECODER_LAYER),
    **{
        ("nn.MultiheadAttention", training, way, "float32"): Expected(_mismatch(41, 2.96e-05, 0.000487), _MULTIHEAD_FUSED)
        for training in TRAINING
        for way in ("defer", "compile")
    },
    **_everywhere("nn.Conv3d", _mismatch(1, 4.2e-05, 4.22e-05), _CONV3D),
    **_everywhere("nn.LazyConv3d", _mismatch(1, 4.2e-05, 4.22e-05), _CONV3D),
    **_everywhere("nn.ConvTranspose3d", _mismatch(0, 4.1e-05, 0.00124), _CONV_TRANSPOSE3D),
    **_everywhere("nn.LazyConvTranspose3d", _mismatch(0, 4.1e-05, 0.00124), _CONV_TRANSPOSE3D),
}


@functools.cache
def module_db() -> dict[str, Any]:
    """PyTorch's ModuleInfo entries by name (imported lazily: the import takes seconds)."""
    from torch.testing._internal.common_modules import module_db as db

    return {info.name: info for info in db}


def cases(ways: tuple[str, ...] = WAYS, dtype: str = "float32") -> list[Case]:
    """Every module (that ModuleInfo lists for ``dtype``) in train and eval, run ``ways``."""
    names = [name for name, info in module_db().items() if DTYPES[dtype] in info.dtypes]
    return [Case(name, training, way, dtype) for name in names for training in TRAINING for way in ways]


# -- one sample --------------------------------------------------------------------------------
def _uninitialized(module: torch.nn.Module) -> bool:
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    return any(isinstance(t, (UninitializedParameter, UninitializedBuffer)) for t in (*module.parameters(), *module.buffers()))


def _built(info: Any, sample: Any, training: bool, device: str | torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The sample's module on ``device`` in ``dtype``, its weights drawn on the CPU from
    seed 0 whatever the device (as ``.to(device)`` of a CPU module). Tensors among the
    constructor's arguments (FractionalMaxPool's ``_random_samples``, made float64 by the
    sample) are given in ``dtype`` on ``device``, as the forward inputs are. A lazy module
    is materialised by a call on the CPU first: on tpu, its first call would draw its
    weights from the device's generator, as on CUDA."""
    torch.manual_seed(0)
    args, kwargs = _moved(sample.constructor_input.args, device, dtype), _moved(sample.constructor_input.kwargs, device, dtype)
    module = info.module_cls(*args, **kwargs)
    module.train(training)
    if _uninitialized(module):
        cpu_args, cpu_kwargs = _inputs(sample, "cpu", torch.float32)
        with torch.no_grad():
            module(*cpu_args, **cpu_kwargs)
    return module.to(device).to(dtype)


def _moved(tree: Any, device: str | torch.device, dtype: torch.dtype) -> Any:
    """The tensors in ``tree`` as fresh leaves on ``device``, floating ones in ``dtype``."""

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = t.detach().to(device)
        if out.is_floating_point():
            out = out.to(dtype)
        return out.requires_grad_(t.requires_grad)

    return tree_map(move, tree)


def _inputs(sample: Any, device: str | torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """The forward arguments as fresh leaves on ``device`` (floating ones in ``dtype``)."""
    return _moved(sample.forward_input.args, device, dtype), _moved(sample.forward_input.kwargs, device, dtype)


def way_context(way: str) -> contextlib.AbstractContextManager[Any]:
    if way == "defer":
        import torchtpu

        return torchtpu.eager_mode("defer_and_fuse")
    return contextlib.nullcontext()


def _call(module: torch.nn.Module, args: Any, kwargs: Any, way: str) -> Any:
    if way != "compile":
        return module(*args, **kwargs)
    # compiled afresh per sample: past Dynamo's recompile limit a module would run eagerly
    torch._dynamo.reset()
    return torch.compile(module, backend="tpu")(*args, **kwargs)


def _run(info: Any, sample: Any, training: bool, device: str | torch.device, dtype: torch.dtype, way: str) -> list[Any]:
    """Outputs, gradients (inputs first, then parameters; None where unused) and buffers of
    one call of the sample's module on ``device`` in ``dtype``, all on the host."""
    module = _built(info, sample, training, device, dtype)
    args, kwargs = _inputs(sample, device, dtype)
    return run_module(module, args, kwargs, way)


def run_module(module: torch.nn.Module, args: Any, kwargs: Any, way: str) -> list[Any]:
    """Outputs, gradients (of the arguments that require one, then of the parameters; None
    where unused) and buffers of one call ``module(*args, **kwargs)`` run ``way``, all on
    the host. The gradients are taken for fixed random cotangents (``_cotangents``)."""
    with way_context(way):
        torch.manual_seed(1)
        out = _call(module, args, kwargs, way)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        grads: tuple[Any, ...] = ()
        differentiable = [t for t in outputs if t.requires_grad]
        if differentiable:
            leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            leaves += [p for p in module.parameters() if p.requires_grad]
            loss = sum((t * c).sum() for t, c in zip(differentiable, _cotangents(differentiable)))
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        result = [*outputs, *grads, *module.buffers()]
        return [t if t is None else t.detach().cpu() for t in result]


def _cotangents(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fixed random weights for the outputs (the same numbers on every device and dtype)."""
    g = torch.Generator().manual_seed(2)
    return [torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype).to(t.device) for t in outputs]


def _outputs(info: Any, sample: Any, training: bool, way: str, dtype: torch.dtype) -> Outputs:
    try:
        expected = _run(info, sample, training, "cpu", dtype, "eager")
    except Exception as e:  # noqa: BLE001 - a sample the CPU refuses is not compared
        raise _CpuRefused(str(e)) from e
    actual = _run(info, sample, training, TPU, dtype, way)
    return Outputs(actual, expected, lambda: _run(info, sample, training, "cpu", torch.float64, "eager"))


# -- one case ----------------------------------------------------------------------------------
@dataclass
class Result:
    case: Any  # a Case of this module's, of nn_tests' or of optiminfo's
    status: str  # pass | fail | xfail | xpass | skip
    detail: str = ""
    samples: int = 0
    refereed: int = 0  # samples beyond the tolerance that the float64 referee passed
    seconds: float = 0.0


def _samples(info: Any, training: bool, max_samples: int | None, dtype: torch.dtype) -> Iterator[Any]:
    torch.manual_seed(0)  # the same inputs whatever ran before (entries name samples by index)
    samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
    return iter(samples[:max_samples] if max_samples else samples)


def run_case(case: Case, max_samples: int | None = None) -> Result:
    """Run every sample of ``case`` (up to ``max_samples``) and hold it to its expected failure."""
    t0 = time.perf_counter()
    info, training, dtype = module_db()[case.module], TRAINING[case.training], DTYPES[case.dtype]
    failures: list[SampleFailure] = []
    compared = refereed = 0
    for index, sample in enumerate(_samples(info, training, max_samples, dtype)):
        checks.clear()  # a device-side error an earlier sample left is not this one's
        try:
            outcome = compare(index, _outputs(info, sample, training, case.way, dtype), dtype, None)
        except _CpuRefused:
            continue
        except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the run
            outcome = _failure(index, e)
        compared += 1
        if isinstance(outcome, SampleFailure):
            failures.append(outcome)
        elif isinstance(outcome, Refereed):
            refereed += 1
    res = Result(case, "pass", samples=compared, refereed=refereed, seconds=round(time.perf_counter() - t0, 3))
    if compared == 0:
        res.status, res.detail = "skip", "no sample the CPU accepts"
        return res
    expected = EXPECTED.get(case.key)
    ran = range(max_samples if max_samples else 1 << 30)
    verdict = judge(failures, ran, expected.observed if expected else None, expected.reason if expected else None)
    res.status, res.detail = verdict.status, verdict.detail
    return res
