"""Execution modes: asynchronous eager, DeferAndFuse and torch.compile(backend="tpu").

marimo edit docs/notebooks/02_execution_modes.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Execution modes

        torchtpu runs the same PyTorch program three ways, all over the same lowering rules:

        | mode | how to turn it on | what runs |
        |---|---|---|
        | **eager** (default) | nothing | each op is its own cached XLA program, enqueued asynchronously |
        | **DeferAndFuse** | `with torchtpu.eager_mode("defer_and_fuse"):`, `torchtpu.set_eager_mode(...)` or `TORCHTPU_DEFER_AND_FUSE=1` | ops are recorded; the pending graph runs as one fused program when a value is needed |
        | **compiled** | `torch.compile(fn, backend="tpu")` | Dynamo + AOTAutograd hand each FX graph to the backend: one program per graph |

        This notebook trains the same MLP in each mode, counts what each compiles and runs
        per step with `torchtpu.metrics.snapshot()`, checks every loss against PyTorch on the
        CPU, and times the steps.
        """
    )
    return (mo,)


@app.function
def md_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table (for mo.md)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@app.cell
def _():
    import statistics
    import time

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    D, BATCH, LR, STEPS, WARMUP = 256, 64, 0.05, 12, 2

    def make_mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 10))

    _g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(BATCH, D, generator=_g), torch.randint(0, 10, (BATCH,), generator=_g)

    def counters() -> dict:
        """Programs built (compiled or loaded from the disk cache), programs run, and
        DeferAndFuse's flushes by reason, so far in this process."""
        m = torchtpu.metrics.snapshot()
        return {"built": m["compiles"] + m["disk_cache_hits"], "executed": m["executions"], **m["flushes_by_reason"]}

    def measure(step, device: str, steps: int = STEPS) -> dict:
        """Run ``step()`` (which returns the loss) ``steps`` times: losses, seconds and
        counter deltas per step. A step ends with synchronize, so it is timed whole."""
        losses, seconds, per_step = [], [], []
        for _ in range(steps):
            before = counters()
            t0 = time.perf_counter()
            loss = step()
            if device == "tpu":
                torch.tpu.synchronize()
            seconds.append(time.perf_counter() - t0)
            after = counters()
            per_step.append({k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})
            losses.append(loss.item())
        return {"losses": losses, "seconds": seconds, "per_step": per_step}

    def assert_same_losses(actual: list[float], expected: list[float]) -> None:
        """float32 losses equal up to PyTorch's float32 tolerance (item() gives Python floats)."""
        torch.testing.assert_close(torch.tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32))

    def stock_loop(device: str, compile_model: bool = False):
        """The stock training step; with compile_model, the model's forward (and its
        backward) run through torch.compile(backend="tpu")."""
        torch._dynamo.reset()
        model = make_mlp().to(device)
        forward = torch.compile(model, backend="tpu") if compile_model else model
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = X.to(device), Y.to(device)

        def step() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
            opt.step()
            return loss

        return step

    return (
        F,
        LR,
        WARMUP,
        X,
        Y,
        assert_same_losses,
        counters,
        make_mlp,
        measure,
        statistics,
        stock_loop,
        torch,
        torchtpu,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The reference: PyTorch on the CPU

    Every tpu run below must reproduce these losses (float32, up to rounding).
    """)
    return


@app.cell
def _(measure, stock_loop):
    cpu_run = measure(stock_loop("cpu"), "cpu")
    print([round(v, 6) for v in cpu_run["losses"]])
    return (cpu_run,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Eager

    Each op (every `linear`, `relu`, the loss, each op of the backward and of the SGD
    update) runs as its own XLA program, keyed by op, shapes, strides, dtypes and static
    arguments. The first step builds them; every later step runs the same programs.
    Python numbers such as the learning rate are operands, not part of the key, so
    changing them builds nothing.
    """)
    return


@app.cell
def _(assert_same_losses, cpu_run, measure, mo, stock_loop):
    eager_run = measure(stock_loop("tpu"), "tpu")
    assert_same_losses(eager_run["losses"], cpu_run["losses"])
    assert all(s.get("built", 0) == 0 for s in eager_run["per_step"][2:]), eager_run["per_step"]
    mo.md(
        "Counter deltas of the first three steps: "
        + ", ".join(f"`{s}`" for s in eager_run["per_step"][:3])
        + f"; of the last step: `{eager_run['per_step'][-1]}`."
    )
    return (eager_run,)


