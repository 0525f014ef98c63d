"""The c10d process group behind ``init_process_group("tpu")``.

A Python ``torch.distributed.ProcessGroup``: c10d has no Python trampoline for a
per-device ``Backend``, so, as c10d does for every Python group, this object *is* the
group and also receives CPU tensors (``"cpu:gloo,tpu:tpu"`` behaves like ``"tpu"``;
CPU tensors go straight to gloo). Each collective:

1. optionally checks that every rank called the same collective with matching tensors
   (``TORCHTPU_DIST_CHECK``), so a mismatch is an error naming both, not a hang;
2. runs on the transport ``TORCHTPU_COLLECTIVES`` picks: ``xla_transport`` (XLA programs
   with StableHLO collectives; the default on tpu/cuda) or ``gloo_host`` (gloo on host
   views; the default on the cpu platform), see docs/distributed.md;
3. turns transport failures (timeouts, dead peers) into ``DistributedError`` that name
   the collective, the group and the timeout.

``all_reduce`` and ``all_reduce_coalesced`` (DDP's gradient buckets) are asynchronous:
they return a ``Work`` at once, whose ``wait()`` / ``get_future()`` complete when the
result is in the tensors (``_work.py``). The other collectives complete before they
return, after the group's earlier asynchronous ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import config, metrics
from ..errors import TpuError, check_device_index
from ..runtime import pjrt, platforms
from . import _fsdp
from ._work import CHECK_SLOT_BYTES, CrossRankCheck, Pending, TpuWork, completed
from .gloo_host import GlooHostTransport

ReduceOp = dist.ReduceOp
_OP_NAMES = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
    ReduceOp.PREMUL_SUM: "premul_sum",
}
_DESC_BYTES = 480
_HEADER_BYTES = 16  # the check slot's header: crc32 of the call's description, the payload's length (-1: none)


class DistributedError(TpuError):
    """A collective failed: mismatched calls across ranks, a timeout or a dead peer."""


def _shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _shapes(ts: Sequence[torch.Tensor]) -> str:
    return ", ".join(_shape(t) for t in ts)


def _op_name(opts: Any) -> str:
    op = getattr(opts.reduceOp, "op", opts.reduceOp)
    return _OP_NAMES.get(op, str(op))


def transport_kind() -> str:
    """``TORCHTPU_COLLECTIVES``: ``xla`` or ``host``; empty picks by platform (host on cpu,
    where gloo on host views beats in-program collectives; xla on tpu/cuda, whose
    interconnect only XLA programs reach)."""
    kind = config.get("TORCHTPU_COLLECTIVES").strip().lower()
    if kind in ("xla", "host"):
        return kind
    if kind:
        raise ValueError(f"TORCHTPU_COLLECTIVES={kind!r}: expected 'xla', 'host' or empty (the platform's default)")
    return "host" if platforms.choose().name == "cpu" else "xla"


def make_transport(
    store: Any, rank: int, size: int, timeout: timedelta, global_ranks: Sequence[int] | None = None, kind: str | None = None
) -> Any:
    """The transport for one group: collectives as XLA programs (``xla_transport``) or gloo
    on host views (``gloo_host``), per ``transport_kind()``."""
    if (kind or transport_kind()) == "xla":
        from .xla_transport import XlaTransport

        return XlaTransport(store, rank, size, timeout, global_ranks if global_ranks is not None else range(size))
    return GlooHostTransport(store, rank, size, timeout)


class TpuProcessGroup(dist.ProcessGroup):
    """c10d backend "tpu": collectives on tpu tensors (and CPU tensors) for one group."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, global_ranks: Sequence[int] | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._timeout = rank, size, timeout
        self._group_name = ""
        self._group_desc = ""
        self._coalesced: list[TpuWork] | None = None
        kind = transport_kind()
        # Start the device now: DeviceMesh otherwise calls torch.tpu.set_device(LOCAL_RANK),
        # and every process drives exactly one device, tpu:0. The xla transport starts it
        # itself, as a member of the distributed runtime.
        if kind == "host":
            pjrt.get()
        _fsdp.install()  # FSDP2 frees parameter storage by resizing it: a stand-in where tpu storages cannot resize
        try:
            self._t = make_transport(store, rank, size, timeout, global_ranks, kind)
        except TpuError:
            raise
        except RuntimeError as e:
            raise DistributedError(
                f"torchtpu.distributed: rank {rank} of {size} could not connect to its peers within "
                f"{timeout.total_seconds():g}s ({e}). Check that all {size} processes started and reach "
                "MASTER_ADDR/MASTER_PORT; the limit is init_process_group(timeout=...)."
            ) from e

    # -- c10d plumbing (a Python group replaces the whole group object, so it keeps its name) --
    def getBackendName(self) -> str:
        return "tpu"

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    # c10d asks the backend of the device given to init_process_group(device_id=...) (Lightning
    # and torchtitan give one) whether it splits communicators; a Python group is its own backend
    # for every device, connected at creation, and splits nothing (new groups are made afresh).
    supports_splitting = False

    def _get_backend(self, device: torch.device) -> TpuProcessGroup:
        device = torch.device(device)
        if device.type == "tpu":
            check_device_index(device.index)
        return self

    def _label(self) -> str:
        return f"{self._group_desc or 'group'} (name {self._group_name!r})"

    @property
    def transport(self) -> Any:
        return self._t

    # -- the common path ---------------------------------------------------------------------
    def _run(
        self, name: str, desc: str | None, fn: Callable[[], Any], in_check: Callable[[CrossRankCheck], bool] | None = None
    ) -> Any:
        """Check (if enabled) that all ranks agree on ``desc``, then run ``fn`` with
        transport errors turned into messages that say what happened. ``in_check(check)``:
        the collective done within the check's own exchange, which it makes; False when it
        could not be (``fn`` then runs after it)."""
        metrics.add("collectives")
        try:
            self._t.drain()  # the group's earlier asynchronous collectives come first
            if desc is not None and config.flag("TORCHTPU_DIST_CHECK"):
                if in_check is None:
                    self._check(name, desc)
                elif in_check(self._checker(name, desc)):
                    return None
            return fn()
        except DistributedError:
            raise
        except RuntimeError as e:
            raise self._failure(name, e) from e

    def _start(self, name: str, desc: str, result: Any, start: Callable[[Any], Any], sync: Callable[[], Any]) -> TpuWork:
        """An asynchronous collective: ``start(check)`` begins it and returns what its work
        waits on, or None when it cannot run asynchronously (then ``sync`` runs it here).
        ``check`` is the cross-rank check, which the transport runs in call order."""
        check = self._checker(name, desc) if config.flag("TORCHTPU_DIST_CHECK") else None
        try:
            pending = start(check)
        except DistributedError:
            raise
        except RuntimeError as e:
            raise self._failure(name, e) from e
        if pending is None:
            self._run(name, desc, sync)
            return self._done(result)
        metrics.add("collectives")
        return self._track(TpuWork(result, [pending], lambda e: self._translate(name, e)))

    def _translate(self, name: str, e: BaseException) -> BaseException:
        """A transport error as the ``DistributedError`` that names the collective."""
        if isinstance(e, RuntimeError) and not isinstance(e, DistributedError):
            return self._failure(name, e)
        return e

    def _done(self, result: Any) -> TpuWork:
        return self._track(completed(result))

    def _track(self, work: TpuWork) -> TpuWork:
        if self._coalesced is not None:  # inside _coalescing_manager: its work waits for these
            self._coalesced.append(work)
        return work

    def _checker(self, name: str, desc: str) -> CrossRankCheck:
        """The cross-rank check of this call, for a transport to make (with a payload or not)."""
        return lambda payload=None: self._check(name, desc, payload)

    def _check(self, name: str, desc: str, payload: torch.Tensor | None = None) -> torch.Tensor | None:
        """One all_gather of a fixed-size slot per rank: a hash of ``name + desc``, the
        length of ``payload`` and the payload (:class:`CrossRankCheck`). The slot's size is
        the same for every call, so ranks calling different collectives still pair up in
        gloo (which aborts a process on mismatched sizes). On a mismatch, a second
        all_gather of the descriptions themselves, so every rank raises the same, complete
        error. Returns every rank's payload area when every rank sent a payload, else None."""
        text = f"{name}: {desc}"
        crc = zlib.crc32(text.encode())
        # numpy, not torch, for the slot's bookkeeping: a few microseconds less per collective
        slot = np.zeros(_HEADER_BYTES + CHECK_SLOT_BYTES, dtype=np.uint8)
        slot[:_HEADER_BYTES].view(np.int64)[:] = (crc, -1 if payload is None else payload.numel())
        if payload is not None:
            slot[_HEADER_BYTES : _HEADER_BYTES + payload.numel()] = payload.numpy()
        slots = self._t.allgather_small(torch.from_numpy(slot))
        headers = slots.numpy()[:, :_HEADER_BYTES].view(np.int64)
        if (headers[:, 0] == crc).all():
            # a peer whose tensor cannot travel in the check (not a whole storage) sent none
            return slots[:, _HEADER_BYTES:] if (headers[:, 1] >= 0).all() else None
        raw = text.encode()[:_DESC_BYTES].ljust(_DESC_BYTES, b"\0")
        texts = self._t.allgather_small(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        decoded = [bytes(texts[r].tolist()).rstrip(b"\0").decode(errors="replace") for r in range(self._size)]
        lines = [f"  rank {r}: {d}" for r, d in enumerate(decoded)]
        raise DistributedError(
            f"torchtpu.distributed: mismatched collective {name} on group {self._label()}: "
            "the ranks called it with different collectives or tensors:\n" + "\n".join(lines) + "\n"
            "Every rank must call the same collectives in the same order with the same shapes and dtypes "
            "(set TORCHTPU_DIST_CHECK=0 to skip this check)."
        )

    def _failure(self, name: str, e: BaseException) -> DistributedError:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        secs = self._timeout.total_seconds()
        low = msg.lower()
        if "timed out" in low or "timeout" in low:
            why = f"it timed out after {secs:g}s waiting for a peer (a rank hung, died or never called {name})"
        elif "closed" in low or "reset" in low or "broken pipe" in low or "connection" in low:
            why = "a peer process closed its connection (it died or exited)"
        else:
            why = "the transport failed"
        return DistributedError(
            f"torchtpu.distributed: {name} failed on rank {self._rank} of {self._size} "
            f"(group {self._label()}): {why}. Transport error: {msg}. "
            f"The limit is the process group's timeout, init_process_group(timeout=...) (now {secs:g}s)."
        )

    # -- reductions ----------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._start(
            "all_reduce",
            f"{_op_name(opts)} {_shapes(tensors)}",
            tensors,
            lambda check: self._t.allreduce_start(tensors, opts, check),
            lambda: self._t.allreduce(tensors, opts),
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._start(
            "all_reduce_coalesced",
            f"{_op_name(opts)} {_shapes(tensors)}",
            tensors,
            lambda check: self._t.allreduce_start(tensors, opts, check, coalesced=True),
            lambda: self._t.allreduce_coalesced(tensors, opts),
        )

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        desc = f"{_op_name(opts)} root={opts.rootRank} {_shapes(tensors)}"
        self._run("reduce", desc, lambda: self._t.reduce(tensors, opts))
        return self._done(tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        self._check_multiple("reduce_scatter_tensor", output, input)
        desc = f"{_op_name(opts)} {_shape(output)}"
        self._run("reduce_scatter_tensor", desc, lambda: self._t.reduce_scatter_tensor(output, input, opts))
        return self._done(output)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return self._done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        desc = f"{_op_name(opts)} {_shapes(outputs)}"
        self._run("reduce_scatter", desc, lambda: self._t.reduce_scatter(outputs, input_lists, opts))
        return self._done(outputs)

    # -- data movement ---------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        self._run("broadcast", f"root={opts.rootRank} {_shapes(tensors)}", lambda: self._t.broadcast(tensors, opts))
        return self._done(tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        self._check_multiple("all_gather_into_tensor", input, output)
        self._run(
            "all_gather_into_tensor",
            _shape(input),
            lambda: self._t.allgather_into_tensor(output, input, opts),
            lambda check: self._t.allgather_in_check([output], input, check),
        )
        return self._done(output)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return self._done(outputs)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        in_check = None
        if len(inputs) == 1:
            in_check = lambda check: self._t.allgather_in_check(output_lists[0], inputs[0], check)  # noqa: E731
        self._run("all_gather", _shapes(inputs), lambda: self._t.allgather(output_lists, inputs, opts), in_check)
        return self._done(output_lists)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for outs, i in zip(output_lists, inputs):
            self._run("all_gather_coalesced", _shape(i), lambda outs=outs, i=i: self._t.allgather([outs], [i], opts))
        return self._done(output_lists)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        self._run("gather", f"root={opts.rootRank} {_shapes(inputs)}", lambda: self._t.gather(output_lists, inputs, opts))
        return self._done(output_lists)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        self._run("scatter", f"root={opts.rootRank} {_shapes(outputs)}", lambda: self._t.scatter(outputs, input_lists, opts))
        return self._done(outputs)

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any = None
    ) -> Any:
        # uneven splits legitimately differ per rank: only the dtype and trailing dims must agree
        desc = f"{str(input.dtype).removeprefix('torch.')}{list(input.shape[1:])}" if (out_splits or in_splits) else _shape(input)
        self._run("all_to_all_single", desc, lambda: self._t.alltoall_base(output, input, out_splits, in_splits, opts))
        return self._done(output)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        desc = f"{len(inputs)} tensors of {str(inputs[0].dtype).removeprefix('torch.')}" if inputs else "0 tensors"
        self._run("all_to_all", desc, lambda: self._t.alltoall(outputs, inputs, opts))
        return self._done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BarrierOptions()
        self._run("barrier", "", lambda: self._t.barrier(opts))
        return self._done(None)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self._run("monitored_barrier", None, lambda: self._t.gloo.monitored_barrier(timeout, wait_all_ranks))

    # -- point to point (no cross-rank check: the peers' calls are send and recv) ----------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p("send", tensors, lambda: self._t.send(tensors, dst, tag), dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p("recv", tensors, lambda: self._t.recv(tensors, src, tag), src)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._p2p("recv", tensors, lambda: self._t.recv_anysource(tensors, tag), -1)

    def _p2p(self, name: str, tensors: list[torch.Tensor], post: Callable[[], Pending], peer: int) -> TpuWork:
        """A send or recv: the transport posts it and returns what its work waits on, as
        gloo's ``isend``/``irecv`` do, so that two ranks can each send to the other before
        either waits (a pipeline schedule's ``batch_isend_irecv``)."""
        work = self._track(TpuWork(tensors, [self._run(name, None, post)], lambda e: self._translate(name, e)))
        work.source_rank_value = peer  # -1 (recv from any rank): the work asks its transfer after the wait
        return work

    # -- the single-tensor names torch.distributed calls today -----------------------------------
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any = None
    ) -> Any:
        return self.alltoall_base(output, input, out_splits, in_splits, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # A coalescing block's work waits for the works of the collectives inside it.
    def _start_coalescing(self, device: Any) -> None:
        self._coalesced = []

    def _end_coalescing(self, device: Any) -> Any:
        works, self._coalesced = self._coalesced or [], None
        return TpuWork(None, [p for w in works for p in w._pending], lambda e: self._translate("coalesced collectives", e))

    # -- lifetime ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self._t.shutdown()

    def abort(self) -> None:
        self._t.abort()

    # -- argument checks that need no peer ---------------------------------------------------------
    def _check_multiple(self, name: str, small: torch.Tensor, big: torch.Tensor) -> None:
        if big.numel() != small.numel() * self._size or big.dtype != small.dtype:
            raise DistributedError(
                f"torchtpu.distributed: {name} needs the larger tensor to hold group size ({self._size}) x the "
                f"smaller one, with the same dtype; got {_shape(small)} and {_shape(big)}"
            )
