"""torch.distributed on tpu: multi-process tests (2 processes; one 4-process run).

Each test launches worker scripts from tests/distributed_scripts/ (or the examples),
either with torchrun or as plain processes with env:// variables, and reads the JSON
each rank writes. Results are compared with gloo on CPU tensors (collectives) or with
the same training in one process (DDP, FSDP2, tensor parallel).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchtpu import _registration

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "distributed_scripts"
EXAMPLES = ROOT / "examples" / "distributed"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(out: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, TORCHTPU_TEST_OUT=str(out), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def _check_rc(procs_out: list[tuple[int, str]]) -> None:
    for rc, err in procs_out:
        assert rc == 0, f"worker failed (rc {rc}):\n{err[-4000:]}"


def torchrun(script: Path, *args: str, nproc: int = 2, out: Path, timeout: float = 240) -> None:
    cmd = [*TORCHRUN, f"--nproc-per-node={nproc}", f"--master-port={_free_port()}", str(script), *args]
    _check_rc([run_group(cmd, _env(out), timeout)])


def run_group(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``cmd`` (torchrun) in a process group of its own: (exit code, output). At the
    timeout the whole group is killed -- torchrun and its workers: killing torchrun alone
    left hung ranks running into the tests after it -- and the test fails with the output."""
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        output, _ = p.communicate()
        pytest.fail(f"{' '.join(cmd[3:])} timed out after {timeout:g}s:\n{output[-4000:]}")
    return p.returncode, output


def spawn(
    script: Path, *args: str, nproc: int = 2, world: int | None = None, out: Path, timeout: float = 120, **env: str
) -> list[tuple[int, str]]:
    """Start ``nproc`` plain processes with env:// rendezvous variables (no torchrun:
    a rank that dies must not take the others down)."""
    port, world = _free_port(), world or nproc
    procs = []
    for r in range(nproc):
        e = _env(
            out, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args], env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    results = []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, _ = p.communicate()
        results.append((p.returncode, stdout))
    return results


def _read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


# -- collectives ------------------------------------------------------------------------------
def _assert_all_ok(out: Path, nproc: int) -> None:
    for r in range(nproc):
        res = _read(out, f"rank{r}.json")
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {r}: {bad}"
        assert len(res) >= 30


def test_collectives_match_gloo_torchrun(tmp_path: Path) -> None:
    torchrun(SCRIPTS / "collectives.py", out=tmp_path)
    _assert_all_ok(tmp_path, 2)


@pytest.mark.slow
def test_collectives_match_gloo_4_processes(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "collectives.py", nproc=4, out=tmp_path, timeout=300))
    _assert_all_ok(tmp_path, 4)


@pytest.mark.slow
def test_mixed_backend_string(tmp_path: Path) -> None:
    """init_process_group("cpu:gloo,tpu:tpu"): the same collectives, CPU tensors included."""
    _check_rc(spawn(SCRIPTS / "collectives.py", out=tmp_path, TORCHTPU_TEST_BACKEND="cpu:gloo,tpu:tpu"))
    _assert_all_ok(tmp_path, 2)


# -- training equals the single-process run -----------------------------------------------------
def _assert_same_losses(out: Path, name: str, tol: float) -> None:
    for r in range(2):
        res = _read(out, f"{name}_rank{r}.json")
        assert len(res["losses"]) == 10
        assert res["max_diff"] <= tol, f"rank {r}: {res['losses']} vs single-process {res['reference']}"


def assert_pipeline_matches_one_process(out: Path) -> None:
    """pipeline.py's reports: the two-way exchange delivered each rank the other's values,
    and both schedules trained each stage as one process on the CPU trains the whole model."""
    for r in range(2):
        res = _read(out, f"rank{r}.json")
        assert res["received"] == [float(2 - r)] * 3  # rank 0 gets rank 1's 2.0s, rank 1 rank 0's 1.0s
        for name in ("gpipe", "1f1b"):
            assert res[name]["param_diff"] <= 1e-6, f"rank {r} {name}"  # measured 1.5e-8
            if r == 1:  # the last stage computes the losses
                assert res[name]["losses"] == pytest.approx(res[name]["ref_losses"], rel=1e-5)
    last = _read(out, "rank1.json")
    assert (last["sent_once"], last["source"]) == ([7.0, 8.0], 0)


