"""The xla transport of the "tpu" process group (TORCHTPU_COLLECTIVES=xla): collectives as
XLA programs over jaxlib's multi-process CPU client (gloo TCP inside XLA).

Multi-process tests launch tests/distributed_scripts/ workers and compare with gloo on CPU
tensors or with CPU references computed from every rank's inputs (float64 where it rounds).
The in-process tests check the programs' text and a one-process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import (
    EXAMPLES,
    ROOT,
    SCRIPTS,
    _check_rc,
    _read,
    assert_checks_ok,
    assert_ddp_options_train_as_gloo,
    assert_fsdp_options_train_as_gloo,
    assert_pipeline_matches_one_process,
    assert_ring_pipeline_matches_one_process,
    spawn,
)

from torchtpu.distributed import xla_programs as P

XLA = {"TORCHTPU_COLLECTIVES": "xla"}


# -- programs (no device) -------------------------------------------------------------------------
def test_reduce_scatter_is_all_to_all_plus_local_sum() -> None:
    text = P.reduce_scatter([(8,)], torch.float32, "sum", 2, (4,))
    assert '"stablehlo.all_to_all"' in text and "reduce_scatter" not in text  # jaxlib bug 1
    assert "split_count = 2 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>" in text


def test_all_reduce_regions_xla_cpu_accepts() -> None:
    text = P.all_reduce([(3, 5)], torch.float32, "max", 4)
    assert '"stablehlo.all_reduce"' in text and '"stablehlo.maximum"' in text
    # XLA CPU rejects an `or` reduction region: bitwise ops reduce an all_gather locally
    band = P.all_reduce([(6,)], torch.int32, "bor", 2)
    assert '"stablehlo.all_gather"' in band and '"stablehlo.all_reduce"' not in band and '"stablehlo.or"' in band


def test_broadcast_sums_the_roots_bits() -> None:
    text = P.broadcast([(4,)], torch.bfloat16, root=1, w=2)
    assert '"stablehlo.replica_id"' in text and "collective_broadcast" not in text
    assert "tensor<4xui16>" in text  # bitcast: -0.0 and NaN payloads arrive unchanged


def test_uneven_all_to_all_keeps_the_exchange_alive() -> None:
    # a rank that receives nothing must still run the all_to_all (XLA deletes unused collectives)
    text = P.all_to_all([(0,)], torch.float32, 2, [0, 0], [0, 0], 3, [(0,)])
    assert '"stablehlo.all_to_all"' in text and "-> (tensor<0xf32>, tensor<2x3xf32>)" in text


def test_transport_kind() -> None:
    from torchtpu.distributed.process_group import transport_kind

    old = os.environ.pop("TORCHTPU_COLLECTIVES", None)
    try:
        assert transport_kind() == ("host" if os.environ.get("TORCHTPU_PLATFORM", "cpu") == "cpu" else "xla")
        os.environ["TORCHTPU_COLLECTIVES"] = "XLA"
        assert transport_kind() == "xla"
        os.environ["TORCHTPU_COLLECTIVES"] = "nccl"
        with pytest.raises(ValueError, match="TORCHTPU_COLLECTIVES='nccl'"):
            transport_kind()
    finally:
        os.environ.pop("TORCHTPU_COLLECTIVES", None)
        if old is not None:
            os.environ["TORCHTPU_COLLECTIVES"] = old


@pytest.mark.slow
def test_one_process_group_runs_every_program(tmp_path: Path) -> None:
    """world_size 1: each collective compiles and runs as a one-replica XLA program."""
    code = (
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('tpu', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
        "assert dist.group.WORLD.transport.name == 'xla'\n"
        "t = torch.arange(6.0).reshape(2, 3).to('tpu') * 2 + 1\n"
        "dist.all_reduce(t, op=dist.ReduceOp.AVG)\n"
        "assert torch.equal(t.cpu(), torch.arange(6.0).reshape(2, 3) * 2 + 1), t\n"
        "i = torch.tensor([5, -3], device='tpu'); dist.all_reduce(i, op=dist.ReduceOp.BXOR)\n"
        "assert i.cpu().tolist() == [5, -3], i\n"
        "out = torch.zeros(2, 3, device='tpu'); dist.all_gather_into_tensor(out, t[:, :] + 1)\n"
        "assert torch.equal(out.cpu(), torch.arange(6.0).reshape(2, 3) * 2 + 2), out\n"
        "dist.broadcast(t, src=0); dist.barrier()\n"
        "rs = torch.zeros(2, 3, device='tpu'); dist.reduce_scatter_tensor(rs, t)\n"
        "a2a = torch.zeros(2, 3, device='tpu'); dist.all_to_all_single(a2a, t, [2], [2])\n"
        "assert torch.equal(rs.cpu(), t.cpu()) and torch.equal(a2a.cpu(), t.cpu())\n"
        "print('OK', dist.group.WORLD.transport.name)\n"
        "dist.destroy_process_group()\n"
    )
    env = dict(os.environ, **XLA)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert p.returncode == 0 and "OK xla" in p.stdout, p.stdout + p.stderr[-3000:]


# -- collectives on several processes -------------------------------------------------------------
def _assert_all_ok(out: Path, nproc: int) -> None:
    for r in range(nproc):
        res = _read(out, f"rank{r}.json")
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {r}: {bad}"
        assert len(res) >= 80 and res["transport_is_xla"] == "ok"


def test_xla_collectives_2_processes(tmp_path: Path) -> None:
    """collectives.py's checks against gloo, plus every reduce op and dtype, exact broadcast,
    uneven all_to_all, send/recv, DeviceMesh dimensions, subgroups and program caching."""
    _check_rc(spawn(SCRIPTS / "collectives_xla.py", out=tmp_path, timeout=300, **XLA))
    _assert_all_ok(tmp_path, 2)


def test_xla_pipeline_schedules_exchanging_both_ways_match_one_process(tmp_path: Path) -> None:
    """GPipe and 1F1B on the xla transport, where a send and its recv are one two-rank
    program: each direction's transfers run in order on a thread of their own, so two ranks
    sending to each other at once both complete."""
    _check_rc(spawn(SCRIPTS / "pipeline.py", "tpu", out=tmp_path, timeout=180, **XLA))
    assert_pipeline_matches_one_process(tmp_path)


def test_xla_ddp_options_and_comm_hooks_train_as_gloo_does(tmp_path: Path) -> None:
    """DDP's options and hooks on the xla transport. PowerSGD hung: its future callback
    waits for the next all_reduce's future, whose completion was queued behind that
    callback on the one completion thread; such a future now completes on the spot."""
    _check_rc(spawn(SCRIPTS / "ddp_options.py", out=tmp_path, timeout=180, **XLA))
    assert_ddp_options_train_as_gloo(tmp_path)


@pytest.mark.slow  # one launch (15 s)
def test_xla_ddp_options_and_comm_hooks_under_defer_and_fuse(tmp_path: Path) -> None:
    """Under DeferAndFuse the all_reduce is recorded into the caller's graph and its future
    completes at once. A rank whose callback ran on the main thread flushed that graph (and
    ran the collective) before the nested all_reduce's cross-rank check; its peer, whose
    callback ran on the completion thread, flushed only that thread's (empty) graph and went
    to the check: each waited for the other (2 of 3 runs hung). Every pending graph holding
    a collective now runs before a host exchange, whichever thread recorded it."""
    _check_rc(spawn(SCRIPTS / "ddp_options.py", out=tmp_path, timeout=180, TORCHTPU_DEFER_AND_FUSE="1", **XLA))
    assert_ddp_options_train_as_gloo(tmp_path)


@pytest.mark.slow  # one launch, 16 trainings
def test_xla_fsdp2_options_and_loss_parallel_train_as_gloo_does(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "fsdp_options.py", out=tmp_path, timeout=240, **XLA))
    assert_fsdp_options_train_as_gloo(tmp_path)


@pytest.mark.slow  # 4 processes
def test_xla_interleaved_pipeline_round_four_ranks_matches_one_process(tmp_path: Path) -> None:
    """Interleaved 1F1B round 4 ranks on the xla transport: a send that waited for its
    recv on the caller's thread deadlocked here (each rank waiting on its neighbour)."""
    _check_rc(spawn(SCRIPTS / "pipeline_ring.py", "tpu", nproc=4, out=tmp_path, timeout=300, **XLA))
    assert_ring_pipeline_matches_one_process(tmp_path)