@app.cell
def _(counters, mo, torch):
    # a Python number is an operand of the program: a new value builds nothing
    _cpu = torch.randn(5, 7)
    _x = _cpu.to("tpu")
    _built = []
    for _s in (0.37, 0.73, 1.91):
        _before = counters()["built"]
        torch.testing.assert_close((_x * _s).cpu(), _cpu * _s)
        _built.append(counters()["built"] - _before)
    assert _built[1:] == [0, 0], _built
    mo.md(f"`x * s` for `s` = 0.37, 0.73, 1.91: programs built {_built}.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## DeferAndFuse

    The same loop inside `torchtpu.eager_mode("defer_and_fuse")`. Ops are recorded
    instead of run; the pending graph is compiled and run as one fused program when a
    value is needed (`.item()`, `.cpu()`, printing, a data-dependent branch, a
    collective), at `torch.tpu.synchronize()`, when a repeated op sequence starts again,
    or at a size cap. `backward()` records into the forward's graph and leaves it
    pending, so forward, backward and the optimizer update fuse into one program. Graphs
    are cached by structure, so the loop compiles in its first steps and then never.
    `flushes_by_reason` in the metrics says why each graph ran.
    """)
    return


@app.cell
def _(
    assert_same_losses,
    cpu_run,
    eager_run,
    measure,
    mo,
    stock_loop,
    torchtpu,
):
    _step = stock_loop("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        assert torchtpu.get_eager_mode() == "defer_and_fuse"
        defer_run = measure(_step, "tpu")
    assert torchtpu.get_eager_mode() == "eager"  # the context manager restores the mode

    assert_same_losses(defer_run["losses"], cpu_run["losses"])
    _steady = defer_run["per_step"][2:]
    assert all(s.get("built", 0) == 0 for s in _steady), defer_run["per_step"]
    # a few fused programs per step instead of one per op
    assert all(s["executed"] < e["executed"] for s, e in zip(_steady, eager_run["per_step"][2:]))
    mo.md(
        "Counter deltas of the first three steps: "
        + ", ".join(f"`{s}`" for s in defer_run["per_step"][:3])
        + f"; of the last step: `{defer_run['per_step'][-1]}`. "
        + "(`synchronize`: our `torch.tpu.synchronize()`.)"
    )
    return (defer_run,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### What makes a DeferAndFuse graph run early

    Reading a value in the middle of a step (here `loss.item()` before `backward()`)
    forces the pending graph to run there, splitting the step into more programs. The
    results stay the same; only the fusion suffers. Keep reads of values (logging the
    loss) after the step, or every few steps.
    """)
    return


@app.cell
def _(F, X, Y, make_mlp, mo, torch, torchtpu):
    _model = make_mlp().to("tpu")
    _x, _y = X.to("tpu"), Y.to("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        torch.tpu.synchronize()  # start with nothing pending
        _before = torchtpu.metrics.snapshot()["flushes_by_reason"]
        _loss = F.cross_entropy(_model(_x), _y)
        _value = _loss.item()  # a value is needed now: the forward runs as its own program
        _loss.backward()
        torch.tpu.synchronize()
        _after = torchtpu.metrics.snapshot()["flushes_by_reason"]
    _flushes = {k: v - _before.get(k, 0) for k, v in _after.items() if v != _before.get(k, 0)}
    assert _flushes.get("item", 0) == 1, _flushes
    torch.testing.assert_close(_value, F.cross_entropy(make_mlp()(X), Y).item())
    mo.md(f"Flushes caused by one step with a `loss.item()` before `backward()`: `{_flushes}`")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `torch.compile(model, backend="tpu")`

    Compiling the model turns its forward and its backward (through AOTAutograd) into
    one XLA program each; the loss and the optimizer still run eagerly, op by op.
    """)
    return


@app.cell
def _(assert_same_losses, cpu_run, measure, mo, stock_loop):
    compiled_model_run = measure(stock_loop("tpu", compile_model=True), "tpu")
    assert_same_losses(compiled_model_run["losses"], cpu_run["losses"])
    assert all(s.get("built", 0) == 0 for s in compiled_model_run["per_step"][2:]), compiled_model_run["per_step"]
    mo.md(
        "Counter deltas of the first three steps: "
        + ", ".join(f"`{s}`" for s in compiled_model_run["per_step"][:3])
        + f"; of the last step: `{compiled_model_run['per_step'][-1]}`."
    )
    return (compiled_model_run,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The whole step as one program

    Dynamo breaks a graph around `loss.backward()` and `opt.step()`, so compiling the
    stock step gives several programs. Written functionally, with
    `torch.func.grad_and_value` and an in-place update, the whole step (forward,
    backward and SGD) is **one** program, and the parameters are updated in place on
    the device (their old buffers are donated to XLA). See `docs/compile.md`.
    """)
    return


