"""torch.compile(backend="tpu") with varying shapes: recompiles, bounded dynamism, and how to avoid recompiles.

marimo edit docs/notebooks/04_compile_and_dynamic_shapes.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(r"""
    # torch.compile and dynamic shapes

    An XLA program has static shapes. `torch.compile(fn, backend="tpu")` turns each graph
    Dynamo captures into one program per *key*: the inputs' shapes, strides, dtypes and
    storage sizes, and the matmul precision. A call with a new key builds another program
    (compiled, or loaded from the disk cache): a **recompile**. A model fed sequences of
    many lengths would build a program per length.

    **Bounded dynamism** avoids that: mark a dimension dynamic with a maximum size, and
    lengths are rounded up to power-of-two *buckets*; each bucket's program masks the
    padding, so the results are those of the exact shapes. This notebook shows both, with
    every output and gradient checked against PyTorch on the CPU.
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
    import contextlib
    import io
    import os
    import warnings

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchtpu

    def programs_built() -> int:
        """XLA programs this process has built: compiled, or loaded from the disk cache."""
        m = torchtpu.metrics.snapshot()
        return m["compiles"] + m["disk_cache_hits"]

    def dynamo_graphs() -> int:
        """Graphs Dynamo has captured in this process."""
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    @contextlib.contextmanager
    def recompile_log():
        """Collect torchtpu's TORCHTPU_LOG_RECOMPILES=1 lines (one per new program of a
        graph, saying which part of the key changed) into a list."""
        lines: list[str] = []
        saved = os.environ.get("TORCHTPU_LOG_RECOMPILES")
        os.environ["TORCHTPU_LOG_RECOMPILES"] = "1"  # read at each call
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stderr(buffer):
                yield lines
        finally:
            if saved is None:
                del os.environ["TORCHTPU_LOG_RECOMPILES"]
            else:
                os.environ["TORCHTPU_LOG_RECOMPILES"] = saved
            lines += [line for line in buffer.getvalue().splitlines() if "recompiling" in line]

    class Block(nn.Module):
        """A pre-norm transformer block on (batch, seq, d)."""

        def __init__(self, d: int = 16) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
            p = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
            x = x + self.proj(p @ v)
            return x + self.fc2(F.gelu(self.fc1(x)))

    def block_pair() -> tuple[nn.Module, nn.Module]:
        """The same block on the CPU and on tpu."""
        torch.manual_seed(0)
        cpu = Block()
        tpu = Block().to("tpu")
        tpu.load_state_dict(cpu.state_dict())
        return cpu, tpu

    return (
        block_pair,
        dynamo_graphs,
        nn,
        programs_built,
        recompile_log,
        torch,
        torchtpu,
        warnings,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exact shapes: a program per length

    The block, compiled as is, on six sequence lengths. Dynamo traces twice: a static
    graph for the first length, then (automatic dynamic shapes) a graph with a symbolic
    length. Without a bound, torchtpu runs that graph at exact shapes, one program per
    length. `TORCHTPU_LOG_RECOMPILES=1` prints why each new program was needed.
    """)
    return


@app.cell
def _(block_pair, dynamo_graphs, mo, programs_built, recompile_log, torch):
    _cpu, _tpu = block_pair()
    torch._dynamo.reset()
    _compiled = torch.compile(_tpu, backend="tpu")
    _lengths = [3, 5, 9, 17, 33, 65]
    _g = torch.Generator().manual_seed(0)
    _built, _graphs = programs_built(), dynamo_graphs()
    with recompile_log() as _log, torch.no_grad():
        for _n in _lengths:
            _x = torch.randn(2, _n, 16, generator=_g)
            torch.testing.assert_close(_compiled(_x.to("tpu")).cpu(), _cpu(_x))
    _built, _graphs = programs_built() - _built, dynamo_graphs() - _graphs

    assert _graphs == 2, _graphs
    assert len(_log) == len(_lengths) - 2, _log  # the dynamic graph's 2nd, 3rd, ... program
    # 0 when this cell runs again in the same kernel: the programs are already built
    assert _built in (len(_lengths), 0), _built
    mo.md(
        f"{len(_lengths)} lengths: **{_graphs}** Dynamo graphs, **{_built}** programs built.\n\n```\n" + "\n".join(_log) + "\n```"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Bounded dynamism with `torchtpu.mark_dynamic`

    `torchtpu.mark_dynamic(tensor, dim, max_size)` marks one dimension of an input as
    dynamic, up to `max_size`. Each length `n` runs in the program of its bucket (the
    next power of two, at most the bound): the input is padded, the program marks the
    dimension's true size with `stablehlo.set_dimension_size`, so XLA masks the padding
    in reductions, matmuls and softmax itself, and the output comes back as a view of
    its first `n` rows. Sixteen lengths from 2 to 256 need at most eight programs
    (buckets 2, 4, ..., 256); each output equals the CPU's at its exact length.
    """)
    return


