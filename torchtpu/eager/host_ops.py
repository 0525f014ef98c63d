"""Eager kernels for ops whose output shape depends on tensor values (nonzero,
masked_select, bool-mask indexing, unique and unique_consecutive, bincount; and the
histograms, which run on the host for now). They sync to the host for the data-dependent part
(the positions of the True elements) and run everything else as ordinary device programs.

Register ``kernels()`` for the PrivateUse1 key after the generic op kernels (or exclude
these ops from the generic registration): they wrap ``index.Tensor`` and ``index_put``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from .. import op_report

aten = torch.ops.aten

_MASK_DTYPES = (torch.bool, torch.uint8)


def _run(op: Any, args: tuple, kwargs: dict | None = None) -> Any:
    from . import dispatch

    return dispatch.run(op, args, kwargs or {})


def nonzero(x: torch.Tensor) -> torch.Tensor:
    """The positions, in a storage with spare rows (buckets.py): ops on them (``x[token]``,
    ``index_add_``) then run through a program per bucket, not per count."""
    from .minimal import from_cpu, to_cpu, upload_bucketed

    _report_sync(aten.nonzero.default)
    with op_report.quiet():
        positions = torch.nonzero(to_cpu(x, cause=_data_dependent(aten.nonzero.default)))
        out = upload_bucketed(positions)
        return from_cpu(positions) if out is None else out


def _report_sync(op: Any) -> None:
    if op_report.recorder is not None:
        op_report.recorder.record(op_report.HOST_SYNC, f"{op.name()} (data-dependent shape)")


def _data_dependent(op: Any) -> str:
    """How a host sync for ``op`` is named (profiler spans, metrics, explain)."""
    return f"{op.name()} (data-dependent shape)"


def _is_mask(i: Any) -> bool:
    return isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES


def _expand_masks(x: torch.Tensor, indices: list[Any]) -> list[Any]:
    """ATen's expandTensors: a k-dim mask becomes k long index tensors (host sync)."""
    out: list[Any] = []
    for i in indices:
        if not _is_mask(i):
            out.append(i)
            continue
        d = len(out)
        if tuple(i.shape) != tuple(x.shape[d : d + i.dim()]):
            raise IndexError(
                f"The shape of the mask {list(i.shape)} at index {d} does not match the shape of the indexed tensor {list(x.shape)}"
            )
        nz = nonzero(i)  # (n, k)
        out.extend(nz[:, j] for j in range(i.dim()))
    return out


def _on_device(indices: Any) -> list[Any]:
    """Index tensors may live on the CPU, as for CUDA tensors ("indices should be either on
    cpu or on the same device as the indexed tensor"): move them to the device."""
    from ..tensor.storage import DEVICE

    return [i.to(DEVICE) if isinstance(i, torch.Tensor) and i.device.type == "cpu" else i for i in indices]


def index(x: torch.Tensor, indices: list[Any]) -> torch.Tensor:
    indices = _on_device(indices)
    if any(_is_mask(i) for i in indices):
        indices = _expand_masks(x, indices)
    return _run(aten.index.Tensor, (x, indices))


def _static_mask(indices: list[Any]) -> bool:
    """The one bool-mask index_put case the lowering handles without a sync."""
    nonnull = [d for d, i in enumerate(indices) if i is not None]
    return nonnull == [0] and _is_mask(indices[0])


def _index_put_kernel(op: Any) -> Any:
    def kernel(x: torch.Tensor, indices: list[Any], values: torch.Tensor, accumulate: bool = False, *rest: Any, **kwargs: Any) -> torch.Tensor:
        indices = _on_device(indices)
        if any(_is_mask(i) for i in indices) and not _static_mask(indices):
            indices = _expand_masks(x, indices)
        return _run(op, (x, indices, values, accumulate, *rest), kwargs)

    return kernel


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    xb, mb = torch.broadcast_tensors(x, mask)
    if xb.dim() == 0:
        xb, mb = xb.reshape(1), mb.reshape(1)
    return index(xb, [mb])