def test_pipeline_schedules_exchanging_both_ways_match_one_process(tmp_path: Path) -> None:
    """torch.distributed.pipelining's GPipe and 1F1B on 2 ranks, and a batch_isend_irecv in
    which both ranks send first. A send used to return only once the peer had received it,
    so two ranks sending to each other at once (1F1B's steady state) waited forever."""
    _check_rc(spawn(SCRIPTS / "pipeline.py", "tpu", out=tmp_path, timeout=180))
    assert_pipeline_matches_one_process(tmp_path)


def assert_ring_pipeline_matches_one_process(out: Path) -> None:
    for r in range(4):
        res = _read(out, f"rank{r}.json")
        assert all(res[name] <= 1e-6 for name in ("gpipe", "1f1b", "interleaved")), f"rank {r}: {res}"  # measured 1.5e-8


@pytest.mark.slow  # 4 processes (make test keeps the 2-rank exchange above)
def test_interleaved_pipeline_round_four_ranks_matches_one_process(tmp_path: Path) -> None:
    """GPipe, 1F1B and interleaved 1F1B (two stages per rank, rank 3 sending back to rank 0)
    on 4 ranks train each stage as one process on the CPU trains the whole model."""
    _check_rc(spawn(SCRIPTS / "pipeline_ring.py", "tpu", nproc=4, out=tmp_path, timeout=300))
    assert_ring_pipeline_matches_one_process(tmp_path)


@pytest.mark.slow  # make test keeps the 2-rank schedules of distributed_scripts/pipeline.py
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_example_matches_single_process(tmp_path: Path, schedule: str) -> None:
    _check_rc(spawn(EXAMPLES / "pipeline.py", "--schedule", schedule, "--compare", out=tmp_path, timeout=240))
    _assert_same_losses(tmp_path, f"pipeline-{schedule}", 1e-4)  # measured 2.4e-7


def test_ddp_matches_single_process(tmp_path: Path) -> None:
    _check_rc(spawn(EXAMPLES / "ddp.py", "--compare", out=tmp_path, timeout=240))
    _assert_same_losses(tmp_path, "ddp", 1e-4)


def test_sync_batch_norm_matches_one_batch_norm_over_the_whole_batch(tmp_path: Path) -> None:
    """nn.SyncBatchNorm's per-device ops (batch_norm_stats, ..._gather_stats_with_counts,
    ..._elemt, ..._backward_reduce, ..._backward_elemt) had no tpu kernels: its forward
    raised NotImplementedError. Two ranks with 3 and 5 images against nn.BatchNorm2d over
    all 8 on the CPU, eager and DeferAndFuse, three training steps and eval."""
    _check_rc(spawn(SCRIPTS / "sync_batch_norm.py", out=tmp_path, timeout=240))
    for r in range(2):
        result = _read(tmp_path, f"rank{r}.json")
        assert result["error"] is None, result["error"]
        for mode, diffs in result["diffs"].items():
            assert set(diffs) == {"output", "input grad", "weight and bias grads", "running mean", "running var", "eval output"}
            assert max(diffs.values()) < 1e-4, (r, mode, diffs)


@pytest.mark.slow  # make test-all: make test keeps DDP and the collectives (time budget)
def test_fsdp2_matches_single_process(tmp_path: Path) -> None:
    _check_rc(spawn(EXAMPLES / "fsdp2.py", "--compare", out=tmp_path, timeout=240))
    _assert_same_losses(tmp_path, "fsdp2", 1e-4)