@pytest.mark.slow  # make test runs the host transport's twin (tests/test_distributed.py)
def test_xla_async_work_futures_and_ddp_comm_hook(tmp_path: Path) -> None:
    """async_op=True enqueues the program and returns; wait() and get_future() follow its
    result buffers (the same checks as the host transport's test)."""
    _check_rc(spawn(SCRIPTS / "async_work.py", out=tmp_path, timeout=300, **XLA))
    assert_checks_ok(tmp_path, 2, 9)


@pytest.mark.slow
def test_xla_collectives_4_processes(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "collectives_xla.py", nproc=4, out=tmp_path, timeout=600, **XLA))
    _assert_all_ok(tmp_path, 4)


@pytest.mark.slow
def test_xla_mixed_backend_string(tmp_path: Path) -> None:
    """init_process_group("cpu:gloo,tpu:tpu"): CPU tensors take gloo, tpu tensors XLA programs."""
    env = dict(XLA, TORCHTPU_TEST_BACKEND="cpu:gloo,tpu:tpu")
    _check_rc(spawn(SCRIPTS / "collectives.py", out=tmp_path, timeout=300, **env))
    for r in range(2):
        res = _read(tmp_path, f"rank{r}.json")
        assert all(v == "ok" for v in res.values()) and len(res) >= 30, res


