"""Which layer first differs from the CPU: run a module on tpu and on a CPU copy, compare every
submodule's outputs (and, optionally, gradients) and report the first one that diverges.

    from torchtpu.debug.compare import compare_with_cpu
    result = compare_with_cpu(model, x)          # prints a table and a verdict
    result.first_forward, result.first_backward  # ModuleDiff records (None: no difference)

The model is left as it was: every hook is removed, parameters' ``.grad`` and buffers (batch-norm
running statistics) are restored, and the global RNG state is forked. Use ``model.eval()`` (or
dropout p=0): dropout draws differ between tpu and the CPU even with the same seed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

__all__ = ["Comparison", "ModuleDiff", "compare_with_cpu"]

# torch.testing.assert_close's documented defaults, (rtol, atol) per dtype; other dtypes are exact.
_DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
_DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_Key = tuple[str, int]  # (module name, 1-based call number)


@dataclasses.dataclass
class ModuleDiff:
    """One compared value: a module call's outputs, or one kind of gradient."""

    module: str  # "encoder.layer.0", "block#2" for the second call, "(root)" for the model itself
    module_type: str  # class name: "Linear"
    kind: str  # "output" | "grad out" | "grad in" | "grad param"
    max_abs: float  # nan when the shapes differ
    max_rel: float
    status: str  # "ok" | "DIFF" | "shape" | "dtype" | "missing"
    detail: str = ""  # the worst element, or why the values can't be compared
    param: str = ""  # parameter name (kind "grad param")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def where(self) -> str:
        name = f"{self.module}.{self.param}" if self.param else self.module
        return f"{name} ({self.module_type})"


