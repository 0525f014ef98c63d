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
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..errors import TpuError
from ..lowering.collectives import ReplicaLayout
from .gloo_host import attempt_prefix

_NAMESPACE = "_c10d_functional"


def group_names(gm: torch.fx.GraphModule) -> list[str]:
    """The process-group names of ``gm``'s functional collectives, in order of first use."""
    names: list[str] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target.namespace != _NAMESPACE or node.target._schema.name.endswith("wait_tensor"):
            continue
        name = _name_arg(node)
        if name not in names:
            names.append(name)
    return names


def _name_arg(node: torch.fx.Node) -> str:
    schema = node.target._schema  # type: ignore[union-attr]
    index = [a.name for a in schema.arguments].index("group_name")
    value = node.kwargs.get("group_name", node.args[index] if index < len(node.args) else None)
    return value if isinstance(value, str) else value.group_name


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
