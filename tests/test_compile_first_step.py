"""What the first compiled step may skip, pinned by graphs and numbers (never by timing).

AOTAutograd's CSE pass imports ``torch._inductor.pattern_matcher`` (0.5-1 s of the first
training step). The "tpu" backend skips the pass when it would merge nothing
(``backend.cse_candidates``), and only inside its own partitioner call. These tests check
that the skip leaves every graph, program and number as CSE would, that graphs with
duplicates still get CSE, and that ``torch._functorch.config.cse`` stays on for everyone
else. See docs/compile.md, "First-step time".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._functorch.partitioners as partitioners
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu.compile import backend, fx_lowering


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def _duplicates(x: torch.Tensor) -> torch.Tensor:
    """The same subexpressions twice: CSE has something to merge."""
    h = F.linear(x, torch.ones(4, x.shape[-1], device=x.device) / 8)
    return torch.softmax(h, -1) + torch.softmax(h, -1) * h.exp() + x.var() * x.var()


class _Dup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _duplicates(self.lin(x))


def _train(make: Callable[[], nn.Module], steps: int = 3) -> dict:
    """A few SGD steps of the compiled model: losses, parameters, and per graph its FX code
    and its programs' StableHLO."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fwd = torch.compile(model, backend="tpu")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 16, generator=g).to("tpu"), torch.tensor([0, 1, 2, 3, 0, 1]).to("tpu")
    before = {id(c) for c in fx_lowering.GRAPHS}
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    graphs = sorted((c for c in fx_lowering.GRAPHS if id(c) not in before), key=lambda c: c.name)
    return {
        "losses": torch.stack(losses),
        "params": [p.detach().cpu() for p in model.parameters()],
        "graphs": [(c.name.rstrip("0123456789"), c.gm.code, [p.storage.text for p in c.programs.values()]) for c in graphs],
    }


def _assert_same(a: dict, b: dict) -> None:
    assert torch.equal(a["losses"], b["losses"])
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"]))
    assert [g[0] for g in a["graphs"]] == ["backward", "forward"]
    assert a["graphs"] == b["graphs"]  # same FX graphs and the same program texts, one program each


@pytest.fixture
def cse_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(nodes before, nodes after) of every CSE run by AOTAutograd's partitioner."""
    calls: list[tuple[int, int]] = []
    original = partitioners.fx_graph_cse

    def counted(graph: torch.fx.Graph) -> torch.fx.Graph:
        n = len(graph.nodes)
        out = original(graph)
        calls.append((n, len(out.nodes)))
        return out

    monkeypatch.setattr(partitioners, "fx_graph_cse", counted)
    return calls


def _always_cse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "cse_candidates", lambda graph: True)


def test_without_duplicates_cse_is_skipped_and_changes_nothing(cse_calls, monkeypatch):
    skipped = _train(_mlp)
    assert cse_calls == []
    _always_cse(monkeypatch)
    with_cse = _train(_mlp)
    assert len(cse_calls) == 1 and cse_calls[0][0] == cse_calls[0][1]  # CSE ran and merged nothing
    _assert_same(skipped, with_cse)


def test_with_duplicates_cse_still_runs(cse_calls, monkeypatch):
    ours = _train(_Dup)
    assert len(cse_calls) == 1 and cse_calls[0][1] < cse_calls[0][0]  # it merged the duplicates
    _always_cse(monkeypatch)
    _assert_same(ours, _train(_Dup))
    # without CSE the forward would save more activations (a different program): the
    # reason the backend never turns CSE off where it has something to merge
    with functorch_config.patch(cse=False):
        no_cse = _train(_Dup)
    assert no_cse["graphs"] != ours["graphs"]


def test_cse_candidates_agrees_with_fx_graph_cse(monkeypatch):
    """On every joint graph of a few models: False only where PyTorch's CSE merges nothing."""
    seen: list[tuple[bool, int, int]] = []
    original = backend.cse_candidates

    def check(graph: torch.fx.Graph) -> bool:
        found = original(graph)
        merged = partitioners.fx_graph_cse(graph)
        seen.append((found, len(graph.nodes), len(merged.nodes)))
        return found

    monkeypatch.setattr(backend, "cse_candidates", check)
    _train(_mlp, steps=1)
    _train(_Dup, steps=1)
    _train(lambda: nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 4)), steps=1)
    assert len(seen) == 3
    for found, before, after in seen:
        assert found or before == after
    assert [s[0] for s in seen] == [False, True, False]


def test_cse_setting_stays_inside_our_partitioner(monkeypatch, cse_calls):
    """cse=False holds only during our own partitioner call; the global setting, and with it
    inductor's and every other backend's CSE, is untouched before, after and on error."""
    states: list[bool] = []
    original = partitioners.min_cut_rematerialization_partition

    def spy(*args, **kwargs):
        states.append(functorch_config.cse)
        return original(*args, **kwargs)

    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", spy)
    assert functorch_config.cse is True
    _train(_mlp, steps=1)
    assert states == [False] and functorch_config.cse is True

    def boom(*args, **kwargs):
        raise RuntimeError("partitioner failed")

    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", boom)
    with pytest.raises(Exception, match="partitioner failed"):
        _train(_mlp, steps=1)
    assert functorch_config.cse is True

    # another AOTAutograd backend in the same process still runs CSE on the same model
    assert cse_calls == []
    torch._dynamo.reset()
    torch.compile(_mlp(), backend="aot_eager_decomp_partition")(torch.randn(3, 16)).sum().backward()
    assert len(cse_calls) == 1


FRESH = r"""
import json, sys, torch, torch.nn as nn, torch.nn.functional as F, torchtpu
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
x = torch.randn(6, 16).to("tpu")
F.cross_entropy(torch.compile(model, backend="tpu")(x), torch.tensor([0, 1, 2, 3, 0, 1]).to("tpu")).backward()
torch.tpu.synchronize()
print(json.dumps({m: m in sys.modules for m in ("torch._dynamo", "torch._inductor.pattern_matcher", "torch._inductor.lowering")}))
"""


def test_first_training_step_does_not_import_inductor_lowerings():
    """A fresh process's first compiled training step imports Dynamo but not Inductor's
    pattern matcher and lowerings (what AOTAutograd's CSE would pull in)."""
    env = dict(os.environ, TORCHTPU_CACHE_DIR="")
    out = subprocess.run([sys.executable, "-c", FRESH], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"torch._dynamo": True, "torch._inductor.pattern_matcher": False, "torch._inductor.lowering": False}


def test_metrics_unchanged_by_the_skip(monkeypatch):
    """Programs compiled and run per step are the same with and without the skip."""

    def counts() -> tuple[int, int]:
        torchtpu.metrics.reset()
        _train(_mlp, steps=2)
        m = torchtpu.metrics.snapshot()
        return m["compiled_graphs"], m["executions"]

    skipped = counts()
    _always_cse(monkeypatch)
    assert counts() == skipped
