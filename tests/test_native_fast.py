"""The C++ fast paths (torchtpu/csrc/fast.cpp) against their Python twins.

``new_tensor`` makes every op's results and ``graph_key`` keys every compiled-graph call;
the Python versions stay as the fallback where the extension was not built, so each
native result must be exactly what the Python path gives.
"""

from __future__ import annotations

import io
import shutil
from typing import Any

import pytest
import torch
from utils import TPU

from torchtpu.compile import fx_lowering
from torchtpu.errors import TpuError
from torchtpu.runtime import memory
from torchtpu.tensor import storage
from torchtpu.tensor.storage import Cell, cell_of

pytestmark = pytest.mark.skipif(storage._fast is None, reason="torchtpu was installed without its C++ fast paths")


def test_the_fast_paths_are_built_where_a_compiler_is() -> None:
    """setup.py builds them with the Makefile's install: a silent fallback would turn
    every test here into a skip."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert storage.new_tensor is storage._fast.new_tensor
    assert fx_lowering.graph_key is storage._fast.graph_key
    from torchtpu.eager import dispatch
    from torchtpu.runner import program

    assert dispatch.collect_call is storage._fast.collect_call and dispatch.donatable is storage._fast.donatable
    assert dispatch.input_buffers is fx_lowering.input_buffers is storage._fast.input_buffers
    assert program.native_write_back is storage._fast.write_back
    assert memory.allocated is memory._counters.allocated


@pytest.mark.skipif(memory._counters is None, reason="torchtpu was installed without its C memory counters")
def test_the_memory_counters_count_as_the_python_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same allocations, frees, peak and count resets through the C counters and through
    their Python twins (counting from the same state) end in the same counts."""
    before = memory._counters.snapshot()
    monkeypatch.setattr(memory, "_stats", dict(before))
    events = [("allocated", 4096), ("allocated", 100), ("freed", 4096), ("reset_peak", None), ("allocated", 7), ("reset_accumulated", None), ("freed", 107)]
    for name, n in events:
        for fn in (getattr(memory._counters, name), getattr(memory, f"_py_{name}")):
            fn() if n is None else fn(n)
    assert memory._counters.snapshot() == memory._py_snapshot()
    assert memory._counters.current() == memory._py_current() == before["allocated_bytes"]
    assert memory._counters.peak() == memory._py_peak() == before["allocated_bytes"] + 100 + 7
    with pytest.raises(TypeError):
        memory._counters.allocated("4096")


def test_memory_allocated_follows_a_tensors_life() -> None:
    """torch.tpu.memory_allocated through the native counters: a result's bytes while it
    lives, none after."""
    x = torch.ones(1000, device=TPU)
    torch.tpu.synchronize()
    held = torch.tpu.memory_allocated()
    y = x * 2
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == held + 4000
    del y
    assert torch.tpu.memory_allocated() == held


def _geometry(t: torch.Tensor) -> tuple:
    return (
        t.dtype,
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.untyped_storage().nbytes(),
        t.is_contiguous(),
        t.requires_grad,
        str(torch._C._dispatch_keys(t)),
        t.device,
    )


