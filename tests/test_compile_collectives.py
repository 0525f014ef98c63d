"""Functional collectives inside torch.compile(backend="tpu") programs (docs/compile.md,
"Collectives in compiled programs").

With TORCHTPU_COLLECTIVES=xla the ``_c10d_functional`` ops DTensor and tensor parallelism
put into a graph lower to StableHLO collectives in the same program, compiled in replica
mode over the group's ranks: a tensor-parallel training step is one program per step.
With the host transport the graph runs op by op. Multi-process tests launch
tests/distributed_scripts/compiled_collectives.py (see test_distributed.py's spawn).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_distributed import EXAMPLES, SCRIPTS, _check_rc, _read, spawn

from torchtpu.lowering import collectives as C
from torchtpu.lowering import registry
from torchtpu.lowering.context import ProgramContext
from torchtpu.lowering.graph import lower_graph

XLA = {"TORCHTPU_COLLECTIVES": "xla"}
SCRIPT = SCRIPTS / "compiled_collectives.py"
_F = torch.ops._c10d_functional


# -- lowering (no device, no process group) ------------------------------------------------------
def _lower(fn: Callable[..., torch.Tensor], layout: C.ReplicaLayout | None, shape: tuple[int, ...], out: tuple[int, ...]) -> str:
    """StableHLO of ``fn`` (a graph of functional collectives) on a float32 ``shape`` input;
    ``out`` is every node's result shape (the meta value AOTAutograd would record: the
    ops' own meta kernels need a real process group)."""
    registry._load_rules()
    gm = torch.fx.symbolic_trace(fn)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta["val"] = torch.empty(out, device="meta")
    ctx = ProgramContext()
    ctx.replica_layout = layout
    return ctx.b.module([lower_graph(ctx, gm, [ctx.b.param(shape, torch.float32)])])


def test_all_reduce_and_wait_lower_to_one_all_reduce_over_the_layouts_groups() -> None:
    def fn(x):
        return _F.wait_tensor.default(_F.all_reduce.default(x, "avg", "tp"))

    text = _lower(fn, C.ReplicaLayout((0, 1, 2, 3), {"tp": ((0, 1), (2, 3))}), (4, 3), (4, 3))
    assert text.count('"stablehlo.all_reduce"') == 1 and "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>" in text
    assert '"stablehlo.divide"' in text  # avg over the group's 2 ranks


def test_reduce_scatter_in_a_graph_is_all_to_all_plus_local_sum() -> None:
    def fn(x):
        return _F.reduce_scatter_tensor.default(x, "sum", 2, "0")

    text = _lower(fn, C.ReplicaLayout((0, 1), {"0": ((0, 1),)}), (4, 3), (2, 3))
    assert '"stablehlo.all_to_all"' in text and "reduce_scatter" not in text
    assert "-> (tensor<2x3xf32>)" in text.splitlines()[1]


def test_broadcast_root_is_a_group_rank_of_each_block() -> None:
    def fn(x):
        return _F.broadcast.default(x, 1, "dp")

    text = _lower(fn, C.ReplicaLayout((0, 1, 2, 3), {"dp": ((0, 2), (1, 3))}), (5,), (5,))
    # group rank 1 of [0, 2] is replica 2, of [1, 3] replica 3
    assert "dense<2> : tensor<ui32>" in text and "dense<3> : tensor<ui32>" in text


def test_dtensor_shard_dim_alltoall_is_one_all_to_all_kept_alive() -> None:
    """DTensor's Shard(0) -> Shard(1): one all_to_all of the (2, 6) input's column chunks,
    received rows stacked along dim 0 into (4, 3); the exchanged value is also kept as a
    program output (a rank whose padded chunk DTensor slices to nothing must still run it)."""
    registry._load_rules()
    gm = torch.fx.symbolic_trace(lambda x: torch.ops._dtensor.shard_dim_alltoall.default(x, 0, 1, "0"))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta["val"] = torch.empty(4, 3, device="meta")
    ctx = ProgramContext()
    ctx.replica_layout = C.ReplicaLayout((0, 1), {"0": ((0, 1),)})
    out = lower_graph(ctx, gm, [ctx.b.param((2, 6), torch.float32)])
    text = ctx.b.module([out, *ctx.keep])
    assert out.shape == (4, 3) and len(ctx.keep) == 1 and ctx.keep[0].shape == (2, 6)
    assert text.count('"stablehlo.all_to_all"') == 1 and "replica_groups = dense<[[0, 1]]>" in text


