"""Run PyTorch's OptimizerInfo database (``optim_db``: every ``torch.optim`` optimizer with
its sample constructor configurations and error inputs) on tpu against the CPU.

A *config* is one of the database's ``OptimizerInput`` s in one implementation: the
for-loop (``foreach=False``; every ``supported_impls`` flag off, as PyTorch's
``_get_optim_inputs_including_global_cliquey_kwargs`` makes it), ``foreach``,
``differentiable`` and ``fused``. The configurations are the ones the database gives a
device where ``capturable`` works (``optim_inputs_func("cuda")``: PyTorch lists PrivateUse1
among the capturable devices), so the ``capturable`` and tensor-``betas`` inputs are
included; ``fused`` runs wherever the optimizer has a fused kernel (PyTorch allows fused
on PrivateUse1; ``supports_fused_on`` names only the devices PyTorch's CI has). Each
scheduler list of ``scheduler_inputs`` runs once more with the ``default`` input, for-loop
and foreach, and every input runs once more in complex64 (for-loop and foreach) where the
database says the optimizer supports complex parameters (its error inputs check the refusal
where it does not). ``SparseAdam`` takes only sparse gradients, which tpu does not have:
skipped. LBFGS runs 2 iterations a step (``HARNESS_KWARGS`` says why).

A run draws the parameters (shapes ``SHAPES``; 2-d only for Muon) and one gradient per step
on the CPU from fixed seeds and gives both devices the same values; LBFGS (which needs a
closure) and ReduceLROnPlateau's metric use the loss ``_loss`` computed on each device.
After every one of ``STEPS`` steps the harness takes a snapshot: the parameters, every
entry of ``state_dict()["state"]`` (moments, step counts, LBFGS's history) and the numeric
hyper-parameters of every param group (the learning rate a scheduler set), plus the loss a
closure returned. Step ``i``'s snapshot on tpu is compared with the CPU's by
``opinfo.compare`` (PyTorch's float32 tolerance, else the float64 referee: the same run on
the CPU in float64 from the same float32 values, and tpu passes when its summed error
against it is no larger than the CPU's). The comparison's sample index is the step.
A ``differentiable`` config adds one more comparison (index ``STEPS``): the gradients of a
fixed random weighting of the final parameters with respect to the parameters, the
floating optimizer state and the gradients the last step started from (each the clone of a
fresh leaf, as PyTorch's ``test_optim_differentiable.py`` passes them).

When the CPU refuses a config (raises), tpu must raise the same exception type with the
same message (``cpu`` read as ``tpu``). A ``capturable`` config runs on the CPU with
PyTorch's capturable device check admitting the CPU (the check is about CUDA graphs; the
arithmetic is the same code).

A case is one config run one way: ``eager``, ``defer`` (DeferAndFuse) or ``compile``
(``torch.compile(opt.step, backend="tpu")``, compiled afresh per case; a differentiable
config's reference is then the CPU's own compile, ``_reference_way``). Error cases run
``optim_error_inputs_func``'s inputs (built for the CPU, their tensors moved to tpu):
the same exception or warning type with a message matching the database's regex, at the
same point (construction or step). Expected failures are strict and measured
(``EXPECTED``). ``tests/test_optiminfo.py`` runs them.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..runner import checks
from .moduleinfo import Expected, Result, way_context
from .observed import SampleFailure, judge
from .opinfo import TPU, Outputs, Refereed, _failure, _first_line, compare

WAYS = ("eager", "defer", "compile")
IMPLS = ("forloop", "foreach", "differentiable", "fused")
STEPS = 4
SHAPES = ((4, 3), (3,), (4, 3))  # two shapes: each new shape compiles every op again
MATRIX_ONLY = {"Muon"}  # optimizers that take 2-d parameters only
SKIPPED = {"SparseAdam": "SparseAdam takes sparse gradients only; tpu has no sparse tensors"}
# Set on every config of the optimizer (unless the config sets it). LBFGS's default 20
# iterations a step reach the minimum of any convex loss within the first step, and then its
# history is rounding noise (ro = 1/(y.s) of differences of ~1e-8): measured, the CPU's own
# float32 run is up to 2.8e6 times the float32 tolerance from float64 there, and its
# iteration count differs. On a non-convex loss (Rosenbrock) the trajectory turns chaotic
# in float32 after ~20 iterations. With 2 iterations a step (8 in all) the CPU's float32
# run stays within 0.4x the tolerance of float64 on the parameters for the database's lr=1
# configs, so the comparison sees the arithmetic, not the conditioning.
HARNESS_KWARGS: dict[str, dict[str, Any]] = {"LBFGS": {"max_iter": 2}}


@dataclass(frozen=True)
class Config:
    """One optimizer configuration: the database input, its implementation, its schedulers."""

    optimizer: str
    desc: str  # the OptimizerInput's desc
    impl: str  # forloop | foreach | differentiable | fused
    kwargs: tuple[tuple[str, Any], ...]
    schedulers: int | None = None  # index into the OptimizerInfo's scheduler_inputs
    complex: bool = False  # complex64 parameters and gradients (float32 otherwise)

    @property
    def name(self) -> str:
        sched = "" if self.schedulers is None else f"-sched{self.schedulers}"
        return f"{self.optimizer}-{_slug(self.desc)}-{self.impl}{sched}{'-complex64' if self.complex else ''}"

    def dtype(self, wide: bool = False) -> torch.dtype:
        """The parameters' dtype: float32/complex64, or float64/complex128 for the referee."""
        if self.complex:
            return torch.complex128 if wide else torch.complex64
        return torch.float64 if wide else torch.float32


