"""Profiling and debugging: torch.profiler spans, XLA's device trace, metrics, explain() and compare_with_cpu().

marimo edit docs/notebooks/07_profiling_and_debugging.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Profiling and debugging

        torchtpu works with the standard PyTorch tools and adds a few of its own:

        | question | tool |
        |---|---|
        | where does a step's time go? | `torch.profiler`: every compile, execution, DeferAndFuse flush, transfer and host sync is a `torchtpu::` span |
        | how long did the device work? | `torchtpu.profiler.device_timing(True)` |
        | what did XLA run, instruction by instruction? | `torchtpu.profiler.trace(logdir)`: XLA's own device trace next to the torch.profiler one |
        | how many programs, syncs, bytes? | `torchtpu.metrics.report()` |
        | why did it compile again, why did it wait? | `torchtpu.debug.explain()` |
        | which layer first differs from the CPU? | `torchtpu.debug.compare_with_cpu(model, x)` |

        Every cell checks what it shows: the spans the profiler recorded, the files the trace
        wrote, the causes `explain()` names, the module `compare_with_cpu` blames, and the
        losses of every profiled step against PyTorch on the CPU. `docs/debugging.md` is the
        reference.
        """
    )
    return (mo,)


@app.function
def md_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table (for mo.md)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The setup

    A small MLP trained with SGD on a mean-squared-error loss, three steps per run, each
    step inside a `record_function("train_step")` scope. `profiled_steps(mode)` runs them
    under `torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True)`
    in one of the three execution modes (notebook 02) and returns the profiler and the
    losses; `cpu_losses()` is the same loop on the CPU.

    A compile span says which cache tier served the program: `compiled` (by XLA),
    `disk` (the disk cache, `TORCHTPU_CACHE_DIR`) or `memory` (already built in this
    process). So that this notebook shows XLA compiling, whatever ran before on this
    machine, it turns the disk cache off first (`TORCHTPU_CACHE_DIR=""`; the variable is
    read at each compile). Each mode uses its own output width, so its programs are new
    to the process.
    """)
    return


@app.cell
def _():
    import copy
    import json
    import os
    import tempfile
    from pathlib import Path

    # no disk cache: the first use of each program is compiled by XLA (see above)
    os.environ["TORCHTPU_CACHE_DIR"] = ""

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.autograd.profiler_util import EventList
    from torch.profiler import ProfilerActivity, profile, record_function

    import torchtpu
    import torchtpu.profiler

    D_IN, HIDDEN, BATCH, LR, STEPS = 32, 64, 16, 0.1, 3
    OUT = {"eager": 10, "defer_and_fuse": 11, "compiled": 12}  # one output width per mode

    def make_mlp(d_out: int) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, d_out))

    def make_data(d_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, d_out, generator=g)

    def train_step(forward, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        return loss

    def cpu_losses(d_out: int) -> list[float]:
        model = make_mlp(d_out)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = make_data(d_out)
        return [train_step(model, opt, x, y).item() for _ in range(STEPS)]

    def profiled_steps(mode: str, d_out: int) -> tuple[profile, list[float]]:
        """STEPS training steps on tpu in ``mode`` under torch.profiler; the profiler and the losses."""
        torch._dynamo.reset()
        model = make_mlp(d_out).to("tpu")
        forward = torch.compile(model, backend="tpu") if mode == "compiled" else model
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        xc, yc = make_data(d_out)
        losses = []
        with torchtpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "eager"):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(STEPS):
                    with record_function("train_step"):
                        x, y = xc.to("tpu"), yc.to("tpu")
                        losses.append(train_step(forward, opt, x, y).item())
        return prof, losses

    def torchtpu_rows(prof: profile) -> EventList:
        """key_averages() restricted to our spans and the user's train_step scope."""
        rows = [e for e in prof.key_averages() if e.key.startswith("torchtpu::") or e.key == "train_step"]
        return EventList(rows)

    def span_counts(prof: profile) -> dict[str, int]:
        return {e.key: e.count for e in prof.key_averages() if e.key.startswith("torchtpu::")}

    def chrome_spans(prof: profile, directory: str) -> list[dict]:
        """The complete events ("X") of the profiler's Chrome trace, with their args."""
        path = Path(directory) / "trace.json"
        prof.export_chrome_trace(str(path))
        return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]

    def assert_losses(actual: list[float], expected: list[float]) -> None:
        """float32 losses equal up to PyTorch's float32 tolerance (item() gives Python floats)."""
        torch.testing.assert_close(torch.tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32))

    return (
        BATCH,
        D_IN,
        OUT,
        ProfilerActivity,
        Path,
        assert_losses,
        chrome_spans,
        copy,
        cpu_losses,
        json,
        make_data,
        make_mlp,
        nn,
        profile,
        profiled_steps,
        record_function,
        span_counts,
        tempfile,
        torch,
        torchtpu,
        torchtpu_rows,
        train_step,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Eager under torch.profiler

    In eager mode every op is its own program: the first step compiles one per op
    (`torchtpu::compile (compiled)`), every op of every step enqueues one
    (`torchtpu::execute`, the enqueue only: execution is asynchronous), the batch is
    copied to the device (`torchtpu::h2d`) and `loss.item()` waits for the device
    (`torchtpu::host_sync (.item())`, around its `torchtpu::d2h`). The spans nest inside
    the ATen ops and inside your own `record_function` scopes; `key_averages()` groups
    them by name. The table below is `key_averages().table()` of the torchtpu rows and
    the `train_step` scope.
    """)
    return


@app.cell
def _(OUT, assert_losses, cpu_losses, profiled_steps, span_counts, torchtpu_rows):
    eager_prof, _losses = profiled_steps("eager", OUT["eager"])
    assert_losses(_losses, cpu_losses(OUT["eager"]))
    eager_counts = span_counts(eager_prof)
    for _name in (
        "torchtpu::compile (compiled)",
        "torchtpu::execute",
        "torchtpu::h2d",
        "torchtpu::d2h",
        "torchtpu::host_sync (.item())",
    ):
        assert _name in eager_counts, (_name, eager_counts)
    assert eager_counts["torchtpu::h2d"] == 2 * 3  # x and y, three steps
    assert eager_counts["torchtpu::host_sync (.item())"] == 3
    # the ops of steps 2 and 3 reuse step 1's programs: executions outnumber compiles
    assert eager_counts["torchtpu::execute"] >= 2 * eager_counts["torchtpu::compile (compiled)"]
    print(torchtpu_rows(eager_prof).table(sort_by="cpu_time_total", row_limit=20))
    return eager_counts, eager_prof


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Span arguments need `record_shapes=True`

    Each span carries arguments: the program and cache tier of a compile, the program
    of an execute (its HLO module name, as XLA's own trace shows it), the bytes of a
    transfer, the cause of a host sync. PyTorch records a span's arguments only under
    `profile(record_shapes=True)`; they show in the Chrome trace
    (`prof.export_chrome_trace(path)`, open it in Perfetto or `chrome://tracing`).
    """)
    return


