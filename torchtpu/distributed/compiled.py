"""Process groups of the functional collectives in a torch.compile graph, as plain data.

A compiled graph's ``_c10d_functional.*`` ops name their process group (``group_name``).
The lowering needs, per name, the partition of the program's replicas into that group's
blocks (``lowering/collectives.py: ReplicaLayout``); this module finds it with c10d:

- every collective of the graph on one group (a 1-D mesh, plain tensor parallelism): the
  program spans that group's global ranks, replica ``i`` = group rank ``i``; no exchange;
- collectives on several groups (a 2-D mesh: tensor parallelism inside data parallelism):
  the program spans every rank of the world, replica = global rank, and each group's
  partition is learnt by exchanging each rank's own group ranks (a rank knows only its own
  group) through the default group's c10d store: no tensors, since the backend runs under
  AOTAutograd's fake-tensor mode. Compiles happen in lockstep on every rank (Dynamo compiles
  the same frames in the same order), so the n-th exchange of every rank is the same one.

Groups whose transport is not ``xla`` (the host transport, the cpu default; a gloo group)
cannot run inside an XLA program: :func:`replica_layout` returns None and the caller runs
the graph op by op, with its collectives through the process group.

:class:`InGraphFSDP` puts FSDP2's all-gathers and reduce-scatters into such a graph (its own
hooks cannot be traced). This module is imported only when compiling (it imports Dynamo).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..errors import TpuError
from ..lowering.collectives import ReplicaLayout
from .gloo_host import attempt_prefix

# functional collectives, and DTensor's own (shard_dim_alltoall): ops that name a group
_NAMESPACES = ("_c10d_functional", "_dtensor")


def group_names(gm: torch.fx.GraphModule) -> list[str]:
    """The process-group names of ``gm``'s functional collectives, in order of first use."""
    names: list[str] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target.namespace not in _NAMESPACES or node.target._schema.name.endswith("wait_tensor"):
            continue
        if "group_name" not in (a.name for a in node.target._schema.arguments):
            continue
        name = _name_arg(node)
        if name not in names:
            names.append(name)
    return names


def _name_arg(node: torch.fx.Node) -> str:
    value = _arg(node, "group_name")
    return value if isinstance(value, str) else value.group_name


def _arg(node: torch.fx.Node, name: str) -> Any:
    """Argument ``name`` of an op node, given by position or by keyword."""
    schema = node.target._schema  # type: ignore[union-attr]
    index = [a.name for a in schema.arguments].index(name)
    return node.kwargs.get(name, node.args[index] if index < len(node.args) else None)


