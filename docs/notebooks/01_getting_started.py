"""Getting started: the "tpu" device, torch.tpu, a model trained on tpu and on the CPU.

marimo edit docs/notebooks/01_getting_started.py     # interactive
marimo export html docs/notebooks/01_getting_started.py -o 01.html
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Getting started with torchtpu

        torchtpu gives PyTorch a `"tpu"` device. Every ATen op on a tpu tensor is lowered to
        StableHLO and run through an XLA PjRT client: XLA's CPU client by default (the
        *cpu platform*, which this notebook runs on), libtpu on a TPU VM, or the CUDA PjRT
        plugin on an NVIDIA GPU. The code is the same on all three.

        Every cell that computes something checks its result against PyTorch on the CPU with
        an `assert`, so this notebook is also a test: it fails to export when a claim breaks.
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
    ## `import torch` is all it takes

    Installed, torchtpu registers itself under PyTorch's `torch.backends` entry point
    group. PyTorch calls every such entry point when it is imported (*device backend
    autoload*), so a bare `import torch` renames PyTorch's PrivateUse1 device to `"tpu"`,
    installs `torch.tpu` and registers the kernels. Nothing else to import.
    (`TORCH_DEVICE_BACKEND_AUTOLOAD=0` turns autoloading off; then `import torchtpu`
    loads it by hand.)
    """)
    return


@app.cell
def _(mo):
    import importlib.metadata
    import sys

    import torch

    _entry_points = {e.name: e.value for e in importlib.metadata.entry_points(group="torch.backends")}
    assert _entry_points.get("tpu") == "torchtpu:_autoload", _entry_points
    assert "torchtpu" in sys.modules, "import torch should have loaded torchtpu"
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    mo.md(
        f"""
        `torch.backends` entry points: `{_entry_points}`

        After `import torch`: `torchtpu` loaded: **{"torchtpu" in sys.modules}**,
        PrivateUse1 is called **`{torch._C._get_privateuse1_backend_name()}`**.
        """
    )
    return (torch,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The device and `torch.tpu`

    `torch.device("tpu")` works like `torch.device("cuda")`, and `torch.tpu` mirrors
    `torch.cuda`. One process drives one device, `tpu:0`; for several devices run one
    process per device (notebook 05). `torch.accelerator` agrees, so libraries that ask
    PyTorch for "the" accelerator (Hugging Face's Trainer, accelerate) find tpu.
    """)
    return


@app.cell
def _(mo, torch):
    import torchtpu

    _props = torch.tpu.get_device_properties()
    _facts = [
        ["`torch.device('tpu')`", torch.device("tpu")],
        ["`torch.tpu.is_available()`", torch.tpu.is_available()],
        ["`torch.tpu.device_count()`", torch.tpu.device_count()],
        ["`torch.tpu.current_device()`", torch.tpu.current_device()],
        ["`torch.tpu.get_device_name()`", torch.tpu.get_device_name()],
        ["`torch.tpu.get_device_properties()`", _props],
        ["`torch.tpu.is_bf16_supported()`", torch.tpu.is_bf16_supported()],
        ["`torch.accelerator.current_accelerator()`", torch.accelerator.current_accelerator()],
        ["`torchtpu.platform()`", torchtpu.platform()],
    ]
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torchtpu.platform() in ("cpu", "tpu", "cuda")
    mo.md(md_table(["call", "result"], _facts))
    return (torchtpu,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Tensors

    `.to("tpu")`, `device="tpu"` in factories, `.cpu()`, `.item()`, `.tolist()` and
    printing work as with CUDA. A tpu tensor is a plain `torch.Tensor` whose storage
    holds one device buffer: views share it, in-place writes are seen by every alias.
    """)
    return


@app.cell
def _(torch):
    _g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=_g)
    b = torch.randn(4, 5, generator=_g)

    c = (a.to("tpu") @ b.to("tpu")).relu()  # runs on the device
    expected = (a @ b).relu()  # the same on the CPU
    torch.testing.assert_close(c.cpu(), expected)

    # views alias their base, as on the CPU
    _base = torch.zeros(2, 3, device="tpu")
    _base[1].fill_(7.0)  # an in-place write through a view
    assert _base.tolist() == [[0.0, 0.0, 0.0], [7.0, 7.0, 7.0]]
    assert torch.tensor([1.5, 2.5], device="tpu").sum().item() == 4.0
    print(c)
    return (a,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Asynchronous execution and `torch.tpu.synchronize()`

    Each op is enqueued on the device and the Python call returns; `.cpu()`, `.item()`,
    printing and `torch.tpu.synchronize()` wait for the result, as with CUDA. Time
    device work only after a `synchronize()`. The first number below is how long the
    Python calls took, the second includes waiting for the device.
    """)
    return


@app.cell
def _(mo, torch):
    import time

    _x = torch.randn(1024, 1024).to("tpu")
    _y = (_x @ _x).tanh()  # build both programs before timing
    torch.tpu.synchronize()

    _t0 = time.perf_counter()
    for _ in range(10):
        _y = (_y @ _x).tanh()
    _enqueued = time.perf_counter() - _t0
    torch.tpu.synchronize()  # wait for the ten matmuls
    _done = time.perf_counter() - _t0

    mo.md(
        f"Ten `(y @ x).tanh()` steps: the calls returned after **{_enqueued * 1e3:.1f} ms**, "
        f"the results were ready after **{_done * 1e3:.1f} ms**."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Memory statistics

    `torch.tpu.memory_allocated()`, `max_memory_allocated()`, `reset_peak_memory_stats()`
    and `memory_stats()` count the bytes held by live tpu storages, like their CUDA
    namesakes. A buffer is freed when its last tensor dies.
    """)
    return