@pytest.mark.slow  # make test-all (time budget); test_native_hooks.py keeps the storage resize it needs in make test
def test_fsdp1_matches_the_single_process_run_on_the_cpu(tmp_path: Path) -> None:
    """FSDP1 (``FullyShardedDataParallel``, FULL_SHARD per layer, ``clip_grad_norm_``,
    a full state dict gathered to rank 0's CPU) against the same steps in one process on
    the CPU. Before, its first unshard raised PyTorch's "implement
    `resizePrivateUse1Bytes`": FSDP1 frees parameters by resizing their storage."""
    if not _registration.NATIVE_HOOKS:
        pytest.skip("torchtpu was installed without its C++ hooks (storage resize)")
    _check_rc(spawn(SCRIPTS / "fsdp1.py", out=tmp_path, timeout=240))
    losses = [_read(tmp_path, f"rank{r}.json")["losses"] for r in range(2)]
    result = _read(tmp_path, "rank0.json")
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert losses[0] == pytest.approx(result["reference"], rel=1e-5)
    assert result["state_keys"] and result["max_weight_diff"] < 1e-5


@pytest.mark.slow
def test_fsdp2_mixed_precision_close_to_fp32(tmp_path: Path) -> None:
    _check_rc(spawn(EXAMPLES / "fsdp2.py", "--compare", "--bf16", out=tmp_path, timeout=240))
    _assert_same_losses(tmp_path, "fsdp2_bf16", 3e-2)  # bf16 parameters: close, not equal


@pytest.mark.slow  # make test-all (time budget)
def test_tensor_parallel_matches_single_process(tmp_path: Path) -> None:
    _check_rc(spawn(EXAMPLES / "tensor_parallel.py", "--compare", out=tmp_path, timeout=240))
    _assert_same_losses(tmp_path, "tensor_parallel", 1e-4)


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_dcp_save_on_2_load_on_1(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt_root"
    ckpt.mkdir()
    _check_rc(spawn(SCRIPTS / "dcp.py", "save", str(ckpt), out=tmp_path, timeout=240))
    assert _read(tmp_path, "rank0.json") == {"saved": True, "sharded": True}
    _check_rc(spawn(SCRIPTS / "dcp.py", "load", str(ckpt), nproc=1, out=tmp_path))
    res = _read(tmp_path, "rank0.json")
    assert res["loaded"] and res["on_tpu"] and res["mismatched"] == []


@pytest.mark.slow
def test_ray_example_matches_single_process(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "ray_train.py"), "--compare"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    _check_rc([(p.returncode, p.stdout + p.stderr)])
    res = _read(tmp_path, "ray_train_rank0.json")
    assert len(res["losses"]) == 10 and res["max_diff"] <= 1e-4, res


# -- failures ---------------------------------------------------------------------------------------
def _errors(out: Path, ranks: list[int]) -> list[dict]:
    return [_read(out, f"rank{r}.json") for r in ranks]


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_mismatched_shapes_name_the_collective_and_shapes(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "failures.py", "shapes", out=tmp_path))
    for res in _errors(tmp_path, [0, 1]):
        msg = res["error"]
        assert msg.startswith("DistributedError") and "all_reduce" in msg
        assert "rank 0: all_reduce: sum float32[4, 4]" in msg and "rank 1: all_reduce: sum float32[4, 5]" in msg


@pytest.mark.slow
def test_mismatched_collectives_name_both(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "failures.py", "kinds", out=tmp_path))
    for res in _errors(tmp_path, [0, 1]):
        assert "rank 0: all_reduce" in res["error"] and "rank 1: broadcast" in res["error"]