def _on_host(op: Any) -> Any:
    """A kernel that runs ``op`` on host copies of its tensor arguments and moves every
    result back: the output sizes (number of unique values, bincount's length) are only
    known after looking at the data, so the whole op runs where the data already has to be."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        from .minimal import from_cpu, to_cpu

        cause = _data_dependent(op)
        host = lambda t: to_cpu(t, cause=cause) if isinstance(t, torch.Tensor) and t.device.type == "tpu" else t  # noqa: E731
        _report_sync(op)
        with op_report.quiet():
            out = op(*tree_map(host, args), **tree_map(host, kwargs))
        return tree_map(lambda t: from_cpu(t) if isinstance(t, torch.Tensor) else t, out)

    kernel.__name__ = f"tpu_host_{op.name()}"
    return kernel


def _into_out(fn: Any, checks_overlap: bool = False) -> Any:
    """The out= form of a data-dependent op: compute, then resize ``out`` and copy (as the
    CPU kernels do). ``checks_overlap``: the CPU kernel first refuses an ``out`` that
    overlaps itself or an input (nonzero, masked_select), before resizing it."""

    def kernel(*args: Any, out: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if checks_overlap:
            from ..eager.validate import assert_no_internal_overlap, assert_no_overlap

            assert_no_internal_overlap(out)
            for a in args:
                if isinstance(a, torch.Tensor):
                    assert_no_overlap(out, a)
        result = fn(*args, **kwargs)
        out.resize_(result.shape)
        return out.copy_(result)

    return kernel


_UNIQUE_OPS = (aten._unique.default, aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default, aten.unique_dim_consecutive.default)
# bincount's and repeat_interleave's lengths are data-dependent; the histograms' shapes are not, but their CPU
# kernels' bin search is what OpInfo compares against (no device rule yet): on the host too
_HOST_OPS = (
    aten.bincount.default,
    aten.repeat_interleave.Tensor,  # the indices for repeat_interleave: length sum(repeats)
    aten.histogram.bin_ct,
    aten.histogram.bins_tensor,
    aten._histogramdd_bin_edges.default,
    aten._histogramdd_from_bin_cts.default,
    aten._histogramdd_from_bin_tensors.default,
)


def fused_moving_avg_obs_fq_helper(
    x: torch.Tensor,
    observer_on: torch.Tensor,
    fake_quant_on: torch.Tensor,
    running_min: torch.Tensor,
    running_max: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    averaging_const: float,
    quant_min: int,
    quant_max: int,
    ch_axis: int,
    per_row_fake_quant: bool = False,
    symmetric_quant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FusedMovingAvgObsFakeQuantize`` (the default QAT qconfig): a moving-average min/max
    observer, quantization parameters chosen from it, then fake quantization of ``x``.

    The CPU kernel reads the two flags with ``.item()`` and picks the parameters with FBGEMM's
    ChooseQuantizationParams (double-precision steps, resizing empty per-channel buffers).
    Here the min/max of ``x`` (per row of the channel axis, or overall) is computed on the
    device; the observer update and the parameter choice run through that same CPU kernel,
    on the host copies of the small state and a stand-in input with the same min/max; the
    new state is written back, and ``x`` is fake-quantized on the device with it."""
    from .minimal import from_cpu, to_cpu

    op = aten._fused_moving_avg_obs_fq_helper.default
    cause = f"{op.name()} (observer flags and quantization parameters)"
    _report_sync(op)
    with op_report.quiet():
        observe = bool(to_cpu(observer_on, cause=cause).reshape(-1)[0])
        if per_row_fake_quant and observe and ch_axis != 0:
            raise RuntimeError("Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is only supported on axis == 0")
        if per_row_fake_quant:
            channels = x.shape[ch_axis]
            if observe:  # rows of the channel axis: min and max of each
                rows = x.movedim(ch_axis, 0).reshape(channels, -1)
                lo, hi = torch.aminmax(rows, dim=1)
                stand_in = to_cpu(torch.stack([lo, hi], dim=1), cause=cause)
            else:
                stand_in = torch.zeros([channels if d == ch_axis else 1 for d in range(x.dim())], dtype=x.dtype)
        elif observe:
            lo, hi = torch.aminmax(x)
            stand_in = to_cpu(torch.stack([lo, hi]), cause=cause)
        else:
            stand_in = torch.zeros(1, dtype=x.dtype)
        state = [to_cpu(t, cause=cause).clone() for t in (running_min, running_max, scale, zero_point)]
        flags = [to_cpu(t, cause=cause) for t in (observer_on, fake_quant_on)]
        op(stand_in, *flags, *state, averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)
        for device_t, host_t in zip((running_min, running_max, scale, zero_point), state, strict=True):
            if device_t.shape != host_t.shape:  # an empty per-channel buffer, sized on first use
                device_t.resize_(host_t.shape)
            device_t.copy_(from_cpu(host_t))
        if not bool(flags[1].reshape(-1)[0]):
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if per_row_fake_quant:
        return aten.fake_quantize_per_channel_affine_cachemask.default(x, scale, zero_point, ch_axis, quant_min, quant_max)
    enabled = torch.ones(1, dtype=torch.long, device=x.device)
    return aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default(x, scale, zero_point, enabled, quant_min, quant_max)


def padded_dense_to_jagged(padded: torch.Tensor, offsets: list[torch.Tensor], total_L: int | None = None) -> torch.Tensor:  # noqa: N803
    """A jagged nested tensor's values from their padded form: without ``total_L`` the
    result's length is the last offset, read from the device as the CPU kernel reads it."""
    if total_L is None and len(offsets) == 1:
        total_L = int(offsets[0][-1])  # noqa: N806
    return _run(aten._padded_dense_to_jagged_forward.default, (padded, offsets, total_L))


def range_out(start: Any, end: Any, step: Any = 1, *, out: torch.Tensor) -> torch.Tensor:
    """``torch.range`` (deprecated; ``end`` included): its values computed on the host, as
    the CPU computes them, and copied into ``out``."""
    values = torch.range(start, end, step, dtype=out.dtype)
    out.resize_(values.shape)
    return out.copy_(values)


def kernels() -> dict[Any, Any]:
    return {
        aten.range.out: range_out,
        aten.range.out_: lambda start, end, *, out: range_out(start, end, out=out),
        aten._fused_moving_avg_obs_fq_helper.default: fused_moving_avg_obs_fq_helper,
        aten.nonzero.default: nonzero,
        aten.masked_select.default: masked_select,
        aten.index.Tensor: index,
        aten.index_put_.default: _index_put_kernel(aten.index_put_.default),
        aten.index_put.default: _index_put_kernel(aten.index_put.default),
        aten._index_put_impl_.default: _index_put_kernel(aten._index_put_impl_.default),
        aten.nonzero.out: _into_out(nonzero, checks_overlap=True),
        aten.masked_select.out: _into_out(masked_select, checks_overlap=True),
        **{op: _on_host(op) for op in (*_UNIQUE_OPS, *_HOST_OPS)},
        aten.bincount.out: _into_out(_on_host(aten.bincount.default)),
        aten._padded_dense_to_jagged_forward.default: padded_dense_to_jagged,
    }