@app.cell
def _(mo, torch):
    torch.tpu.reset_peak_memory_stats()
    _before = torch.tpu.memory_allocated()
    _x = torch.zeros(256, 1024, device="tpu")  # 1 MiB of float32
    _during = torch.tpu.memory_allocated() - _before
    _stats = torch.tpu.memory_stats()
    del _x
    _after = torch.tpu.memory_allocated() - _before
    _peak = torch.tpu.max_memory_allocated() - _before

    assert _during == 256 * 1024 * 4, _during
    assert _after == 0 and _peak == 256 * 1024 * 4
    mo.md(
        md_table(
            ["", "bytes"],
            [
                ["allocated while `x` lives (delta)", f"{_during:,}"],
                ["allocated after `del x` (delta)", f"{_after:,}"],
                ["peak (delta)", f"{_peak:,}"],
            ],
        )
        + "\n\n`torch.tpu.memory_stats()` while `x` lived:\n\n"
        + md_table(["key", "value"], [[f"`{k}`", f"{v:,}"] for k, v in _stats.items()])
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Train a model on tpu and on the CPU

    The training loop is a stock PyTorch loop; the device string is the only difference.
    Both runs start from the same seed and see the same batches, and end with the same
    losses and parameters (float32, up to rounding: XLA may sum in another order).
    `torchtpu.metrics.snapshot()` counts the XLA programs built (compiled, or loaded
    from the disk cache) and run: the first step builds one program per op, later steps
    reuse them.
    """)
    return


@app.cell
def _(torch, torchtpu):
    import torch.nn as nn
    import torch.nn.functional as F

    STEPS = 10

    def make_data() -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return torch.randn(STEPS, 64, 16, generator=g), torch.randint(0, 4, (STEPS, 64), generator=g)

    def programs_built() -> int:
        """XLA programs this process has built: compiled, or loaded from the disk cache."""
        m = torchtpu.metrics.snapshot()
        return m["compiles"] + m["disk_cache_hits"]

    def train(device: str) -> tuple[list[float], list[int], nn.Module]:
        """Losses, programs built per step, and the trained model."""
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        xs, ys = make_data()
        losses, built = [], []
        for x, y in zip(xs, ys):
            before = programs_built()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            built.append(programs_built() - before)
        return losses, built, model

    return nn, train


@app.cell
def _(mo, torch, train):
    tpu_losses, tpu_built, tpu_model = train("tpu")
    cpu_losses, _, cpu_model = train("cpu")

    # float32 losses (item() gives Python floats): PyTorch's float32 tolerance
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses))
    for _p_tpu, _p_cpu in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert _p_tpu.device.type == "tpu"
        torch.testing.assert_close(_p_tpu.detach().cpu(), _p_cpu.detach())
    assert all(n == 0 for n in tpu_built[2:]), tpu_built  # the loop settles: nothing new to build

    mo.md(
        md_table(
            ["step", "loss on tpu", "loss on CPU", "difference", "programs built (tpu)"],
            [
                [i + 1, f"{t:.7f}", f"{c:.7f}", f"{abs(t - c):.1e}", n]
                for i, (t, c, n) in enumerate(zip(tpu_losses, cpu_losses, tpu_built))
            ],
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `model.to("tpu")` keeps your parameters

    As with `"cuda"`, moving a module keeps every `Parameter` object: an optimizer
    built before the move keeps updating the model, tied weights stay tied.
    """)
    return