def test_collective_signature_names_op_reduction_groups_and_types() -> None:
    """What the ranks compare before running a program with collectives (a rank's own
    constants are not part of it; the collectives' order, ops, reductions and types are)."""
    from torchtpu.distributed import xla_programs as P
    from torchtpu.runtime.distributed import collective_signature

    total = collective_signature(P.all_reduce([(4,), (2, 3)], torch.float32, "sum", 2))
    assert total == ["all_reduce(add) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<10xf32>) -> tensor<10xf32>"]
    assert collective_signature(P.all_reduce([(4,), (2, 3)], torch.float32, "max", 2)) != total
    assert collective_signature(P.all_reduce([(4,), (2, 2)], torch.float32, "sum", 2)) != total
    gathered = collective_signature(P.all_gather((4,), torch.float32, 2, [(8,)]))
    assert gathered == ["all_gather {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<1x4xf32>) -> tensor<2x4xf32>"]


def test_collective_without_a_layout_is_a_clear_error() -> None:
    def fn(x):
        return _F.all_reduce.default(x, "sum", "0")

    with pytest.raises(NotImplementedError, match="TORCHTPU_COLLECTIVES=xla"):
        _lower(fn, None, (2,), (2,))


def test_uneven_all_to_all_pads_every_rank_to_the_groups_largest_split() -> None:
    """Rank 0 of two sends 1 and 3 rows of 2 and receives 2 and 2; a peer's largest split
    is 4 (agreed when compiling): both chunks go padded to 4 rows (8 elements) in one
    (2, 8) exchange, kept in the program, and the rows received are cut back out."""

    def fn(x):
        return _F.all_to_all_single.default(x, [2, 2], [1, 3], "0")

    layout = C.ReplicaLayout((0, 1), {"0": ((0, 1),)}, {"0": (1, 4)})
    text = _lower(fn, layout, (4, 2), (4, 2))
    exchanges = re.findall(r'"stablehlo.all_to_all"\(%\w+\) (\{.*?\}) : \((.*?)\)', text)
    assert len(exchanges) == 1 and "tensor<2x8xf32>" in exchanges[0][1], exchanges
    assert "replica_groups = dense<[[0, 1]]>" in exchanges[0][0]


def test_all_to_all_even_here_but_uneven_in_the_group_is_padded_too() -> None:
    """Even local splits take the padded exchange when a peer's are uneven: every rank of
    the group must run the same shape."""

    def fn(x):
        return _F.all_to_all_single.default(x, [2, 2], [2, 2], "0")

    even = _lower(fn, C.ReplicaLayout((0, 1), {"0": ((0, 1),)}, {"0": (2, 2)}), (4,), (4,))
    padded = _lower(fn, C.ReplicaLayout((0, 1), {"0": ((0, 1),)}, {"0": (0, 3)}), (4,), (4,))
    assert "tensor<2x2xf32>" in even and "tensor<2x3xf32>" in padded


def test_uneven_all_to_all_without_an_agreed_size_is_a_clear_error() -> None:
    def fn(x):
        return _F.all_to_all_single.default(x, [1, 3], [2, 2], "0")

    with pytest.raises(NotImplementedError, match="uneven splits"):
        _lower(fn, C.ReplicaLayout((0, 1), {"0": ((0, 1),)}), (4,), (4,))


# -- several processes ----------------------------------------------------------------------------
def _assert_all_ok(out: Path, nproc: int, at_least: int) -> None:
    for r in range(nproc):
        res = _read(out, f"rank{r}.json")["collectives"]
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad and len(res) >= at_least, f"rank {r}: {bad or res}"


def _tp_results(out: Path) -> list[dict]:
    results = [_read(out, f"rank{r}.json")["tp"] for r in range(2)]
    for res in results:
        assert len(res["losses"]) == 4
        # the tolerance tensor_parallel's single-process comparison uses (test_distributed.py)
        assert res["max_diff"] <= 1e-4, f"{res['losses']} vs single-process {res['reference']}"
    return results


