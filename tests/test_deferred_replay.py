"""DeferAndFuse replay: a graph that repeats the op sequence of the last graph that began
with the same op follows that graph's trace, reuses its records and finds its program
without hashing the sequence (eager/deferred.py ``_Trace``). These tests pin that a repeated
step takes that path, that any change (another op, shape, dtype, strides, storage sharing)
leaves it and still gives the CPU's numbers, and that new input values are used."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.eager import deferred
from torchtpu.runner import checks


@pytest.fixture(autouse=True)
def _defer() -> Iterator[None]:
    with torchtpu.eager_mode("defer_and_fuse"):
        yield


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per flush: did the graph follow its trace to the end?"""
    seen: list[bool] = []
    program = deferred._program

    def spy(g: deferred.Graph, rest: tuple, live: list, donated: tuple) -> deferred._Compiled:
        seen.append(g.trace is not None and len(g.nodes) == len(g.trace.keys))
        return program(g, rest, live, donated)

    monkeypatch.setattr(deferred, "_program", spy)
    return seen


def _step(x: torch.Tensor, w: torch.Tensor, s: float) -> torch.Tensor:
    return (torch.relu(x @ w + s) * 0.5).sum(0)


def _run(step: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
    """``step`` on tpu copies of the tensor arguments, read back to the CPU."""
    return step(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]).cpu()


def test_a_repeated_step_replays_and_uses_new_input_values(replays: list[bool]) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, generator=g)
    wt = w.to("tpu")
    for i in range(5):
        x = torch.randn(3, 8, generator=g)
        s = 0.25 * i + 0.1  # a lifted Python number: a new operand value each step
        got = _step(x.to("tpu"), wt, s).cpu()
        torch.testing.assert_close(got, _step(x, w, s))
    assert replays[0] is False and all(replays[2:]), replays


def test_a_changed_input_value_in_place_is_seen(replays: list[bool]) -> None:
    x = torch.arange(6.0).reshape(2, 3)
    xt = x.to("tpu")
    for _ in range(4):
        xt.add_(1.0)
        x.add_(1.0)
        torch.testing.assert_close((xt * 2).cpu(), x * 2)
    assert any(replays), replays


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda x, w: (x, w), id="same"),
        pytest.param(lambda x, w: (torch.cat([x, x]), w), id="shape"),
        pytest.param(lambda x, w: (x.double(), w.double()), id="dtype"),
        pytest.param(lambda x, w: (x.t().contiguous().t(), w), id="strides"),
        pytest.param(lambda x, w: (x[:, :8], w), id="view-of-wider"),
    ],
)
def test_a_changed_call_leaves_the_trace_and_matches_the_cpu(change: Callable, replays: list[bool]) -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 8, generator=g), torch.randn(8, 4, generator=g)
    for _ in range(3):
        torch.testing.assert_close(_run(_step, x, w, 0.5), _step(x, w, 0.5))
    x2, w2 = change(torch.cat([x, torch.randn(3, 2, generator=g)], 1)[:, :8], w)
    torch.testing.assert_close(_run(_step, x2, w2, 0.5), _step(x2, w2, 0.5))
    torch.testing.assert_close(_run(_step, x, w, 0.5), _step(x, w, 0.5))  # and back


def test_another_op_sequence_leaves_the_trace_and_matches_the_cpu(replays: list[bool]) -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 8, generator=g), torch.randn(8, 4, generator=g)

    def other(x: torch.Tensor, w: torch.Tensor, s: float) -> torch.Tensor:  # same first op, then differs
        return (torch.sigmoid(x @ w + s) * 0.5).sum(0)

    def longer(x: torch.Tensor, w: torch.Tensor, s: float) -> torch.Tensor:  # the step, then more
        return _step(x, w, s).exp()

    for step in (_step, _step, other, _step, longer, _step, _step):
        torch.testing.assert_close(_run(step, x, w, 0.5), step(x, w, 0.5))
    assert replays[-1] is True, replays


def _tail(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The same first op every time (the trace is picked), then an op on ``z``."""
    return torch.relu(x @ w) * z + 1


@pytest.mark.parametrize(
    "make_z",
    [
        pytest.param(lambda x, z: z.clone(), id="same"),
        pytest.param(lambda x, z: z[0].clone(), id="shape"),
        pytest.param(lambda x, z: z.double(), id="dtype"),
        pytest.param(lambda x, z: z.t().contiguous().t(), id="strides"),
        pytest.param(lambda x, z: torch.cat([z, z], 1)[:, 4:], id="offset"),
        pytest.param(lambda x, z: x, id="shared-storage"),  # the same key on another graph slot
    ],
)
def test_a_change_after_the_first_op_leaves_the_trace_and_matches_the_cpu(make_z: Callable, replays: list[bool]) -> None:
    g = torch.Generator().manual_seed(4)
    x, w, z = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    xt, wt = x.to("tpu"), w.to("tpu")
    for _ in range(3):
        torch.testing.assert_close(_tail(xt, wt, z.to("tpu")).cpu(), _tail(x, w, z))
    assert replays[-1] is True, replays
    z2 = make_z(x, z)
    z2t = xt if z2 is x else make_z(xt, z.to("tpu"))
    torch.tpu.synchronize()  # z2t's own ops run first: the step's graph starts with x @ w again
    torch.testing.assert_close(_tail(xt, wt, z2t).cpu(), _tail(x, w, z2))
    torch.testing.assert_close(_tail(xt, wt, z.to("tpu")).cpu(), _tail(x, w, z))  # and back


def test_training_steps_replay_and_match_the_cpu(replays: list[bool]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        for m, o, d in ((model, opt, "tpu"), (ref, ref_opt, "cpu")):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(m(x.to(d)), y.to(d)).backward()
            o.step()
        torch.tpu.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q)
    assert replays[-2:] == [True, True], replays


def test_a_replayed_device_check_names_this_calls_line() -> None:
    w = torch.randn(4, 3, device="tpu")
    good, bad = torch.tensor([0, 3], device="tpu"), torch.tensor([0, 4], device="tpu")
    for _ in range(3):
        (F.embedding(good, w) * 2).sum().item()
    z = F.embedding(bad, w) * 2
    line = test_a_replayed_device_check_names_this_calls_line.__code__.co_firstlineno + 5
    with pytest.raises(checks.TpuAsyncError, match=rf"aten::embedding.*test_deferred_replay.py:{line}\b"):
        z.sum().item()