@pytest.mark.slow  # make test-all (make test stays within 15 minutes)
def test_hung_peer_times_out_with_the_group_timeout(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "failures.py", "hang", out=tmp_path, TORCHTPU_TEST_TIMEOUT="3"))
    res = _read(tmp_path, "rank0.json")
    assert res["error"].startswith("DistributedError") and "all_reduce" in res["error"] and "timed out after 3s" in res["error"]
    assert res["seconds"] < 30  # it fails at the group's timeout, not never


def test_dead_peer_fails_the_collective(tmp_path: Path) -> None:
    results = spawn(SCRIPTS / "failures.py", "dead", out=tmp_path, TORCHTPU_TEST_TIMEOUT="20")
    assert results[0][0] == 0, results[0][1][-3000:]
    res = _read(tmp_path, "rank0.json")
    assert res["error"] is not None and res["error"].startswith("DistributedError") and "all_reduce" in res["error"], res
    # the cross-rank check failed before gloo wrote anything: the tensor keeps its value
    assert res["then_error"] is None, res


@pytest.mark.slow  # make test-all (session 55: make test ran 850-914 s of its 900); test_dead_peer_fails_the_collective stays
def test_dead_peer_loses_the_value_written_in_place(tmp_path: Path) -> None:
    """Without the check, gloo itself fails while reducing in the tensor's own buffer (the
    cpu platform's in-place all_reduce): reading the tensor then raises, naming that
    failure, instead of returning a half-reduced value."""
    results = spawn(SCRIPTS / "failures.py", "dead", out=tmp_path, TORCHTPU_TEST_TIMEOUT="20", TORCHTPU_DIST_CHECK="0")
    assert results[0][0] == 0, results[0][1][-3000:]
    res = _read(tmp_path, "rank0.json")
    assert res["error"] is not None and res["error"].startswith("DistributedError") and "all_reduce" in res["error"], res
    assert res["then_error"] is not None and res["then_error"].startswith("TpuError"), res
    assert "collective that was writing this tensor in place failed" in res["then_error"], res


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_absent_peer_fails_init_with_timeout(tmp_path: Path) -> None:
    _check_rc(spawn(SCRIPTS / "failures.py", "absent", nproc=1, world=2, out=tmp_path, TORCHTPU_TEST_TIMEOUT="3"))
    res = _read(tmp_path, "rank0.json")
    assert res["error"] is not None and "Timed out" in res["error"] and res["seconds"] < 30


# -- in-process (no peers needed) ----------------------------------------------------------------------
def test_backend_registered_at_import() -> None:
    import torch.distributed as dist

    assert "TPU" in dist.Backend._plugins
    assert dist.Backend.default_device_backend_map.get("tpu") == "tpu"


def _on_cpu_and_tpu(script: Path, tmp_path: Path) -> dict[str, list[dict]]:
    """``torchrun --nproc-per-node=2 script cpu``, then ``... tpu``: each device's rank reports."""
    results = {}
    for device in ("cpu", "tpu"):
        out = tmp_path / device
        out.mkdir()
        torchrun(script, device, out=out)
        results[device] = [_read(out, f"rank{r}.json") for r in range(2)]
    return results


@pytest.mark.slow  # two torchrun launches (25 s)
def test_compiled_ddp_with_several_buckets_trains_as_gloo(tmp_path: Path) -> None:
    """torch.compile of a DDP model whose parameters fill several buckets (Dynamo's
    DDPOptimizer splits the graph at each): the losses and weights of the same DDP model
    uncompiled on gloo."""
    results = _on_cpu_and_tpu(SCRIPTS / "ddp_compiled.py", tmp_path)
    for cpu, tpu in zip(results["cpu"], results["tpu"]):
        assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-5)  # measured 1.6e-7
        for a, e in zip(tpu["weights"], cpu["weights"]):
            assert a == pytest.approx(e, rel=1e-4, abs=1e-5)  # measured 3.7e-7


