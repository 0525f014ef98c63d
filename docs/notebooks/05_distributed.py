"""Distributed training: the "tpu" process group, DDP on two processes launched with torchrun.

marimo edit docs/notebooks/05_distributed.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(r"""
    # Distributed training

    One process drives one device (each sees `tpu:0`), as with one GPU per process. Launch
    one process per device with `torchrun`, and use PyTorch's own API: the process group
    backend is `"tpu"` (registered when `import torch` loads torchtpu), and DDP, FSDP2
    (`fully_shard`), DTensor, tensor parallelism and `torch.distributed.checkpoint` run
    on it unchanged.

    On the **cpu platform** each process runs its own XLA CPU client, so two processes on
    one machine are two "devices"; collectives move the bytes with gloo, reading the
    device buffers in place. This notebook launches a two-process DDP run from Python
    with `torchrun` and checks that its losses equal the same training in one process and
    on the CPU.
    """)
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
    ## The model and the data

    A module both the workers and this notebook import, so that all runs train the same
    model on the same global batches. It is written to a temporary directory.
    """)
    return


@app.cell
def _(mo):
    import importlib.util
    import json
    import os
    import subprocess
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    COMMON = textwrap.dedent('''\
    """Model, data and the single-process training run shared by the workers and the notebook."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    STEPS, BATCH, LR = 8, 32, 0.1


    def make_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))


    def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The global batches, on the CPU."""
        g = torch.Generator().manual_seed(1)
        return [(torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g)) for _ in range(STEPS)]


    def train_one_process(device: str) -> tuple[list[float], list[float]]:
        """Losses and final parameters of the same training, whole batches, one process."""
        model = make_model().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for x, y in batches():
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, torch.cat([p.detach().cpu().flatten() for p in model.parameters()]).tolist()
    ''')

    WORKER = textwrap.dedent('''\
    """One DDP rank: trains on its half of every global batch. Run with
    torchrun --nproc-per-node=2 ddp_worker.py OUT_DIR"""
    import json
    import os
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_common import LR, batches, make_model

    dist.init_process_group("tpu")  # rank, world size and rendezvous from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    ones = torch.full((3,), float(rank + 1), device="tpu")
    dist.all_reduce(ones)  # 1 + 2 on every rank

    model = DDP(make_model().to("tpu"))  # same seed on every rank; DDP broadcasts rank 0's anyway
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        x, y = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks here
        opt.step()
        opt.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)  # the loss of the whole batch
        losses.append(global_loss.item())

    result = {
        "rank": rank,
        "world": world,
        "backend": dist.get_backend(),
        "device": str(next(model.parameters()).device),
        "all_reduce": ones.cpu().tolist(),
        "losses": losses,
        "params": torch.cat([p.detach().cpu().flatten() for p in model.parameters()]).tolist(),
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    ''')

    def write_scripts(directory: Path) -> None:
        (directory / "ddp_common.py").write_text(COMMON)
        (directory / "ddp_worker.py").write_text(WORKER)

    with tempfile.TemporaryDirectory(prefix="torchtpu_ddp_") as _tmp:
        write_scripts(Path(_tmp))
        _spec = importlib.util.spec_from_file_location("ddp_common", Path(_tmp) / "ddp_common.py")
        common = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(common)  # the module lives on in memory

    mo.md(f"`ddp_common.py`:\n\n```python\n{COMMON}```")
    return (
        Path,
        WORKER,
        common,
        json,
        os,
        subprocess,
        sys,
        tempfile,
        write_scripts,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The worker

    A plain DDP script, as for CUDA with `"nccl"` replaced by `"tpu"` and `"cuda"` by
    `"tpu"`. Each rank trains on its half of every batch; DDP averages the gradients, so
    every rank takes the step the whole batch would give.
    """)
    return


@app.cell
def _(WORKER, mo):
    mo.md(f"`ddp_worker.py`:\n\n```python\n{WORKER}```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Launch two processes with `torchrun`

    `torchrun --standalone --nproc-per-node=2 ddp_worker.py OUT` (here as
    `python -m torch.distributed.run`, with this notebook's Python). Each rank writes its
    results as JSON.
    """)
    return


