"""When an op's program cannot be built for its arguments, raise what the CPU raises.

Building a program checks arguments through PyTorch's meta functions, decompositions and
our lowering rules; each says *something* when the arguments are wrong, but often not
what the CPU kernel says (``a and b must have same reduction dim`` where the CPU says
``mat1 and mat2 shapes cannot be multiplied (2x3 and 5x4)``), or with another exception
type (a ValueError from a shape helper where the CPU raises RuntimeError). So when
building fails, the same call runs once on CPU copies of the arguments: if the CPU
refuses it, the user gets the CPU's exception, chained to ours. This costs nothing on the
hot path (a cached program was built, so its arguments were fine) and only runs for
small arguments, where a CPU run is cheap.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from torch.utils._pytree import tree_flatten, tree_map

# Above this many elements in all tensor arguments together, our own message stands.
MAX_ELEMENTS = 1 << 22


def _to_cpu(v: Any, uninitialized_floats: bool = False) -> Any:
    """A CPU copy with the tensor's geometry (strides decide some errors) in a resizable
    storage (an ``out=`` tensor may be resized), or the CPU device for a tpu one.
    ``uninitialized_floats``: a floating-point tensor gets the geometry without its values
    (nothing read from the device), for errors that do not depend on them."""
    if isinstance(v, torch.Tensor) and v.device.type == "tpu":
        if uninitialized_floats and (v.is_floating_point() or v.is_complex()):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).requires_grad_(v.requires_grad)
        host = v.detach().cpu()
        try:
            copy = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).copy_(host)
        except RuntimeError:  # an overlapping layout (expanded): a dense copy
            copy = host.clone()
        return copy.requires_grad_(v.requires_grad)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    return v


def _small(args: tuple, kwargs: dict, uninitialized_floats: bool) -> bool:
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if uninitialized_floats:  # only the others are copied
        tensors = [t for t in tensors if not (t.is_floating_point() or t.is_complex())]
    return sum(t.numel() for t in tensors) <= MAX_ELEMENTS


def cpu_error(op: Any, args: tuple, kwargs: dict, uninitialized_floats: bool = False) -> Exception | None:
    """The exception the CPU raises for this call; None when it accepts the arguments (or
    they are too large to try, or cannot be copied). ``uninitialized_floats``: the error
    sought does not depend on floating-point values (see ``_to_cpu``)."""
    if not _small(args, kwargs, uninitialized_floats):
        return None
    try:
        cpu_args, cpu_kwargs = tree_map(lambda v: _to_cpu(v, uninitialized_floats), (args, kwargs))
    except Exception:  # noqa: BLE001 - the arguments cannot be read back: keep our error
        return None
    try:
        op(*cpu_args, **cpu_kwargs)
    except NotImplementedError as e:
        # a dtype the CPU's kernel refuses ("bitwise_and_cpu" not implemented for 'Float') is
        # its answer; an op the CPU lacks too is not: our message says more
        return e if "not implemented for '" in str(e) else None
    except Exception as e:  # noqa: BLE001 - this is the result
        return e
    return None


def raise_as_cpu(op: Any, args: tuple, kwargs: dict, ours: Exception) -> NoReturn:
    """Raise the CPU's exception for this call if it has one, else ``ours``. An error
    eager/validate.py raised is already the CPU's, worded for tpu tensors: it stands."""
    if getattr(ours, "torchtpu_as_cpu", False):
        raise ours
    theirs = cpu_error(op, args, kwargs)
    if theirs is None:
        raise ours
    raise theirs from ours
