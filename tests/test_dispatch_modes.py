"""tpu ops under a user's TorchDispatchMode (a FlopCounterMode, a logging mode): an op
whose program is built there traces its decomposition from inside the mode's handler,
where PyTorch excludes the keys tracing needs. The trace lost its input and the op raised
"Cannot copy out of meta tensor" (found by the model zoo's EnCodec under DeferAndFuse and
torch.compile, where AOTAutograd's runtime checks are such a mode)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import torchtpu

TPU = "tpu"


class Logging(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_a_decomposed_op_under_a_dispatch_mode_matches_the_cpu(mode: str) -> None:
    x = torch.randn(2, 1, 23)  # a length no other test uses: the program is built here
    with torchtpu.eager_mode(mode), Logging() as log:
        y = F.pad(x.to(TPU), (7, 2), mode="reflect") * 2
    assert "aten.reflection_pad1d.default" in log.ops
    assert torch.equal(y.cpu(), F.pad(x, (7, 2), mode="reflect") * 2)


def test_flop_counter_mode_counts_tpu_ops() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with FlopCounterMode(display=False) as counter:
        out = F.pad(a.to(TPU)[None], (3, 1), mode="reflect")[0, :, :16] @ b.to(TPU)
    assert counter.get_total_flops() == 2 * 8 * 16 * 4
    torch.testing.assert_close(out.cpu(), F.pad(a[None], (3, 1), mode="reflect")[0, :, :16] @ b)


@pytest.mark.parametrize(
    "structure",
    [[[1, 2, 3]], [1, [2, 3], 4], [1, None, 2], [[], 1], ([1, 2], 3), [{"a": 1}, 2]],
    ids=["foreach", "mixed", "optional", "empty_list", "tuple", "dict"],
)
def test_unflattener_is_tree_unflatten(structure) -> None:
    """eager/oplower.py's ``unflattener`` rebuilds an op's returns (foreach lists, optional
    results) without walking the pytree spec per call: exactly what tree_unflatten gives."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from torchtpu.eager.oplower import unflattener

    leaves, tree = tree_flatten(structure)
    flat = [object() for _ in leaves]
    rebuilt, expected = unflattener(tree)(flat), tree_unflatten(flat, tree)
    assert rebuilt == expected and type(rebuilt) is type(expected)