@app.cell
def _(
    block_pair,
    mo,
    programs_built,
    recompile_log,
    torch,
    torchtpu,
    warnings,
):
    _cpu, _tpu = block_pair()
    torch._dynamo.reset()
    _compiled = torch.compile(_tpu, backend="tpu")
    _lengths = [2, 3, 5, 7, 9, 16, 17, 31, 33, 60, 64, 65, 100, 129, 200, 256]
    _buckets = sorted({1 << (n - 1).bit_length() for n in _lengths})
    _g = torch.Generator().manual_seed(0)
    _before = programs_built()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs at exact shapes" fallback warning
        with recompile_log() as _log, torch.no_grad():
            for _n in _lengths:
                _x = torch.randn(2, _n, 16, generator=_g)
                _out = _compiled(torchtpu.mark_dynamic(_x.to("tpu"), 1, 256))
                assert tuple(_out.shape) == (2, _n, 16)
                torch.testing.assert_close(_out.cpu(), _cpu(_x))
    _built = programs_built() - _before

    assert len(_log) == len(_buckets) - 1, _log  # one program per bucket, not per length
    assert _built <= len(_buckets), _built
    mo.md(
        f"{len(_lengths)} lengths, buckets {_buckets}: **{_built}** programs built "
        f"(0 when this cell runs again in the same kernel), **{len(_log)}** recompiles logged "
        "after the first program."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `dynamic=True` with a bound

    `torch.compile(fn, backend="tpu", dynamic=True, options={"max_size": N})` makes every
    dimension Dynamo sees as dynamic a bounded one, without marking inputs (also
    `options={"bounded_dynamism": True, "max_size": N}`). Every dimension: prefer
    `mark_dynamic` on the one dimension that varies when the others (a batch of 2, say)
    do not. Here a token model on one sequence at a time, its output per token and a sum
    over the sequence.
    """)
    return


@app.cell
def _(mo, nn, programs_built, torch, warnings):
    class TokenAttention(nn.Module):
        def __init__(self, vocab: int = 50, d: int = 16) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, 3)

        def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.emb(idx)  # (n, d)
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
            return self.out(a), a.sum(dim=0)

    torch.manual_seed(0)
    _cpu = TokenAttention()
    _tpu = TokenAttention().to("tpu")
    _tpu.load_state_dict(_cpu.state_dict())
    torch._dynamo.reset()
    _compiled = torch.compile(_tpu, backend="tpu", dynamic=True, options={"max_size": 512})
    _lengths = [3, 5, 7, 9, 16, 17, 31, 33, 60, 64, 300, 512]
    _buckets = sorted({1 << (n - 1).bit_length() for n in _lengths})
    _g = torch.Generator().manual_seed(0)
    _before = programs_built()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            for _n in _lengths:
                _idx = torch.randint(0, 50, (_n,), generator=_g)
                _out, _total = _compiled(_idx.to("tpu"))
                _exp_out, _exp_total = _cpu(_idx)
                torch.testing.assert_close(_out.cpu(), _exp_out)
                torch.testing.assert_close(_total.cpu(), _exp_total)
    _built = programs_built() - _before
    assert _built <= len(_buckets), _built
    mo.md(f"{len(_lengths)} lengths up to 512, buckets {_buckets}: **{_built}** programs built.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Training with varying lengths

    A training step through the compiled block and loss builds one forward and one
    backward program per bucket; the gradients are the CPU's at every length.
    """)
    return


