"""FSDP2 (fully_shard) under torch.compile(backend="tpu") (docs/compile.md, "Collectives in
compiled programs", FSDP2).

PyTorch 2.13 runs FSDP2's hooks eagerly (torch._dynamo.disable), so torch.compile(model)
compiles each block and its all-gathers and reduce-scatters run between the programs.
``InGraphFSDP`` puts them into the graph: the example's whole training step is one program
with its collectives inside, and the losses are the single-process run's. Multi-process
tests launch tests/distributed_scripts/compiled_fsdp.py (see test_distributed.py's spawn).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_distributed import EXAMPLES, SCRIPTS, _check_rc, _read, spawn

from torchtpu.distributed.compiled import InGraphFSDP

XLA = {"TORCHTPU_COLLECTIVES": "xla"}
SCRIPT = SCRIPTS / "compiled_fsdp.py"
AG, A2A = '"stablehlo.all_gather"', '"stablehlo.all_to_all"'
N_PARAMS = 38  # examples/distributed/common.py's TinyTransformer: every one all-gathered and reduce-scattered
FSDP2_TOL = 1e-4  # the fsdp2 example's single-process comparison (test_distributed.py)
BF16_TOL = 3e-2  # and its bf16 one


def test_in_graph_fsdp_needs_a_fully_sharded_model() -> None:
    with pytest.raises(ValueError, match="fully_shard"):
        InGraphFSDP(torch.nn.Linear(2, 2))


def _results(out: Path, scenario: str, nproc: int = 2) -> list[dict]:
    results = [_read(out, f"rank{r}.json")[scenario] for r in range(nproc)]
    for res in results:
        assert "error" not in res, res["error"]
    return results


def _collective_programs(dump: Path) -> set[tuple[int, int, str, str]]:
    """Per compiled program with collectives (both ranks'): its all_gathers, its all_to_alls
    (reduce-scatters) and the element types of their operands."""
    texts = [p.read_text() for p in dump.glob("*.stablehlo.mlir")]
    return {(t.count(AG), t.count(A2A), _operand_types(t, AG), _operand_types(t, A2A)) for t in texts if AG in t}


def _operand_types(text: str, op: str) -> str:
    """The element types of ``op``'s operands: ``... : (tensor<2x32xbf16>) -> ...`` after it."""
    return ",".join(sorted({t.split("x")[-1] for t in re.findall(rf"{op}\(.*?: \(tensor<([^>]*)>", text)}))


@pytest.mark.slow  # ~2 min on a loaded 2-core machine: start-up, three compiles, the references
def test_fsdp2_step_is_one_program_with_its_collectives(tmp_path: Path) -> None:
    """(1) The whole step (forward, autograd.grad, SGD) on fully_shard's shards is ONE program
    per step, its all-gathers and reduce-scatters inside, nothing compiles after step 1, the
    losses are the single-process run's, and an eager FSDP2 step afterwards continues the
    same training (its hooks are back). (2) With a bf16 MixedPrecisionPolicy: all-gathers in
    bf16, reduce-scatters (all_to_all) in f32. (3) Shards of uneven sizes (FSDP2 pads them).
    (4) The stock torch.compile(model): correct,
    several programs per step, and fullgraph=True refused at FSDP2's disabled hooks."""
    dump = tmp_path / "dump"
    _check_rc(spawn(SCRIPT, "step,bf16,uneven,model", out=tmp_path, timeout=600, TORCHTPU_DUMP_DIR=str(dump), **XLA))
    for res in _results(tmp_path, "step"):
        assert len(res["losses"]) == 5 and res["max_diff"] <= FSDP2_TOL, f"{res['losses']} vs {res['reference']}"
        compiled = res["counts"][:4]
        assert compiled[0]["executions"] == 1 and all(c == {"executions": 1, "compiles": 0} for c in compiled[1:]), compiled
    for res in _results(tmp_path, "bf16"):
        assert res["max_diff"] <= BF16_TOL, f"{res['losses']} vs {res['reference']}"
        assert all(c["executions"] == 1 for c in res["counts"]), res["counts"]
    for res in _results(tmp_path, "uneven"):  # 5 rows on 2 ranks: shards of 3 and 2
        assert res["max_diff"] <= FSDP2_TOL and all(c["executions"] == 1 for c in res["counts"]), res
    assert {s["0.weight"][0] for s in (_read(tmp_path, f"rank{r}.json")["uneven"]["shards"] for r in range(2))} == {3, 2}
    # one all-gather and one reduce-scatter per parameter; with bf16 the gathers in bf16, the reductions in f32
    kinds = {(N_PARAMS, N_PARAMS, "f32", "f32"), (N_PARAMS, N_PARAMS, "bf16", "f32"), (4, 4, "f32", "f32")}
    assert _collective_programs(dump) == kinds
    for res in _results(tmp_path, "model"):
        assert res["max_diff"] <= FSDP2_TOL and all(c["executions"] > 1 for c in res["counts"]), res
        assert "Unsupported" in res["fullgraph_error"] and "disable" in res["fullgraph_error"], res["fullgraph_error"]


@pytest.mark.slow  # 4 processes
def test_hsdp_step_is_one_program_with_its_collectives(tmp_path: Path) -> None:
    """HSDP (fully_shard on a 2 x 2 (replicate, shard) mesh) under InGraphFSDP: one program per
    step spanning the 4 ranks, each parameter all-gathered within its shard group and its
    gradient reduce-scattered there and all-reduced across the replicas; the losses are the
    single-process run's and eager FSDP2 HSDP's."""
    dump = tmp_path / "dump"
    _check_rc(spawn(SCRIPT, "hsdp", nproc=4, out=tmp_path, timeout=600, TORCHTPU_DUMP_DIR=str(dump), **XLA))
    for res in _results(tmp_path, "hsdp", nproc=4):
        assert res["placements"] == ["(Replicate(), Shard(dim=0))"], res["placements"]
        assert len(res["losses"]) == 4 and res["max_diff"] <= FSDP2_TOL, f"{res['losses']} vs {res['reference']}"
        assert max(abs(a - b) for a, b in zip(res["losses"], res["eager_fsdp2"])) <= FSDP2_TOL, res
        counts = res["counts"]
        assert counts[0]["executions"] == 1 and all(c == {"executions": 1, "compiles": 0} for c in counts[1:]), counts
    texts = [p.read_text() for p in dump.glob("*.stablehlo.mlir")]
    (step,) = {t for t in texts if AG in t}
    assert step.count(AG) == N_PARAMS and step.count(A2A) == N_PARAMS
    assert step.count('"stablehlo.all_reduce"') >= N_PARAMS  # the replicas' gradient means (and the loss's)
    assert "replica_groups = dense<[[0, 2], [1, 3]]>" in step and "replica_groups = dense<[[0, 1], [2, 3]]>" in step


@pytest.mark.slow  # 4 processes
def test_fsdp_over_tensor_parallel_step_is_one_program(tmp_path: Path) -> None:
    """FSDP on dimension 0 of a (dp, tp) mesh over tensor parallelism on dimension 1 under
    InGraphFSDP: one program per step spanning the 4 ranks, with the losses of one process
    and of eager FSDP2 + TP on the same model."""
    _check_rc(spawn(SCRIPT, "fsdp_tp", nproc=4, out=tmp_path, timeout=600, **XLA))
    for res in _results(tmp_path, "fsdp_tp", nproc=4):
        assert "(_StridedShard(dim=0, sf=2), Shard(dim=0))" in res["placements"], res["placements"]
        assert "(Shard(dim=0), Shard(dim=1))" in res["placements"], res["placements"]
        assert len(res["losses"]) == 4 and res["max_diff"] <= FSDP2_TOL, f"{res['losses']} vs {res['reference']}"
        assert max(abs(a - b) for a, b in zip(res["losses"], res["eager_fsdp2"])) <= FSDP2_TOL, res
        counts = res["counts"]
        assert counts[0]["executions"] == 1 and all(c == {"executions": 1, "compiles": 0} for c in counts[1:]), counts


@pytest.mark.slow
def test_fsdp2_example_compiled_step_matches_single_process(tmp_path: Path) -> None:
    """examples/distributed/fsdp2.py --compile step: one program per step, the 10 losses of one process."""
    _check_rc(spawn(EXAMPLES / "fsdp2.py", "--compile", "step", "--compare", out=tmp_path, timeout=400, **XLA))
    for r in range(2):
        res = _read(tmp_path, f"fsdp2_compiled_step_rank{r}.json")
        assert len(res["losses"]) == 10 and res["max_diff"] <= FSDP2_TOL, res
        assert _read(tmp_path, f"fsdp2_compiled_step_programs_rank{r}.json") == [1] * 10