@dataclass(frozen=True)
class Case:
    optimizer: str
    config: int  # index into configs(optimizer); -1: the error inputs
    way: str  # eager | defer | compile | errors

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.optimizer, self.config, self.way)

    @property
    def id(self) -> str:
        if self.config < 0:
            return f"{self.optimizer}-errors"
        return f"{configs(self.optimizer)[self.config].name}-{self.way}"


# Keyed by Case.key; recorded with the seeds the harness fixes (a step index names the
# same values on every machine).
EXPECTED: dict[tuple[str, int, str], Expected] = {}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


# -- the database ------------------------------------------------------------------------------
@functools.cache
def optim_db() -> dict[str, Any]:
    """PyTorch's OptimizerInfo entries by name (imported lazily: the import takes seconds)."""
    from torch.testing._internal.common_optimizers import optim_db as db

    return {info.name: info for info in db}


def _impls(info: Any) -> tuple[str, ...]:
    return ("forloop", *(i for i in IMPLS[1:] if i in info.supported_impls))


def _with_impl(info: Any, kwargs: dict[str, Any], impl: str) -> dict[str, Any]:
    out = {**HARNESS_KWARGS.get(info.name, {}), **kwargs}
    for flag in info.supported_impls:
        out[flag] = flag == impl
    return out


@functools.cache
def configs(optimizer: str) -> tuple[Config, ...]:
    """Every config of ``optimizer``, in a stable order (cases name them by index)."""
    info = optim_db()[optimizer]
    inputs = info.optim_inputs_func("cuda")  # a capturable device's list: no CUDA is touched
    seen: dict[str, int] = {}
    for oi in inputs:  # NAdam has two inputs named "decoupled_weight_decay, capturable"
        seen[oi.desc] = seen.get(oi.desc, 0) + 1
        oi.desc += f" {seen[oi.desc]}" if seen[oi.desc] > 1 else ""
    out = [
        Config(optimizer, oi.desc, impl, tuple(_with_impl(info, oi.kwargs, impl).items()))
        for oi in inputs
        for impl in _impls(info)
    ]
    default = inputs[0].kwargs
    for i in range(len(info.scheduler_inputs)):
        for impl in _impls(info)[:2]:
            out.append(Config(optimizer, "default", impl, tuple(_with_impl(info, default, impl).items()), i))
    if info.supports_complex:  # PyTorch's test_complex leaves differentiable out; fused kernels are real
        out += [
            Config(optimizer, oi.desc, impl, tuple(_with_impl(info, oi.kwargs, impl).items()), complex=True)
            for oi in inputs
            for impl in _impls(info)[:2]
        ]
    return tuple(out)


def cases(ways: tuple[str, ...] = WAYS, errors: bool = True) -> list[Case]:
    out = []
    for name in optim_db():
        if errors:
            out.append(Case(name, -1, "errors"))
        out += [Case(name, i, way) for i in range(len(configs(name))) for way in ways]
    return out


# -- one run -----------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """What one step left: names and values (host tensors or numbers), in a stable order."""

    names: list[str]
    values: list[Any]