def test_collectives_and_tensor_parallel_step_in_one_program(tmp_path: Path) -> None:
    """(1) all_reduce (sum/avg/max/bor), all_gather_into_tensor, reduce_scatter_tensor,
    all_to_all_single, broadcast and the three _coalesced variants in one compiled function: the
    same values as gloo on CPU tensors, one program per call; DTensor Shard(a) -> Shard(b)
    redistributions (_dtensor.shard_dim_alltoall, uneven dims included) with their backward. (2) A tensor-parallel MLP
    (DTensor + parallelize_module, Colwise/RowwiseParallel): forward, backward, the SGD
    update and their all_reduces are ONE program per step, nothing compiles after step 1,
    and the losses are the single-process run's. One launch: start-up is most of the time."""
    _check_rc(spawn(SCRIPT, "collectives,tp,mismatch", out=tmp_path, timeout=240, **XLA))
    _assert_all_ok(tmp_path, 2, 24)
    for res in _tp_results(tmp_path):
        assert all(c == {"executions": 1, "compiles": 0} for c in res["counts"][1:]), res["counts"]
        assert res["counts"][0]["executions"] == 1 and res["warnings"] == [], res
    _assert_mismatches_are_errors(tmp_path)


def _assert_mismatches_are_errors(out: Path) -> None:
    """(3) Compiled functions whose collectives depend on the rank raise CollectiveMismatchError
    on every rank, naming each rank's collective (before, a different reduce op mixed the
    ranks' values silently: [4, 4, 2, 2]; a different length aborted rank 0 in gloo); a
    rank's own constant leaves the collectives alike and runs: sum of x * (rank + 1)."""
    for r in range(2):
        res = _read(out, f"rank{r}.json")["mismatch"]
        for case, differs in (("reduce_op", "all_reduce(maximum)"), ("shape", "tensor<6xf32>")):
            error = res[case]
            assert error and error.startswith("CollectiveMismatchError: "), (case, error)
            assert "rank 0:" in error and "rank 1:" in error and differs in error, (case, error)
        assert res["constant"] == [3.0] * 4


@pytest.mark.slow
def test_a_program_only_one_rank_builds_is_an_error_within_the_timeout(tmp_path: Path) -> None:
    """Rank 1 compiles a graph with a collective that rank 0 never compiles: rank 1 raises
    CollectiveMismatchError naming rank 0 after the group's timeout (10 s here)."""
    _check_rc(spawn(SCRIPT, "lonely", out=tmp_path, timeout=120, TORCHTPU_TEST_TIMEOUT="10", **XLA))
    lonely = _read(tmp_path, "rank1.json")["lonely"]
    assert lonely["error"].startswith("CollectiveMismatchError: torchtpu: rank 0 built no program"), lonely
    assert 9 <= lonely["seconds"] < 60, lonely
    assert _read(tmp_path, "rank0.json")["lonely"]["error"] is None


@pytest.mark.slow
def test_compiled_collectives_4_processes_and_a_2d_mesh(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPT, "collectives", nproc=4, out=tmp_path, timeout=400, **XLA))
    _assert_all_ok(tmp_path, 4, 26)


@pytest.mark.slow  # ~35 s on a loaded 2-core machine: start-up of 2 processes, then op by op
def test_host_transport_runs_the_graph_op_by_op(tmp_path: Path) -> None:
    """TORCHTPU_COLLECTIVES=host (the cpu default): the same step works, op by op, warned once."""
    _check_rc(spawn(SCRIPT, "tp", out=tmp_path, timeout=240, TORCHTPU_COLLECTIVES="host"))
    for res in _tp_results(tmp_path):
        assert all(c["executions"] > 1 for c in res["counts"]), res["counts"]
        assert len(res["warnings"]) == 1 and "TORCHTPU_COLLECTIVES=xla" in res["warnings"][0], res["warnings"]


@pytest.mark.slow
def test_dead_peer_fails_the_compiled_program_naming_it(tmp_path: Path) -> None:
    results = spawn(SCRIPT, "kill", out=tmp_path, timeout=180, TORCHTPU_DIST_CHECK="0", **XLA)
    assert results[1][0] == -9
    assert results[0][0] == 0, f"survivor exit code {results[0][0]} (an abort is -6):\n{results[0][1][-3000:]}"
    err = _read(tmp_path, "rank0.json")["error"]
    assert err is not None and err.startswith("CollectiveError") and "compiled graph" in err, err


@pytest.mark.slow
def test_compiled_tensor_parallel_example_matches_single_process(tmp_path: Path) -> None:
    """examples/distributed/tensor_parallel.py --compile: the transformer's whole step, one program."""
    _check_rc(spawn(EXAMPLES / "tensor_parallel.py", "--compile", "--compare", out=tmp_path, timeout=400, **XLA))
    for r in range(2):
        res = _read(tmp_path, f"tensor_parallel_compiled_rank{r}.json")
        assert len(res["losses"]) == 10 and res["max_diff"] <= 1e-4, res
        assert _read(tmp_path, f"tensor_parallel_compiled_programs_rank{r}.json") == [1] * 10
