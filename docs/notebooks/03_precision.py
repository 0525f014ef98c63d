"""Precision: float32 matmul precision, bfloat16, torch.autocast("tpu") and GradScaler("tpu").

marimo edit docs/notebooks/03_precision.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(r"""
    # Precision

    Three controls decide how many bits a tpu computation uses:

    1. the **float32 matmul precision** of every matmul and convolution
       (`torch.set_float32_matmul_precision`, `torch.tpu.precision`);
    2. **bfloat16 tensors** (`.to(torch.bfloat16)`, `model.bfloat16()`);
    3. **mixed precision**: `torch.autocast("tpu")` with `torch.amp.GradScaler("tpu")`.

    Each section checks the tpu results against PyTorch on the CPU, and against a float64
    computation where the question is which result is more accurate.
    """)
    return (mo,)


@app.function
def md_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table (for mo.md)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@app.cell
def _():
    import math
    import warnings

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    def programs_built() -> int:
        """XLA programs this process has built: compiled, or loaded from the disk cache."""
        m = torchtpu.metrics.snapshot()
        return m["compiles"] + m["disk_cache_hits"]

    return F, math, nn, programs_built, torch, torchtpu, warnings


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Float32 matmul precision

    Every matmul and convolution torchtpu emits carries a StableHLO `precision_config`:

    | PyTorch | `torch.tpu.Precision` | StableHLO | on a TPU |
    |---|---|---|---|
    | `"medium"` (torchtpu's default) | `DEFAULT` | `DEFAULT` | one bfloat16 pass, float32 accumulation |
    | `"high"` | `HIGH` | `HIGH` | three bfloat16 passes (~3x the cost) |
    | `"highest"` | `HIGHEST` | `HIGHEST` | six passes, full float32 (~6x) |

    PyTorch's own global starts at `"highest"`, which would make every TPU matmul 6x
    slower, so torchtpu uses `"medium"` until you call `torch.set_float32_matmul_precision`
    yourself. `with torch.tpu.precision(...)` overrides it for the calling thread, and
    `"high"`/`"highest"` warn once about their cost. The precision is part of every
    program's cache key, eager and compiled.
    """)
    return


@app.cell
def _(mo, torch):
    # torchtpu's default, whatever PyTorch's own global says
    assert torch.tpu.get_precision() == torch.tpu.Precision.DEFAULT
    mo.md(
        f"`torch.get_float32_matmul_precision()` = `{torch.get_float32_matmul_precision()!r}`, "
        f"`torch.tpu.get_precision()` = `{torch.tpu.get_precision()}`"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same float32 matmul under each precision, compared with a float64 matmul of the
    same inputs. The check is the classical error bound of a float32 dot product of
    length `K` (each result within `K·u·(|a|@|b|)` of the exact value, `u = 2⁻²⁴`), which
    PyTorch's CPU result satisfies too. On the **cpu platform**, XLA computes float32 dots
    in float32 whatever the precision, so the three results are identical; on a TPU,
    `DEFAULT` rounds the inputs to bfloat16 (`u = 2⁻⁸`).
    """)
    return


@app.cell
def _(mo, programs_built, torch, torchtpu, warnings):
    _K = 512
    _g = torch.Generator().manual_seed(0)
    _a, _b = torch.randn(256, _K, generator=_g), torch.randn(_K, 96, generator=_g)
    _exact = _a.double() @ _b.double()
    _cpu = _a @ _b
    _on_cpu_platform = torchtpu.platform() == "cpu"

    def _bound(unit: float) -> torch.Tensor:
        return _K * unit * (_a.double().abs() @ _b.double().abs())

    assert ((_cpu.double() - _exact).abs() <= _bound(2**-24)).all()
    _results, _built, _warned = {}, [], []
    for _name in ("medium", "high", "highest"):
        with warnings.catch_warnings(record=True) as _caught:
            warnings.simplefilter("always")
            with torch.tpu.precision(_name):
                _before = programs_built()
                _results[_name] = (_a.to("tpu") @ _b.to("tpu")).cpu()
                _built.append(programs_built() - _before)
        _warned += [str(w.message) for w in _caught]
        _unit = 2**-24 if _on_cpu_platform or _name == "highest" else 2**-8
        assert ((_results[_name].double() - _exact).abs() <= _bound(_unit)).all(), _name
    if _on_cpu_platform:
        assert torch.equal(_results["medium"], _results["high"])
        assert torch.equal(_results["medium"], _results["highest"])
    # one program per precision: [1, 1, 1] in a fresh process; [0, 0, 0] when this cell
    # runs again in the same kernel (the programs are already built)
    assert _built in ([1, 1, 1], [0, 0, 0]), _built
    assert torch.tpu.get_precision() == torch.tpu.Precision.DEFAULT  # the context ended

    _rows = [
        [
            f"tpu, `{name}`",
            f"{(r.double() - _exact).abs().max().item():.2e}",
            f"{(r.double() - _exact).abs().mean().item():.2e}",
            n,
        ]
        for (name, r), n in zip(_results.items(), _built)
    ]
    _rows.append(
        [
            "CPU (PyTorch)",
            f"{(_cpu.double() - _exact).abs().max().item():.2e}",
            f"{(_cpu.double() - _exact).abs().mean().item():.2e}",
            "-",
        ]
    )
    mo.md(
        md_table(["float32 `a @ b`, K = 512", "max error vs float64", "mean error", "programs built"], _rows)
        + "\n\nWarnings:\n\n"
        + "\n".join(f"- {w}" for w in _warned)
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    `torch.set_float32_matmul_precision` sets the process-wide default (the same call as on
    CUDA); `torch.tpu.precision` contexts nest and win over it. This cell sets `"high"`,
    then goes back to `"medium"`.
    """)
    return


