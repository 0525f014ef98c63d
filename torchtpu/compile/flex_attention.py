"""flex_attention inside a compiled graph: one XLA program with the rest of the graph.

Dynamo records ``flex_attention`` as a higher-order operator whose score and mask
modifications are subgraphs; inductor lowers it to a fused attention kernel. torchtpu has
no such kernel, and the operator left the whole graph running op by op. Before AOTAutograd
traces the graph, this pass swaps each flex_attention call for its dense reference
implementation (``sdpa_dense``, what flex_attention runs eagerly on any device): the score
matrix with the modifications applied elementwise and the block mask expanded. AOTAutograd
then traces it into ordinary aten ops and differentiates them, and the graph compiles to one
program, forward and backward, with the numbers of eager mode.
"""

from __future__ import annotations

import torch


def inline_flex_attention(gm: torch.fx.GraphModule) -> int:
    """Swap ``sdpa_dense`` in for every flex_attention call of Dynamo's graph ``gm``
    (same arguments, same (output, logsumexp, max scores) result). Returns how many."""
    hop = getattr(torch.ops.higher_order, "flex_attention", None)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop] if hop is not None else []
    if not calls:
        return 0
    from torch._higher_order_ops.flex_attention import sdpa_dense

    for node in calls:
        node.target = sdpa_dense
    gm.recompile()
    return len(calls)
