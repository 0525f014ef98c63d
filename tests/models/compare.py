"""Train a model one step on tpu and on the CPU from the same weights and compare.

A model passes a stage when every compared tensor matches the CPU within the issue's
tolerances (float32): the eval forward (rtol=atol=1e-4), every parameter's gradient of
one training backward, and the parameters after one SGD step (rtol 1e-3, atol 1e-4).

Where gradients or stepped parameters miss that tolerance, a float64 copy of the model on
the CPU arbitrates: an element passes when the tpu value is at least as close to float64
as the CPU's float32 value (within the same tolerance), since the CPU is then no better a
reference than tpu. The detail says how many tensors were settled that way.
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

FORWARD_TOL = dict(rtol=1e-4, atol=1e-4)
GRAD_TOL = dict(rtol=1e-3, atol=1e-4)
STAGES = ("forward", "backward", "step")
LR = 0.1  # the SGD step


@dataclasses.dataclass
class ModelCase:
    """One model of the zoo: how to build it (on the CPU) and its inputs."""

    name: str
    family: str
    build: Callable[[str | None], nn.Module]  # attn_implementation (None: the library's default) -> model
    inputs: Callable[[], dict[str, Any]]  # CPU inputs for forward(**inputs); labels give .loss
    attn_implementations: tuple[str | None, ...] = (None, "sdpa", "eager")
    fast: bool = False  # also in `make test`


@dataclasses.dataclass
class StageResult:
    ok: bool
    detail: str = ""


@dataclasses.dataclass
class ModelResult:
    case: str
    family: str
    attn: str
    stages: dict[str, StageResult]
    # this attention implementation does not exist for the model, or (compiled) torch.compile
    # cannot trace the model on the CPU either, so there is nothing of ours to compare
    unsupported: str = ""

    @property
    def passed(self) -> bool:
        return not self.unsupported and all(s.ok for s in self.stages.values())

    def failure(self) -> str:
        for stage in STAGES:
            s = self.stages.get(stage)
            if s is not None and not s.ok:
                return f"{stage}: {s.detail}"
        return ""


def _to(x: Any, device: str) -> Any:
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)


def _float_outputs(out: Any) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    leaves, _ = tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _mismatch(actual: torch.Tensor, expected: torch.Tensor, tol: dict[str, float]) -> str | None:
    """None when close, else a one-line description with the worst error."""
    a = actual.detach().cpu()
    e = expected.detach()
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs CPU {tuple(e.shape)} {e.dtype}"
    try:
        torch.testing.assert_close(a, e, equal_nan=True, **tol)
    except AssertionError:
        diff = (a.double() - e.double()).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
        worst = int(diff.argmax())
        rel = float(diff.flatten()[worst] / e.double().abs().flatten()[worst].clamp_min(1e-30))
        return f"max abs err {float(diff.max()):.3g} (rel {rel:.3g}) over {int((diff > tol['atol'] + tol['rtol'] * e.double().abs()).sum())}/{e.numel()} elements"
    return None


def _no_farther_from_float64(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor, tol: dict[str, float]) -> bool:
    """Every element of ``actual`` is within ``tol`` of ``expected`` or at least as close
    to the float64 ``reference`` as ``expected`` is (up to the same tolerance)."""
    a, e, r = actual.detach().cpu().double(), expected.detach().double(), reference.detach().double()
    if a.shape != r.shape:
        return False
    slack = tol["atol"] + tol["rtol"] * r.abs()
    close = (a - e).abs() <= tol["atol"] + tol["rtol"] * e.abs()
    no_farther = (a - r).abs() <= (e - r).abs() + slack
    return bool((close | no_farther | (a.isnan() & e.isnan())).all())


def _compare_all(
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]], tol: dict[str, float], reference: dict[str, torch.Tensor] | None = None
) -> StageResult:
    bad = [(name, m) for name, a, e in pairs if (m := _mismatch(a, e, tol)) is not None]
    arbitrated = 0
    if bad and reference is not None:
        tensors = {name: (a, e) for name, a, e in pairs}
        settled = {name for name, _ in bad if name in reference and _no_farther_from_float64(*tensors[name], reference[name], tol)}
        arbitrated = len(settled)
        bad = [(name, m) for name, m in bad if name not in settled]
    if not bad:
        note = f"; {arbitrated} settled by float64 (tpu at least as close as the CPU)" if arbitrated else ""
        return StageResult(True, f"{len(pairs)} tensors{note}")
    name, msg = bad[0]
    return StageResult(False, f"{len(bad)}/{len(pairs)} differ; first {name}: {msg}")


def _error(e: BaseException) -> StageResult:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return StageResult(False, f"{type(e).__name__}: {first_line[:300]} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})")


def _projection(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A fixed random weight per output (the same on every device and dtype)."""
    g = torch.Generator().manual_seed(2)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64) / max(o.numel(), 1) for o in outs]


