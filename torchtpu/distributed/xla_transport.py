"""The XLA transport: every collective runs as a small XLA program on the device.

On a TPU (and the CUDA plugin) the interconnect is only reachable from inside XLA
programs, so a collective is a cached program with the matching StableHLO collective
over the group's replica groups (``xla_programs.py``); the PjRT clients of all processes
form one distributed runtime, joined when the first "tpu" group is created
(``runtime/distributed.py``). On the cpu platform the same programs run over XLA's gloo
TCP collectives (``TORCHTPU_COLLECTIVES=xla``).

The transport also keeps a gloo group (the host transport) for what is not a device
collective: the process group's cross-rank check, CPU tensors given to the group
(``"cpu:gloo,tpu:tpu"``), ``monitored_barrier`` and the split sizes of an uneven all_to_all.

``allreduce_start`` (every ``all_reduce``, DDP's buckets) enqueues the program and returns:
the device runs collectives in launch order, and the work waits on the result buffers.

Under DeferAndFuse ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast`` and an even ``all_to_all_single`` are recorded into the thread's pending graph
instead (``deferred.record_collective``): each runs in one program with the compute around
it, and its work is complete at once, as later reads of the tensors follow it in that program.
Every other collective runs the graph first. So does every host exchange (the cross-rank
check, CPU tensors, split sizes): a rank blocked on the host while its graph still holds
a collective could hold back a peer that waits on the device for that collective.
``barrier`` runs the graph and waits by design: it is a rendezvous of the hosts (NCCL's
returns only once every rank reached it), which a recorded program cannot be. ``send``
is not recorded either: a recorded send would only start when the sender's graph next
runs, while a peer may already wait for it; NCCL's send starts at once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..eager import deferred
from ..eager.minimal import covers_storage
from ..errors import TpuRuntimeError
from ..runtime import distributed as rdist
from ..stablehlo.types import numpy_dtype
from ..tensor.storage import Cell, cell_of, new_tensor
from . import xla_programs as P
from ._host import is_tpu
from ._work import Job, Launched, Pending, Worker
from .gloo_host import GlooHostTransport, attempt_prefix

ReduceOp = dist.ReduceOp
Shape = tuple[int, ...]
_OPS = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
}
_programs: dict[tuple, Any] = {}  # (collective, geometry, global ranks) -> executable


def _op(opts: Any) -> str:
    op = getattr(opts.reduceOp, "op", opts.reduceOp)
    if op == ReduceOp.PREMUL_SUM:
        raise NotImplementedError(
            "torchtpu.distributed: ReduceOp.PREMUL_SUM is not supported; scale the tensor and use ReduceOp.SUM"
        )
    return _OPS[op]


# -- tensors <-> device buffers --------------------------------------------------------------


def _arg(t: torch.Tensor) -> tuple[Any, Shape]:
    """The device buffer holding ``t``'s value, and its shape (a copy for a view)."""
    t = t.detach()
    if not covers_storage(t):
        # copied into a storage of its own size: a clone would keep a bucketed tensor's
        # spare rows (eager/buckets.py), and the program would exchange them too
        exact = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        exact.copy_(t)
        t = exact
    cell = cell_of(t)
    buf = cell.buf  # runs pending DeferAndFuse work that produces it
    if buf is None:  # never written: reads as zeros
        buf = rdist.zeros(cell.shape, numpy_dtype(cell.dtype))
    return buf, cell.shape


def _out_shape(t: torch.Tensor) -> Shape:
    """The shape a program should give the result that goes into ``t``."""
    return cell_of(t).shape if covers_storage(t) else tuple(t.shape)


def _store(t: torch.Tensor, buf: Any, shape: Shape) -> None:
    """Put a program's result into ``t``: swap its storage's buffer when ``t`` is the whole
    storage (every alias sees it), else copy into the view."""
    if covers_storage(t) and cell_of(t).shape == shape:
        cell_of(t).set(buf)
        return
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    tmp = new_tensor(Cell(t.numel(), t.dtype, buf, shape), shape, strides, 0, t.dtype)
    with torch.no_grad():
        t.copy_(tmp.view(t.shape))


def _flush() -> None:
    """Pending DeferAndFuse work runs before a collective that is not recorded (its buffers
    are read directly) and before a host exchange (the module doc): this thread's graph
    and every graph holding a collective, so that each rank runs the same ones first."""
    deferred.flush_collectives("collective")


