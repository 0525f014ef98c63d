"""The nested-tensor path of ``nn.TransformerEncoder`` on tpu.

In inference (eval mode, no autograd) with a ``src_key_padding_mask`` whose padding sits at
the end of each row, PyTorch packs the batch into a nested tensor (each sequence without
its padding), runs every layer's fused ``_transformer_encoder_layer_fwd`` on it, and pads
the result back with zeros. It does so for "cpu", "cuda" and the PrivateUse1 device, so
the padded positions of the output are 0, where the layers' dense path would leave values.

tpu keeps nested tensors PyTorch's own: a ``NestedTensorImpl`` over a flat tpu buffer,
made by the CPU kernel of ``_nested_view_from_buffer`` (it only records sizes, strides and
offsets, all host metadata). These kernels give the three ops of that path a tpu
implementation:

- ``_nested_tensor_from_mask_left_aligned`` and ``_nested_tensor_from_mask`` (dense tpu
  tensors): the mask is read on the host, as the CPU kernels read it, and the kept rows of
  each sequence are concatenated into the buffer on the device;
- ``_transformer_encoder_layer_fwd`` and ``to_padded_tensor`` on the nested tensor: the
  sequences padded into one dense batch and run through the dense layer with the padding
  as a key mask. Every position that is not padding depends only on the unpadded keys, so
  it is the nested computation; the padding is dropped again when re-packing.
"""

from __future__ import annotations

from typing import Any

import torch

_K = torch._C.DispatchKey
aten = torch.ops.aten
_libs: list[torch.library.Library] = []


# -- packing and unpacking ----------------------------------------------------------------------
def _pack(rows: list[torch.Tensor]) -> torch.Tensor:
    """A nested tensor of the 2-D ``rows`` [length_i, D] (contiguous, one tpu buffer)."""
    d = rows[0].shape[1]
    sizes = torch.tensor([[r.shape[0], d] for r in rows], dtype=torch.int64)
    strides = torch.tensor([[d, 1]] * len(rows), dtype=torch.int64)
    offsets = torch.cumsum(torch.tensor([0] + [r.shape[0] * d for r in rows[:-1]], dtype=torch.int64), 0)
    buffer = torch.cat([r.reshape(-1) for r in rows])
    return aten._nested_view_from_buffer.default._op_dk(_K.CPU, buffer, sizes, strides, offsets)


def _unpack(nt: torch.Tensor) -> list[torch.Tensor]:
    """The components of a nested tensor, each a view of its tpu buffer (the sizes, strides
    and offsets are host tensors of the NestedTensorImpl)."""
    buffer = aten.values.default._op_dk(_K.NestedTensorCPU, nt)
    sizes = aten._nested_tensor_size.default._op_dk(_K.NestedTensorCPU, nt).tolist()
    strides = aten._nested_tensor_strides.default._op_dk(_K.NestedTensorCPU, nt).tolist()
    offsets = aten._nested_tensor_storage_offsets.default._op_dk(_K.NestedTensorCPU, nt).tolist()
    return [buffer.as_strided(size, stride, buffer.storage_offset() + o) for size, stride, o in zip(sizes, strides, offsets)]


def _padded(parts: list[torch.Tensor], target: list[int], value: float = 0.0) -> torch.Tensor:
    """[B, *target]: each component padded with ``value`` at the end of every dim."""
    pads = [[x for d in reversed(range(len(target))) for x in (0, target[d] - p.shape[d])] for p in parts]
    return torch.stack([torch.nn.functional.pad(p, pad, value=value) for p, pad in zip(parts, pads)])


# -- the kernels --------------------------------------------------------------------------------
def _kept_lengths(mask: torch.Tensor) -> tuple[list[int], bool]:
    """Per row of the keep-mask [B, T]: how many it keeps, and whether every row keeps a
    prefix (no gaps), as the CPU kernels check it."""
    host = mask.detach().cpu().to(torch.bool)
    lengths = host.sum(1)
    prefix = torch.arange(host.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return lengths.tolist(), bool(torch.equal(prefix, host))


def _from_mask_left_aligned(t: torch.Tensor, mask: torch.Tensor) -> bool:
    return _kept_lengths(mask)[1]


def _from_mask(t: torch.Tensor, mask: torch.Tensor, mask_check: bool = True) -> torch.Tensor:
    lengths, left_aligned = _kept_lengths(mask)
    if mask_check and not left_aligned:
        raise RuntimeError("Mask must be left-aligned without gaps")
    return _pack([t[b, :n] for b, n in enumerate(lengths)])


def _encoder_layer(src: torch.Tensor, *args: Any, mask: Any = None, mask_type: Any = None) -> torch.Tensor:
    if mask is not None:
        raise RuntimeError("NestedTensor with mask is not supported yet")  # the CPU kernel's refusal
    rows = _unpack(src)
    longest = max((r.shape[0] for r in rows), default=0)
    padding = torch.arange(longest, device=src.device).unsqueeze(0) >= torch.tensor(
        [r.shape[0] for r in rows], device=src.device
    ).unsqueeze(1)
    out = aten._transformer_encoder_layer_fwd.default(_padded(rows, [longest, rows[0].shape[1]]), *args, mask=padding, mask_type=1)
    return _pack([out[b, : r.shape[0]] for b, r in enumerate(rows)])


def _to_padded_tensor(nt: torch.Tensor, padding: float, output_size: Any = None) -> torch.Tensor:
    """[B, *the largest size of each dim] (or ``output_size``): each component padded at
    the end of every dim with ``padding``, as the CPU kernel pads them."""
    parts = _unpack(nt)
    if output_size is not None:
        target = list(output_size[1:])
    else:
        target = [max((p.shape[d] for p in parts), default=0) for d in range(nt.dim() - 1)]
    if not parts:
        return torch.full([0, *target], padding, dtype=nt.dtype, device=nt.device)
    return _padded(parts, target, padding)


def _unbind(nt: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, ...]:
    """The components, as views of the buffer (what printing a nested tensor asks for)."""
    if dim != 0:
        raise RuntimeError(f"NestedTensor can only be unbound along dimension 0 got dimension {dim} instead.")  # the CPU kernel's words
    return tuple(_unpack(nt))


def install() -> None:
    """Register the kernels (once)."""
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_nested_tensor_from_mask_left_aligned", _from_mask_left_aligned, "PrivateUse1")
    lib.impl("_nested_tensor_from_mask", _from_mask, "PrivateUse1")
    lib.impl("_transformer_encoder_layer_fwd", _encoder_layer, "NestedTensorPrivateUse1")
    lib.impl("to_padded_tensor", _to_padded_tensor, "NestedTensorPrivateUse1")
    lib.impl("unbind.int", _unbind, "NestedTensorPrivateUse1")
    _libs.append(lib)
