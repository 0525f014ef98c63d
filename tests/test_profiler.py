"""torch.profiler sees torchtpu's work: compiles (with the cache tier), executions, device
waits, DeferAndFuse flushes, transfers, host syncs and CPU fallbacks are named spans in the
Chrome trace and in key_averages(), nested in the user's record_function scopes, in all
three execution modes; ``torchtpu.profiler.trace`` adds XLA's own device trace."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

import torchtpu
import torchtpu.profiler
from torchtpu import _spans
from torchtpu.eager import dispatch
from torchtpu.runtime import cache
from torchtpu.runtime.profiler import read_xspace

TPU = "tpu"


def _mlp(d_in: int, hidden: int, d_out: int) -> tuple[nn.Module, nn.Module]:
    """A Linear-ReLU-Linear MLP on tpu and the same on the CPU (sizes no other test uses,
    so its programs are new to this process)."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    return copy.deepcopy(cpu).to(TPU), cpu


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _profiled_step(model: nn.Module, cpu: nn.Module, d_in: int, d_out: int, tmp_path) -> tuple[list[dict], profile]:
    """One SGD step under the profiler inside a "train_step" scope; checks the loss and the
    updated weights against the same step on the CPU. Returns the Chrome trace's spans."""
    g = torch.Generator().manual_seed(1)
    xc, yc = torch.randn(6, d_in, generator=g), torch.randn(6, d_out, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("train_step"):
            x, y = xc.to(TPU), yc.to(TPU)
            loss = _step(model, opt, x, y).item()
    expected = _step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1), xc, yc).item()
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1.3e-6, atol=1e-5)
    return _spans_of(prof, tmp_path), prof


def _spans_of(prof: profile, tmp_path) -> list[dict]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def _named(events: list[dict], prefix: str) -> list[dict]:
    return [e for e in events if e["name"].startswith(prefix)]


def _inside(inner: dict, outer: dict) -> bool:
    """``inner`` runs within ``outer`` on the same thread (the trace's nesting)."""
    return (
        inner["tid"] == outer["tid"]
        and inner["ts"] >= outer["ts"]
        and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3
    )


def _check_transfers_and_sync(events: list[dict], d_in: int, d_out: int) -> None:
    (step,) = _named(events, "train_step")
    h2d = _named(events, "torchtpu::h2d")
    assert sorted(e["args"]["bytes"] for e in h2d) == sorted([6 * d_in * 4, 6 * d_out * 4])
    (sync,) = _named(events, "torchtpu::host_sync")
    assert sync["name"] == "torchtpu::host_sync (.item())" and sync["args"]["cause"] == ".item()"
    (d2h,) = _named(events, "torchtpu::d2h")
    assert d2h["args"]["bytes"] == 4  # the float32 loss
    assert _inside(d2h, sync)
    for e in [*h2d, sync]:  # the user's scope nests around ours
        assert _inside(e, step)


def _key_names(prof: profile) -> set[str]:
    return {e.key for e in prof.key_averages()}


def test_eager_mlp_step_spans(tmp_path):
    model, cpu = _mlp(11, 23, 5)
    events, prof = _profiled_step(model, cpu, 11, 5, tmp_path)
    _check_transfers_and_sync(events, 11, 5)
    compiles = _named(events, "torchtpu::compile (compiled)")
    programs = {e["args"]["program"].split(" [")[0] for e in compiles}
    assert {"aten::addmm", "aten::relu", "aten::mse_loss", "aten::mm"} <= programs
    assert all(e["args"]["tier"] == "compiled" for e in compiles)
    # each forward compile runs inside its ATen op's span (on the calling thread)
    (addmm_compile, *_) = [e for e in compiles if e["args"]["program"].startswith("aten::addmm")]
    assert any(_inside(addmm_compile, op) for op in _named(events, "aten::addmm"))
    executes = _named(events, "torchtpu::execute")
    assert len(executes) >= 10 and {e["args"]["program"] for e in executes} >= {"aten_addmm", "aten_relu"}
    assert {"train_step", "torchtpu::execute", "torchtpu::compile (compiled)", "torchtpu::h2d", "torchtpu::d2h",
            "torchtpu::host_sync (.item())"} <= _key_names(prof)  # fmt: skip