@app.cell
def _(
    BATCH,
    D_IN,
    OUT,
    ProfilerActivity,
    chrome_spans,
    eager_prof,
    profile,
    tempfile,
    torch,
):
    with tempfile.TemporaryDirectory() as _tmp:
        _events = chrome_spans(eager_prof, _tmp)
        _spans = [e for e in _events if e["name"].startswith("torchtpu::")]
        _x = torch.ones(3, 5, device="tpu")
        with profile(activities=[ProfilerActivity.CPU]) as _bare:  # record_shapes=False
            (_x * 2).cpu()
        _bare_spans = [e for e in chrome_spans(_bare, _tmp) if e["name"].startswith("torchtpu::")]

    _h2d = sorted(e["args"]["bytes"] for e in _spans if e["name"] == "torchtpu::h2d")
    assert _h2d == sorted([BATCH * D_IN * 4, BATCH * OUT["eager"] * 4] * 3), _h2d  # float32 x and y
    _compiles = [e for e in _spans if e["name"] == "torchtpu::compile (compiled)"]
    assert all(e["args"]["tier"] == "compiled" for e in _compiles)
    assert any(e["args"]["program"].startswith("aten::addmm") for e in _compiles)
    # without record_shapes the spans are there, their arguments are not
    assert {e["name"] for e in _bare_spans} >= {"torchtpu::execute", "torchtpu::d2h"}
    assert not any("program" in e["args"] or "bytes" in e["args"] for e in _bare_spans)

    def _inside(inner: dict, outer: dict) -> bool:
        """The trace's nesting: ``inner`` runs within ``outer`` on the same thread."""
        return (
            inner["tid"] == outer["tid"]
            and outer["ts"] <= inner["ts"] <= inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
        )

    # the user's scopes nest around ours: every transfer and sync is inside a train_step
    _steps = [e for e in _events if e["name"] == "train_step"]
    _io = [e for e in _spans if e["name"] in ("torchtpu::h2d", "torchtpu::d2h", "torchtpu::host_sync (.item())")]
    assert len(_steps) == 3 and all(any(_inside(e, s) for s in _steps) for e in _io)

    _ours = ("program", "tier", "bytes", "cause")  # the trace's own keys (External id, ...) left out
    print("the first span of each kind, with record_shapes=True:")
    for _name in ("torchtpu::compile (compiled)", "torchtpu::execute", "torchtpu::h2d", "torchtpu::host_sync (.item())"):
        _args = next(e for e in _spans if e["name"] == _name)["args"]
        _args = {k: v for k, v in _args.items() if k in _ours}
        print(f"  {_name:<30} {_args}")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## DeferAndFuse under torch.profiler

    Under DeferAndFuse the ops are recorded and the pending graph runs as one program:
    each run is a `torchtpu::flush (<reason>)` span (here `item`: the loss read at the
    end of each step), with the fused graph's compile and execute inside it. Forward,
    backward and the optimizer update are one graph: three steps run three programs.
    """)
    return


@app.cell
def _(OUT, assert_losses, cpu_losses, profiled_steps, span_counts, torchtpu_rows):
    defer_prof, _losses = profiled_steps("defer_and_fuse", OUT["defer_and_fuse"])
    assert_losses(_losses, cpu_losses(OUT["defer_and_fuse"]))
    defer_counts = span_counts(defer_prof)
    for _name in ("torchtpu::flush (item)", "torchtpu::compile (compiled)", "torchtpu::execute", "torchtpu::h2d"):
        assert _name in defer_counts, (_name, defer_counts)
    assert defer_counts["torchtpu::flush (item)"] == 3  # one fused program per step
    assert defer_counts["torchtpu::execute"] == 3, defer_counts
    print(torchtpu_rows(defer_prof).table(sort_by="cpu_time_total", row_limit=20))
    return (defer_counts,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## torch.compile under torch.profiler

    With `torch.compile(model, backend="tpu")` the forward and the backward are one
    program each (named `compiled_graph_forward…` / `compiled_graph_backward…`); the loss
    and SGD still run eagerly, op by op.
    """)
    return


