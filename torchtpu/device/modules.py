"""``nn.Module.to("tpu")`` keeps every Parameter object, as ``.to("cuda")`` does, and so
does ``param.data = param.to("tpu")`` (FSDP2's ``fully_shard`` of a CPU-built module).

``nn.Module._apply`` keeps a Parameter's identity by assigning ``param.data = new`` only
when ``torch._has_compatible_shallow_copy_type(old, new)`` holds, which PyTorch defines
for the dense CPU/CUDA/MPS/XPU/HPU/MTIA tensors but not for PrivateUse1. For a move to or
from tpu it therefore builds a new Parameter per module, which silently unties tied
weights (an embedding shared with the LM head becomes two tensors that train apart) and
leaves an optimizer built before the move updating the old CPU tensors.

The refusal is only a list: a dense CPU tensor and a tpu one are both plain TensorImpls,
so torchtpu's C++ extension does what ``set_data`` does for CUDA (``set_data_across``,
csrc/fast.cpp), and for exactly the modules whose conversion crosses the tpu boundary
``_apply``'s steps run with ``param.data = new`` (and ``param.grad.data``), as for CUDA
(``_apply_by_set_data``). Parameters keep their object, weak references (which
``torch.compile`` and ``torch.export`` hold), hooks and autograd metadata. CPU-only
conversions keep PyTorch's behaviour unchanged.

Without the C++ extension the same identity comes from PyTorch's other supported way:
``_apply`` swaps the new tensor into the existing Parameter object
(``torch.utils.swap_tensors``) when ``torch.__future__.get_swap_module_params_on_conversion()``
is true, which we turn on for those modules. A swap refuses a Parameter with weak
references; the module then gets new Parameters, with a warning.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..tensor.storage import set_data_across

_swap_override = threading.local()


def _crosses_tpu(old: torch.Tensor, new: torch.Tensor) -> bool:
    """True when ``_apply`` would replace ``old`` by a new Parameter because of tpu."""
    if new is old or "tpu" not in (old.device.type, new.device.type):
        return False
    return not torch._has_compatible_shallow_copy_type(old, new)


class _Precomputed:
    """``fn`` with this module's parameters already converted: ``_apply`` asks for each
    parameter once more, and must get the same tensor instead of a second transfer."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], params: list[torch.Tensor]) -> None:
        self.fn = fn
        with torch.no_grad():
            self.done = {id(p): (p, _moved_lazy(p, fn(p))) for p in params}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        hit = self.done.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        return self.fn(t)

    def crosses_tpu(self) -> bool:
        return any(_crosses_tpu(old, new) for old, new in self.done.values())

    def has_wrapper_subclass(self) -> bool:
        """A DTensor-like parameter, which ``_apply`` always swaps (it has inner tensors)."""
        is_wrapper = torch.utils._python_dispatch.is_traceable_wrapper_subclass
        return any(is_wrapper(old) or is_wrapper(new) for old, new in self.done.values())