def test_defer_and_fuse_mlp_step_spans(tmp_path):
    model, cpu = _mlp(11, 23, 6)
    with torchtpu.eager_mode("defer_and_fuse"):
        events, prof = _profiled_step(model, cpu, 11, 6, tmp_path)
    _check_transfers_and_sync(events, 11, 6)
    # forward, backward and the SGD update are one graph, run when .item() needs the loss
    (flush,) = _named(events, "torchtpu::flush")
    assert flush["name"] == "torchtpu::flush (item)" and flush["args"]["ops"] > 10
    # the fused graph compiles and runs inside its flush
    (compile_span,) = [e for e in _named(events, "torchtpu::compile") if _inside(e, flush)]
    assert compile_span["args"]["program"].startswith("fused graph of ")
    (execute,) = [e for e in _named(events, "torchtpu::execute") if _inside(e, flush)]
    assert execute["args"]["program"].startswith("fused_graph_of_")
    assert {"torchtpu::flush (item)", "torchtpu::execute", "torchtpu::compile (compiled)"} <= _key_names(prof)


def test_compiled_mlp_step_spans(tmp_path):
    # Dynamo keys its shape history by code object: an earlier test of this worker that
    # compiled nn.Sequential.forward at two batch sizes would make this batch dim dynamic,
    # and bounded dynamism's padded uploads would add h2d spans the check below counts
    torch._dynamo.reset()
    model, cpu = _mlp(11, 23, 7)
    compiled = torch.compile(model, backend="tpu")
    g = torch.Generator().manual_seed(1)
    xc, yc = torch.randn(6, 11, generator=g), torch.randn(6, 7, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("train_step"):
            x, y = xc.to(TPU), yc.to(TPU)
            loss = _step(compiled, opt, x, y).item()
    assert loss == pytest.approx(_step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1), xc, yc).item(), rel=1e-5)
    events = _spans_of(prof, tmp_path)
    _check_transfers_and_sync(events, 11, 7)
    programs = {e["args"]["program"].split(" [")[0] for e in _named(events, "torchtpu::compile (compiled)")}
    assert any(p.startswith("compiled graph forward") for p in programs), programs
    assert any(p.startswith("compiled graph backward") for p in programs), programs
    executed = {e["args"]["program"] for e in _named(events, "torchtpu::execute")}
    assert any(p.startswith("compiled_graph_forward") for p in executed)
    assert {"torchtpu::execute", "torchtpu::compile (compiled)"} <= _key_names(prof)


def test_spans_without_record_shapes_and_cache_tiers(tmp_path):
    """The default profile() shows the spans by name (the tier is in it); a program found
    in memory or on disk says so."""
    x = torch.full((3, 17), 2.0, device=TPU)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x * 3).cpu()  # new: compiled by XLA
        dispatch.clear_cache()  # forget eager's keys: the next call finds the program in memory
        (x * 3).cpu()
        dispatch.clear_cache()
        cache.clear_memory()  # ... and on disk
        (x * 3).cpu()
    names = [e["name"] for e in _spans_of(prof, tmp_path) if e["name"].startswith("torchtpu::compile")]
    assert names == ["torchtpu::compile (compiled)", "torchtpu::compile (memory)", "torchtpu::compile (disk)"]
    assert "torchtpu::host_sync (.cpu() / print)" in _key_names(prof)