@app.cell
def _(torch, warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-time cost warning, seen above
        torch.set_float32_matmul_precision("high")
        assert torch.tpu.get_precision() == torch.tpu.Precision.HIGH
        with torch.tpu.precision("highest"):
            assert torch.tpu.get_precision() == torch.tpu.Precision.HIGHEST
            with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
                assert torch.tpu.get_precision() == torch.tpu.Precision.DEFAULT
        assert torch.tpu.get_precision() == torch.tpu.Precision.HIGH
        torch.set_float32_matmul_precision("medium")
    assert torch.tpu.get_precision() == torch.tpu.Precision.DEFAULT
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## bfloat16 tensors

    bfloat16 is float32's exponent with 8 bits of mantissa: the TPU's native matmul
    input type. Tensors and modules convert as usual (`.to(torch.bfloat16)`,
    `.bfloat16()`). A bfloat16 matmul multiplies bfloat16 inputs and accumulates in
    float32, then rounds the result to bfloat16 — what PyTorch's CPU kernels do too.
    `torch.tpu.is_bf16_supported()` is true on every platform.
    """)
    return


@app.cell
def _(mo, nn, torch):
    _g = torch.Generator().manual_seed(1)
    _x = torch.randn(32, 64, generator=_g).bfloat16()
    _w = torch.randn(64, 48, generator=_g).bfloat16()

    _tpu = (_x.to("tpu") @ _w.to("tpu")).cpu()
    _cpu = _x @ _w
    _exact = _x.double() @ _w.double()  # the same bfloat16 inputs, multiplied exactly
    assert _tpu.dtype == torch.bfloat16
    torch.testing.assert_close(_tpu, _cpu)  # PyTorch's bfloat16 tolerance

    _chain_cpu = (_x[:, :48] * _cpu + 1).sigmoid().sum(-1)
    _chain_tpu = (_x[:, :48].to("tpu") * _cpu.to("tpu") + 1).sigmoid().sum(-1)
    torch.testing.assert_close(_chain_tpu.cpu(), _chain_cpu)

    torch.manual_seed(0)
    _layer = nn.Linear(64, 16)
    _layer_tpu = nn.Linear(64, 16).to("tpu")
    _layer_tpu.load_state_dict(_layer.state_dict())
    _layer_tpu.bfloat16()
    _layer.bfloat16()
    assert _layer_tpu.weight.dtype == torch.bfloat16
    torch.testing.assert_close(_layer_tpu(_x.to("tpu")).cpu(), _layer(_x))

    mo.md(
        md_table(
            ["bfloat16 `x @ w`", "max error vs exact product of the bfloat16 inputs"],
            [
                ["tpu", f"{(_tpu.double() - _exact).abs().max().item():.3e}"],
                ["CPU (PyTorch)", f"{(_cpu.double() - _exact).abs().max().item():.3e}"],
            ],
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Mixed precision: `torch.autocast("tpu")`

    Keep float32 parameters, and let autocast run each op in the dtype suited to it:
    matmuls, linears, convolutions and attention in bfloat16 (the default autocast dtype
    on tpu), numerically sensitive ops (`layer_norm`, `exp`, `log`, losses, ...) in
    float32, reductions such as `softmax` and `sum` with a float32 output. torchtpu
    follows **CUDA's** autocast policy op for op, not the CPU's: a model moved from CUDA
    gets the dtypes it had there (`docs/autocast.md` has the whole table).
    """)
    return