@app.cell
def _(
    OUT,
    assert_losses,
    chrome_spans,
    cpu_losses,
    profiled_steps,
    span_counts,
    tempfile,
    torchtpu_rows,
):
    compiled_prof, _losses = profiled_steps("compiled", OUT["compiled"])
    assert_losses(_losses, cpu_losses(OUT["compiled"]))
    compiled_counts = span_counts(compiled_prof)
    for _name in ("torchtpu::compile (compiled)", "torchtpu::execute", "torchtpu::h2d", "torchtpu::host_sync (.item())"):
        assert _name in compiled_counts, (_name, compiled_counts)
    with tempfile.TemporaryDirectory() as _tmp:
        _executed = {e["args"]["program"] for e in chrome_spans(compiled_prof, _tmp) if e["name"] == "torchtpu::execute"}
    assert any(p.startswith("compiled_graph_forward") for p in _executed), _executed
    assert any(p.startswith("compiled_graph_backward") for p in _executed), _executed
    print(torchtpu_rows(compiled_prof).table(sort_by="cpu_time_total", row_limit=20))
    print("programs executed:", ", ".join(sorted(_executed)))
    return (compiled_counts,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Side by side

    Calls of each span in the three runs of three steps. DeferAndFuse and torch.compile
    run far fewer programs than eager; the host syncs and transfers are the same, since
    the loop is the same.
    """)
    return


@app.cell
def _(compiled_counts, defer_counts, eager_counts, mo):
    assert defer_counts["torchtpu::execute"] < compiled_counts["torchtpu::execute"] < eager_counts["torchtpu::execute"]
    for _counts in (defer_counts, compiled_counts):
        assert _counts["torchtpu::h2d"] == eager_counts["torchtpu::h2d"]
        assert _counts["torchtpu::host_sync (.item())"] == eager_counts["torchtpu::host_sync (.item())"]
    _names = sorted(set(eager_counts) | set(defer_counts) | set(compiled_counts))
    mo.md(
        md_table(
            ["span", "eager", "DeferAndFuse", "torch.compile"],
            [[f"`{n}`", eager_counts.get(n, 0), defer_counts.get(n, 0), compiled_counts.get(n, 0)] for n in _names],
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## How long the device worked: `device_timing(True)`

    `torchtpu::execute` only covers the enqueue. `torchtpu.profiler.device_timing(True)`
    makes every execution under a profiler wait for its results in a
    `torchtpu::device_wait` span, so the trace shows the device's time per program, at
    the cost of the overlap between host and device. It is a process-wide switch: turn it
    off again.
    """)
    return


