"""The two conversions of jagged nested tensors (``torch.nested``, ``layout=torch.jagged``).

A jagged nested tensor keeps its values as one dense tensor ``[sum of lengths, *D]`` and an
``offsets`` tensor ``[B + 1]``; its ops run as ordinary ops on the values, except
``to_padded_tensor``, ``torch.nested.nested_tensor_from_jagged(...)``'s padded
constructors, and the softmax and layer norm along the ragged dim, which go through two
fused ops with CPU and CUDA kernels (FBGEMM's): ``_jagged_to_padded_dense_forward`` and
``_padded_dense_to_jagged_forward``. Each is the other's gradient. Here they are gathers:

- jagged -> padded ``[B, max_length, *D]``: row ``b``, position ``j`` reads value row
  ``offsets[b] + j`` when ``j`` is within the sequence, else the padding value (sequences
  longer than ``max_length`` are cut, as the kernels cut them);
- padded -> jagged ``[total_L, *D]``: value row ``p`` belongs to the sequence ``b`` whose
  offsets enclose it (a search of ``offsets``) and reads ``padded[b, p - offsets[b]]``.

``total_L`` sizes the second one's result. When the caller leaves it out, the CPU kernel
reads the last offset, a wait for the device; the tpu kernel does the same
(``eager/host_ops.py``).
"""

from __future__ import annotations

import torch

from .decomp import meta_where_missing, register_own

aten = torch.ops.aten


def _one_jagged_dim(offsets: list[torch.Tensor]) -> torch.Tensor:
    if len(offsets) != 1:
        raise AssertionError(f"Only one jagged dim is supported, got {len(offsets)} offsets")  # the meta kernel's words
    return offsets[0]


@register_own(aten._jagged_to_padded_dense_forward.default)
def _jagged_to_padded_dense(values: torch.Tensor, offsets: list[torch.Tensor], max_lengths: list[int], padding_value: float = 0.0) -> torch.Tensor:
    offs = _one_jagged_dim(offsets)
    batch, length, rest = offs.shape[0] - 1, max_lengths[0], values.shape[1:]
    if values.shape[0] == 0 or batch == 0 or length == 0:
        return values.new_full((batch, length, *rest), padding_value)
    position = offs[:-1].unsqueeze(1) + torch.arange(length, device=values.device, dtype=offs.dtype)  # [B, S]
    inside = position < offs[1:].unsqueeze(1)
    # positions past a sequence's end read any valid row: the padding replaces them
    rows = values.index_select(0, position.clamp(max=values.shape[0] - 1).reshape(-1)).reshape(batch, length, *rest)
    return rows.masked_fill(~inside.reshape(batch, length, *([1] * len(rest))), padding_value)


@register_own(aten._padded_dense_to_jagged_forward.default)
def _padded_dense_to_jagged(padded: torch.Tensor, offsets: list[torch.Tensor], total_L: int | None = None) -> torch.Tensor:  # noqa: N803 - schema name
    offs = _one_jagged_dim(offsets)
    if total_L is None:
        raise RuntimeError("_padded_dense_to_jagged_forward: total_L must be given where the offsets cannot be read")
    position = torch.arange(total_L, device=padded.device, dtype=offs.dtype)
    sequence = torch.searchsorted(offs, position, right=True) - 1
    within = position - offs.index_select(0, sequence)
    return padded.flatten(0, 1).index_select(0, sequence * padded.shape[1] + within)


def _padded_to_jagged_meta(padded: torch.Tensor, offsets: list[torch.Tensor], total_L: int | None = None) -> torch.Tensor:  # noqa: N803
    """The result's shape, for the eager path (PyTorch registers only a fake-tensor rule)."""
    _one_jagged_dim(offsets)
    if total_L is None:
        raise RuntimeError("_padded_dense_to_jagged_forward: the result's length (total_L) depends on the offsets' values")
    return padded.new_empty((total_L, *padded.shape[2:]))


meta_where_missing("_padded_dense_to_jagged_forward", _padded_to_jagged_meta)