@app.cell
def _(F, mo, torch):
    _g = torch.Generator().manual_seed(2)
    _x, _w, _b = torch.randn(8, 16, generator=_g), torch.randn(32, 16, generator=_g), torch.randn(32, generator=_g)

    def _ops(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict:
        h = F.linear(x, w, b)
        n = F.layer_norm(h, (32,))
        return {"linear": h, "layer_norm": n, "softmax": torch.softmax(n, -1), "sum": h.sum()}

    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    with torch.autocast("tpu"):
        _tpu = _ops(_x.to("tpu"), _w.to("tpu"), _b.to("tpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _cpu_autocast = _ops(_x, _w, _b)

    # CUDA's policy on the CPU, by hand: linear in bfloat16, the rest in float32
    _h = F.linear(_x.bfloat16(), _w.bfloat16(), _b.bfloat16())
    _n = F.layer_norm(_h.float(), (32,))
    _expected = {"linear": _h, "layer_norm": _n, "softmax": torch.softmax(_n, -1), "sum": _h.sum(dtype=torch.float32)}
    for _k in _expected:
        assert _tpu[_k].dtype == _expected[_k].dtype, _k
        torch.testing.assert_close(_tpu[_k].cpu(), _expected[_k])

    with torch.autocast("tpu", dtype=torch.float16):
        assert F.linear(_x.to("tpu"), _w.to("tpu")).dtype == torch.float16
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]

    mo.md(
        md_table(
            ["op", 'dtype under `autocast("tpu")`', "= CUDA's policy, computed on the CPU", 'dtype under `autocast("cpu")`'],
            [[f"`{k}`", _tpu[k].dtype, "yes", _cpu_autocast[k].dtype] for k in _expected],
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `torch.amp.GradScaler("tpu")`

    With float16 (and harmlessly with bfloat16) scale the loss so small gradients do not
    underflow. `GradScaler("tpu")` is PyTorch's own GradScaler; its two device kernels are
    lowered to XLA. A step whose gradients hold an inf or NaN is skipped and the scale
    backed off; after `growth_interval` good steps the scale grows. The run below plants
    an inf at step 4 and a NaN at step 6, on tpu and on the CPU: the same scales, the
    same skipped steps, the same parameters. Backward runs outside the autocast region,
    as on CUDA.
    """)
    return


@app.cell
def _(F, math, mo, nn, torch):
    def scaler_run(device: str, dtype: torch.dtype = torch.float32) -> tuple[list[float], list[float], list]:
        """Scales, losses and final parameters of 7 steps with an inf and a NaN planted."""
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(device, dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        g = torch.Generator().manual_seed(1)
        planted = {3: math.inf, 5: math.nan}
        scales, losses = [], []
        for step in range(7):
            x = torch.randn(4, 8, generator=g).to(device, dtype)
            y = torch.randint(0, 3, (4,), generator=g).to(device)
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            scaler.scale(loss).backward()
            if step in planted:
                model[0].weight.grad[0, 1] = planted[step]  # a bad gradient: skip this step
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
            losses.append(loss.item())
        return scales, losses, [p.detach().cpu() for p in model.parameters()]

    _tpu_scales, _tpu_losses, _tpu_params = scaler_run("tpu")
    _cpu_scales, _cpu_losses, _cpu_params = scaler_run("cpu")
    _, _, _exact_params = scaler_run("cpu", torch.float64)  # autocast leaves float64 alone

    assert _tpu_scales == _cpu_scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 512.0, 512.0]
    torch.testing.assert_close(torch.tensor(_tpu_losses), torch.tensor(_cpu_losses))
    torch.testing.assert_close(_tpu_params, _cpu_params)

    def _err(params: list) -> float:
        return max((p.double() - e).abs().max().item() for p, e in zip(params, _exact_params))

    mo.md(
        md_table(
            ["step", "scale (tpu)", "scale (CPU)", "loss (tpu)", "loss (CPU)"],
            [
                [i + 1, st, sc, f"{lt:.6f}", f"{lc:.6f}"]
                for i, (st, sc, lt, lc) in enumerate(zip(_tpu_scales, _cpu_scales, _tpu_losses, _cpu_losses))
            ],
        )
        + f"\n\nLargest parameter difference from the float64 run (no bfloat16 rounding): "
        f"tpu {_err(_tpu_params):.2e}, CPU {_err(_cpu_params):.2e}."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## In short

    - Leave float32 matmul precision at `"medium"` unless a result needs more; raise it
      for one region with `with torch.tpu.precision("high"):`.
    - For training, keep float32 parameters and use `torch.autocast("tpu")` (bfloat16)
      around the forward pass and the loss; add `torch.amp.GradScaler("tpu")` for float16.
    - Autocast, GradScaler and the precision setting work the same in eager,
      DeferAndFuse and `torch.compile(backend="tpu")`.
    """)
    return


if __name__ == "__main__":
    app.run()