def _loss(model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    out = model(**inputs)
    loss = getattr(out, "loss", None)
    if loss is None:
        # no labels: a fixed random projection of every float output, so every output's
        # gradient path is exercised
        outs = _float_outputs(out)
        loss = sum((o * p.to(o.device, o.dtype)).sum() for o, p in zip(outs, _projection(outs)))
    return loss


def _float64_run(model: nn.Module, inputs: dict[str, Any], lr: float) -> dict[str, torch.Tensor] | None:
    """Gradients ("<name>.grad") and stepped parameters ("<name>") of a float64 copy of the
    model (the arbiter), or None when the model does not run in float64."""
    try:
        m = copy.deepcopy(model).double().train()
        m.zero_grad(set_to_none=True)
        _loss(m, tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, inputs)).backward()
    except Exception:  # noqa: BLE001 - no arbiter for this model
        return None
    out = {}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.grad is not None:
                out[f"{name}.grad"] = p.grad
                out[name] = p - lr * p.grad
            else:
                out[name] = p.detach()
    return out


def _compiled(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[nn.Module, Callable[[], Any]]:
    """The tpu side under ``torch.compile(backend="tpu")``: the module's forward (so its
    backward runs as the compiled graph's backward program) and the optimizer's step.
    Dynamo's caches are reset first: the previous case's graphs of the same classes would
    otherwise count against the recompile limit, past which Dynamo silently runs eager."""
    torch._dynamo.reset()
    return torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")


def _cpu_compile_error(case: ModelCase, attn: str | None) -> str:
    """Why the model's forward and backward fail under ``torch.compile(backend="aot_eager")``
    on the CPU (Dynamo and AOTAutograd, no device of ours involved), or "" when they run."""
    torch.manual_seed(0)
    model = case.build(attn).float()
    torch.manual_seed(1)
    inputs = case.inputs()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="aot_eager")
        with torch.no_grad():
            compiled.eval()(**inputs)
        _loss(compiled.train(), inputs).backward()
    except Exception as e:  # noqa: BLE001 - the message is the record
        lines = str(e).strip().splitlines()
        return f"torch.compile fails on the CPU too (backend='aot_eager'): {type(e).__name__}: {lines[0][:200] if lines else ''}"
    return ""


def _unreached_by_aot(grad: torch.Tensor) -> bool:
    """A parameter the loss does not reach, compiled: AOTAutograd runs the whole graph's
    backward as one autograd Function, which returns zeros for every input where eager
    autograd leaves ``grad`` None (DAC's decoder; ``aot_eager`` on the CPU does the same,
    pytorch/pytorch#131794)."""
    return not bool(grad.detach().cpu().any())


def run_case(case: ModelCase, attn: str | None, compile: bool = False) -> ModelResult:
    """``compile``: the tpu model's forward and its optimizer step run compiled; a failure
    is then ours only if the model compiles on the CPU (``_cpu_compile_error``).

    Compiled, NumPy's random calls run as NumPy (``use_numpy_random_stream``): by default
    Dynamo traces ``np.random.seed`` as torch's seed but runs ``np.random.permutation`` as
    NumPy, unseeded, so BigBird's block-sparse attention picks other random blocks than in
    eager, on the CPU too (``aot_eager``: the same 7 gradients differ)."""
    with torch._dynamo.config.patch(use_numpy_random_stream=compile):
        result = _run_case(case, attn, compile)
    if compile and not result.passed and not result.unsupported:
        result.unsupported = _cpu_compile_error(case, attn)
    return result