def test_device_timing_waits_in_its_own_span(tmp_path):
    x = torch.ones(4, 19, device=TPU)
    torchtpu.profiler.device_timing(True)
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            y = torch.relu(x - 0.5) * 2
    finally:
        torchtpu.profiler.device_timing(False)
    events = _spans_of(prof, tmp_path)
    executes, waits = _named(events, "torchtpu::execute"), _named(events, "torchtpu::device_wait")
    assert len(executes) == len(waits) >= 2
    for ex, wait in zip(sorted(executes, key=lambda e: e["ts"]), sorted(waits, key=lambda e: e["ts"])):
        assert wait["ts"] >= ex["ts"] + ex["dur"] - 1e-3 and wait["args"]["program"] == ex["args"]["program"]
    assert torch.equal(y.cpu(), torch.relu(torch.ones(4, 19) - 0.5) * 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.relu(x - 0.5).cpu()
    assert not _named(_spans_of(prof, tmp_path), "torchtpu::device_wait")


def test_cpu_fallback_and_data_dependent_sync_spans(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")

    @torch.library.custom_op("profiler_test::twice", mutates_args=(), device_types="cpu")
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.arange(6.0, device=TPU)
    with pytest.warns(UserWarning, match="no tpu lowering"):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            y = twice(x)
            picked = x[x > 2]
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0] and picked.cpu().tolist() == [3.0, 4.0, 5.0]
    events = _spans_of(prof, tmp_path)
    (fallback,) = _named(events, "torchtpu::cpu_fallback")
    assert fallback["name"] == "torchtpu::cpu_fallback (profiler_test::twice)"
    assert fallback["args"]["op"] == "profiler_test::twice"
    assert any(_inside(e, fallback) for e in _named(events, "torchtpu::d2h"))  # its copies are inside it
    assert any(_inside(e, fallback) for e in _named(events, "torchtpu::h2d"))
    (sync,) = [e for e in _named(events, "torchtpu::host_sync") if "nonzero" in e["name"]]
    assert sync["args"]["cause"] == "aten::nonzero (data-dependent shape)"


def test_no_span_is_made_without_a_profiler(monkeypatch):
    """Off, every event is one flag test: opening a span would raise here."""

    def boom(*args, **kwargs):
        raise AssertionError("a span was opened without a profiler")

    monkeypatch.setattr(_spans, "_RecordFunctionFast", boom)
    x = torch.ones(2, 21).to(TPU)
    (x + 1).sum().item()
    with torchtpu.eager_mode("defer_and_fuse"):
        (x * 5).cpu()


def test_metrics_report_covers_syncs_and_tiers():
    torchtpu.metrics.reset()
    x = torch.ones(5, 23, device=TPU)
    (x * 7).sum().item()
    x[x > 0].cpu()
    snap = torchtpu.metrics.snapshot()
    assert snap["host_syncs"] == 3 and snap["host_syncs_by_cause"] == {
        ".item()": 1,
        ".cpu() / print": 1,
        "aten::nonzero (data-dependent shape)": 1,
    }
    text = torchtpu.metrics.report(file=open("/dev/null", "w"))
    for row in ("host_syncs", "memory_cache_hits", "disk_cache_hits", "compiles", "  host syncs: .item()"):
        assert row in text


def test_trace_writes_xla_device_trace(tmp_path):
    a = torch.randn(7, 31).to(TPU)
    b = torch.randn(31, 3).to(TPU)
    with torchtpu.profiler.trace(tmp_path) as t:
        with record_function("matmul"):
            out = (a @ b).cpu()
    torch.testing.assert_close(out, a.cpu() @ b.cpu())
    assert t.run_dir.parent == tmp_path / "plugins" / "profile"
    assert t.xplane.name.endswith(".xplane.pb") and t.xplane.parent == t.run_dir
    # the Chrome trace next to it has our spans
    chrome = json.loads(t.chrome_trace.read_text())["traceEvents"]
    assert any(e.get("name") == "torchtpu::execute" and e["args"].get("program") == "aten_mm" for e in chrome)
    # XLA's own trace: the program ran on XLA's CPU runtime, instruction by instruction
    events = read_xspace(t.xplane)
    ours = [e for e in events if e.stats.get("hlo_module") == "aten_mm"]
    assert ours and all(e.stats.get("hlo_op") == e.name and e.duration_ns > 0 for e in ours), ours
    # events of the host-side XLA CPU runtime (this platform has no separate device plane)
    assert all(e.plane == "/host:CPU" for e in ours)
    assert any("Execute" in e.name for e in events if e.plane.startswith("/host:CPU"))
    assert "torchtpu::execute" in {e.key for e in t.profile.key_averages()}


def test_trace_waits_for_the_programs_the_block_enqueued(tmp_path):
    """A program still running when the block ends (nothing read its result) is in XLA's
    trace: trace() waits for the device before it stops the session."""
    a = torch.randn(512, 512).to(TPU)
    (a @ a).cpu()  # compiled and warm
    with torchtpu.profiler.trace(tmp_path) as t:
        b = a @ a  # enqueued, never read inside the block
    assert "aten_mm" in {e.stats.get("hlo_module") for e in read_xspace(t.xplane)}
    assert b.shape == (512, 512)
