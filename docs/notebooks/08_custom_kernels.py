"""Custom kernels: a fused RMSNorm as StableHLO text, as a JAX function, and as a lowering for a torch.library op.

marimo edit docs/notebooks/08_custom_kernels.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Custom kernels

        When an op is missing, or a hand-fused version of a few ops is worth having,
        torchtpu takes a kernel of your own, three ways:

        | route | you write | for |
        |---|---|---|
        | `torchtpu.kernels.stablehlo` | StableHLO text (or a function returning it per input shape) | full control, no dependencies |
        | `@torchtpu.kernels.jax` | a JAX function (`jax.numpy`, `lax`, Pallas) | reusing JAX code; lowered once per shape and cached on disk |
        | `torchtpu.library.register_lowering` | a lowering rule for a `torch.library.custom_op` | a library that defines its own op and wants tpu support |

        Each becomes one PyTorch op: it runs eagerly, fuses with the ops around it under
        DeferAndFuse, and stays one node under `torch.compile(backend="tpu")` (no graph
        break). Autograd goes through `register_autograd`, as for any custom op.

        This notebook writes one fused RMSNorm, `x * rsqrt(mean(x², -1) + eps) * w`, all
        three ways and checks each, forward and backward, against
        `torch.nn.functional.rms_norm` on the CPU in all three execution modes.
        `examples/custom_kernels/` has the same kernels as a script.
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
    ## The test bench

    Every kernel is checked the same way. `step(op, x, w)` is `op(x * 2, w, eps) + 1`: the
    kernel between two ordinary ops, so that we can see it fuse with them. `check(op)`
    runs it on tpu in eager, DeferAndFuse and `torch.compile` mode and compares the
    output with `F.rms_norm` on the CPU (torch.testing's float32 tolerance), counting the
    programs each mode ran (`torchtpu.metrics`) and Dynamo's graph breaks.
    `check_backward(op)` does the same for the gradients of `step(...).sin().sum()`
    with respect to `x` and `w`.

    """)
    return