def _moved_lazy(p: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``new`` (``fn(p)``), except for a LazyModule's UninitializedParameter moved across
    tpu: that one stays the same object and class, now a placeholder on ``new``'s device
    and dtype, as ``param.data = new`` keeps it on CUDA (``UninitializedParameter.to``
    returns a plain tensor, and swapping that in would leave a Parameter of shape [0] that
    ``materialize`` no longer replaces), and ``p`` itself is returned."""
    if not nn.parameter.is_lazy(p) or not _crosses_tpu(p, new):
        return new
    placeholder = type(p)(requires_grad=p.requires_grad, device=new.device, dtype=new.dtype)
    torch.utils.swap_tensors(p, placeholder)  # swaps the Python state too: give p its own back
    p.__dict__, placeholder.__dict__ = placeholder.__dict__, p.__dict__
    return p


def _reattach_hooks(p: torch.Tensor) -> None:
    """Tensor hooks live in the autograd metadata of the tensor's C++ object, which a swap
    replaces, while their Python dicts stay on the Parameter: re-register them there (as
    ``set_data`` on CUDA keeps them)."""
    if p._backward_hooks:
        p._backward_hooks = p._backward_hooks
    post = getattr(p, "_post_accumulate_grad_hooks", None)
    if post:
        p._post_accumulate_grad_hooks = post


def _swap_requested() -> bool:
    return getattr(_swap_override, "on", False)


@contextlib.contextmanager
def _swap_params(on: bool) -> Iterator[None]:
    previous = getattr(_swap_override, "on", False)
    _swap_override.on = on
    try:
        yield
    finally:
        _swap_override.on = previous


def _install_future_flag_override() -> None:
    """``_apply`` reads the global future flag; let a thread-local request force it on."""
    future = torch.__future__
    original = future.get_swap_module_params_on_conversion
    if getattr(original, "_torchtpu", False):
        return

    def get_swap_module_params_on_conversion() -> bool:
        return _swap_requested() or original()

    get_swap_module_params_on_conversion._torchtpu = True  # type: ignore[attr-defined]
    get_swap_module_params_on_conversion.__doc__ = original.__doc__
    future.get_swap_module_params_on_conversion = get_swap_module_params_on_conversion


def _install_apply_wrapper() -> None:
    original_apply = nn.Module._apply
    if getattr(original_apply, "_torchtpu", False):
        return

    def _apply(self: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        if recurse:
            for child in self.children():
                child._apply(fn)
        params = [p for p in self._parameters.values() if p is not None]
        if not params:
            return original_apply(self, fn, recurse=False)
        converted = _Precomputed(fn, params)
        if not converted.crosses_tpu():
            return original_apply(self, converted, recurse=False)
        if isinstance(self, torch.jit.ScriptModule):
            return _apply_to_script_module(self, converted)
        if set_data_across is not None and not converted.has_wrapper_subclass():
            return _apply_by_set_data(self, converted)
        try:
            with _swap_params(True):
                original_apply(self, converted, recurse=False)
        except RuntimeError as e:
            # swap_tensors refuses a Parameter with weak references or extra C++
            # references (e.g. saved in a live autograd graph). Finish the move the way
            # PyTorch does for PrivateUse1 (new Parameter objects) and say what that means.
            warnings.warn(
                f"{type(self).__name__}.to(): could not keep the Parameter objects of this module "
                f"({e.__cause__ or e}); its parameters were replaced by new ones, so weights tied to "
                "other modules are no longer shared and optimizers built before the move must be rebuilt.",
                stacklevel=3,
            )
            return original_apply(self, converted, recurse=False)
        for p in self._parameters.values():
            if p is not None:
                _reattach_hooks(p)
        return self

    _apply._torchtpu = True  # type: ignore[attr-defined]
    _apply.__doc__ = original_apply.__doc__
    nn.Module._apply = _apply  # type: ignore[method-assign]


def _apply_by_set_data(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """``_apply``'s own steps for one module where PyTorch would take ``param.data = new``
    (as it does for CUDA) if it knew the pair compatible: each Parameter and its gradient
    keep their objects and take the converted data (``set_data_across``); buffers are
    replaced, as ``_apply`` replaces them."""
    for param in module._parameters.values():
        if param is None:
            continue
        grad = param.grad
        with torch.no_grad():
            param.data = fn(param)  # drops a gradient that no longer fits: it follows below
            if grad is not None:
                grad.data = fn(grad)
        if grad is not None:
            param.grad = grad
    for key, buf in module._buffers.items():
        if buf is not None:
            module._buffers[key] = fn(buf)
    return module


def _apply_to_script_module(module: torch.jit.ScriptModule, fn: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A TorchScript module's parameters are attributes of its C++ object, which neither a
    swap (the object holds a second reference) nor a new Parameter (``_apply`` asserts a
    loaded module's plain tensors are Parameters) can replace: assign each converted tensor
    to its attribute, as ``param.data = new`` does for a move to CUDA."""
    for key, param in list(module._parameters.items()):
        if param is None:
            continue
        with torch.no_grad():
            new = fn(param).requires_grad_(param.requires_grad)
            if param.grad is not None:
                new.grad = fn(param.grad)
        module._parameters[key] = new
    for key, buf in list(module._buffers.items()):
        if buf is not None:
            module._buffers[key] = fn(buf)
    return module


# the C getter/setter of ``tensor.data`` (``torch._C.TensorBase``), which ``torch.Tensor`` inherits
_BASE_DATA = torch._C.TensorBase.__dict__["data"]


def _set_data(self: torch.Tensor, new: torch.Tensor) -> None:
    """``tensor.data = new``: PyTorch's ``set_data``, which refuses a move across tpu for the
    reason ``_apply`` does (a dense CPU and a PrivateUse1 tensor are not "compatible shallow
    copy types"). FSDP2's ``fully_shard`` moves a module built on the CPU to its mesh's
    device this way (``param.data = param.to(device)``), as older code moves parameters.
    Across tpu, ``new``'s data is swapped into ``self`` instead: ``self`` keeps its identity,
    Python class, attributes, ``requires_grad`` and hooks, and shares ``new``'s storage, as
    after ``set_data`` on CUDA; a ``.grad`` that no longer fits is dropped (the gradient
    setter refuses one of another device)."""
    try:
        _BASE_DATA.__set__(self, new)
    except RuntimeError:
        if not isinstance(new, torch.Tensor) or not _crosses_tpu(self, new):
            raise
        if self.requires_grad and not (new.is_floating_point() or new.is_complex()):
            raise RuntimeError("data set to a tensor that requires gradients must be floating point or complex dtype") from None
        if set_data_across is None:
            _swap_data(self, new)
            return
        grad = self.grad
        set_data_across(self, new)
        if grad is not None and (grad.device, grad.dtype, grad.shape) != (self.device, self.dtype, self.shape):
            self.grad = None  # of the old device: the gradient setter would refuse it now


def _swap_data(var: torch.Tensor, new: torch.Tensor) -> None:
    grad = var.grad
    replacement = new.detach().requires_grad_(var.requires_grad)  # new's storage, a fresh tensor object
    cls, state = var.__class__, var.__dict__
    torch.utils.swap_tensors(var, replacement)  # swaps the Python class and attributes too: var keeps its own
    replacement.__class__, replacement.__dict__ = torch.Tensor, {}  # now the old data, dropped
    var.__class__, var.__dict__ = cls, state
    _reattach_hooks(var)
    if grad is not None and (grad.device, grad.dtype, grad.shape) == (var.device, var.dtype, var.shape):
        var.grad = grad


def _install_data_setter() -> None:
    current = torch.Tensor.__dict__.get("data")
    if isinstance(current, property) and getattr(current.fset, "_torchtpu", False):
        return
    _set_data._torchtpu = True  # type: ignore[attr-defined]
    torch.Tensor.data = property(_BASE_DATA.__get__, _set_data, doc=_BASE_DATA.__doc__)  # type: ignore[method-assign, assignment]


def install() -> None:
    """Make ``Module.to``/``to_empty``/``half``… and ``tensor.data = ...`` keep Parameter
    identity across tpu."""
    _install_future_flag_override()
    _install_apply_wrapper()
    _install_data_setter()