@app.cell
def _(ProfilerActivity, profile, torch, torchtpu, torchtpu_rows):
    _cpu = torch.randn(256, 256)
    _x = _cpu.to("tpu")
    torchtpu.profiler.device_timing(True)
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as _prof:
            _y = torch.tanh(_x @ _x) * 2
            _out = _y.cpu()
    finally:
        torchtpu.profiler.device_timing(False)
    # a 256-term float32 sum differs between summation orders (XLA's and the CPU's BLAS), so
    # the check is against float64 within the dot's rounding-error bound, 256 * eps * (|x| @ |x|)
    # (tanh changes an error by at most its own size; * 2 doubles it)
    _exact = torch.tanh(_cpu.double() @ _cpu.double()) * 2
    _bound = 2 * 256 * torch.finfo(torch.float32).eps * (_cpu.abs() @ _cpu.abs()).double() + 1e-6
    assert ((_out.double() - _exact).abs() <= _bound).all()
    _counts = {e.key: e.count for e in _prof.key_averages()}
    assert _counts["torchtpu::device_wait"] == _counts["torchtpu::execute"] == 3, _counts  # mm, tanh, mul
    print(torchtpu_rows(_prof).table(sort_by="cpu_time_total", row_limit=10))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## XLA's own trace: `torchtpu.profiler.trace(logdir)`

    `with torchtpu.profiler.trace(logdir) as t:` runs torch.profiler (with
    `record_shapes=True`) together with XLA's profiler session (through jaxlib) and, at
    the end of the block, writes both traces TensorBoard-style:
    `<logdir>/plugins/profile/<run>/<host>.pt.trace.json` (torch.profiler's Chrome trace)
    and `<host>.xplane.pb` (XLA's XSpace: each program's execution and its HLO
    instructions). Open the directory with TensorBoard's profile plugin or XProf.
    `t.profile` is the torch profiler. Programs have the same names in both traces.

    End the block with `torch.tpu.synchronize()`: `trace()` stops XLA's session without
    waiting for the device, so a program still running then (here: the backward and the
    optimizer's, which `loss.item()` does not wait for) would be missing from
    `xplane.pb`.
    """)
    return


@app.cell
def _(
    OUT,
    Path,
    copy,
    json,
    make_data,
    make_mlp,
    mo,
    record_function,
    tempfile,
    torch,
    torchtpu,
    train_step,
):
    from torchtpu.runtime.profiler import read_xspace  # a parser of the .xplane.pb (torchtpu's tests use it)

    _model = make_mlp(OUT["eager"]).to("tpu")  # the eager run's shapes: its programs are built already
    _cpu_model = copy.deepcopy(_model).cpu()
    _xc, _yc = make_data(OUT["eager"])
    with tempfile.TemporaryDirectory() as _logdir:
        with torchtpu.profiler.trace(_logdir) as _t:
            with record_function("train_step"):
                _loss = train_step(_model, torch.optim.SGD(_model.parameters(), lr=0.1), _xc.to("tpu"), _yc.to("tpu"))
                _value = _loss.item()
            torch.tpu.synchronize()  # trace() does not wait for the device (see above)
        _files = sorted(p for p in Path(_logdir).rglob("*") if p.is_file())
        _sizes = [p.stat().st_size for p in _files]
        _listing = [[f"`{p.relative_to(_logdir)}`", f"{n:,}"] for p, n in zip(_files, _sizes)]
        _chrome = json.loads(_t.chrome_trace.read_text())["traceEvents"]
        _xla_events = read_xspace(_t.xplane)
    _expected = train_step(_cpu_model, torch.optim.SGD(_cpu_model.parameters(), lr=0.1), _xc, _yc).item()
    torch.testing.assert_close(torch.tensor(_value), torch.tensor(_expected))

    assert [p.parent for p in _files] == [_t.run_dir] * 2, _files
    assert sorted(p.name.split(".", 1)[1] for p in _files) == ["pt.trace.json", "xplane.pb"], _files
    assert all(n > 0 for n in _sizes), _sizes
    # the same program names in both traces: torch.profiler's execute spans, XLA's hlo_module
    _executed = {e["args"]["program"] for e in _chrome if e.get("name") == "torchtpu::execute"}
    _modules = {e.stats["hlo_module"] for e in _xla_events if "hlo_module" in e.stats}
    assert {"aten_addmm", "aten_mse_loss"} <= _executed, _executed
    assert _executed <= _modules, _executed - _modules
    assert "torchtpu::compile (compiled)" not in {e.key for e in _t.profile.key_averages()}  # built in the first run
    mo.md(
        "Files written:\n\n"
        + md_table(["file", "bytes"], _listing)
        + f"\n\nPrograms executed, by name in both traces: {', '.join(f'`{m}`' for m in sorted(_executed))}"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Counters: `torchtpu.metrics.report()`

    The same events as counters, whether or not a profiler runs: programs compiled and
    found in the memory or disk cache, executions, DeferAndFuse flushes by reason,
    transfers in bytes, host syncs by cause, CPU fallbacks by op.
    `torchtpu.metrics.snapshot()` returns them as a dict, `reset()` zeroes them and
    `report()` prints a table (and returns its text). One eager step with a
    `loss.item()` and a boolean-mask read (a data-dependent shape: the host must wait
    to learn the output's size):
    """)
    return


@app.cell
def _(OUT, make_data, make_mlp, torch, torchtpu, train_step):
    _model = make_mlp(OUT["eager"]).to("tpu")
    _xc, _yc = make_data(OUT["eager"])
    torchtpu.metrics.reset()
    _loss = train_step(_model, torch.optim.SGD(_model.parameters(), lr=0.1), _xc.to("tpu"), _yc.to("tpu"))
    _loss.item()
    _positive = _model[0].bias[_model[0].bias > 0]  # boolean-mask indexing: nonzero decides the size
    _text = torchtpu.metrics.report()
    _snap = torchtpu.metrics.snapshot()

    assert _snap["host_syncs_by_cause"] == {".item()": 1, "aten::nonzero (data-dependent shape)": 1}, _snap
    # x and y (float32), and the mask's indices (int64), which the host learned from nonzero:
    # they go up in a storage of 512 rows (the smallest size bucket), so that the ops that
    # read them compile once per bucket, not once per count (docs/compile.md, bounded dynamism)
    _n_positive = int((_model[0].bias.detach().cpu() > 0).sum())
    assert 0 < _n_positive <= 512
    assert _snap["h2d_bytes"] == (_xc.numel() + _yc.numel()) * 4 + 512 * 8, _snap
    assert _snap["executions"] > 10
    for _row in ("compiles", "executions", "h2d_bytes", "host syncs: .item()", "host syncs: aten::nonzero"):
        assert _row in _text, _row
    torch.testing.assert_close(_positive.cpu(), _model[0].bias.detach().cpu()[_model[0].bias.detach().cpu() > 0])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Why did it compile, why did it wait: `torchtpu.debug.explain()`

    `with torchtpu.debug.explaining():` records a block (or `TORCHTPU_EXPLAIN=1` records
    the whole run and prints the report at exit); `torchtpu.debug.explain()` prints the
    report and returns it. It groups every new program by cause (new op, new shape, new
    dtype, new strides, new static argument, new graph structure, Dynamo guard failure),
    lists every host sync and CPU fallback with the source line that caused it, and gives
    a line of advice per group.

    A loop whose batch grows by a row per step, and that reads the loss with `.item()`
    every step, builds new programs for every shape and waits for the device every step:
    """)
    return


@app.cell
def _(torch, torchtpu):
    from torchtpu.debug.explain import NEW_SHAPE

    def growing_loop(rows: list[int], pad_to: int | None = None) -> float:
        total = 0.0
        for n in rows:
            batch = torch.arange(n * 13, dtype=torch.float32).reshape(n, 13)
            if pad_to is not None:  # the fix: pad on the host to one size (zero rows do not change the sum)
                batch = torch.nn.functional.pad(batch, (0, 0, 0, pad_to - n))
            x = batch.to("tpu")
            total += x.square().sum().item()
        return total

    with torchtpu.debug.explaining():
        _total = growing_loop([3, 4, 5])
    shape_report = torchtpu.debug.explain()

    # integers below 2**24: float32 sums them exactly, in any order
    assert _total == sum(v * v for n in (3, 4, 5) for v in range(n * 13))
    _text = str(shape_report)
    _shape = shape_report.by_cause().get(NEW_SHAPE, [])
    _ops = {p.name for p in _shape}
    assert "aten::sum" in _ops and len(_ops) == 2, _text  # the square and the sum
    for _op in _ops:  # rows 3 -> 4 -> 5: two new shapes per op
        _details = [p.detail for p in _shape if p.name == _op]
        assert _details == ["self: shape (3, 13) -> (4, 13)", "self: shape (4, 13) -> (5, 13)"], _text
    assert "new shape:" in _text and "pad or bucket" in _text
    (_item,) = [s for s in shape_report.syncs if s.cause == ".item()"]
    assert _item.calls == 3 and ".item() x3 at" in _text
    return (growing_loop,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The report names the cause (`self: shape (3, 13) -> (4, 13)`), the source line, and
    the fix. Padding every batch to one size on the host, before it is moved (a padding
    op on the device would itself see every size), with rows that do not change the
    result, builds the programs once; the `.item()` per step stays, and would be the
    next thing to remove (accumulate the loss as a tensor and read it every N steps).
    """)
    return