@pytest.mark.slow
def test_xla_collectives_defer_and_fuse(tmp_path: Path) -> None:
    """Pending DeferAndFuse work runs before a collective reads its buffers."""
    _check_rc(spawn(SCRIPTS / "collectives_xla.py", out=tmp_path, timeout=300, TORCHTPU_DEFER_AND_FUSE="1", **XLA))
    _assert_all_ok(tmp_path, 2)


@pytest.mark.slow  # make test-all (session 55: make test ran 850-914 s of its 900); test_single_process_group_collectives[defer_and_fuse] stays
@pytest.mark.parametrize("check", ["1", "0"])
def test_defer_and_fuse_records_collectives(tmp_path: Path, check: str) -> None:
    """DeferAndFuse records all_reduce, reduce, all_gather (into a tensor or a list), gather, scatter, reduce_scatter_tensor, broadcast
    and even all_to_all_single into the pending graph: values equal the CPU's (DDP training included), one program for
    compute + all_reduce + compute without the cross-rank check, ranks whose graphs end at
    different ops, a result one rank drops, bucketed tensors exchanged without spare rows."""
    _check_defer_collectives(tmp_path, 2, check)


@pytest.mark.slow
def test_defer_and_fuse_records_collectives_4_processes(tmp_path: Path) -> None:
    _check_defer_collectives(tmp_path, 4, "0")