@dataclass
class Inputs:
    """A run's starting point, drawn on the CPU in float32 (complex64)."""

    params: list[torch.Tensor]
    grads: list[list[torch.Tensor]]  # per step
    loss_weights: list[torch.Tensor]  # _loss's a_i
    loss_centres: list[torch.Tensor]  # _loss's c_i
    cotangents: list[torch.Tensor]  # weights of the final parameters (differentiable)


def _inputs(config: Config) -> Inputs:
    g = torch.Generator().manual_seed(0)
    shapes = [s for s in SHAPES if len(s) == 2] if config.optimizer in MATRIX_ONLY else list(SHAPES)
    dtype = config.dtype()

    def draw(dtype: torch.dtype = dtype) -> list[torch.Tensor]:
        return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]

    params = draw()
    grads = [draw() for _ in range(STEPS)]
    weights = [w.abs() + 0.5 for w in draw(torch.float32)]
    return Inputs(params, grads, weights, draw(), draw())


def _square(x: torch.Tensor) -> torch.Tensor:
    return (x * x.conj()).real if x.is_complex() else x * x


def _loss(params: list[torch.Tensor], inputs: Inputs) -> torch.Tensor:
    """sum(a |p - c|^2 + 0.1 |p|^4): smooth, not quadratic (LBFGS's closure, the metric)."""
    total = None
    for p, a, c in zip(params, inputs.loss_weights, inputs.loss_centres):
        a, c = a.to(p.device, p.real.dtype), c.to(p.device, p.dtype)
        term = (a * _square(p - c) + 0.1 * _square(_square(p))).sum()
        total = term if total is None else total + term
    assert total is not None
    return total


def _moved_kwargs(kwargs: tuple[tuple[str, Any], ...], dtype: torch.dtype) -> dict[str, Any]:
    """Fresh copies of tensor hyper-parameters (an optimizer writes its tensor lr), floating
    ones in float64 for the float64 run; they stay on the CPU, as the database gives them."""

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            v = v.clone()
            return v.to(dtype) if dtype == torch.float64 and v.is_floating_point() else v
        if isinstance(v, tuple):
            return tuple(copy(x) for x in v)
        return v

    return {k: copy(v) for k, v in kwargs}


_CAPTURABLE_MODULES = ("adadelta", "adam", "adamax", "asgd", "nadam", "radam", "rmsprop", "rprop")


@contextlib.contextmanager
def _capturable_on_cpu() -> Iterator[None]:
    """PyTorch refuses ``capturable=True`` on the CPU (a check for CUDA graphs); admit it, so
    that the CPU reference runs the same code as tpu."""
    import importlib

    from torch.optim.optimizer import _get_capturable_supported_devices as original

    def devices(supports_xla: bool = True) -> list[str]:
        return [*original(supports_xla), "cpu"]

    modules = [importlib.import_module(f"torch.optim.{m}") for m in _CAPTURABLE_MODULES]
    for m in modules:
        m._get_capturable_supported_devices = devices  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in modules:
            m._get_capturable_supported_devices = original  # type: ignore[attr-defined]


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flat(v)]
    return [value]


def _snapshot(opt: torch.optim.Optimizer, params: list[torch.Tensor], loss: Any, real: torch.dtype) -> Snapshot:
    """The parameters, the optimizer's state and its numeric hyper-parameters, on the host.
    Python floats (LBFGS's ``prev_loss``, a scheduler's lr) become tensors of the run's real
    dtype, compared at its tolerance and refereed like the rest; ints (step and iteration
    counts) must match exactly."""
    names: list[str] = []
    values: list[Any] = []

    def add(name: str, value: Any) -> None:
        for i, v in enumerate(_flat(value)):
            if isinstance(v, torch.Tensor):
                v = v.detach().to("cpu", copy=True)  # a copy: the CPU run goes on writing its tensors
            elif isinstance(v, float):
                v = torch.tensor(v, dtype=real)
            elif isinstance(v, bool) or not isinstance(v, int):
                continue  # flags and names: configuration, not results
            names.append(name if i == 0 and not isinstance(value, (tuple, list)) else f"{name}[{i}]")
            values.append(v)

    for i, p in enumerate(params):
        add(f"param {i}", p)
    sd = opt.state_dict()
    for index, state in sd["state"].items():
        for key, v in state.items():
            add(f"state {index} {key}", v)
    for gi, group in enumerate(sd["param_groups"]):
        for key, v in group.items():
            if key != "params":
                add(f"group {gi} {key}", v)
    if loss is not None:
        add("loss", loss)
    return Snapshot(names, values)