@app.cell
def _():
    import torch
    import torch.nn.functional as F

    import torchtpu
    import torchtpu.kernels
    import torchtpu.library
    from torchtpu.kernels import Spec

    EPS = 1e-6
    _g = torch.Generator().manual_seed(0)
    X, W = torch.randn(6, 64, generator=_g), torch.randn(64, generator=_g)

    def step(op, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return op(x * 2, w, EPS) + 1

    def cpu_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x * 2, (x.shape[-1],), w, EPS) + 1

    def counters() -> dict:
        m = torchtpu.metrics.snapshot()
        return {
            "programs run": m["executions"],
            "flushes": m["flushes"],
            "fused ops": m["fused_ops"],
            "graph breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
        }

    def delta(before: dict) -> dict:
        return {k: v - before[k] for k, v in counters().items()}

    MODES = ("eager", "defer_and_fuse", "compile")

    def in_mode(fn, mode: str):
        """``fn``, compiled with torch.compile(backend="tpu") for mode "compile"."""
        if mode != "compile":
            return fn
        torch._dynamo.reset()
        return torch.compile(fn, backend="tpu", dynamic=False)

    def eager_mode(mode: str):
        return torchtpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "eager")

    def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a.double() - b.double()).abs().max().item()

    def check(op) -> dict[str, dict]:
        """The forward in each mode against the CPU; the counters of its second call (the first builds)."""
        expected = cpu_step(X, W)
        exact = cpu_step(X.double(), W.double())  # to see how far float32 rounding puts each side
        xt, wt = X.to("tpu"), W.to("tpu")
        results = {}
        for mode in MODES:
            fn = in_mode(step, mode)
            with eager_mode(mode):
                fn(op, xt, wt).cpu()  # builds the programs
                before = counters()
                out = fn(op, xt, wt).cpu()
                counts = delta(before)
            torch.testing.assert_close(out, expected)
            results[mode] = {**counts, "vs float64": max_abs(out, exact), "CPU vs float64": max_abs(expected, exact)}
        return results

    def loss(op, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return step(op, x, w).sin().sum()

    def cpu_grads(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients of ``loss`` w.r.t. x and w: PyTorch's autograd through F.rms_norm on the CPU."""
        xr, wr = X.to(dtype, copy=True).requires_grad_(), W.to(dtype, copy=True).requires_grad_()
        loss(lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps), xr, wr).backward()
        return xr.grad, wr.grad

    def check_backward(op) -> dict[str, dict]:
        """Gradients w.r.t. x and w in each mode against the CPU; distances from float64."""
        expected, exact = cpu_grads(torch.float32), cpu_grads(torch.float64)
        out = {}
        for mode in MODES:
            xt, wt = X.to("tpu").requires_grad_(), W.to("tpu").requires_grad_()
            calls = backward_calls[0]
            with eager_mode(mode):
                in_mode(loss, mode)(op, xt, wt).backward()
                gx, gw = xt.grad.cpu(), wt.grad.cpu()
            assert backward_calls[0] > calls, f"{mode}: the op's own backward did not run"
            torch.testing.assert_close(gx, expected[0])
            torch.testing.assert_close(gw, expected[1])
            out[mode] = {
                "grad x: tpu": max_abs(gx, exact[0]),
                "grad x: CPU": max_abs(expected[0], exact[0]),
                "grad w: tpu": max_abs(gw, exact[1]),
                "grad w: CPU": max_abs(expected[1], exact[1]),
            }
        return out

    # -- the backward every route shares: plain PyTorch ops, which run on tpu like any others
    backward_calls = [0]  # how often it ran (or was traced, under torch.compile)

    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def rms_backward(ctx, grad: torch.Tensor) -> tuple:
        backward_calls[0] += 1
        x, w = ctx.saved_tensors
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = x * r
        g = grad * w
        grad_x = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        grad_w = (grad * xhat).sum(tuple(range(x.dim() - 1)))
        return grad_x, grad_w, None

    return (
        EPS,
        F,
        Spec,
        X,
        W,
        check,
        check_backward,
        rms_backward,
        setup_context,
        torch,
        torchtpu,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    `rms_backward` above is the backward all three kernels share, written in PyTorch
    ops: with `ctx.saved_tensors` from `setup_context`, it returns the gradients with
    respect to `x` and `w` (and `None` for `eps`). It runs on tpu like any other code.

    ## 1. StableHLO text: `torchtpu.kernels.stablehlo`

    A kernel is a `func.func @main` taking and returning tensors. A *text function*
    receives a `Spec` (shape, dtype; `.type` is the MLIR type such as `tensor<6x64xf32>`)
    per tensor argument and the static arguments (here `eps`, a float: part of the text,
    one text per value), and returns the text for those shapes. `shape=` gives the output
    `Spec` for given inputs (here: `x`'s), which is what DeferAndFuse and `torch.compile`
    need to know without running it. The statistics are reduced over the last dimension
    in float32. This is the text for a `(6, 64)` input:
    """)
    return


@app.cell
def _(Spec, rms_backward, setup_context, torch, torchtpu):
    def rms_text(x: Spec, w: Spec, eps: float = 1e-6) -> str:
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            raise TypeError(f"this kernel takes float32 tensors, got {x.dtype} and {w.dtype}")
        last = x.ndim - 1
        r = f"tensor<{''.join(f'{d}x' for d in x.shape[:-1])}f32>"  # one statistic per row
        row_dims = ", ".join(str(d) for d in range(last))
        return f"""
    func.func @main(%x: {x.type}, %w: {w.type}) -> {x.type} {{
      %sq = stablehlo.multiply %x, %x : {x.type}
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [{last}] : ({x.type}, tensor<f32>) -> {r}
      %n = stablehlo.constant dense<{float(x.shape[-1]):.1f}> : {r}
      %mean = stablehlo.divide %sum, %n : {r}
      %eps = stablehlo.constant dense<{eps:.9e}> : {r}
      %shifted = stablehlo.add %mean, %eps : {r}
      %inv = stablehlo.rsqrt %shifted : {r}
      %inv_b = stablehlo.broadcast_in_dim %inv, dims = [{row_dims}] : ({r}) -> {x.type}
      %w_b = stablehlo.broadcast_in_dim %w, dims = [{last}] : ({w.type}) -> {x.type}
      %normed = stablehlo.multiply %x, %inv_b : {x.type}
      %out = stablehlo.multiply %normed, %w_b : {x.type}
      return %out : {x.type}
    }}"""

    rms_norm_stablehlo = torchtpu.kernels.stablehlo(
        rms_text, shape=lambda x, w, eps=1e-6: x, backward=rms_backward, setup_context=setup_context
    )
    print(rms_text(Spec((6, 64), torch.float32), Spec((64,), torch.float32)))
    return (rms_norm_stablehlo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    `torchtpu.kernels.stablehlo(...)` returns the op (a `torch.library` custom op in the
    `torchtpu_kernels` namespace); its `backward=` and `setup_context=` arguments are
    the same as calling `op.register_autograd(rms_backward, setup_context=...)` on it.
    Called on tpu tensors, it matches the CPU in every mode. The counters are those of a second call (the first builds the programs): eager
    runs `x * 2`, the kernel and `+ 1` as three programs; DeferAndFuse records them and
    runs **one** fused program (three fused ops, one flush, at `.cpu()`);
    `torch.compile` captures them as one graph, one program, with no graph break. The
    last two columns are the largest differences from the float64 result, of the tpu
    output and of the CPU's own float32 output.
    """)
    return


@app.function
def assert_fused(results: dict) -> None:
    """Eager runs the kernel and its two neighbours as three programs; DeferAndFuse and
    torch.compile as one, without a graph break."""
    assert results["eager"]["programs run"] == 3, results["eager"]
    defer = results["defer_and_fuse"]
    assert (defer["programs run"], defer["flushes"], defer["fused ops"]) == (1, 1, 3), defer
    assert results["compile"]["programs run"] == 1 and results["compile"]["graph breaks"] == 0, results["compile"]


@app.function
def results_table(results: dict) -> str:
    headers = ["mode", "programs run", "flushes", "fused ops", "graph breaks", "tpu vs float64", "CPU vs float64"]
    rows = [
        [
            mode,
            r["programs run"],
            r["flushes"],
            r["fused ops"],
            r["graph breaks"],
            f"{r['vs float64']:.1e}",
            f"{r['CPU vs float64']:.1e}",
        ]
        for mode, r in results.items()
    ]
    return md_table(headers, rows)


@app.cell
def _(check, mo, rms_norm_stablehlo):
    stablehlo_results = check(rms_norm_stablehlo)
    assert_fused(stablehlo_results)
    mo.md(results_table(stablehlo_results))
    return (stablehlo_results,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The backward: gradients of `step(...).sin().sum()` through the op's own backward
    (`rms_backward` counts its calls, and each mode must call it), against PyTorch's
    autograd through `F.rms_norm` on the CPU, and each side's largest difference from
    the float64 gradients.
    """)
    return


@app.function
def grads_table(grads: dict) -> str:
    """Each gradient's largest difference from the float64 result, on tpu and on the CPU (float32)."""
    columns = ["grad x: tpu", "grad x: CPU", "grad w: tpu", "grad w: CPU"]
    rows = [[mode, *(f"{g[c]:.1e}" for c in columns)] for mode, g in grads.items()]
    return md_table(["mode", *(f"{c} vs float64" for c in columns)], rows)


@app.cell
def _(check_backward, mo, rms_norm_stablehlo):
    stablehlo_grads = check_backward(rms_norm_stablehlo)
    mo.md(grads_table(stablehlo_grads))
    return (stablehlo_grads,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. A JAX function: `@torchtpu.kernels.jax`

    The same kernel in `jax.numpy`. Parameters without a default are tensors (JAX arrays
    inside); `eps: float` is static. torchtpu lowers the function with
    `jax.jit(fn).trace(...).lower(...)` once per input signature and caches the
    StableHLO text on disk under `TORCHTPU_CACHE_DIR`, so a later run that finds it there
    never imports jax. Import jax *inside* the function for that reason. A Pallas kernel
    works the same way (`interpret=True` on the cpu platform; see
    `examples/custom_kernels/rms_norm.py`). To show the file it writes, the cell points
    `TORCHTPU_CACHE_DIR` (read at each use) at an empty temporary directory while it
    runs. This route needs `pip install 'torchtpu[jax]'`; without jax, the cell says so
    and checks nothing.
    """)
    return


@app.cell
def _(
    check,
    check_backward,
    mo,
    rms_backward,
    setup_context,
    torchtpu,
):
    import os
    import tempfile
    from pathlib import Path

    @torchtpu.kernels.jax(shape=lambda x, w, eps=1e-6: x, backward=rms_backward, setup_context=setup_context)
    def rms_norm_jax(x, w, eps: float = 1e-6):  # noqa: ANN001, ANN202 - jax arrays
        import jax
        import jax.numpy as jnp

        ms = jnp.mean(x * x, axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(ms + eps) * w

    try:
        import jax as _jax  # noqa: F401 - only to know whether this route can run here

        HAVE_JAX = True
    except ImportError:
        HAVE_JAX = False

    if HAVE_JAX:
        _saved = os.environ.get("TORCHTPU_CACHE_DIR")
        with tempfile.TemporaryDirectory() as _tmp:
            os.environ["TORCHTPU_CACHE_DIR"] = _tmp  # an empty disk cache, to see what is written
            try:
                jax_results = check(rms_norm_jax)
                jax_grads = check_backward(rms_norm_jax)
                _cached = [p.relative_to(_tmp) for p in Path(_tmp).glob("*/kernels/*.mlir")]
            finally:
                if _saved is None:
                    del os.environ["TORCHTPU_CACHE_DIR"]
                else:
                    os.environ["TORCHTPU_CACHE_DIR"] = _saved
        assert_fused(jax_results)
        assert len(_cached) == 1, _cached  # one input signature, one lowered text
        _jax_text = (
            results_table(jax_results)
            + "\n\nGradients:\n\n"
            + grads_table(jax_grads)
            + "\n\nLowered text cached on disk: "
            + ", ".join(f"`{p}`" for p in _cached)
        )
    else:
        jax_results = jax_grads = None
        _jax_text = "**Skipped: jax is not installed** (`pip install 'torchtpu[jax]'`); nothing in this cell was checked."
    mo.md(_jax_text)
    return jax_grads, jax_results


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. A library's own op: `torchtpu.library.register_lowering`

    A library that defines an op with `torch.library.custom_op` (its CPU/CUDA kernel,
    a `register_fake` giving output shapes, a `register_autograd`) adds tpu support with
    one more registration: a lowering rule, written as torchtpu's own rules are. The
    rule gets `L` (`L.b` is the StableHLO program builder; `L.full`, `L.to`, … are
    helpers) and the op's arguments: tensors as builder values, `eps` as a Python
    float. It returns the output value. On the CPU the op runs the library's own kernel.

    (A `custom_op` name can be defined once per process: to run this cell again,
    restart the notebook's kernel.)
    """)
    return


@app.cell
def _(EPS, F, X, W, rms_backward, setup_context, torch, torchtpu):
    @torch.library.custom_op("guide08::rms_norm", mutates_args=())
    def rms_norm_op(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)  # the library's kernel (CPU and any other device)

    @rms_norm_op.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return torch.empty_like(x)

    rms_norm_op.register_autograd(rms_backward, setup_context=setup_context)

    @torchtpu.library.register_lowering(rms_norm_op)
    def _(L, x, w, eps: float = 1e-6):  # noqa: ANN001, ANN202 - a lowering rule
        b, f32 = L.b, torch.float32
        last = x.rank - 1
        xf = L.to(x, f32)
        (total,) = b.reduce(
            [b.binary("multiply", xf, xf)], [b.constant(0, f32)], [last], lambda acc, v: [b.binary("add", acc, v)]
        )
        mean = b.binary("divide", total, L.full(x.shape[-1], total.shape, f32))
        inv = b.unary("rsqrt", b.binary("add", mean, L.full(eps, total.shape, f32)))
        normed = b.binary("multiply", xf, b.broadcast_in_dim(inv, xf.shape, list(range(last))))
        out = b.binary("multiply", normed, b.broadcast_in_dim(L.to(w, f32), xf.shape, [last]))
        return L.to(out, x.dtype)

    # on the CPU: the library's own kernel
    torch.testing.assert_close(rms_norm_op(X, W, EPS), F.rms_norm(X, (64,), W, EPS))
    return (rms_norm_op,)


@app.cell
def _(check, check_backward, mo, rms_norm_op):
    library_results = check(rms_norm_op)
    assert_fused(library_results)
    library_grads = check_backward(rms_norm_op)
    mo.md(results_table(library_results) + "\n\nGradients:\n\n" + grads_table(library_grads))
    return library_grads, library_results


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Side by side

    Every route, in every mode, forward and backward, within torch.testing's float32
    tolerance of the CPU. Eager runs three programs per forward call, DeferAndFuse and
    `torch.compile` one: the kernel is fused into the surrounding program.
    """)
    return


@app.cell
def _(
    jax_grads,
    jax_results,
    library_grads,
    library_results,
    mo,
    stablehlo_grads,
    stablehlo_results,
):
    _routes = {
        "`torchtpu.kernels.stablehlo`": (stablehlo_results, stablehlo_grads),
        "`@torchtpu.kernels.jax`": (jax_results, jax_grads),
        "`torchtpu.library.register_lowering`": (library_results, library_grads),
    }
    _rows = []
    for _route, (_fwd, _bwd) in _routes.items():
        if _fwd is None:
            _rows.append([_route, "skipped: no jax", "", "", "", ""])
            continue
        for _mode in _fwd:
            _rows.append(
                [
                    _route,
                    _mode,
                    _fwd[_mode]["programs run"],
                    f"{_fwd[_mode]['vs float64']:.1e}",
                    f"{_bwd[_mode]['grad x: tpu']:.1e}",
                    f"{_bwd[_mode]['grad w: tpu']:.1e}",
                ]
            )
    mo.md(
        md_table(
            ["route", "mode", "programs run", "output: tpu vs float64", "grad x: tpu vs float64", "grad w: tpu vs float64"],
            _rows,
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Next

    - `examples/custom_kernels/run.py`: these kernels and a Pallas one, as a script.
    - `README.md`, "Custom kernels"; `torchtpu/kernels/__init__.py` and
      `torchtpu/library.py` for every argument (`num_outputs`, `cpu=` for a CPU
      reference, `lift_scalars=True` to pass a changing number as a device operand).
    - `07_profiling_and_debugging.py`: profile what runs (a fused graph is one
      `torchtpu::execute` span) and debug differences from the CPU.
    """)
    return


if __name__ == "__main__":
    app.run()