def _group(name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def transport_of(name: str) -> str:
    """``"xla"``, ``"host"``, or the c10d backend name of a group that is not a tpu group."""
    pg = _group(name)
    transport = getattr(pg, "transport", None)
    return transport.name if transport is not None else pg.name()


def not_in_program(names: Iterable[str]) -> list[tuple[str, str]]:
    """``(group name, transport)`` of each group whose collectives cannot go into an XLA program."""
    return [(n, t) for n in names if (t := transport_of(n)) != "xla"]


def replica_layout(names: list[str], what: str) -> ReplicaLayout:
    """The replicas a program with collectives on groups ``names`` spans, and each group's
    partition of them (see the module doc). Raises for a layout XLA cannot express."""
    from torch.distributed.distributed_c10d import get_process_group_ranks

    mine = [tuple(get_process_group_ranks(_group(n))) for n in names]
    if len(set(mine)) == 1:  # one group: the program spans it
        return ReplicaLayout(mine[0], {n: (tuple(range(len(mine[0]))),) for n in names})
    world = dist.get_world_size()
    everyone = _exchange([list(m) for m in mine], world)
    groups = {n: _partition(n, [everyone[r][k] for r in range(world)], world, what) for k, n in enumerate(names)}
    return ReplicaLayout(tuple(range(world)), groups)


_exchanges = itertools.count()


def _exchange(mine: list[list[int]], world: int) -> list[list[tuple[int, ...]]]:
    """Every rank's ``mine``, by rank, through the default group's store."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = dist.PrefixStore(f"{attempt_prefix('torchtpu_compiled_groups')}/{next(_exchanges)}", _get_default_store())
    store.set(str(dist.get_rank()), json.dumps(mine))
    return [[tuple(g) for g in json.loads(store.get(str(r)))] for r in range(world)]


_A2A = torch.ops._c10d_functional.all_to_all_single.default
_split_exchanges: dict[str, Iterator[int]] = {}  # group name -> its next exchange's number


def split_ranges(gm: torch.fx.GraphModule, what: str) -> dict[str, tuple[int, int]]:
    """Per group of ``gm``'s ``all_to_all_single`` nodes, the smallest and largest split
    (rows) of any rank of the group: what makes every rank's exchange the same padded
    shape when splits are uneven. Each rank knows only its own splits, so the group's
    ranks exchange theirs through the store while their graphs compile (every rank of a
    group compiles the same graphs in the same order, as its collectives run in order)."""
    mine: dict[str, list[int]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _A2A:
            splits = [*_arg(node, "output_split_sizes"), *_arg(node, "input_split_sizes")]
            if splits and all(isinstance(s, int) for s in splits):  # the rule explains the rest
                mine.setdefault(_name_arg(node), []).extend(splits)
    return {name: _group_range(name, min(splits), max(splits), what) for name, splits in mine.items()}


def _group_range(name: str, low: int, high: int, what: str) -> tuple[int, int]:
    """(smallest ``low``, largest ``high``) over the ranks of group ``name``."""
    from torch.distributed.distributed_c10d import _get_default_store, get_process_group_ranks

    n = next(_split_exchanges.setdefault(name, itertools.count()))
    store = dist.PrefixStore(f"{attempt_prefix('torchtpu_compiled_splits')}/{name}/{n}", _get_default_store())
    store.set(str(dist.get_rank()), json.dumps([low, high]))
    ranges = []
    for r in get_process_group_ranks(_group(name)):
        try:
            ranges.append(json.loads(store.get(str(r))))
        except dist.DistStoreError as e:
            raise TpuError(
                f"torchtpu: {what} has an all_to_all_single on group {name!r}, and rank {r} of the group did not "
                "compile its counterpart within the store's timeout: every rank of a group must compile the same "
                f"graphs in the same order ({e})"
            ) from e
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def _partition(name: str, blocks: list[tuple[int, ...]], world: int, what: str) -> tuple[tuple[int, ...], ...]:
    """Every rank's block of group ``name``: a partition of the world into equal blocks."""
    unique = sorted(set(blocks))
    members = [r for b in unique for r in b]
    if sorted(members) != list(range(world)) or len({len(b) for b in unique}) != 1:
        raise TpuError(
            f"torchtpu: {what} has collectives on several process groups, and group {name!r} does not split the "
            f"{world} ranks into equal disjoint groups (each rank's group: {blocks}). A compiled program with "
            "collectives on several groups must span every rank (DeviceMesh dimensions do); run the other "
            "collectives outside the compiled function (torch._dynamo.disable)."
        )
    return tuple(unique)


# -- FSDP2 inside one torch.compile program ------------------------------------------------------
# PyTorch 2.13 wraps every FSDP2 hook in torch._dynamo.disable (traceable FSDP2 was removed
# upstream, pytorch/pytorch#174863), so a compiled forward breaks at each FSDP module and the
# hooks' all-gathers and reduce-scatters run eagerly through the process group. InGraphFSDP
# keeps fully_shard's sharding (its DTensor parameters, optimizer state and
# checkpoints) but does its communication in the graph: the parameters are all-gathered by
# DTensor's functional collectives inside the compiled function, and autograd turns each
# all-gather into the reduce-scatter of its gradient, as JAX (and SimpleFSDP) do.


class InGraphFSDP:
    """A model with fully_shard applied, driven from a torch.compile function with its
    communication in the graph::

        fsdp = InGraphFSDP(model)

        @torch.compile(backend="tpu", fullgraph=True)
        def graph(x):
            return torch.func.functional_call(model, fsdp.unsharded_parameters(), (x,))

        with fsdp.hooks_off():
            out = graph(x)

    Each parameter is all-gathered in its MixedPrecisionPolicy's ``param_dtype`` and its
    gradient reduce-scattered (``avg``, FSDP2's default) in its ``reduce_dtype``, into the
    sharded parameter's own dtype, as FSDP2's hooks would. Not applied: the policy's
    ``cast_forward_inputs`` and ``output_dtype`` (cast the inputs yourself), and FSDP2's
    prefetching and resharding settings (XLA schedules the program and its memory).
    HSDP (``fully_shard(mesh=init_device_mesh(..., (replicas, shards)))``) and FSDP over
    tensor parallelism (``parallelize_module`` on ``mesh["tp"]``, then ``fully_shard`` on
    ``mesh["dp"]``) work the same way."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._states = _fsdp_states(model)
        dtypes = {id(fp.sharded_param): _mp_dtypes(state._mp_policy) for state in self._states for fp in _params_of(state)}
        self._plan = [
            _Unshard(name, p, *dtypes.get(id(p), (None, None)), *_tp_part(name, p)) for name, p in model.named_parameters()
        ]

    @torch._dynamo.dont_skip_tracing  # torchtpu's files are skipped by Dynamo; this is traced into the graph
    def unsharded_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter all-gathered, as plain tensors for ``torch.func.functional_call``;
        call it inside the compiled function. Forward: one ``all_gather_into_tensor`` per
        parameter; backward: its gradient's ``reduce_scatter_tensor``."""
        from torch.distributed.tensor import DTensor, Partial, Replicate

        full = {}
        for u in self._plan:
            if u.tp_mesh is not None:
                # FSDP + tensor parallelism: gathered over the data-parallel dimension only, a
                # tensor-parallel DTensor as the module expects; its gradient is reduce-scattered
                # over the data-parallel ranks (autograd through to_local and from_local)
                gathered = u.param.redistribute(
                    placements=[Replicate(), u.tp_placement], forward_dtype=u.forward_dtype, backward_dtype=u.backward_dtype
                )
                local = gathered.to_local(grad_placements=[Partial("avg"), u.tp_placement])
                full[u.name] = DTensor.from_local(local, u.tp_mesh, [u.tp_placement], run_check=False)
                continue
            # FSDP on a 1-D mesh, HSDP on a (replicate, shard) one: gathered on every mesh
            # dimension; the gradient, partial on each, is reduce-scattered over the shards
            # and (HSDP) all-reduced across the replicas: the mean over every rank, as FSDP2's
            ndim = u.param.device_mesh.ndim
            gathered = u.param.redistribute(
                placements=[Replicate()] * ndim, forward_dtype=u.forward_dtype, backward_dtype=u.backward_dtype
            )
            full[u.name] = gathered.to_local(grad_placements=[Partial("avg")] * ndim)
        return full

    @contextlib.contextmanager
    def hooks_off(self) -> Iterator[None]:
        """Run the model without FSDP2's forward hooks (their eager all-gathers and
        reduce-scatters are in the graph instead); restored on exit. The hook dicts are
        edited in place and refilled in order, so Dynamo's guards on them see the same
        objects every call."""
        saved: list[tuple[dict, list]] = []
        for module in self.model.modules():
            for hooks in (module._forward_pre_hooks, module._forward_hooks):
                items = list(hooks.items())
                if any(_is_fsdp_hook(h, self._states) for _, h in items):
                    saved.append((hooks, items))
                    for key, h in items:
                        if _is_fsdp_hook(h, self._states):
                            del hooks[key]
        try:
            yield
        finally:
            for hooks, items in saved:
                hooks.clear()
                hooks.update(items)


def _fsdp_states(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
    if not states:
        raise ValueError("torchtpu: InGraphFSDP needs a model with fully_shard applied (no FSDPModule found in it)")
    return states


def _params_of(state: Any) -> list[Any]:
    return [fp for group in state._fsdp_param_groups for fp in group.fsdp_params]


def _mp_dtypes(mp: Any) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(all-gather dtype, reduce-scatter dtype) of a MixedPrecisionPolicy: as FSDP2, the
    gradient is reduced in ``param_dtype`` when ``reduce_dtype`` is not given."""
    return mp.param_dtype, mp.reduce_dtype or mp.param_dtype


class _Unshard(NamedTuple):
    """How ``unsharded_parameters`` gathers one parameter."""

    name: str
    param: Any  # the sharded DTensor parameter
    forward_dtype: torch.dtype | None  # MixedPrecisionPolicy's param_dtype
    backward_dtype: torch.dtype | None  # and its reduce dtype
    tp_mesh: Any  # FSDP + tensor parallelism: the tensor-parallel mesh dimension, else None
    tp_placement: Any  # and the parameter's placement on it


def _tp_part(name: str, p: torch.Tensor) -> tuple[Any, Any]:
    """(tensor-parallel mesh, placement) of a parameter sharded by FSDP on dimension 0 of a
    2-D (dp, tp) mesh and by tensor parallelism on dimension 1; (None, None) for FSDP on a
    1-D mesh and HSDP on a (replicate, shard) mesh; raises for anything else."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(p, DTensor):
        raise ValueError(f"torchtpu: parameter {name!r} is not sharded (a DTensor): apply fully_shard to the whole model")
    placements, mesh = tuple(p.placements), p.device_mesh
    if len(placements) == 1 and isinstance(placements[0], Shard):
        return None, None
    if len(placements) == 2 and isinstance(placements[0], Replicate) and isinstance(placements[1], Shard):
        return None, None  # HSDP
    names = mesh.mesh_dim_names
    if len(placements) == 2 and isinstance(placements[0], (Shard, _StridedShard)) and names is not None:
        return mesh[names[1]], placements[1]  # _StridedShard: FSDP's shard of a row-split TP shard
    raise NotImplementedError(
        f"torchtpu: InGraphFSDP supports FSDP on a 1-D mesh, HSDP on a (replicate, shard) mesh and FSDP on dimension 0 "
        f"of a named (dp, tp) mesh with tensor parallelism on dimension 1; {name!r} is {p.placements} on {mesh}"
    )


def _is_fsdp_hook(hook: Any, states: list[Any]) -> bool:
    return any(getattr(hook, "__self__", None) is s for s in states)