def _stepper(opt: torch.optim.Optimizer, way: str) -> Callable[..., Any]:
    """``opt.step``, compiled for ``compile`` (backend tpu) and ``aot_eager`` (the CPU's
    compiled reference, see ``_reference_way``)."""
    if way not in ("compile", "aot_eager"):
        return opt.step
    torch._dynamo.reset()  # compiled afresh per case: past Dynamo's recompile limit it would run eagerly
    return torch.compile(opt.step, backend="tpu" if way == "compile" else "aot_eager")


def _reference_way(config: Config, way: str) -> str:
    """How the CPU runs the reference: eagerly, except a differentiable config's compiled
    step, which runs through the same compile on the CPU (``aot_eager``: Dynamo and
    AOTAutograd, the CPU's kernels). PyTorch's compile path gives other gradients through a
    differentiable step than eager on the CPU as well, measured on Adam (default config):
    d/d exp_avg_sq = 0.878, -0.041, -0.168 compiled, 1.023, -0.048, -0.196 eager (every
    gradient but d/d param scaled alike), and it raises "modified by an inplace operation"
    for weight_decay or amsgrad, where eager runs."""
    return "aot_eager" if way == "compile" and config.impl == "differentiable" else "eager"


def _run(config: Config, device: str | torch.device, dtype: torch.dtype, way: str) -> list[Snapshot]:
    """The snapshots after each step of ``config`` on ``device`` in ``dtype`` (float32, or
    float64 for the referee; complex64/complex128 for a complex config), and, for a
    differentiable config, the gradients through the last step as one more snapshot."""
    info = optim_db()[config.optimizer]
    inputs = _inputs(config)
    differentiable = config.impl == "differentiable"
    wide = dtype == torch.float64
    dtype = config.dtype(wide)
    start = [p.to(dtype).to(device) for p in inputs.params]
    # differentiable steps write their parameters with autograd on: plain tensors, not leaves that require grad
    params = [p.clone() for p in start] if differentiable else [torch.nn.Parameter(p.clone()) for p in start]
    kwargs = _moved_kwargs(config.kwargs, torch.float64 if wide else torch.float32)
    capturable = kwargs.get("capturable") and torch.device(device).type == "cpu"
    snapshots: list[Snapshot] = []
    with _capturable_on_cpu() if capturable else contextlib.nullcontext(), way_context(way):
        opt = info.optim_cls(params, **kwargs)
        schedulers = [] if config.schedulers is None else [make(opt) for make in info.scheduler_inputs[config.schedulers]]
        step = _stepper(opt, way)
        wrt: list[tuple[str, torch.Tensor]] = []
        for k in range(STEPS):
            loss = None
            if differentiable and k == STEPS - 1:
                wrt = _track_from_here(opt, params)
            if info.step_requires_closure:

                def closure() -> torch.Tensor:
                    opt.zero_grad()
                    value = _loss(params, inputs)
                    value.backward()
                    return value

                loss = step(closure)
            else:
                for i, (p, g) in enumerate(zip(params, inputs.grads[k])):
                    p.grad = g.to(dtype).to(device).requires_grad_(bool(wrt))
                    if wrt:
                        wrt.append((f"grad {i}", p.grad))
                step()
            _step_schedulers(schedulers, lambda: _loss(params, inputs))
            snapshots.append(_snapshot(opt, params, loss, torch.float64 if wide else torch.float32))
        if differentiable:
            snapshots.append(_through_the_last_step(params, wrt, inputs))
    return snapshots


def _step_schedulers(schedulers: list[Any], metric: Callable[[], torch.Tensor]) -> None:
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    for s in schedulers:
        if isinstance(s, ReduceLROnPlateau):
            with torch.no_grad():
                s.step(metric())
        else:
            s.step()