def _run_case(case: ModelCase, attn: str | None, compile: bool) -> ModelResult:
    result = ModelResult(case.name, case.family, attn or "default", {})
    torch.manual_seed(0)
    try:
        cpu_model = case.build(attn).float()
    except (ValueError, ImportError) as e:
        message = str(e).lower()
        if attn is not None and ("attn" in message or "attention" in message):
            result.unsupported = str(e).splitlines()[0][:200]
            return result
        raise
    torch.manual_seed(1)
    inputs = case.inputs()
    initial = copy.deepcopy(cpu_model)  # the float64 arbiter starts from these weights
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    tpu_inputs = _to(inputs, "tpu")
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=LR)
    tpu_call, tpu_step = _compiled(tpu_model, tpu_opt) if compile else (tpu_model, tpu_opt.step)

    # 1. eval forward
    cpu_model.eval()
    tpu_model.eval()
    try:
        with torch.no_grad():
            expected = _float_outputs(cpu_model(**inputs))
            actual = _float_outputs(tpu_call(**tpu_inputs))
        if len(expected) != len(actual):
            result.stages["forward"] = StageResult(False, f"{len(actual)} outputs vs CPU {len(expected)}")
        else:
            result.stages["forward"] = _compare_all([(f"output {i}", a, e) for i, (a, e) in enumerate(zip(actual, expected))], FORWARD_TOL)
    except Exception as e:  # noqa: BLE001 - a model zoo records every failure
        result.stages["forward"] = _error(e)

    # 2. training backward: every parameter's gradient
    cpu_model.train()
    tpu_model.train()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=LR)
    reference: dict[str, torch.Tensor] | None = None
    try:
        cpu_loss = _loss(cpu_model, inputs)
        cpu_loss.backward()
        tpu_loss = _loss(tpu_call, tpu_inputs)
        tpu_loss.backward()
        named = list(zip(cpu_model.named_parameters(), tpu_model.parameters()))
        pairs = [("loss", tpu_loss, cpu_loss)]
        for (name, p_cpu), p_tpu in named:
            if p_cpu.grad is None and (p_tpu.grad is None or (compile and _unreached_by_aot(p_tpu.grad))):
                continue
            if (p_cpu.grad is None) != (p_tpu.grad is None):
                pairs.append((f"{name}.grad (None on one side)", torch.ones(1), torch.zeros(1)))
                continue
            pairs.append((f"{name}.grad", p_tpu.grad, p_cpu.grad))
        result.stages["backward"] = _compare_all(pairs, GRAD_TOL)
        if not result.stages["backward"].ok and (reference := _float64_run(initial, inputs, LR)) is not None:
            result.stages["backward"] = _compare_all(pairs, GRAD_TOL, reference)
    except Exception as e:  # noqa: BLE001
        result.stages["backward"] = _error(e)
        return result

    # 3. one optimizer step
    try:
        cpu_opt.step()
        tpu_step()
        pairs = [(name, p_tpu, p_cpu) for (name, p_cpu), p_tpu in zip(cpu_model.named_parameters(), tpu_model.parameters())]
        result.stages["step"] = _compare_all(pairs, GRAD_TOL)
        if not result.stages["step"].ok and (reference or (reference := _float64_run(initial, inputs, LR))) is not None:
            result.stages["step"] = _compare_all(pairs, GRAD_TOL, reference)
    except Exception as e:  # noqa: BLE001
        result.stages["step"] = _error(e)
    return result


def zero_dropout(config: Any) -> Any:
    """Training with dropout draws different random numbers on tpu than on the CPU, so
    every dropout-like probability of a config is set to 0 (stochastic depth and
    SpecAugment-style masking too)."""
    for key, value in list(config.to_dict().items()):
        lowered = key.lower()
        if isinstance(value, float) and ("drop" in lowered or lowered in ("mask_time_prob", "mask_feature_prob")):
            setattr(config, key, 0.0)
    for child in list(vars(config).values()):  # sub-configs: text_config, encoder_config, ...
        if child is not config and hasattr(child, "to_dict") and hasattr(child, "model_type"):
            zero_dropout(child)
    return config