def assert_ddp_options_train_as_gloo(out: Path) -> None:
    for rank in range(2):
        res = _read(out, f"rank{rank}.json")
        cpu, tpu = res["cpu"], res["tpu"]
        assert tpu["empty"] == cpu["empty"] == {"shapes": [[0], [0, 3], [0]], "strides": [[1], [3, 1]]}
        assert tpu["nested"] == cpu["nested"] == [[5.0, 5.0, 5.0], 4.0 * (1 << 17)]
        for case in ("find_unused", "static_graph", "bucket_view", "small_buckets", "fp16_hook", "powersgd", "zero", "join"):
            assert len(tpu[case]["losses"]) == (5 if case != "join" else 5 - 2 * rank)
            assert tpu[case]["losses"] == pytest.approx(cpu[case]["losses"], rel=1e-5), case  # measured 2.4e-7 abs
            for a, e in zip(tpu[case]["weights"], cpu[case]["weights"]):
                assert a == pytest.approx(e, rel=1e-4, abs=1e-5), case  # measured 2.1e-7


def test_ddp_options_and_comm_hooks_train_as_gloo_does(tmp_path: Path) -> None:
    """DDP's options (unused parameters, static graph, gradients as bucket views, one
    gradient per bucket), the fp16 and PowerSGD communication hooks, ZeroRedundancyOptimizer
    and Join with uneven inputs, each trained on tpu and on CPU tensors through gloo in one
    ``cpu:gloo,tpu:tpu`` job. PowerSGD's all_reduce of an empty tensor (the biases' flat
    bucket when a bucket holds only matrices) used to fail: the host view of an empty
    buffer had a zero stride, which ``Tensor.view(torch.uint8)`` refuses. A callback that
    all_reduces again and waits (PowerSGD does) hung past 64 KB: the wait was queued
    behind the callback on the transport's thread."""
    _check_rc(spawn(SCRIPTS / "ddp_options.py", out=tmp_path, timeout=180))
    assert_ddp_options_train_as_gloo(tmp_path)


@pytest.mark.slow  # one launch (15 s); the eager run above is in make test
def test_ddp_options_and_comm_hooks_under_defer_and_fuse(tmp_path: Path) -> None:
    """The same under DeferAndFuse. The callback's ``second.sum()`` read the value before
    its all_reduce: the callback's pending graph had read ``second`` earlier, and the
    collective's result, stored outside the graph, was not seen by the graph's later ops."""
    _check_rc(spawn(SCRIPTS / "ddp_options.py", out=tmp_path, timeout=180, TORCHTPU_DEFER_AND_FUSE="1"))
    assert_ddp_options_train_as_gloo(tmp_path)


def assert_fsdp_options_train_as_gloo(out: Path) -> None:
    for rank in range(2):
        res = _read(out, f"rank{rank}.json")
        assert res["tpu"].keys() == res["cpu"].keys()
        for case, cpu in res["cpu"].items():
            tpu = res["tpu"][case]
            assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-5), case  # measured 2.4e-7 abs
            assert tpu["sums"].keys() == cpu["sums"].keys()
            for name, value in cpu["sums"].items():
                assert tpu["sums"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), (case, name)  # measured 8.9e-7


@pytest.mark.slow  # one launch, 16 trainings (25 s)
def test_fsdp2_options_and_loss_parallel_train_as_gloo_does(tmp_path: Path) -> None:
    """FSDP2 without resharding after forward, with gradient accumulation through
    ``set_requires_gradient_sync``, CPU offload, activation checkpointing and gradient
    clipping, and tensor parallelism with ``loss_parallel``: tpu against gloo on CPU
    tensors in one ``cpu:gloo,tpu:tpu`` job."""
    _check_rc(spawn(SCRIPTS / "fsdp_options.py", out=tmp_path, timeout=240))
    assert_fsdp_options_train_as_gloo(tmp_path)