def _track_from_here(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Make the next step differentiable with respect to the parameters and the optimizer
    state it starts from: each becomes the clone of a fresh leaf (as PyTorch's
    ``test_optim_differentiable.py`` passes them; a graph through earlier steps would meet
    the state those steps wrote in place). ``params`` and the optimizer take the clones."""
    wrt: list[tuple[str, torch.Tensor]] = []
    for i, old in enumerate(params):
        leaf = old.detach().clone().requires_grad_(True)
        new = leaf.clone()
        wrt.append((f"param {i}", leaf))
        for group in opt.param_groups:
            group["params"] = [new if p is old else p for p in group["params"]]
        state = opt.state.pop(old, {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and key != "step":
                s = value.detach().clone().requires_grad_(True)
                wrt.append((f"state {i} {key}", s))
                state[key] = s.clone()
        opt.state[new] = state
        params[i] = new
    return wrt


def _through_the_last_step(params: list[torch.Tensor], wrt: list[tuple[str, torch.Tensor]], inputs: Inputs) -> Snapshot:
    """The gradients of sum(c * p_final) with respect to the parameters, the state and the
    gradients the last step started from (differentiable=True promises them)."""
    total = sum((p * c.to(p.dtype).to(p.device)).sum() for p, c in zip(params, inputs.cotangents))
    got = torch.autograd.grad(total, [t for _, t in wrt], allow_unused=True)
    keep = [(f"d/d {n}", g.detach().to("cpu", copy=True)) for (n, _), g in zip(wrt, got) if g is not None]
    return Snapshot([n for n, _ in keep], [g for _, g in keep])


# -- one case ----------------------------------------------------------------------------------
def _as_on_tpu(message: str) -> str:
    """A CPU error message as PyTorch words it for a tpu tensor (device and type names, and
    the compile backend of ``_reference_way``)."""
    message = re.sub(r"torch\.(\w+)Tensor\b", r"tpu\1Type", message).replace("backend='aot_eager'", "backend='tpu'")
    return message.replace("cpu", "tpu")


def _same_refusal(config: Config, cpu_error: BaseException, way: str) -> SampleFailure | None:
    """tpu must refuse ``config`` as the CPU did: same type, same message (cpu read as tpu)."""
    try:
        _run(config, TPU, torch.float32, way)
    except Exception as e:  # noqa: BLE001 - the exception is the result
        if type(e) is type(cpu_error) and str(e) in (str(cpu_error), _as_on_tpu(str(cpu_error))):
            return None
        return SampleFailure(
            0,
            "error",
            f"{type(e).__name__}: {_first_line(e)}; the CPU raises {type(cpu_error).__name__}: {_first_line(cpu_error)}",
        )
    return SampleFailure(0, "accepted", f"tpu runs it; the CPU raises {type(cpu_error).__name__}: {_first_line(cpu_error)}")


def _named(failure: SampleFailure, actual: Snapshot, expected: Snapshot) -> SampleFailure:
    """The failure's detail with the entry that differs most named."""
    worst, worst_diff = "", 0.0
    for name, a, e in zip(expected.names, actual.values, expected.values):
        a_t, e_t = torch.as_tensor(a).to(torch.complex128), torch.as_tensor(e).to(torch.complex128)
        if a_t.shape != e_t.shape:
            continue
        d = float(torch.nan_to_num((a_t - e_t).abs(), nan=float("inf")).max()) if e_t.numel() else 0.0
        if d > worst_diff:
            worst, worst_diff = name, d
    if worst:
        failure.detail += f" (most: {worst!r})"
    return failure


def _compare_steps(config: Config, way: str) -> tuple[list[SampleFailure], int, int]:
    """Compare every step's snapshot on tpu with the CPU's; returns failures, steps, refereed."""
    reference = _reference_way(config, way)
    try:
        expected = _run(config, "cpu", torch.float32, reference)
    except Exception as e:  # noqa: BLE001 - the CPU's refusal is the reference
        failure = _same_refusal(config, e, way)
        return ([failure] if failure else []), 1, 0
    actual = _run(config, TPU, torch.float32, way)
    precise = functools.cache(lambda: _run(config, "cpu", torch.float64, reference))
    failures: list[SampleFailure] = []
    refereed = 0
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a.names != e.names:
            failures.append(SampleFailure(k, "meta", f"entries {a.names} on tpu, {e.names} on the CPU"))
            continue
        outcome = compare(k, Outputs(a.values, e.values, lambda k=k: precise()[k].values), config.dtype(), None)
        if isinstance(outcome, SampleFailure):
            failures.append(_named(outcome, a, e))
        elif isinstance(outcome, Refereed):
            refereed += 1
    return failures, len(expected), refereed


def run_case(case: Case) -> Result:
    """Run ``case`` and hold it to its expected failure."""
    t0 = time.perf_counter()
    checks.clear()  # a device-side error an earlier case left is not this one's
    if case.optimizer in SKIPPED:
        return Result(case, "skip", SKIPPED[case.optimizer])
    try:
        if case.config < 0:
            failures, compared, refereed = _check_errors(case.optimizer), len(_error_inputs(case.optimizer, "cpu")), 0
        else:
            failures, compared, refereed = _compare_steps(configs(case.optimizer)[case.config], case.way)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the run
        failures, compared, refereed = [_failure(0, e)], 1, 0
    res = Result(case, "pass", samples=compared, refereed=refereed, seconds=round(time.perf_counter() - t0, 3))
    expected = EXPECTED.get(case.key)
    verdict = judge(failures, range(1 << 30), expected.observed if expected else None, expected.reason if expected else None)
    res.status, res.detail = verdict.status, verdict.detail
    return res


# -- error inputs ------------------------------------------------------------------------------
def _error_inputs(optimizer: str, device: str | torch.device) -> list[Any]:
    """The database's error inputs, built for the CPU from seed 0, their tensors (parameters,
    their gradients, tensor hyper-parameters stay on the CPU) moved to ``device``. A
    parameter given twice stays one tensor."""
    info = optim_db()[optimizer]
    torch.manual_seed(0)
    inputs = info.optim_error_inputs_func(device="cpu", dtype=torch.float32)
    moved: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in moved:
            out = t.detach().to(device)
            out = torch.nn.Parameter(out) if isinstance(t, torch.nn.Parameter) else out
            if t.grad is not None:
                out.grad = t.grad.to(device)
            moved[id(t)] = out
        return moved[id(t)]

    def params(p: Any) -> Any:
        if p is None:  # a hyper-parameter check: give it a real parameter on the device
            return [torch.nn.Parameter(torch.ones(2, 2, device=device))]
        if isinstance(p, torch.Tensor):
            return move(p)
        if isinstance(p, dict):
            return {k: params(v) if k == "params" else v for k, v in p.items()}
        if isinstance(p, tuple):
            return tuple(params(x) if isinstance(x, torch.Tensor) else x for x in p)
        if isinstance(p, list):
            return [params(x) for x in p]
        return p

    for ei in inputs:
        ei.optimizer_error_input.params = params(ei.optimizer_error_input.params)
    return inputs


def _raised(error_input: Any, optim_cls: Any) -> BaseException | None:
    """What PyTorch's ``test_errors`` checks: the exception (or warning) at construction or
    at the first step."""
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum

    oi = error_input.optimizer_error_input
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt = optim_cls(oi.params, **oi.kwargs)
            if error_input.error_on == OptimizerErrorEnum.STEP_ERROR:
                opt.step()
                from ..eager import dispatch

                dispatch.synchronize()
        except Exception as e:  # noqa: BLE001 - the exception is the result
            return e
    if issubclass(error_input.error_type, Warning):
        for w in caught:
            if issubclass(w.category, error_input.error_type):
                return w.message if isinstance(w.message, BaseException) else error_input.error_type(str(w.message))
    return None


def _check_errors(optimizer: str) -> list[SampleFailure]:
    """Each error input: tpu raises (or warns) what the CPU does, matching the regex."""
    info = optim_db()[optimizer]
    failures = []
    for index, (cpu_input, tpu_input) in enumerate(zip(_error_inputs(optimizer, "cpu"), _error_inputs(optimizer, TPU))):
        expected, regex = cpu_input.error_type, cpu_input.error_regex
        cpu = _raised(cpu_input, info.optim_cls)
        if not isinstance(cpu, expected) or not re.search(regex, str(cpu)):
            failures.append(
                SampleFailure(index, "error", f"the CPU does not raise {expected.__name__} matching {regex!r}: {cpu!r}")
            )
            continue
        got = _raised(tpu_input, info.optim_cls)
        says = f"the CPU raises {type(cpu).__name__}: {_first_line(cpu)}"
        if got is None:
            failures.append(SampleFailure(index, "accepted", f"tpu runs it; {says}"))
        elif not isinstance(got, expected):
            failures.append(SampleFailure(index, "error", f"{type(got).__name__}: {_first_line(got)}; {says}"))
        elif not re.search(regex, str(got)):
            failures.append(SampleFailure(index, "message", f"{_first_line(got)}; {says}"))
    return failures