def _check_defer_collectives(out: Path, nproc: int, check: str) -> None:
    env = dict(XLA, TORCHTPU_DEFER_AND_FUSE="1", TORCHTPU_DIST_CHECK=check)
    _check_rc(spawn(SCRIPTS / "defer_collectives.py", nproc=nproc, out=out, timeout=300 * nproc // 2, **env))
    for r in range(nproc):
        res = _read(out, f"rank{r}.json")
        assert len(res) == 11 and all(v == "ok" for v in res.values()), res


@pytest.mark.slow
@pytest.mark.parametrize("defer", ["0", "1"])
@pytest.mark.parametrize("example", ["ddp", "fsdp2", "tensor_parallel", "pipeline"])
def test_xla_training_matches_single_process(tmp_path: Path, example: str, defer: str) -> None:
    env = dict(XLA, TORCHTPU_DEFER_AND_FUSE=defer)  # defer: the collectives are recorded into graphs
    _check_rc(spawn(EXAMPLES / f"{example}.py", "--compare", out=tmp_path, timeout=300, **env))
    name = "pipeline-1f1b" if example == "pipeline" else example  # the pipeline example names its schedule
    for r in range(2):
        res = _read(tmp_path, f"{name}_rank{r}.json")
        assert len(res["losses"]) == 10 and res["max_diff"] <= 1e-4, res


# -- failures -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_killed_rank_gives_survivor_an_exception(tmp_path: Path, victim: int) -> None:
    """SIGKILL either rank (rank 0 started the coordination service's helper): the survivor's
    XLA all_reduce raises DistributedError naming it, and the survivor exits normally."""
    results = spawn(SCRIPTS / "xla_failures.py", f"kill{victim}", out=tmp_path, timeout=180, TORCHTPU_DIST_CHECK="0", **XLA)
    survivor = 1 - victim
    rc, log = results[survivor]
    assert rc == 0, f"survivor exit code {rc} (an abort is -6):\n{log[-3000:]}"
    assert results[victim][0] == -9
    err = _read(tmp_path, f"rank{survivor}.json")["error"]
    assert err is not None and err.startswith("DistributedError") and "all_reduce failed" in err, err
    assert "a collective program failed" in err  # the XLA program, not the gloo check, saw it


@pytest.mark.slow
def test_killed_rank_under_defer_and_fuse(tmp_path: Path) -> None:
    """Recorded all_reduces fail where their graph runs (the survivor's read), with an error
    that names the graph's collectives; the survivor exits normally."""
    env = dict(XLA, TORCHTPU_DIST_CHECK="0", TORCHTPU_DEFER_AND_FUSE="1")
    results = spawn(SCRIPTS / "xla_failures.py", "kill1", out=tmp_path, timeout=180, **env)
    assert results[0][0] == 0, f"survivor exit code {results[0][0]}:\n{results[0][1][-3000:]}"
    err = _read(tmp_path, "rank0.json")["error"]
    assert err is not None and err.startswith("CollectiveError") and "fused graph of" in err, err
    assert "with all_reduce failed in a collective (a peer process died" in err, err


@pytest.mark.slow
def test_dead_peer_with_the_check_on(tmp_path: Path) -> None:
    results = spawn(SCRIPTS / "failures.py", "dead", out=tmp_path, TORCHTPU_TEST_TIMEOUT="20", **XLA)
    assert results[0][0] == 0, results[0][1][-3000:]
    err = _read(tmp_path, "rank0.json")["error"]
    assert err is not None and err.startswith("DistributedError") and "all_reduce" in err, err


@pytest.mark.slow
def test_hung_peer_times_out_with_the_group_timeout(tmp_path: Path) -> None:
    """The XLA collective timeout comes from the default group's timeout (via XLA_FLAGS)."""
    results = spawn(
        SCRIPTS / "xla_failures.py", "hang", out=tmp_path, timeout=180, TORCHTPU_DIST_CHECK="0", TORCHTPU_TEST_TIMEOUT="5", **XLA
    )
    assert results[0][0] == 0, results[0][1][-3000:]
    res = _read(tmp_path, "rank0.json")
    assert res["error"].startswith("DistributedError") and "timed out after 5s" in res["error"], res
    assert res["seconds"] < 30


@pytest.mark.slow
def test_device_used_before_init_process_group_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "import torch, torch.distributed as dist, json, os\n"
        "x = torch.ones(2).to('tpu')\n"
        "try:\n"
        "    dist.init_process_group('tpu')\n"
        "    msg = None\n"
        "except Exception as e:\n"
        "    msg = f'{type(e).__name__}: {e}'\n"
        "open(os.path.join(os.environ['TORCHTPU_TEST_OUT'], 'rank' + os.environ['RANK'] + '.json'), 'w').write(json.dumps(msg))\n"
    )
    script = tmp_path / "order.py"
    script.write_text(code)
    _check_rc(spawn(script, out=tmp_path, timeout=120, **XLA))
    for r in range(2):
        msg = _read(tmp_path, f"rank{r}.json")
        assert msg and "init_process_group() to run before this process first uses the tpu device" in msg, msg
        assert "TORCHTPU_COLLECTIVES=host" in msg