class _Transfer(NamedTuple):
    """One send or recv of a device tensor (group ranks ``src`` -> ``dst``), with the
    program operand taken when it was posted: a send's buffer (its value then), a recv's
    current buffer (the program needs an operand of the shape on both ends)."""

    src: int
    dst: int
    tensor: torch.Tensor
    operand: tuple[Any, Shape]
    sending: bool


class XlaTransport:
    """Collectives for one group as XLA programs over the group's devices."""

    name = "xla"

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, global_ranks: Sequence[int]) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.ranks = tuple(global_ranks)
        # Created first: its rendezvous proves every rank is there (or fails with the group's timeout).
        self.host = GlooHostTransport(store, rank, size, timeout)
        # one thread per direction (source, destination) that runs its sends and recvs in order
        self._lanes: dict[tuple[int, int], Worker] = {}
        world = dist.get_world_size() if dist.is_initialized() else size
        if world > 1 and rdist.cluster() is None:
            if size != world:
                raise TpuRuntimeError(
                    "TORCHTPU_COLLECTIVES=xla: the first 'tpu' group must span every process (it starts the XLA "
                    f"distributed runtime); this group has {size} of {world} ranks. Use the tpu backend for the "
                    "default group: init_process_group('tpu')."
                )
            prefixed = dist.PrefixStore(attempt_prefix("torchtpu_xla"), store)
            rdist.join(prefixed, rank, size, timeout.total_seconds(), _store_host(store))

    @property
    def gloo(self) -> Any:
        return self.host.gloo

    def drain(self) -> None:
        """Nothing to wait for: asynchronous collectives are programs already enqueued on the
        device, in order; the host exchanges all run on the caller's thread (sends and recvs
        run on their own lanes, as NCCL's do on their own streams)."""
        return None

    # -- the common path -------------------------------------------------------------------
    def _run(self, key: tuple, build: Callable[[], str], args: Sequence[Any], what: str, wait: bool = True) -> list[Any]:
        key = (*key, self.ranks)
        exe = _programs.get(key)
        if exe is None:
            exe = _programs[key] = rdist.compile_for_group(build(), self.ranks, what)
        return rdist.run_for_group(exe, args) if wait else rdist.launch_for_group(exe, args)

    def _on_host(self, *groups: Sequence[torch.Tensor]) -> bool:
        """CPU tensors go to the host transport (``"cpu:gloo,tpu:tpu"``); pending
        DeferAndFuse work runs first (the module doc)."""
        if all(is_tpu(t) for g in groups for t in g):
            return False
        _flush()
        return True

    def _reduce(
        self, tensors: list[torch.Tensor], op: str, write: bool = True, wait: bool = True, record: bool = True
    ) -> list[Any]:
        """One program all-reduces every tensor of one dtype (coalesced); the output buffers
        (not yet ready unless ``wait``), none when the all_reduce was recorded (``record``:
        it may be, on every rank alike)."""
        if record and write and self._record_reduce(tensors, op):
            return []
        _flush()
        launched: list[Any] = []
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            P.check_reduce(op, t.dtype)
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype, group in by_dtype.items():
            args = [_arg(t) for t in group]
            shapes = tuple(s for _, s in args)
            outs = self._run(
                ("all_reduce", shapes, dtype, op),
                lambda shapes=shapes, dtype=dtype: P.all_reduce(shapes, dtype, op, self.size),
                [a for a, _ in args],
                "all_reduce",
                wait,
            )
            launched += outs
            if write:
                for t, buf, s in zip(group, outs, shapes):
                    _store(t, buf, s)
        return launched

    def _record(self, key: tuple, reads: list[torch.Tensor], writes: list[torch.Tensor], lower: Callable) -> bool:
        """Under DeferAndFuse, record a collective that reads the storages of ``reads`` and
        rewrites those of ``writes`` (``lower``: their flat values, read -> written) into the
        pending graph. False where it runs as its own program: not deferring, a tensor that
        is a view into a larger storage, two tensors of one storage."""
        if not deferred.deferring() or not all(covers_storage(t) for t in (*reads, *writes)):
            return False
        read_cells, write_cells = [cell_of(t) for t in reads], [cell_of(t) for t in writes]
        distinct = {id(c) for c in read_cells}
        if len(distinct) < len(reads) or (writes is not reads and (distinct & {id(c) for c in write_cells})):
            return False
        if len({id(c) for c in write_cells}) < len(writes):
            return False
        shapes = tuple((c.numel, c.dtype) for c in (*read_cells, *write_cells))
        c = deferred.Collective((*key, shapes, self.ranks), self.ranks, len(reads), lower)
        deferred.record_collective(c, read_cells, write_cells)
        return True

    def _record_reduce(self, tensors: list[torch.Tensor], op: str) -> bool:
        for t in tensors:
            P.check_reduce(op, t.dtype)
        size = self.size
        return self._record(("all_reduce", op), tensors, tensors, lambda b, xs: P.all_reduce_values(b, xs, op, size))

    # -- reductions ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(tensors):
            return self.host.allreduce(tensors, opts)
        for t in tensors:  # several tensors of the list are separate collectives, as in c10d
            self._reduce([t], _op(opts))

    def allreduce_start(
        self, tensors: list[torch.Tensor], opts: Any, check: Callable[[], None] | None, coalesced: bool = False
    ) -> Launched | None:
        """Enqueue the all_reduce program(s) and return at once: the tensors already hold
        the (not yet ready) result buffers, and later device work on them runs after the
        collective. None for CPU tensors (the caller runs them synchronously)."""
        if self._on_host(tensors):
            return None
        if check is not None:  # a host exchange, on this thread like every other one
            check()
        op = _op(opts)
        outs: list[Any] = []
        for group in [tensors] if coalesced else [[t] for t in tensors]:
            outs += self._reduce(group, op, wait=False)
        return Launched(lambda: rdist.wait_for_group(outs), lambda: rdist.ready(outs), "all_reduce")

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(tensors):
            return self.host.allreduce_coalesced(tensors, opts)
        self._reduce(tensors, _op(opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(tensors):
            return self.host.reduce(tensors, opts)
        op, root = _op(opts), opts.rootRank
        for t in tensors:
            if not self._record_reduce_to(t, op, root):
                self._reduce([t], op, write=self.rank == root, record=False)

    def _record_reduce_to(self, t: torch.Tensor, op: str, root: int) -> bool:
        """Record ``reduce``: every rank runs the all_reduce; the root writes its tensor,
        the others a scratch storage the graph keeps as a result until it runs (a
        collective whose value nobody takes would be deleted by XLA, and the peers hang)."""
        P.check_reduce(op, t.dtype)
        size = self.size
        reads = [t]
        writes = reads if self.rank == root else [torch.empty_like(t, memory_format=torch.contiguous_format)]
        return self._record(("reduce", op), reads, writes, lambda b, xs: P.all_reduce_values(b, xs, op, size))

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> None:
        if self._on_host([output, input]):
            return self.host.reduce_scatter_tensor(output, input, opts)
        self._reduce_scatter(output, [input], _op(opts))

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> None:
        if self._on_host(outputs, *input_lists):
            return self.host.reduce_scatter(outputs, input_lists, opts)
        for out, ins in zip(outputs, input_lists):
            self._reduce_scatter(out, ins, _op(opts))

    def _reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], op: str) -> None:
        P.check_reduce(op, output.dtype)
        size = self.size
        if len(inputs) == 1 and self._record(
            ("reduce_scatter", op), inputs, [output], lambda b, xs: [P.reduce_scatter_value(b, xs[0], op, size)]
        ):
            return
        _flush()
        args = [_arg(t) for t in inputs]
        shapes, out = tuple(s for _, s in args), _out_shape(output)
        dtype = output.dtype
        (buf,) = self._run(
            ("reduce_scatter", shapes, dtype, op, out),
            lambda: P.reduce_scatter(shapes, dtype, op, self.size, out),
            [a for a, _ in args],
            "reduce_scatter",
        )
        _store(output, buf, out)

    # -- data movement ------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(tensors):
            return self.host.broadcast(tensors, opts)
        root, size = opts.rootRank, self.size
        if self._record(("broadcast", root), tensors, tensors, lambda b, xs: [P.broadcast_value(b, x, root, size) for x in xs]):
            return
        _flush()
        for t in tensors:
            buf, shape = _arg(t)
            (out,) = self._run(
                ("broadcast", shape, t.dtype, root),
                lambda shape=shape, dtype=t.dtype: P.broadcast([shape], dtype, root, self.size),
                [buf],
                "broadcast",
            )
            if self.rank != root:
                _store(t, out, shape)

    def _gather_into(self, outputs: list[torch.Tensor], input: torch.Tensor, what: str, keep: bool = True) -> None:
        _flush()
        buf, shape = _arg(input)
        dtype = input.dtype
        outs = tuple(_out_shape(o) for o in outputs) if keep else (tuple(input.shape),) * self.size
        results = self._run(("all_gather", shape, dtype, outs), lambda: P.all_gather(shape, dtype, self.size, outs), [buf], what)
        if keep:
            for o, r, s in zip(outputs, results, outs):
                _store(o, r, s)

    def allgather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> None:
        if self._on_host([output, input]):
            return self.host.allgather_into_tensor(output, input, opts)
        size = self.size
        if self._record(("all_gather",), [input], [output], lambda b, xs: [P.all_gather_value(b, xs[0], size)]):
            return
        self._gather_into([output], input, "all_gather_into_tensor")

    def allgather_in_check(self, outputs: list[torch.Tensor], input: torch.Tensor, check: Any) -> bool:
        """The host transport carries a small all_gather in the cross-rank check; here the
        all_gather is a device program (or recorded into the pending graph): only the check."""
        check()
        return False

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(inputs, *output_lists):
            return self.host.allgather(output_lists, inputs, opts)
        for outs, inp in zip(output_lists, inputs):
            if not self._record_gather(outs, inp, ("all_gather_list",)):
                self._gather_into(outs, inp, "all_gather")

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(inputs, *output_lists):
            return self.host.gather(output_lists, inputs, opts)
        root = opts.rootRank
        for i, inp in enumerate(inputs):  # the same program on every rank; only the root keeps the result
            outs = output_lists[i] if self.rank == root else []
            if not self._record_gather(outs, inp, ("gather", root)):
                self._gather_into(outs, inp, "gather", keep=self.rank == root)

    def _record_gather(self, outputs: list[torch.Tensor], input: torch.Tensor, key: tuple) -> bool:
        """Record an all_gather into the tensors ``outputs`` (one per rank); none: a rank
        other than gather's root, which writes a scratch result the graph keeps (an unused
        collective would be deleted by XLA, and the peers would hang)."""
        size, n = self.size, input.numel()
        if any(o.numel() != n or o.dtype != input.dtype for o in outputs):
            return False  # the direct path raises PyTorch's error
        if outputs:
            return self._record(key, [input], outputs, lambda b, xs: P.all_gather_values(b, xs[0], size, n))
        scratch = [torch.empty(size * n, dtype=input.dtype, device=input.device)]
        return self._record(key, [input], scratch, lambda b, xs: [P.all_gather_value(b, xs[0], size)])

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> None:
        if self._on_host(outputs, *input_lists):
            return self.host.scatter(outputs, input_lists, opts)
        root = opts.rootRank
        if len(outputs) == 1 and self._record_scatter(outputs[0], input_lists[0] if self.rank == root else [], root):
            return
        _flush()
        for i, out in enumerate(outputs):
            n, dtype, oshape = out.numel(), out.dtype, _out_shape(out)
            if self.rank == root:
                flat = torch.cat([t.reshape(-1) for t in input_lists[i]])
                buf, shape = _arg(flat)
            else:
                shape = (self.size * n,)
                buf = rdist.zeros(shape, numpy_dtype(dtype))
            (res,) = self._run(
                ("scatter", shape, dtype, root, oshape),
                lambda shape=shape, dtype=dtype, oshape=oshape: P.scatter(shape, dtype, root, self.size, oshape),
                [buf],
                "scatter",
            )
            _store(out, res, oshape)

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> None:
        if self._on_host([output, input]):
            return self.host.alltoall_base(output, input, out_splits, in_splits, opts)
        if not in_splits and not out_splits:  # even by definition on every rank: no size exchange
            size = self.size
            if input.numel() % size == 0 and self._record(
                ("all_to_all",), [input], [output], lambda b, xs: [P.all_to_all_value(b, xs[0], size)]
            ):
                return None
            n = input.numel() // self.size
            return self._exchange([output], [input], [n] * self.size, [n] * self.size, "all_to_all_single", even=True)
        row = math.prod(input.shape[1:])
        ins, outs = [s * row for s in in_splits], [s * row for s in out_splits]
        self._exchange([output], [input], ins, outs, "all_to_all_single")

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> None:
        if self._on_host(outputs, inputs):
            return self.host.alltoall(outputs, inputs, opts)
        self._exchange(outputs, inputs, [t.numel() for t in inputs], [t.numel() for t in outputs], "all_to_all")

    def _record_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], root: int) -> bool:
        """Record ``scatter``: the root's ``inputs`` (none on the other ranks) go one to each rank."""
        size, n, dtype = self.size, output.numel(), output.dtype
        if inputs and (len(inputs) != size or any(t.numel() != n or t.dtype != dtype for t in inputs)):
            return False  # the direct path raises PyTorch's error
        return self._record(("scatter", root), inputs, [output], lambda b, xs: [P.scatter_value(b, xs, n, dtype, root, size)])

    def _exchange(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        ins: list[int],
        outs: list[int],
        what: str,
        even: bool = False,
    ) -> None:
        _flush()
        # every rank must run the same padded size: the largest split anywhere in the group
        width = ins[0] if even else self._group_max(max(ins + outs))
        if width == 0:
            return
        args = [_arg(t) for t in inputs]
        shapes, oshapes = tuple(s for _, s in args), tuple(_out_shape(o) for o in outputs)
        dtype = inputs[0].dtype
        key = ("all_to_all", shapes, dtype, tuple(ins), tuple(outs), width, oshapes)
        res = self._run(
            key, lambda: P.all_to_all(shapes, dtype, self.size, ins, outs, width, oshapes), [a for a, _ in args], what
        )
        for o, r, s in zip(outputs, res, oshapes):
            _store(o, r, s)

    def _group_max(self, value: int) -> int:
        """The largest ``value`` over the group (a small host exchange: split sizes are metadata)."""
        return int(self.host.allgather_small(torch.tensor([value], dtype=torch.int64)).max())

    def barrier(self, opts: Any) -> None:
        token = torch.zeros(1, dtype=torch.int32, device="tpu")
        self._reduce([token], "sum", write=False, record=False)

    # -- point to point ------------------------------------------------------------------------
    # A send and its recv are one two-rank program, which completes only when both ranks run
    # it. Run on the caller's thread, a send would wait for its peer's recv, and two ranks
    # each sending to the other first (a pipeline schedule's batch_isend_irecv), or a ring
    # of stages each waiting on its successor, would wait forever. So sends and recvs are
    # posted, as NCCL posts them on a stream per peer: each direction (source, destination)
    # has a lane, a thread that runs its transfers in posting order -- the order in which
    # both ends post a direction's messages -- and the work waits for the transfer's job.
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Pending:
        if self._on_host(tensors):
            return self.host.send(tensors, dst, tag)
        return self._post([_Transfer(self.rank, dst, t, _arg(t), True) for t in tensors])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Pending:
        if self._on_host(tensors):
            return self.host.recv(tensors, src, tag)
        return self._post([_Transfer(src, self.rank, t, _arg(t), False) for t in tensors])

    def _post(self, transfers: list[_Transfer]) -> Job:
        """One job on the lane of the transfers' direction (a call's tensors share it)."""
        first = transfers[0]
        lane = self._lanes.get((first.src, first.dst))
        if lane is None:
            lane = self._lanes[(first.src, first.dst)] = Worker(f"torchtpu-p2p-{first.src}-{first.dst}")
        return lane.submit(lambda: [self._pair(tr) for tr in transfers])

    def _pair(self, tr: _Transfer) -> None:
        buf, shape = tr.operand
        dtype = tr.tensor.dtype
        pair = (self.ranks[tr.src], self.ranks[tr.dst])
        key = ("send_recv", shape, dtype, pair)
        exe = _programs.get(key)
        if exe is None:
            exe = _programs[key] = rdist.compile_for_group(P.send_recv(shape, dtype), pair, "send/recv")
        (out,) = rdist.run_for_group(exe, [buf])
        if not tr.sending:
            _store(tr.tensor, out, shape)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        if self._on_host(tensors):
            return self.host.recv_anysource(tensors, tag)
        raise NotImplementedError(
            "torchtpu.distributed: recv without src is not supported by the xla transport (a device program needs "
            "both ends); pass src=, or set TORCHTPU_COLLECTIVES=host"
        )

    # -- the process group's own checks, lifetime -------------------------------------------------
    def allgather_small(self, value: torch.Tensor) -> torch.Tensor:
        _flush()  # a host exchange (the module doc)
        return self.host.allgather_small(value)

    def shutdown(self) -> None:
        self._stop_lanes()
        self.host.shutdown()

    def abort(self) -> None:
        self._stop_lanes()
        self.host.abort()

    def _stop_lanes(self) -> None:
        """A transfer whose peer never came stays behind (its lane is a daemon thread)."""
        for lane in self._lanes.values():
            lane.stop()


def _store_host(store: Any) -> str:
    """The host of the rendezvous store (the address every rank reaches)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", "") or os.environ.get("MASTER_ADDR", "") or "127.0.0.1"
    return "127.0.0.1" if host in ("localhost", "0.0.0.0", "") else host