@app.cell
def _(block_pair, mo, programs_built, torch, torchtpu, warnings):
    _cpu, _tpu = block_pair()
    torch._dynamo.reset()
    _loss = torch.compile(lambda x: _tpu(x).square().sum(), backend="tpu")  # the loss inside, too
    _g = torch.Generator().manual_seed(1)
    _rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _n in (5, 7, 12, 13):  # buckets 8, 8, 16, 16
            _before = programs_built()
            _x = torch.randn(2, _n, 16, generator=_g)
            _loss(torchtpu.mark_dynamic(_x.to("tpu"), 1, 64)).backward()
            _cpu(_x).square().sum().backward()
            for _p_tpu, _p_cpu in zip(_tpu.parameters(), _cpu.parameters()):
                torch.testing.assert_close(_p_tpu.grad.cpu(), _p_cpu.grad)
                _p_tpu.grad = _p_cpu.grad = None
            _rows.append([_n, 1 << (_n - 1).bit_length(), programs_built() - _before])
    # a length whose bucket already has its programs builds nothing new
    assert _rows[1][2] == 0 and _rows[3][2] == 0, _rows
    mo.md(
        md_table(["length", "bucket", "programs built"], _rows)
        + "\n\n(In a fresh kernel: a forward and a backward program for each new bucket.)"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What runs at exact shapes instead

    A graph is bucketed only if every op in it is known to give the exact-shape result
    on padded, masked inputs. Otherwise torchtpu warns, naming the op, and runs that
    graph at exact shapes (one program per length): still correct, just not bucketed.
    `mean` is one such op (it divides by a size baked into the program), as is a reshape
    that folds the dynamic dimension into another one. Eager ops on a `mark_dynamic`
    tensor, outside `torch.compile`, also run at exact shapes.
    """)
    return


@app.cell
def _(mo, torch, warnings):
    def _mean_rows(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=0)

    torch._dynamo.reset()
    _compiled = torch.compile(_mean_rows, backend="tpu", dynamic=True, options={"max_size": 64})
    with warnings.catch_warnings(record=True) as _caught:
        warnings.simplefilter("always")
        for _n in (3, 5):
            _x = torch.randn(_n, 4)
            torch.testing.assert_close(_compiled(_x.to("tpu")).cpu(), _mean_rows(_x))
    _messages = [str(w.message) for w in _caught if "exact shapes" in str(w.message)]
    assert _messages, [str(w.message) for w in _caught]
    mo.md("Warning: `" + _messages[0] + "`")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    `dynamic=True` without a bound is an error that says what to pass:
    """)
    return


@app.cell
def _(mo, torch):
    torch._dynamo.reset()
    _compiled = torch.compile(lambda x: x * 2, backend="tpu", dynamic=True)
    try:
        _compiled(torch.randn(5).to("tpu"))
        _error = None
    except Exception as e:  # noqa: BLE001 - any error type: the message is the point
        _error = f"{type(e).__name__}: {e}"
    assert _error is not None and "max_size" in _error, _error
    mo.md(f"`{_error}`")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Python numbers

    A Python `float` argument becomes a device operand: Dynamo specializes on the first
    value, then makes it symbolic on the second, and that one program serves every later
    value. A Python `int` is different: Dynamo and torchtpu treat a changing int like a
    size, which may shape the program. Pass a number that changes every step (a step
    count, a scale) as a 0-d tensor on the device: one program for all values.
    """)
    return


@app.cell
def _(mo, programs_built, torch):
    def _scale(x: torch.Tensor, s) -> torch.Tensor:
        return x * s

    _x = torch.randn(8)
    _rows = []
    for _label, _values in [
        ("Python float", [0.5, 0.25, 0.125, 2.0, 3.5, 7.25]),
        ("0-d tpu tensor", [torch.tensor(v, device="tpu") for v in (0.5, 0.25, 0.125, 2.0, 3.5, 7.25)]),
    ]:
        torch._dynamo.reset()
        _compiled = torch.compile(_scale, backend="tpu")
        _before = programs_built()
        for _s in _values:
            _expected = _x * (_s.item() if isinstance(_s, torch.Tensor) else _s)
            torch.testing.assert_close(_compiled(_x.to("tpu"), _s).cpu(), _expected)
        _rows.append([_label, len(_values), programs_built() - _before])
    assert _rows[0][2] <= 2 and _rows[1][2] <= 1, _rows
    mo.md(
        md_table(["argument", "values", "programs built"], _rows)
        + "\n\n(Counts are for a fresh kernel; running the cell again finds the programs built.)"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Avoiding recompiles

    - **Varying lengths**: `torchtpu.mark_dynamic(x, dim, max_size)` on the dimension
      that varies, or `dynamic=True, options={"max_size": N}`. Keep the ops of the
      compiled region among those that bucket (no `mean` over the dynamic dimension, no
      reshape that folds it into another one); the warning names the op when one does not.
    - **Numbers that change**: floats are fine; pass ints that are not sizes as 0-d
      tensors on the device.
    - **The rest of the key**: a new dtype, a new stride (a transposed or non-contiguous
      input) or another matmul precision (`torch.tpu.precision`) is another program,
      as it must be.
    - **Finding out why**: `TORCHTPU_LOG_RECOMPILES=1` says which input changed for a new
      program of a graph; `TORCH_LOGS=recompiles` says why Dynamo traced a graph again.
      `torchtpu.metrics.snapshot()["compiles"]` counts programs compiled.
    - Programs are cached on disk (`TORCHTPU_CACHE_DIR`): a second run of the same
      script loads them instead of compiling (notebook 06).
    """)
    return


if __name__ == "__main__":
    app.run()