@app.cell
def _(F, LR, X, Y, assert_same_losses, cpu_run, make_mlp, measure, mo, torch):
    def whole_step_loop():
        torch._dynamo.reset()
        model = make_mlp().to("tpu")
        params = {k: v.detach() for k, v in model.named_parameters()}  # share the storages
        x, y = X.to("tpu"), Y.to("tpu")

        def loss_fn(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

        @torch.compile(backend="tpu", fullgraph=True)
        def train_step(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
            for k in p:
                p[k].sub_(grads[k], alpha=LR)  # SGD, in place
            return loss

        return lambda: train_step(params, x, y)

    whole_step_run = measure(whole_step_loop(), "tpu")
    assert_same_losses(whole_step_run["losses"], cpu_run["losses"])
    assert all(s == {"executed": 1} for s in whole_step_run["per_step"][2:]), whole_step_run["per_step"]
    mo.md(
        "Counter deltas of the first three steps: "
        + ", ".join(f"`{s}`" for s in whole_step_run["per_step"][:3])
        + f"; of the last step: `{whole_step_run['per_step'][-1]}`: one program per step."
    )
    return (whole_step_run,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Side by side

    Median step time after the first steps (which build the programs), and the ratio to
    tpu eager in the same run. These are measurements of this run on this machine, for
    comparing the modes with each other, not speeds to expect: on the cpu platform the
    "device" is the CPU that also runs Python (and whatever else shares the machine),
    and on a TPU or GPU the numbers are different. `benchmarks/bench_modes.py` measures
    the modes properly, against JAX and PyTorch on the CPU.
    """)
    return


@app.cell
def _(
    WARMUP,
    compiled_model_run,
    defer_run,
    eager_run,
    mo,
    statistics,
    whole_step_run,
):
    def _median_ms(run: dict) -> float:
        return 1e3 * statistics.median(run["seconds"][WARMUP:])

    def _steady(run: dict, key: str) -> int:
        return max(s.get(key, 0) for s in run["per_step"][WARMUP:])

    _eager_ms = _median_ms(eager_run)
    _rows = []
    for _name, _run in [
        ("tpu eager", eager_run),
        ("tpu DeferAndFuse", defer_run),
        ("tpu, model compiled", compiled_model_run),
        ("tpu, whole step compiled", whole_step_run),
    ]:
        _rows.append(
            [
                _name,
                _run["per_step"][0].get("built", 0),
                _steady(_run, "built"),
                _steady(_run, "executed"),
                f"{_median_ms(_run):.2f}",
                f"{_median_ms(_run) / _eager_ms:.2f}",
            ]
        )
    mo.md(
        md_table(
            [
                "mode",
                "programs built, step 1",
                "programs built per step after",
                "programs run per step",
                "median ms",
                "vs tpu eager",
            ],
            _rows,
        )
        + "\n\n(Programs built in step 1 include those loaded from the disk cache; a program"
        " an earlier cell already built counts as 0.)"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Which mode when

    - **Eager** (the default): any program, as written; errors point at the op that
      raised. It is the mode to start in and to debug in; `TORCHTPU_LAUNCH_BLOCKING=1`
      (or `torchtpu.set_eager_mode("launch_blocking")`) additionally makes every op wait,
      so an error names the op and your source line.
    - **DeferAndFuse**: a stock training loop or inference loop, unchanged, with far
      fewer programs per step and no tracing step. It needs no code changes beyond the
      mode and handles Python control flow. For Hugging Face `generate()`, the loop
      under DeferAndFuse (`with torchtpu.eager_mode("defer_and_fuse"):
      model.generate(...)`) with the static cache's compiled forward is the fastest
      combination the project measures (`benchmarks/bench_generate.py`). Avoid reading
      values in the middle of a step.
    - **`torch.compile(backend="tpu")`**: a whole step written functionally is one
      program per step, the fewest programs and the least Python per step, at the cost
      of Dynamo's tracing on the first step (and on recompiles). `torch.compile(model,
      backend="tpu")` compiles forward and backward and leaves the loss and the
      optimizer eager; it adds Dynamo's guards and AOTAutograd's wrappers to every call,
      so whether it pays off depends on the model: measure (the table above,
      `benchmarks/bench_compile.py`).
      Varying shapes need bounded dynamism (notebook 04).

    The mode is per thread: `torchtpu.eager_mode(...)` as a context manager,
    `torchtpu.set_eager_mode(...)` for the calling thread, `TORCHTPU_DEFER_AND_FUSE=1`
    to start a process in DeferAndFuse. All three modes give the CPU's numbers.
    """)
    return


if __name__ == "__main__":
    app.run()