@pytest.mark.slow  # two torchrun launches (15 s)
def test_object_collectives_and_no_sync_accumulation_match_gloo(tmp_path: Path) -> None:
    """all_gather_object, broadcast_object_list, gather_object and scatter_object_list (what
    evaluation loops and accelerate's gather_object use) deliver what gloo delivers, and DDP's
    ``no_sync`` gradient accumulation trains to gloo's losses and weights."""
    results = _on_cpu_and_tpu(SCRIPTS / "objects_and_no_sync.py", tmp_path)
    for cpu, tpu in zip(results["cpu"], results["tpu"]):
        assert tpu["objects"] == cpu["objects"]
        assert tpu["accumulate"]["losses"] == pytest.approx(cpu["accumulate"]["losses"], rel=1e-5)
        for a, e in zip(tpu["accumulate"]["weights"], cpu["accumulate"]["weights"]):
            assert a == pytest.approx(e, rel=1e-4, abs=1e-6)
    assert results["tpu"][0]["objects"]["at_root"] == [["tuple", 0], ["tuple", 1]]
    assert [r["objects"]["scattered"] for r in results["tpu"]] == [["for 0"], ["for 1"]]


@pytest.mark.slow  # two torchrun launches (16 s); test_device.py checks the alias in one process
def test_the_cuda_ddp_recipe_with_local_rank_devices_runs_unchanged(tmp_path: Path) -> None:
    """PyTorch's DDP tutorial on tpu: ``torch.tpu.set_device(local_rank)``, the model on
    ``tpu:LOCAL_RANK``, ``DDP(model, device_ids=[local_rank], output_device=local_rank)``.
    Rank 1 raised "device index 1 is not available"; tpu:LOCAL_RANK now names the process's
    one device (tensors report tpu:0), and the losses and weights are gloo's on the CPU."""
    results = _on_cpu_and_tpu(SCRIPTS / "cuda_recipe.py", tmp_path)
    for cpu, tpu in zip(results["cpu"], results["tpu"]):
        assert (tpu["device"], tpu["generator"]) == ("tpu:0", "tpu:0")
        assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-5)
        for a, e in zip(tpu["weights"], cpu["weights"]):
            assert a == pytest.approx(e, rel=1e-4, abs=1e-6)