@app.cell
def _(Path, json, mo, os, subprocess, sys, tempfile, write_scripts):
    with tempfile.TemporaryDirectory(prefix="torchtpu_ddp_") as _tmp:
        _dir = Path(_tmp)
        write_scripts(_dir)
        _cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        _cmd += [str(_dir / "ddp_worker.py"), str(_dir)]
        _env = dict(os.environ, OMP_NUM_THREADS="1")
        _proc = subprocess.run(_cmd, cwd=_dir, env=_env, capture_output=True, text=True, timeout=300)
        assert _proc.returncode == 0, f"torchrun failed (rc {_proc.returncode}):\n{_proc.stdout[-3000:]}\n{_proc.stderr[-3000:]}"
        ranks = [json.loads((_dir / f"rank{r}.json").read_text()) for r in range(2)]

    for _r in ranks:
        assert _r["world"] == 2 and _r["backend"] == "tpu" and _r["device"] == "tpu:0", _r
        assert _r["all_reduce"] == [3.0, 3.0, 3.0]  # 1 + 2
    mo.md(
        md_table(
            ["rank", "world size", "backend", "parameters on", "`all_reduce` of `rank + 1`"],
            [[r["rank"], r["world"], r["backend"], r["device"], r["all_reduce"]] for r in ranks],
        )
    )
    return (ranks,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The same training in one process

    In this notebook's process: the whole batch per step, on tpu and on the CPU. DDP's
    losses (averaged over the ranks) and parameters must equal these, and the two ranks
    must hold identical parameters.
    """)
    return


@app.cell
def _(common, mo, ranks):
    import torch

    tpu_losses, tpu_params = common.train_one_process("tpu")
    cpu_losses, cpu_params = common.train_one_process("cpu")

    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["params"] == ranks[1]["params"]  # DDP keeps the replicas identical
    _ddp_losses = torch.tensor(ranks[0]["losses"])  # float32, as computed
    torch.testing.assert_close(_ddp_losses, torch.tensor(tpu_losses))
    torch.testing.assert_close(_ddp_losses, torch.tensor(cpu_losses))
    torch.testing.assert_close(torch.tensor(ranks[0]["params"]), torch.tensor(cpu_params))
    torch.testing.assert_close(torch.tensor(tpu_params), torch.tensor(cpu_params))

    mo.md(
        md_table(
            ["step", "DDP, 2 processes", "1 process, tpu", "1 process, CPU", "max difference"],
            [
                [i + 1, f"{d:.7f}", f"{t:.7f}", f"{c:.7f}", f"{max(abs(d - t), abs(d - c)):.1e}"]
                for i, (d, t, c) in enumerate(zip(ranks[0]["losses"], tpu_losses, cpu_losses))
            ],
        )
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Beyond DDP

    - The examples run FSDP2 and tensor parallelism the same way:
      `torchrun --nproc-per-node=2 examples/distributed/fsdp2.py --compare` and
      `examples/distributed/tensor_parallel.py --compare`; `--compare` checks the losses
      against one process, as above.
    - `init_process_group("cpu:gloo,tpu:tpu")` gives CPU tensors gloo and tpu tensors
      the tpu group.
    - Every collective of `torch.distributed` is there (`all_reduce`, `all_gather`,
      `reduce_scatter`, `all_to_all`, `broadcast`, `send`/`recv`, ...). A rank that dies
      makes the others' next collective raise an error naming it; a rank that hangs does
      so after the group's `timeout`; a rank that calls a different collective makes every
      rank raise, listing each rank's call (`TORCHTPU_DIST_CHECK=0` skips that check).
    - Details, per-platform transports and measurements: `docs/distributed.md`.
    """)
    return


if __name__ == "__main__":
    app.run()