@pytest.mark.parametrize(
    "geometry",
    [((3, 4), (4, 1), 0), ((2, 3), (1, 2), 0), ((2, 2), (4, 1), 5), ((), (), 3), ((0, 5), (5, 1), 0)],
    ids=["contiguous", "transposed", "offset", "scalar", "empty"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_new_tensor_is_the_python_paths_tensor(geometry: tuple, dtype: torch.dtype) -> None:
    sizes, strides, offset = geometry
    cell = Cell(16, dtype)
    native = storage._fast.new_tensor(cell, sizes, strides, offset, dtype)
    python = storage._py_new_tensor(cell, sizes, strides, offset, dtype)
    assert _geometry(native) == _geometry(python)
    assert cell_of(native) is cell and cell_of(python) is cell
    # storages of their own: distinct, non-overlapping data pointers from one counter
    a, b = sorted([native.untyped_storage().data_ptr(), python.untyped_storage().data_ptr()])
    assert a + cell.nbytes <= b


def test_native_results_behave_like_tensors() -> None:
    """Values, views, autograd, in-place writes and torch.save through tensors the native
    path made (every op's result is one)."""
    cpu = torch.randn(4, 6)
    x = cpu.to(TPU)
    y = (x * 2)[1:, ::2]
    assert storage.new_tensor is storage._fast.new_tensor
    torch.testing.assert_close(y.cpu(), (cpu * 2)[1:, ::2], rtol=0, atol=0)
    w = x.clone().requires_grad_()
    (w.sin() * w).sum().backward()
    cw = cpu.clone().requires_grad_()
    (cw.sin() * cw).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), cw.grad)
    z = x.clone()
    z[1:3].mul_(0)
    expected = cpu.clone()
    expected[1:3] = 0
    torch.testing.assert_close(z.cpu(), expected, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save({"y": y, "x": x}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    torch.testing.assert_close(loaded["y"].cpu(), y.cpu(), rtol=0, atol=0)
    del y, z, w
    # the storages die with their tensors: memory_allocated counts the cells, as before
    before = torch.tpu.memory_allocated()
    t = x + 1
    assert torch.tpu.memory_allocated() == before + t.untyped_storage().nbytes()
    del t
    assert torch.tpu.memory_allocated() == before


def _python_key(args: list) -> fx_lowering._Call:
    call = fx_lowering._Call(list(args))
    fx_lowering._collect_args(call, "test")
    return call


def test_graph_key_is_the_python_loops_key() -> None:
    base = torch.randn(6, 4, device=TPU)
    other = torch.arange(5, device=TPU)
    args = [base, base[2:], base.t(), 7, True, None, other, base[1:3, 1:], torch.ones((), device=TPU)]
    call = fx_lowering._Call(list(args))
    assert storage._fast.graph_key(call.args, call.key, call.cells, call.slot_of) is True
    python = _python_key(args)
    assert call.key == python.key
    assert [id(c) for c in call.cells] == [id(c) for c in python.cells]
    assert call.slot_of == python.slot_of
    assert call.key[1][0] == call.key[0][0] == 0, "views of one storage share its slot"


@pytest.mark.parametrize(
    "odd",
    [
        lambda: 0.5,  # a float: a device scalar operand, made in Python
        lambda: torch.randn(3),  # a CPU tensor: uploaded as a stand-in
        lambda: torch.randn(3, dtype=torch.complex64, device=TPU).conj(),  # lazy conjugate bit
        lambda: torch._neg_view(torch.randn(3, device=TPU)),  # lazy negative bit
        lambda: "text",
    ],
    ids=["float", "cpu_tensor", "conj_view", "neg_view", "str"],
)
def test_graph_key_leaves_other_arguments_to_python(odd) -> None:
    args = [torch.randn(2, device=TPU), odd(), 3]
    call = fx_lowering._Call(list(args))
    assert storage._fast.graph_key(call.args, call.key, call.cells, call.slot_of) is False


def test_collect_falls_back_to_python_for_a_float_argument() -> None:
    x = torch.randn(3, device=TPU)
    call = fx_lowering._collect([x, 0.25, x[1:]], "test")
    python = _python_key([x, 0.25, x[1:]])
    assert call.key[:3] == python.key
    assert len(call.scalars) == 1 and len(call.cells) == 1


def test_a_tpu_storage_without_a_cell_is_explained() -> None:
    """A tpu storage torchtpu did not make has no device buffer: the Python path's error."""
    t = storage._create_impl([0], torch.float32)
    bare = storage._make_storage(storage._fake_pointer(16), storage.DEVICE, 16)
    storage._set_storage(storage._CPU_KEYSET, t, bare, 0, [4], [1])
    call = fx_lowering._Call([t])
    assert storage._fast.graph_key(call.args, call.key, call.cells, call.slot_of) is False
    with pytest.raises(RuntimeError, match="has no device buffer"):
        fx_lowering._collect([t], "test")


def _built_key(args: list) -> tuple:
    """The whole key ``fx_lowering._collect`` builds for ``args`` (no earlier key given)."""
    return tuple(fx_lowering._collect(list(args), "test").key)


def _same(args: list, key: tuple) -> bool:
    call = fx_lowering._Call(list(args))
    return storage._fast.same_graph_key(call.args, key, call.cells, call.slot_of) and key[-1] == fx_lowering.current_precision()


def test_same_graph_key_says_true_exactly_when_the_built_key_is_equal() -> None:
    """A compiled graph reuses its last key when ``same_graph_key`` says the arguments have
    it: for each change of one argument, the answer must be whether the built key changed."""
    base = torch.randn(6, 4, device=TPU)
    ids = torch.arange(5, device=TPU)
    args = [base, base[2:], base.t(), 7, True, None, ids, base[1:3, 1:], torch.ones((), device=TPU)]
    key = _built_key(args)
    assert _same(args, key)
    same_geometry = [torch.randn(6, 4, device=TPU), None, None, 7, True, None, torch.arange(5, device=TPU), None, torch.zeros((), device=TPU)]
    same_geometry[1], same_geometry[2], same_geometry[7] = same_geometry[0][2:], same_geometry[0].t(), same_geometry[0][1:3, 1:]
    variants = {
        "new storages, same geometry": same_geometry,
        "another shape": [torch.randn(6, 5, device=TPU), *args[1:]],
        "another dtype": [*args[:6], ids.int(), *args[7:]],
        "another stride": [*args[:2], base.t().contiguous().t(), *args[3:]],
        "another offset": [*args[:1], base[3:], *args[2:]],
        "another int": [*args[:3], 8, *args[4:]],
        "an int for a bool": [*args[:4], 1, *args[5:]],
        "a tensor for None": [*args[:5], ids, *args[6:]],
        "one storage less shared": [*args[:1], base.clone()[2:], *args[2:]],
        "an unwritten storage": [*args[:8], torch.empty((), device=TPU)],
        "a float": [*args[:3], 7.0, *args[4:]],
        "a CPU tensor": [*args[:6], ids.cpu(), *args[7:]],
        "fewer arguments": args[:-1],
    }
    for name, changed in variants.items():
        if name == "a float" or name == "a CPU tensor":
            assert not _same(changed, key), name  # built in Python: never the fast path's
            continue
        assert _same(changed, key) == (_built_key(changed) == key), name
    with torch.tpu.precision("highest"):
        assert not _same(args, key), "the precision is part of the key"


def test_a_compiled_graph_reruns_its_last_program_when_the_geometry_repeats() -> None:
    """The second call with the same geometry reuses the first call's key and program
    (no new key built, hashed or compiled) and gives the same numbers as the CPU; a call
    with another geometry builds its own."""
    import torchtpu

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x @ y.t()).relu().sum(0)

    compiled = torch.compile(f, backend="tpu", dynamic=False)
    xs = [torch.randn(3, 4) for _ in range(3)]
    y = torch.randn(5, 4)
    before = torchtpu.metrics.snapshot()["compiles"]
    for x in xs:
        torch.testing.assert_close(compiled(x.to(TPU), y.to(TPU)).cpu(), f(x, y))
    assert torchtpu.metrics.snapshot()["compiles"] - before == 1
    graph = max(fx_lowering.GRAPHS, key=lambda g: g.token)
    last = graph._last_key
    compiled(xs[0].to(TPU), y.to(TPU))
    assert graph._last_key is last, "the repeated geometry's key object is reused"
    # a storage never written (Dynamo does not guard on it): the same graph, another key
    unwritten = torch.empty(5, 4, device=TPU)
    torch.testing.assert_close(compiled(xs[1].to(TPU), unwritten).cpu(), f(xs[1], torch.zeros(5, 4)))
    assert graph._last_key != last and torchtpu.metrics.snapshot()["compiles"] - before == 2
    torch.testing.assert_close(compiled(xs[2].to(TPU), y.to(TPU)).cpu(), f(xs[2], y))
    assert torchtpu.metrics.snapshot()["compiles"] - before == 2, "back to the first program"


def _eager_calls(ts: list) -> tuple:
    from torchtpu.eager import dispatch

    native = dispatch._Call()
    entries = native.device_tensors(ts)
    python = dispatch._Call()
    expected = tuple(None if t is None else python.tensor(t) for t in ts)
    return native, entries, python, expected


def test_eager_keys_are_the_python_paths_keys() -> None:
    """Views with offsets (a runtime operand each, in argument order), size-1 dimensions
    (normalized strides), lazy conjugate and negative bits, None in a tensor list."""
    base = torch.randn(6, 4, device=TPU)
    z = torch.randn(3, 2, dtype=torch.complex64, device=TPU)
    ts = [base, base[2:], base[:, 1:2], base[3:4].t(), None, z.conj(), torch._neg_view(base), base[5, 3], torch.arange(3, device=TPU)]
    native, entries, python, expected = _eager_calls(ts)
    assert entries == expected
    assert native.tensors == python.tensors and [id(c) for c in native.cells] == [id(c) for c in python.cells]
    assert native.slot_of == python.slot_of
    assert native.scalar_types == python.scalar_types and len(native.scalars) == 4  # base[2:], [:, 1:2], [3:4], [5, 3]
    assert [s is p for s, p in zip(native.scalars, python.scalars)] == [True] * 4, "the same device scalars, in order"


def test_eager_keys_leave_a_storage_without_a_cell_to_python() -> None:
    from torchtpu.eager import dispatch

    t = storage._create_impl([0], torch.float32)
    bare = storage._make_storage(storage._fake_pointer(16), storage.DEVICE, 16)
    storage._set_storage(storage._CPU_KEYSET, t, bare, 0, [4], [1])
    call = dispatch._Call()
    assert storage._fast.eager_keys([t], call.cells, call.slot_of, call.tensors, "offset", []) is None
    with pytest.raises(RuntimeError, match="has no device buffer"):
        call.tensor(t)



def test_the_native_view_kernels_are_the_python_ones() -> None:
    """The C++ view kernels replace exactly minimal.VIEW_OPS's Meta redispatches."""
    from torchtpu.eager import minimal, register

    assert register.native_view_ops() == set(minimal.VIEW_OPS)
    for op in minimal.VIEW_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1")


def _views(x: torch.Tensor) -> list[torch.Tensor]:
    y = x.clone()
    y.t_()
    z = x.clone().unsqueeze_(1).squeeze_(1).transpose_(0, 1).swapdims_(0, 1).swapaxes_(0, 1)
    w = x.clone().as_strided_((2, 3), (1, 2), 1)
    c = torch.view_as_complex(x.reshape(4, 3, 2)[:, :2].contiguous())
    return [
        x.view(3, 8),
        x.view(torch.int32),
        x.reshape(2, 12).t().reshape(24),
        x.as_strided((3, 3), (2, 5), 4),
        x.unfold(1, 3, 2),
        torch.view_as_real(c),
        c.real,
        y,
        z,
        w,
        x.view(-1)[5:].view(19),
    ]


def test_views_match_the_cpu() -> None:
    cpu = torch.randn(4, 6)
    for got, expected in zip(_views(cpu.to(TPU)), _views(cpu)):
        assert (tuple(got.shape), got.stride(), got.storage_offset(), got.dtype) == (
            tuple(expected.shape),
            expected.stride(),
            expected.storage_offset(),
            expected.dtype,
        )
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_view_errors_are_the_cpus() -> None:
    x, cpu = torch.randn(4, 6, device=TPU), torch.randn(4, 6)
    for bad in (lambda t: t.view(5, 5), lambda t: t.t().view(24), lambda t: t.unfold(1, 7, 1), lambda t: t.view(torch.int8).view(torch.int32)[:, 1:].view(torch.float64)):
        with pytest.raises(RuntimeError) as on_cpu:
            bad(cpu)
        with pytest.raises(RuntimeError) as on_tpu:
            bad(x)
        assert str(on_tpu.value) == str(on_cpu.value)


def test_eager_keys_change_nothing_for_a_list_with_a_cpu_tensor() -> None:
    """A CPU tensor among an op's tensors is Python's (a 0-d one is moved, as CUDA does):
    the C++ path must leave no trace of the tensors before it."""
    from torchtpu.eager import dispatch

    x = torch.randn(3, device=TPU)
    call = dispatch._Call()
    offsets: list[int] = []
    assert storage._fast.eager_keys([x[1:], torch.tensor(2.0)], call.cells, call.slot_of, call.tensors, "offset", offsets) is None
    assert (call.cells, call.slot_of, call.tensors, offsets) == ([], {}, [], [])
    cpu = torch.randn(3)
    torch.testing.assert_close(torch.where(x > 0, x, torch.tensor(-1.0)).cpu(), torch.where(x.cpu() > 0, x.cpu(), torch.tensor(-1.0)))
    torch.testing.assert_close((x[1:] * torch.tensor(3.0)).cpu(), x.cpu()[1:] * 3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + cpu


def _both_collects(op: Any, args: tuple, kwargs: dict | None = None) -> tuple:
    """``op``'s call collected by the C++ loop and by the Python loop, from fresh values."""
    from torchtpu.eager import dispatch
    from torchtpu.eager.plan import plan_for

    plan = plan_for(op)
    native = dispatch._collect(plan, plan.bind(args, kwargs or {}))
    saved, dispatch.collect_call = dispatch.collect_call, None
    try:
        python = dispatch._collect(plan, plan.bind(args, kwargs or {}))
    finally:
        dispatch.collect_call = saved
    return native, python


def test_collect_call_is_the_python_loops_key() -> None:
    """Every argument kind the C++ loop handles (tensors and views with offsets, tensor
    lists with None, lifted and special numbers, bools, static ints, floats, lists, dtypes,
    nan and -0.0), and the ones it leaves to Python (a number where the schema says Tensor,
    a CPU 0-d tensor, a Scalar[] operand), give the Python loop's key and operands."""
    from torchtpu.eager import dispatch
    from torchtpu.eager.plan import plan_for

    aten = torch.ops.aten
    x = torch.randn(4, 6, device=TPU)
    w = torch.randn(6, 6, device=TPU)
    i = torch.zeros(4, dtype=torch.long, device=TPU)
    calls = [
        (aten.addmm.default, (x[0], x, w.t()), {"beta": 0.5, "alpha": 2}),
        (aten.add.Tensor, (x[1:], x[:3]), {"alpha": -1}),
        (aten.add.Tensor, (x, 3.5)),
        (aten.mul.Tensor, (x, torch.tensor(2.0))),
        (aten.sum.dim_IntList, (x, [0, 1], True), {"dtype": torch.float64}),
        (aten._foreach_add_.List, ([x, w], [x, w]), {"alpha": -0.01}),
        (aten._foreach_mul_.ScalarList, ([x, w], [0.5, 2.0])),
        (aten.nll_loss_forward.default, (x, i, None, 1, -100)),
        (aten.leaky_relu.default, (x, float("nan"))),
        (aten.clamp.default, (x, -0.0, True)),
        (aten.where.self, (x > 0, x, w[:4])),
        (aten.cat.default, ([x, x[2:]], 0)),
        (aten.full.default, ([2, 3], 7), {"dtype": torch.int32, "device": TPU}),
    ]
    left_to_python = {2, 3, 6}  # 3.5 where the schema says Tensor, a CPU 0-d tensor, a Scalar[]
    for n, (op, *rest) in enumerate(calls):
        plan = plan_for(op)
        c = dispatch._Call()
        took = storage._fast.collect_call(
            plan.kinds, plan.bind(rest[0], rest[1] if len(rest) > 1 else {}), plan.lift_scalars, c.key, c.cells, c.slot_of,
            c.tensors, c.scalars, c.scalar_types,
        )
        assert took is (n not in left_to_python), op
        native, python = _both_collects(op, *rest)
        assert native.key == python.key, op
        assert native.scalar_types == python.scalar_types, op
        if op is not aten.mul.Tensor:  # there each loop moved the CPU tensor to a storage of its own
            assert [id(t) for t in native.tensors] == [id(t) for t in python.tensors], op
            assert [id(c) for c in native.cells] == [id(c) for c in python.cells] and native.slot_of == python.slot_of, op
        assert len(native.scalars) == len(python.scalars), op
        assert all(a is b for a, b in zip(native.scalars, python.scalars)) or op is aten._foreach_mul_.ScalarList, op


def test_collect_call_leaves_a_tensor_in_a_static_argument_to_python() -> None:
    """A tensor where the schema wants a static value: the Python loop's error."""
    from torchtpu.eager import dispatch
    from torchtpu.eager.plan import plan_for

    plan = plan_for(torch.ops.aten.sum.dim_IntList)
    x = torch.randn(3, device=TPU)
    with pytest.raises(TpuError, match="unexpected tensor argument"):
        dispatch._collect(plan, plan.bind((x, [x]), {}))


def test_donatable_is_the_python_paths_choice() -> None:
    """Only a storage whose buffer nothing else holds is donated: not one a second storage
    shares (``t.untyped_storage()`` of a view shares the cell, a ``_to_copy`` alias shares
    the buffer), nor one a pending DeferAndFuse graph produces."""
    import torchtpu
    from torchtpu.eager import dispatch
    from torchtpu.eager.plan import plan_for

    plan = plan_for(torch.ops.aten._foreach_add_.Scalar)
    own, shared, pending = (torch.randn(4, device=TPU) for _ in range(3))
    twin = Cell(4, torch.float32, cell_of(shared)._buf)  # another holder of shared's buffer
    with torchtpu.eager_mode("defer_and_fuse"):
        pending.mul_(2.0)
        values = plan.bind(([own, shared, pending, own[1:]], 1.5), {})
        call = dispatch._collect(plan, values)
        native = storage._fast.donatable(plan.mutated_tensors(values), call.slot_of)
        saved, dispatch.donatable = dispatch.donatable, None
        try:
            python = dispatch._donatable(plan, values, call)
        finally:
            dispatch.donatable = saved
    assert native == python == (call.slot_of[id(cell_of(own))],) * 2
    assert twin.numel == 4


def test_input_buffers_run_pending_graphs_and_skip_unwritten_cells() -> None:
    """What ``[c.buf for c in cells if c.initialized]`` gives: a pending cell's graph runs."""
    import torchtpu

    memory_buffer = cell_of(torch.ones(2, device=TPU))._buf
    written, unwritten = Cell(2, torch.float32, memory_buffer), Cell(2, torch.float32)
    with torchtpu.eager_mode("defer_and_fuse"):
        y = torch.ones(3, device=TPU) * 3
        pending = cell_of(y)
        assert pending.lazy is not None
        bufs = storage._fast.input_buffers([written, unwritten, pending])
    assert pending.lazy is None and bufs == [memory_buffer, pending._buf]
    torch.testing.assert_close(y.cpu(), torch.full((3,), 3.0))


def test_native_write_back_counts_like_cell_set() -> None:
    """A cell written for the first time is counted in memory_allocated, as ``Cell.set``
    counts it; a counted one just takes the new buffer."""
    a, b = torch.ones(5, device=TPU), torch.zeros(5, device=TPU)
    bufs = [cell_of(a)._buf, cell_of(b)._buf]
    c = torch.full((5,), 2.0, device=TPU)
    fresh, held = Cell(5, torch.float32), cell_of(c)
    assert held.counted and not fresh.counted
    before = torch.tpu.memory_allocated()
    storage._fast.write_back((1, 0), [held, fresh], ["result", *bufs], 1)
    assert fresh._buf is bufs[0] and held._buf is bufs[1] and fresh.counted
    assert torch.tpu.memory_allocated() == before + 20  # fresh's bytes; held's were counted
    torch.testing.assert_close(c.cpu(), torch.zeros(5))


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_a_training_step_without_the_fast_paths_is_the_same(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python twins are the fallback where the extension was not built: two SGD steps
    with momentum (in-place foreach updates, donation, write-backs) give the same numbers
    with and without the C++ paths."""
    import torchtpu
    from torchtpu.eager import dispatch
    from torchtpu.runner import program

    def two_steps() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(TPU)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        x, y = torch.randn(4, 8).to(TPU), torch.tensor([0, 2, 1, 0]).to(TPU)
        with torchtpu.eager_mode(mode):
            for _ in range(2):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[1:]), y[1:]).backward()
                opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    fast = two_steps()
    for name in ("collect_call", "donatable", "input_buffers", "eager_keys"):
        monkeypatch.setattr(dispatch, name, None)
    monkeypatch.setattr(program, "native_write_back", None)
    for a, b in zip(fast, two_steps()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