@dataclasses.dataclass
class Comparison:
    """What compare_with_cpu found; ``str()`` is the printed report."""

    forward: list[ModuleDiff]  # module outputs in execution order
    backward: list[ModuleDiff]  # gradients in backward order (nearest the loss first); empty: not run
    rtol: float | None  # None: torch.testing's default for each dtype
    atol: float | None
    warnings: list[str] = dataclasses.field(default_factory=list)
    first_forward: ModuleDiff | None = dataclasses.field(init=False)
    first_backward: ModuleDiff | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.first_forward = next((d for d in self.forward if not d.ok), None)
        self.first_backward = next((d for d in self.backward if not d.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_forward is None and self.first_backward is None

    def __repr__(self) -> str:
        return (
            f"Comparison(ok={self.ok}, first_forward={self.first_forward!r}, first_backward={self.first_backward!r}, "
            f"{len(self.forward)} outputs, {len(self.backward)} gradients)"
        )

    def __str__(self) -> str:
        return self.report()

    def report(self, context: int = 3, max_rows: int = 12) -> str:
        """The tables (divergent region plus ``context`` rows before it) and the one-line verdict."""
        lines: list[str] = []
        for title, rows in (
            ("forward: module outputs in execution order", self.forward),
            ("backward: gradients in backward order", self.backward),
        ):
            first = next((i for i, d in enumerate(rows) if not d.ok), None)
            if first is not None:
                lines.append(f"{title} (tpu vs cpu)")
                lines += _table(rows, first, context, max_rows)
                lines.append(f"   first difference: {rows[first].detail}")
        lines.append(self.verdict())
        return "\n".join(lines)

    def table(self) -> str:
        """Every row, forward then backward."""
        lines = ["forward: module outputs in execution order", *_table(self.forward, None, len(self.forward), len(self.forward))]
        if self.backward:
            lines += ["backward: gradients in backward order", *_table(self.backward, None, 0, len(self.backward))]
        return "\n".join(lines)

    def verdict(self) -> str:
        tol = (
            "torch.testing's default tolerances"
            if self.rtol is None and self.atol is None
            else f"rtol={'default' if self.rtol is None else self.rtol}, atol={'default' if self.atol is None else self.atol}"
        )
        n_out, n_grad = len(self.forward), len(self.backward)
        grads = f" and {n_grad} gradients" if self.backward else ""
        if self.ok:
            return f"verdict: no difference from the CPU: {n_out} module outputs{grads} within {tol}"
        if self.first_forward is not None:
            d = self.first_forward
            n_before = self.forward.index(d)
            also = "; gradients differ too (expected below a forward difference)" if self.first_backward else ""
            return (
                f"verdict: first difference from the CPU in the forward at {d.where} {d.kind}: {_describe(d)}, "
                f"the {n_before} module outputs before it match ({tol}){also}"
            )
        d = self.first_backward
        assert d is not None
        return (
            f"verdict: forward matches ({n_out} module outputs); first gradient difference at {d.where} {d.kind}: "
            f"{_describe(d)} ({tol}) — the module nearest the loss whose backward differs"
        )


def compare_with_cpu(
    model: nn.Module,
    *inputs: Any,
    backward: bool | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    show: bool = True,
    context: int = 3,
    **kwargs: Any,
) -> Comparison:
    """Run ``model(*inputs, **kwargs)`` on tpu and on a CPU copy and find the first submodule whose
    outputs differ beyond ``rtol``/``atol`` (default: torch.testing's per dtype).

    ``backward`` (default: when an output requires grad) also backpropagates the same random output
    gradients on both and compares, in backward order, each module call's output and input
    gradients and each parameter's gradient. The model may be on tpu (it runs as is, a deepcopy runs
    on the CPU) or on the CPU (the copy runs on tpu). Tensors anywhere in ``inputs``/``kwargs`` are
    copied to each side. Prints the report unless ``show=False``; returns it as a ``Comparison``.
    """
    notes = _warn_dropout(model)
    native = _model_device(model)
    other = "cpu" if native == "tpu" else "tpu"
    twin = _copy_to(model, other)
    runs: dict[str, _Run] = {}
    try:
        with torch.random.fork_rng(devices=[0], device_type="tpu"):
            for device, module in ((native, model), (other, twin)):
                runs[device] = _Run(module, device, seed, is_copy=module is twin)
                runs[device].forward(inputs, kwargs)
            backward = _decide_backward(backward, runs["cpu"].output)
            if backward:
                grad_seeds = _grad_seeds(runs["cpu"].output, seed)
                for run in runs.values():
                    run.backward(grad_seeds)
    finally:
        for run in runs.values():
            run.restore()
    result = _compare(runs["tpu"], runs["cpu"], model, rtol, atol)
    result.warnings += notes
    if show:
        print(result.report(context=context))
    return result


# --- running one side ------------------------------------------------------------------------------


class _Run:
    """One side: hooks on every submodule record outputs, and (in backward) output/input gradients."""

    def __init__(self, model: nn.Module, device: str, seed: int, is_copy: bool) -> None:
        self.model, self.device, self.seed, self.is_copy = model, device, seed, is_copy
        self.events: list[tuple[str, _Key]] = []  # ("start" | "end", key) in forward order
        self.outputs: dict[_Key, dict[str, torch.Tensor]] = {}
        self.grad_out: dict[_Key, dict[str, torch.Tensor]] = {}
        self.grad_in: dict[_Key, dict[str, torch.Tensor]] = {}
        self.param_grads: dict[str, torch.Tensor] = {}
        self.output: Any = None
        self._calls: dict[str, int] = {}
        self._open: dict[str, list[int]] = {}  # per module, the calls still running (recursion)
        self._tensor_hooks: list[Any] = []
        self._recording = False
        self._saved_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.did_backward = False

    def forward(self, inputs: tuple, kwargs: dict) -> None:
        args, kw = _to_device(inputs, self.device), _to_device(kwargs, self.device)
        # a train-mode forward updates batch-norm statistics; restore() puts them back after the
        # backward (which may check their version counters)
        self._saved_buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        handles = self._attach()
        try:
            torch.manual_seed(self.seed)  # seeds the CPU and the tpu generators
            self._recording = True
            self.output = self.model(*args, **kw)
        except Exception as e:
            what = "a copy of the model" if self.is_copy else "the model"
            hint = " (Module.to() leaves tensor attributes that are not parameters or buffers behind)" if self.is_copy else ""
            e.add_note(f"compare_with_cpu: raised while running {what} on {self.device}{hint}")
            raise
        finally:
            self._recording = False
            for h in handles:
                h.remove()

    def backward(self, grad_seeds: list[torch.Tensor]) -> None:
        roots = _grad_roots(self.output)
        params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        saved_grads = [p.grad for _, p in params]
        for _, p in params:
            p.grad = None
        self.did_backward = True
        try:
            torch.autograd.backward(roots, [g.to(self.device) for g in grad_seeds])
            self.param_grads = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        finally:
            for (_, p), g in zip(params, saved_grads):
                p.grad = g

    def restore(self) -> None:
        """Remove the tensor hooks (a parameter passed to a submodule holds one) and put back the buffers."""
        for h in self._tensor_hooks:
            h.remove()
        self._tensor_hooks.clear()
        with torch.no_grad():
            for buf, saved in self._saved_buffers:
                buf.copy_(saved)
        self._saved_buffers = []
        self.output = None  # frees the graph

    def _attach(self) -> list[Any]:
        handles = []
        for name, module in self.model.named_modules():
            handles.append(module.register_forward_pre_hook(partial(self._pre, name), with_kwargs=True))
            handles.append(module.register_forward_hook(partial(self._post, name), with_kwargs=True))
        return handles

    def _pre(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self._recording:
            return
        k = self._calls[name] = self._calls.get(name, 0) + 1
        self._open.setdefault(name, []).append(k)
        self.events.append(("start", (name, k)))
        self._hook_grads(itertools.chain(_leaves(args), _leaves(kwargs)), self.grad_in.setdefault((name, k), {}))

    def _post(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._recording or not self._open.get(name):
            return
        key = (name, self._open[name].pop())
        self.events.append(("end", key))
        # a copy now: a later in-place op (ReLU(inplace=True)) must not change what we compare
        self.outputs[key] = {path: t.detach().clone() for path, t in _leaves(output)}
        self._hook_grads(_leaves(output), self.grad_out.setdefault(key, {}))

    def _hook_grads(self, leaves: Iterator[tuple[str, torch.Tensor]], store: dict[str, torch.Tensor]) -> None:
        # a tensor hook sees the gradient of the value as it was here, even if an in-place op
        # changes the tensor afterwards (a full backward hook would refuse the in-place op)
        for path, t in leaves:
            if t.requires_grad:
                self._tensor_hooks.append(t.register_hook(partial(_store_grad, store, path)))


def _store_grad(store: dict[str, torch.Tensor], path: str, grad: torch.Tensor) -> None:
    store[path] = grad.detach().clone()


def _model_device(model: nn.Module) -> str:
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return "cpu" if first is not None and first.device.type == "cpu" else "tpu"


def _copy_to(model: nn.Module, device: str) -> nn.Module:
    """A deepcopy on ``device``; parameters and buffers are copied straight there (no second copy
    on the model's own device), without their ``.grad``."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        c = t.detach().to(device, copy=True)
        memo[id(t)] = nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else c
    return copy.deepcopy(model, memo).to(device)


def _to_device(value: Any, device: str) -> Any:
    """A copy of ``value`` with every tensor in it (any nesting) copied to ``device`` as a new leaf."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to(device, copy=True)
        return t.requires_grad_() if value.requires_grad else t
    if isinstance(value, Mapping):
        items = {k: _to_device(v, device) for k, v in value.items()}
        try:
            return type(value)(items)
        except TypeError:
            return items
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_device(v, device) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a (nested) tuple/list/dict/dataclass/ModelOutput, with its path."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):  # dict, OrderedDict, Hugging Face ModelOutput
        for k, v in value.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _leaves(getattr(value, f.name), f"{path}.{f.name}")


def _grad_roots(output: Any) -> list[torch.Tensor]:
    return [t for _, t in _leaves(output) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _decide_backward(backward: bool | None, cpu_output: Any) -> bool:
    has_grad = bool(_grad_roots(cpu_output))
    if backward and not has_grad:
        raise ValueError(
            "compare_with_cpu(backward=True): no output of the model requires grad; call it outside "
            "torch.no_grad() with parameters that require grad, or pass backward=False"
        )
    return has_grad if backward is None else backward


def _grad_seeds(output: Any, seed: int) -> list[torch.Tensor]:
    """The same output gradients for both sides: 1 for a scalar (a loss), else standard normal."""
    gen = torch.Generator().manual_seed(seed)  # a private generator: the user's RNG is not touched
    seeds = []
    for t in _grad_roots(output):
        if t.dim() == 0:
            seeds.append(torch.ones((), dtype=t.dtype))
        else:
            dtype = torch.complex64 if t.is_complex() else torch.float32
            seeds.append(torch.randn(t.shape, generator=gen, dtype=dtype).to(t.dtype))
    return seeds


def _warn_dropout(model: nn.Module) -> list[str]:
    active = [n or "(root)" for n, m in model.named_modules() if isinstance(m, _DROPOUT_TYPES) and m.training and m.p > 0]
    if not active:
        return []
    message = (
        f"compare_with_cpu: {len(active)} dropout module(s) with p>0 are in train mode ({', '.join(active[:3])}"
        f"{', ...' if len(active) > 3 else ''}); dropout draws differ between tpu and the CPU even with the same "
        "seed, so outputs differ from there on. Call model.eval() or set their p to 0 first."
    )
    warnings.warn(message, UserWarning, stacklevel=3)
    return [message]


# --- comparing ------------------------------------------------------------------------------------


def _compare(tpu: _Run, cpu: _Run, model: nn.Module, rtol: float | None, atol: float | None) -> Comparison:
    types = {name: type(m).__name__ for name, m in model.named_modules()}
    label = _labeler(cpu._calls)
    cmp = partial(_compare_values, rtol=rtol, atol=atol)
    forward = []
    for key in _ordered_keys(cpu, tpu, "end"):
        a, b = tpu.outputs.get(key), cpu.outputs.get(key)
        if a or b:  # a module returning no tensor has nothing to compare
            forward.append(ModuleDiff(label(key), types[key[0]], "output", *cmp(a, b, "output")))
    backward = _compare_backward(tpu, cpu, model, types, label, cmp) if cpu.did_backward else []
    return Comparison(forward, backward, rtol, atol)


def _compare_backward(tpu: _Run, cpu: _Run, model: nn.Module, types: dict, label: Callable, cmp: Callable) -> list[ModuleDiff]:
    """Walk the forward timeline backwards: a module call's output gradient is ready where its forward
    ended, its parameters' and input gradients where it started."""
    owners = _param_owners(model)
    params_done: set[str] = set()
    rows: list[ModuleDiff] = []
    for event, key in reversed(_ordered_events(cpu, tpu)):
        name = key[0]
        if event == "end":
            store = "grad_out"
        else:
            # a parameter's gradient is complete (summed over calls) where its module's first call starts
            for pname in owners.get(name, []) if key[1] == 1 else []:
                if pname in cpu.param_grads or pname in tpu.param_grads:
                    params_done.add(pname)
                    a, b = tpu.param_grads.get(pname), cpu.param_grads.get(pname)
                    short = pname[len(name) + 1 :] if name else pname
                    rows.append(
                        ModuleDiff(label(key), types[name], "grad param", *cmp(_one(a), _one(b), f"grad of {pname}"), param=short)
                    )
            store = "grad_in"
        a, b = getattr(tpu, store).get(key), getattr(cpu, store).get(key)
        if a or b:
            kind = "grad out" if store == "grad_out" else "grad in"
            what = "grad of output" if store == "grad_out" else "grad of input"
            rows.append(ModuleDiff(label(key), types[name], kind, *cmp(a, b, what)))
    for pname in sorted((cpu.param_grads.keys() | tpu.param_grads.keys()) - params_done):  # owner never called
        a, b = tpu.param_grads.get(pname), cpu.param_grads.get(pname)
        owner, _, short = pname.rpartition(".")
        rows.append(
            ModuleDiff(
                owner or "(root)", types.get(owner, "?"), "grad param", *cmp(_one(a), _one(b), f"grad of {pname}"), param=short
            )
        )
    return rows


def _one(t: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
    return None if t is None else {"": t}


def _param_owners(model: nn.Module) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for pname, _ in model.named_parameters():  # tied weights once, under their first name
        owners.setdefault(pname.rpartition(".")[0], []).append(pname)
    return owners


def _ordered_events(cpu: _Run, tpu: _Run) -> list[tuple[str, _Key]]:
    """The CPU's forward timeline, then whatever only the tpu run did (a different control flow)."""
    seen = set(cpu.events)
    return cpu.events + [e for e in tpu.events if e not in seen]


def _ordered_keys(cpu: _Run, tpu: _Run, event: str) -> list[_Key]:
    return [key for e, key in _ordered_events(cpu, tpu) if e == event]


def _labeler(calls: dict[str, int]) -> Callable[[_Key], str]:
    def label(key: _Key) -> str:
        name = key[0] or "(root)"
        return f"{name}#{key[1]}" if calls.get(key[0], 1) > 1 or key[1] > 1 else name

    return label


def _compare_values(
    tpu: dict[str, torch.Tensor] | None, cpu: dict[str, torch.Tensor] | None, what: str, rtol: float | None, atol: float | None
) -> tuple[float, float, str, str]:
    """(max abs, max rel, status, detail) over every tensor of one module output or gradient."""
    if tpu is None or cpu is None:
        return math.nan, math.nan, "missing", f"{what} only on {'cpu' if tpu is None else 'tpu'}"
    max_abs = max_rel = 0.0
    status, detail = "ok", ""
    for path in list(cpu) + [p for p in tpu if p not in cpu]:
        if path not in tpu or path not in cpu:
            d = (math.nan, math.nan, "missing", f"only on {'cpu' if path in cpu else 'tpu'}")
        else:
            d = _compare_tensor(tpu[path], cpu[path], rtol, atol)
        max_abs, max_rel = _nanmax(max_abs, d[0]), _nanmax(max_rel, d[1])
        if d[2] != "ok" and status == "ok":
            status, detail = d[2], f"{what}{path}: {d[3]}"
    return max_abs, max_rel, status, detail


def _compare_tensor(a: torch.Tensor, b: torch.Tensor, rtol: float | None, atol: float | None) -> tuple[float, float, str, str]:
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.shape != b.shape:
        return math.nan, math.nan, "shape", f"shape {tuple(a.shape)} on tpu vs {tuple(b.shape)} on cpu"
    if a.numel() == 0:
        return 0.0, 0.0, "ok", ""
    rt, at = _tolerance(a.dtype, b.dtype, rtol, atol)
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    a64, b64 = a.to(wide), b.to(wide)
    exact = not (a.is_floating_point() or a.is_complex() or b.is_floating_point() or b.is_complex())
    close = (a == b) if exact else torch.isclose(a64, b64, rtol=rt, atol=at, equal_nan=True)
    same = (a64 == b64) | (a64.isnan() & b64.isnan())
    diff = torch.where(same, 0.0, (a64 - b64).abs())
    rel = torch.where(same, 0.0, diff / b64.abs())
    max_abs, max_rel = diff.max().item(), rel.max().item()
    if bool(close.all()):
        if a.dtype != b.dtype:
            return max_abs, max_rel, "dtype", f"dtype {a.dtype} on tpu vs {b.dtype} on cpu"
        return max_abs, max_rel, "ok", ""
    bad = ~close
    # the worst element: the largest difference among those beyond tolerance (NaN first)
    score = torch.where(bad, torch.nan_to_num(diff, nan=math.inf), -1.0)
    flat = int(score.flatten().argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return (
        max_abs,
        max_rel,
        "DIFF",
        f"{int(bad.sum())} of {a.numel()} elements differ beyond rtol={rt:g}, atol={at:g}; worst at {idx}: "
        f"tpu {a.flatten()[flat].item():.6g} vs cpu {b.flatten()[flat].item():.6g}",
    )


def _tolerance(a: torch.dtype, b: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float]:
    ra, aa = _DEFAULT_TOLERANCES.get(a, (0.0, 0.0))
    rb, ab = _DEFAULT_TOLERANCES.get(b, (0.0, 0.0))
    return (max(ra, rb) if rtol is None else rtol, max(aa, ab) if atol is None else atol)


def _nanmax(x: float, y: float) -> float:
    return math.nan if math.isnan(x) or math.isnan(y) else max(x, y)


# --- printing -------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return "0" if v == 0 else f"{v:.2e}" if math.isfinite(v) else str(v)


def _describe(d: ModuleDiff) -> str:
    if d.status == "DIFF":
        return f"max abs {_fmt(d.max_abs)}, max rel {_fmt(d.max_rel)}"
    return d.detail


def _table(rows: list[ModuleDiff], first: int | None, context: int, max_rows: int) -> list[str]:
    """Rows from ``context`` before ``first`` to ``max_rows`` after it, the first one marked ``>>``."""
    pivot = 0 if first is None else first
    start, stop = max(0, pivot - context), min(len(rows), pivot + max_rows)
    shown = rows[start:stop]
    width = max([len("module"), *(len(d.where) for d in shown)])
    lines = [f"   {'module':<{width}}  {'kind':<10}  {'max abs':>9}  {'max rel':>9}  status"]
    if start:
        lines.append(f"   ... {start} matching rows before")
    for i, d in enumerate(shown, start):
        mark = ">> " if i == first else "   "
        note = "   <- first difference" if i == first else ""
        lines.append(f"{mark}{d.where:<{width}}  {d.kind:<10}  {_fmt(d.max_abs):>9}  {_fmt(d.max_rel):>9}  {d.status}{note}")
    if stop < len(rows):
        rest = rows[stop:]
        lines.append(f"   ... {len(rest)} more rows, {sum(not d.ok for d in rest)} of them differ")
    return lines