@app.cell
def _(nn, torch):
    _model = nn.Linear(4, 2)
    _weight = _model.weight
    _opt = torch.optim.SGD(_model.parameters(), lr=0.1)  # built before the move
    _model.to("tpu")
    assert _model.weight is _weight and _weight.device.type == "tpu"

    _x = torch.ones(3, 4, device="tpu")
    _old = _weight.detach().cpu().clone()
    _model(_x).sum().backward()
    _opt.step()
    # d(sum)/dW is 3 in every entry: SGD moved each weight by -0.1 * 3
    torch.testing.assert_close(_weight.detach().cpu(), _old - 0.3)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## A default device

    `torch.set_default_device("tpu")` (or `with torch.device("tpu"):`) makes factories
    and module constructors allocate on tpu, as with CUDA. It is process-wide, so this
    cell restores the default when it is done.
    """)
    return


@app.cell
def _(a, nn, torch):
    torch.set_default_device("tpu")
    try:
        _z = torch.zeros(2, 3)
        _layer = nn.Linear(3, 3)
        _from_cpu = torch.as_tensor(a)  # an existing CPU tensor is copied to the default device
    finally:
        torch.set_default_device(None)
    assert _z.device.type == "tpu" and _layer.weight.device.type == "tpu"
    assert _from_cpu.device.type == "tpu"
    torch.testing.assert_close(_from_cpu.cpu(), a)
    assert torch.zeros(1).device.type == "cpu"  # restored

    with torch.device("tpu"):
        _w = torch.ones(4)
    assert _w.device.type == "tpu"
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Random numbers

    tpu random numbers come from a device generator: reproducible under
    `torch.manual_seed` (or `torch.tpu.manual_seed`), but not the same numbers as the
    CPU generator. To compare a model with the CPU, create it on the CPU and move it
    (as above), or copy a `state_dict`.
    """)
    return


@app.cell
def _(torch):
    torch.manual_seed(123)
    _first = torch.randn(5, device="tpu").cpu()
    torch.manual_seed(123)
    _second = torch.randn(5, device="tpu").cpu()
    assert torch.equal(_first, _second)
    print(_first)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Next

    - `02_execution_modes.py`: eager, DeferAndFuse and `torch.compile(backend="tpu")`.
    - `03_precision.py`: matmul precision, bfloat16, autocast and GradScaler.
    - `04_compile_and_dynamic_shapes.py`: varying shapes without recompiling.
    - `05_distributed.py`: DDP over the `"tpu"` process group.
    - `06_environment_variables.py`: every `TORCHTPU_*` setting.
    """)
    return


if __name__ == "__main__":
    app.run()