@pytest.mark.slow  # two torchrun launches (make test-all); test_hf_stack.py checks the set-up in one process
def test_hugging_face_trainer_under_torchrun_trains_ddp_as_on_the_cpu(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node=2`` of a Trainer script: accelerate initialises the "tpu"
    process group and DDP, and the losses and weights are those of the same script on the
    CPU (gloo). Before, accelerate found no distributed set-up for tpu: each rank trained
    alone as process 0 of 1, on data it did not share."""
    results = _on_cpu_and_tpu(SCRIPTS / "hf_trainer.py", tmp_path)
    for r, res in enumerate(results["tpu"]):
        assert (res["backend"], res["world_size"], res["process_index"], res["device"]) == ("tpu", 2, r, "tpu:0"), res
    cpu, tpu = results["cpu"][0], results["tpu"][0]
    assert len(tpu["losses"]) == 3
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-5)
    assert tpu["weights"] == pytest.approx(cpu["weights"], rel=1e-4, abs=1e-6)


@pytest.mark.slow  # two torchrun launches of 2 processes (about 25 s); test_lightning.py keeps one device in make test
def test_lightning_under_torchrun_trains_as_on_the_cpu(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node=2`` of a Lightning ``Trainer`` and a ``Fabric`` loop,
    both ``strategy="ddp"``, a ``Trainer`` with ``ModelParallelStrategy`` (FSDP2 of a module
    built on the CPU) and one with ``strategy="fsdp"`` (FSDP1; Lightning refused it on any
    accelerator but a GPU): the "tpu" process group, each rank on tpu:0, and the losses of
    the same script on the CPU (gloo; DDP where Lightning refuses FSDP on the CPU). Before, Lightning's DDP passed the tpu device to
    ``init_process_group(device_id=...)``, which torchtpu's group refused ("No backend type
    associated with device type tpu"), and built the model in a ``torch.cuda.Stream``;
    ``fully_shard`` refused to move the CPU module (``param.data = param.to("tpu")``)."""
    pytest.importorskip("lightning")
    results = _on_cpu_and_tpu(SCRIPTS / "lightning_torchrun.py", tmp_path)
    for r, res in enumerate(results["tpu"]):
        for run, strategy in (("trainer", "DDPStrategy"), ("sharded", "ModelParallelStrategy"), ("fsdp1", "FSDPStrategy")):
            got = res[run]
            assert (got["strategy"], got["backend"], got["world_size"], got["rank"], got["device"]) == (strategy, "tpu", 2, r, "tpu:0"), got
        assert (res["fabric"]["device"], res["fabric"]["world_size"]) == ("tpu:0", 2)
    cpu, tpu = results["cpu"][0], results["tpu"][0]
    for run, steps in (("trainer", 4), ("fabric", 2), ("sharded", 4), ("fsdp1", 4)):
        assert len(tpu[run]["losses"]) == steps
        assert tpu[run]["losses"] == pytest.approx(cpu[run]["losses"], rel=1e-5), run


def test_init_process_group_with_a_device_id(tmp_path: Path) -> None:
    """``init_process_group("tpu", device_id=torch.device("tpu", 0))``, the eager form
    Lightning and torchtitan use, then a new group and a ``DeviceMesh`` from it. Before,
    c10d asked the group for the device's backend and got "No backend type associated with
    device type tpu"."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        f"dist.init_process_group('tpu', init_method='file://{tmp_path}/store', rank=0, world_size=1, device_id=torch.device('tpu', 0))\n"
        "t = torch.ones(3, device='tpu')\n"
        "dist.all_reduce(t, group=dist.new_group([0]))\n"
        "dist.all_reduce(t, group=init_device_mesh('tpu', (1,)).get_group())\n"
        "assert torch.equal(t.cpu(), torch.ones(3)), t\n"
        "print('OK')\n"
        "dist.destroy_process_group()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr[-3000:]


@pytest.mark.parametrize("defer", ["0", "1"], ids=["eager", "defer_and_fuse"])
def test_single_process_group_collectives(tmp_path: Path, defer: str) -> None:
    """world_size 1: cheap coverage of the whole path, also with pending deferred work
    (a collective must run it first)."""
    code = (
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('tpu', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
        "t = torch.arange(6.0).reshape(2, 3).to('tpu') * 2 + 1\n"
        "dist.all_reduce(t, op=dist.ReduceOp.AVG)\n"
        "out = torch.zeros(2, 3, device='tpu'); dist.all_gather_into_tensor(out, t + 1)\n"
        "assert torch.equal(out.cpu(), torch.arange(6.0).reshape(2, 3) * 2 + 2), out\n"
        "print('OK', dist.get_backend())\n"
        "dist.destroy_process_group()\n"
    )
    env = dict(os.environ, TORCHTPU_DEFER_AND_FUSE=defer)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 0 and "OK tpu" in p.stdout, p.stdout + p.stderr[-3000:]


# -- asynchronous work ----------------------------------------------------------------------------
def assert_checks_ok(out: Path, nproc: int, count: int) -> None:
    for r in range(nproc):
        res = _read(out, f"rank{r}.json")
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad and len(res) == count, f"rank {r}: {bad}"


@pytest.mark.slow  # make test-all (session 55: make test ran 850-914 s of its 900); DDP stays in test_ddp_matches_single_process
def test_async_work_futures_and_ddp_comm_hook(tmp_path: Path) -> None:
    """async_op=True, get_future(), ordering against synchronous collectives, coalescing
    blocks, DDP with a Python comm hook (the host transport)."""
    torchrun(SCRIPTS / "async_work.py", out=tmp_path)
    assert_checks_ok(tmp_path, 2, 9)
