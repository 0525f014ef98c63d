"""The host transport: gloo on host views of the tpu tensors.

Used on the cpu platform, where XLA's buffers are host memory and torch's gloo beats
in-program XLA collectives (64 MB all_reduce: 40-57 ms vs 105-129 ms, see
docs/distributed.md). Every method takes the caller's tensors (tpu or CPU), blocks
until the collective is done and has written the results into them -- except
``allreduce_start``, which returns at once: the copy to the host, gloo and the new
device buffer happen on the group's worker thread, so DDP's gradient buckets travel
while the backward pass goes on. Every gloo call of the group is issued in program
order (gloo pairs calls across ranks by that order): a synchronous call first waits
for the worker (``drain``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import _spans, metrics
from ._host import Whole, capture_whole, empty_like_host, is_tpu, read_view, work_copy, write_back
from ._work import CHECK_SLOT_BYTES, CrossRankCheck, Job, Posted, Worker

ReduceOp = dist.ReduceOp
# An all_reduce this small runs on the caller's thread when nothing else is in flight: it
# takes well under a millisecond, and two thread hand-offs on a busy host cost about as much.
INLINE_BYTES = 64 << 10


def attempt_prefix(name: str) -> str:
    """A store prefix of this torchrun attempt: torchrun's static rendezvous keeps one store
    across restarts (``--max-restarts``), and a restarted rank must not read the addresses
    its peers published before the restart."""
    return f"{name}/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


# dtypes whose sum torch computes as gloo does (elementwise, wrapping integers)
_SUMMABLE = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
)


def _sums_in_check(whole: list[Whole], op: Any) -> bool:
    """An all_reduce small enough to ride in the cross-rank check's exchange: one tensor
    whose values fit its slot, summed (SUM, or AVG's sum)."""
    return len(whole) == 1 and op == ReduceOp.SUM and whole[0].cell.dtype in _SUMMABLE and whole[0].cell.nbytes <= CHECK_SLOT_BYTES


def _gathered(slots: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Every rank's values of ``like``'s size and dtype from the check's payload areas:
    ``(group size, like.numel())``, a copy."""
    return slots[:, : like.numel() * like.element_size()].contiguous().view(like.dtype)


def _reduce_options(op: Any, timeout: timedelta) -> Any:
    o = dist.AllreduceOptions()
    o.reduceOp = op
    o.timeout = timeout
    return o


class GlooHostTransport:
    """Collectives for one group, through a private gloo group over the group's store."""

    name = "gloo-host"

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore(attempt_prefix("torchtpu_gloo"), store), rank, size, timeout)
        self.worker = Worker(f"torchtpu-gloo-host-{rank}")

    def drain(self) -> None:
        """Wait for the asynchronous collectives issued so far (before a synchronous one)."""
        self.worker.drain()

    def _timeout(self, opts: Any) -> timedelta:
        t = getattr(opts, "timeout", None)
        return t if t is not None and t.total_seconds() > 0 else self.timeout

    # -- reductions ---------------------------------------------------------------------
    def _reduce_op(self, opts: Any) -> tuple[Any, bool]:
        """gloo has no AVG: sum, then divide by the group size."""
        op = getattr(opts.reduceOp, "op", opts.reduceOp)
        if op == ReduceOp.AVG:
            return ReduceOp.SUM, True
        if op == ReduceOp.PREMUL_SUM:
            raise NotImplementedError(
                "torchtpu.distributed: ReduceOp.PREMUL_SUM is not supported; scale the tensor and use ReduceOp.SUM"
            )
        return op, False

    def _finish_avg(self, h: torch.Tensor, avg: bool) -> None:
        if avg:
            if h.is_floating_point():
                h.div_(self.size)
            else:
                h.floor_divide_(self.size)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> None:
        op, avg = self._reduce_op(opts)
        hosts = [work_copy(t) for t in tensors]
        self.gloo.allreduce(hosts, _reduce_options(op, self._timeout(opts))).wait()
        for t, h in zip(tensors, hosts):
            self._finish_avg(h, avg)
            write_back(t, h)

    def allreduce_start(
        self, tensors: list[torch.Tensor], opts: Any, check: CrossRankCheck | None, coalesced: bool = False
    ) -> Job | None:
        """Start an all_reduce on the worker thread and return its job at once; None when a
        tensor is not a whole tpu storage (the caller then runs it synchronously). ``check``
        (the cross-rank check) runs first on the worker: it is a gloo call too, and a small
        sum carries its values in it (:meth:`_sum_in_check`)."""
        op, avg = self._reduce_op(opts)
        o = _reduce_options(op, self._timeout(opts))
        # gloo reduces in the buffers themselves when it can (one tensor per buffer)
        whole = capture_whole(tensors, in_place=not coalesced)
        if whole is None:
            return None
        fits_check = check is not None and not coalesced and _sums_in_check(whole, op)

        def reduce() -> None:
            if fits_check and self._sum_in_check(whole[0], check, avg):
                return
            if check is not None and not fits_check:
                check()
            if coalesced:
                self._reduce_whole_coalesced(whole, o, avg)
                return
            hosts = [w.to_host() for w in whole]
            self.gloo.allreduce(hosts, o).wait()
            for w, h in zip(whole, hosts):
                self._finish_avg(h, avg)
                w.store(h)

        def run() -> None:
            try:
                reduce()
            except BaseException as e:
                for w in whole:
                    w.release(e)
                raise

        def traced() -> None:  # a profiler span on this worker thread: the overlap is visible
            with _spans.maybe_span("torchtpu::collective (all_reduce)", transport="host", bytes=nbytes):
                run()

        nbytes = sum(w.cell.nbytes for w in whole)
        if nbytes <= INLINE_BYTES and self.worker.idle():
            job = Job(traced)  # latency-bound: a thread hand-off costs more than the overlap gains
            job.run()
            return job
        return self.worker.submit(traced)

    def _sum_in_check(self, whole: Whole, check: CrossRankCheck, avg: bool) -> bool:
        """A small SUM/AVG all_reduce in the cross-rank check's own exchange: every rank
        gathers every rank's values with its check slot and adds them up in rank order, so
        it costs one gloo round trip instead of two and every rank gets the same bits.
        16-bit floats are summed in float32 and rounded once (gloo rounds after every
        addition). A mismatch raises before anything is written into the tensor. False
        (the check done, nothing written) when a peer sent no values: its tensor is not a
        whole storage, and it runs gloo's all_reduce, as this rank must then too."""
        host = whole.to_host(writing=False)
        slots = check(host.view(torch.uint8))
        if slots is None:
            return False
        metrics.add("collectives_in_check")
        values = _gathered(slots, host)
        acc = values[0].to(torch.float32 if host.dtype in (torch.float16, torch.bfloat16) else host.dtype, copy=True)
        for v in values[1:]:
            acc.add_(v)
        self._finish_avg(acc, avg)
        whole.begin_writing()
        host.copy_(acc)
        whole.store(host)
        return True

    def _reduce_whole_coalesced(self, whole: list[Whole], o: Any, avg: bool) -> None:
        by_dtype: dict[torch.dtype, list[Whole]] = {}
        for w in whole:
            by_dtype.setdefault(w.cell.dtype, []).append(w)
        for group in by_dtype.values():
            flat = torch.cat([w.to_host() for w in group]) if len(group) > 1 else group[0].to_host()
            self.gloo.allreduce([flat], o).wait()
            self._finish_avg(flat, avg)
            for w, piece in zip(group, flat.split([w.cell.numel for w in group])):
                w.store(piece)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> None:
        # one flat host buffer per dtype: one gloo round trip instead of one per tensor
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        op, avg = self._reduce_op(opts)
        for group in by_dtype.values():
            flat = torch.cat([read_view(t).reshape(-1) for t in group])
            self.gloo.allreduce([flat], _reduce_options(op, self._timeout(opts))).wait()
            self._finish_avg(flat, avg)
            for t, piece in zip(group, flat.split([t.numel() for t in group])):
                write_back(t, piece.view(t.shape))

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> None:
        op, avg = self._reduce_op(opts)
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank, o.rootTensor, o.timeout = op, opts.rootRank, opts.rootTensor, self._timeout(opts)
        hosts = [work_copy(t) for t in tensors]
        self.gloo.reduce(hosts, o).wait()
        if self.rank == opts.rootRank:
            for t, h in zip(tensors, hosts):
                self._finish_avg(h, avg)
                write_back(t, h)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> None:
        op, avg = self._reduce_op(opts)
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = op, self._timeout(opts)
        h = empty_like_host(output)
        self.gloo._reduce_scatter_base(h, read_view(input).contiguous(), o).wait()
        self._finish_avg(h, avg)
        write_back(output, h)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> None:
        for out, ins in zip(outputs, input_lists):
            flat = torch.cat([read_view(i).reshape(-1) for i in ins])
            self.reduce_scatter_tensor(out, flat, opts)

    # -- data movement --------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> None:
        o = dist.BroadcastOptions()
        o.rootRank, o.rootTensor, o.timeout = opts.rootRank, opts.rootTensor, self._timeout(opts)
        root = self.rank == opts.rootRank
        hosts = [read_view(t) if root else empty_like_host(t) for t in tensors]
        hosts = [h if h.is_contiguous() else h.contiguous() for h in hosts]
        self.gloo.broadcast(hosts, o).wait()
        if not root:
            for t, h in zip(tensors, hosts):
                write_back(t, h)

    def allgather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> None:
        h = empty_like_host(output)
        self.gloo._allgather_base(h, read_view(input).contiguous()).wait()
        write_back(output, h)

    def allgather_in_check(self, outputs: list[torch.Tensor], input: torch.Tensor, check: CrossRankCheck) -> bool:
        """An all_gather of at most :data:`CHECK_SLOT_BYTES` within the cross-rank check's
        own exchange (which is an all_gather): one gloo round trip instead of two.
        ``outputs``: one tensor of ``size`` x the input's elements (all_gather_into_tensor)
        or one per rank. False (the check made, nothing written) when the input does not
        fit the slot or a peer sent no values."""
        nbytes = input.numel() * input.element_size()
        if nbytes > CHECK_SLOT_BYTES or input.dtype.is_complex:
            check()
            return False
        slots = check(read_view(input).contiguous().reshape(-1).view(torch.uint8))
        if slots is None:
            return False
        metrics.add("collectives_in_check")
        gathered = _gathered(slots, input)
        if len(outputs) == 1:
            write_back(outputs[0], gathered.view(outputs[0].shape))
        else:
            for o, row in zip(outputs, gathered):
                write_back(o, row.view(o.shape))
        return True

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> None:
        for outs, inp in zip(output_lists, inputs):
            flat = torch.empty((self.size * inp.numel(),), dtype=inp.dtype)
            self.gloo._allgather_base(flat, read_view(inp).contiguous().reshape(-1)).wait()
            for o, piece in zip(outs, flat.chunk(self.size)):
                write_back(o, piece.view(o.shape))

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> None:
        o = dist.GatherOptions()
        o.rootRank, o.timeout = opts.rootRank, self._timeout(opts)
        outs = [[empty_like_host(t) for t in lst] for lst in output_lists]
        self.gloo.gather(outs, [read_view(t).contiguous() for t in inputs], o).wait()
        for lst, hs in zip(output_lists, outs):
            for t, h in zip(lst, hs):
                write_back(t, h)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> None:
        o = dist.ScatterOptions()
        o.rootRank, o.timeout = opts.rootRank, self._timeout(opts)
        hs = [empty_like_host(t) for t in outputs]
        ins = [[read_view(t).contiguous() for t in lst] for lst in input_lists]
        self.gloo.scatter(hs, ins, o).wait()
        for t, h in zip(outputs, hs):
            write_back(t, h)

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> None:
        o = dist.AllToAllOptions()
        o.timeout = self._timeout(opts)
        h = empty_like_host(output)
        self.gloo.alltoall_base(h, read_view(input).contiguous(), list(out_splits), list(in_splits), o).wait()
        write_back(output, h)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> None:
        # gloo has no list all_to_all: one flat exchange with per-peer split sizes
        flat_in = torch.cat([read_view(t).reshape(-1) for t in inputs])
        flat_out = torch.empty((sum(t.numel() for t in outputs),), dtype=outputs[0].dtype)
        o = dist.AllToAllOptions()
        o.timeout = self._timeout(opts)
        self.gloo.alltoall_base(flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs], o).wait()
        for t, piece in zip(outputs, flat_out.split([t.numel() for t in outputs])):
            write_back(t, piece.view(t.shape))

    def barrier(self, opts: Any) -> None:
        o = dist.BarrierOptions()
        o.timeout = self._timeout(opts)
        self.gloo.barrier(o).wait()

    # -- point to point: posted now, completed by the work's wait (Posted) -------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Posted:
        hosts = [read_view(t).contiguous() for t in tensors]  # a view holds its device buffer: no donation meanwhile
        return Posted(self.gloo.send(hosts, dst, tag), keep=hosts)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Posted:
        hosts = [empty_like_host(t) for t in tensors]
        return Posted(self.gloo.recv(hosts, src, tag), finish=lambda: _write_back_all(tensors, hosts))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Posted:
        hosts = [empty_like_host(t) for t in tensors]
        return Posted(self.gloo.recv_anysource(hosts, tag), finish=lambda: _write_back_all(tensors, hosts))

    # -- small exchanges for the process group's own checks --------------------------------------
    def allgather_small(self, value: torch.Tensor) -> torch.Tensor:
        out = torch.empty((self.size * value.numel(),), dtype=value.dtype)
        self.gloo._allgather_base(out, value.reshape(-1)).wait()
        return out.view(self.size, *value.shape)

    def shutdown(self) -> None:
        self.worker.drain()
        self.worker.stop()
        try:
            self.gloo.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    def abort(self) -> None:
        self.worker.stop()
        try:
            self.gloo.abort()
        except Exception:  # noqa: BLE001 - best effort
            pass


def _write_back_all(tensors: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
    for t, h in zip(tensors, hosts):
        write_back(t, h)


__all__ = ["GlooHostTransport", "is_tpu"]