@app.cell
def _(growing_loop, torchtpu):
    with torchtpu.debug.explaining():
        _total = growing_loop([3, 4, 5], pad_to=8)
    _report = torchtpu.debug.explain()
    assert _total == sum(v * v for n in (3, 4, 5) for v in range(n * 13))
    # one program per op, for the one padded shape (new to this process, once)
    _padded = [p for p in _report.programs if p.mode == "eager"]
    assert len(_padded) == 2 and all(p.detail == "self: shape (5, 13) -> (8, 13)" for p in _padded), str(_report)
    assert _report.host_syncs == 3
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Which layer first differs from the CPU: `compare_with_cpu`

    `torchtpu.debug.compare_with_cpu(model, *inputs)` runs the model on tpu and on a CPU
    copy with the same weights, with a hook on every submodule, and reports the first
    module whose output differs (torch.testing's default tolerance per dtype), then the
    first difference in the gradients, in backward order. It leaves the model as it was.

    To see it find something, plant a difference: a module that adds `1e-3` on tpu only,
    in the middle of an MLP.
    """)
    return


@app.cell
def _(D_IN, nn, torch):
    class PlantedOffset(nn.Module):
        """Adds 1e-3 on tpu only: a bug compare_with_cpu must pin here."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1e-3 if x.device.type == "tpu" else x

    def suspect_model(planted: bool) -> nn.Module:
        torch.manual_seed(0)
        middle = PlantedOffset() if planted else nn.Identity()
        return nn.Sequential(nn.Linear(D_IN, 64), nn.ReLU(), middle, nn.Linear(64, 10)).to("tpu")

    x_small = torch.randn(4, D_IN, generator=torch.Generator().manual_seed(2))
    return suspect_model, x_small


@app.cell
def _(suspect_model, torchtpu, x_small):
    planted = torchtpu.debug.compare_with_cpu(suspect_model(planted=True), x_small)  # prints its report
    assert not planted.ok
    _first = planted.first_forward
    assert (_first.module, _first.module_type, _first.kind) == ("2", "PlantedOffset", "output"), _first
    assert abs(_first.max_abs - 1e-3) < 1e-5, _first.max_abs
    assert [d.ok for d in planted.forward[:2]] == [True, True]  # the Linear and ReLU before it match
    assert "first difference from the CPU in the forward at 2 (PlantedOffset)" in planted.verdict()
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same model without the planted offset matches the CPU everywhere, outputs and
    gradients:
    """)
    return


@app.cell
def _(suspect_model, torchtpu, x_small):
    clean = torchtpu.debug.compare_with_cpu(suspect_model(planted=False), x_small)
    assert clean.ok and clean.first_forward is None and clean.first_backward is None
    assert clean.backward and all(d.ok for d in clean.forward + clean.backward)
    assert clean.verdict().startswith("verdict: no difference from the CPU")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Next

    - `docs/debugging.md`: every span, the explain() causes, compare_with_cpu's options
      (`rtol`/`atol`, `backward`, dropout).
    - `TORCHTPU_LAUNCH_BLOCKING=1` (listed in notebook 06): every op waits, so an error
      names the op and your source line.
    - `python -m torchtpu.check_model train.py`: which ops a script needs, lowered or not.
    - `08_custom_kernels.py`: write a kernel of your own.
    """)
    return


if __name__ == "__main__":
    app.run()
