"""Custom kernels: StableHLO text and JAX functions (torchtpu.kernels), and lowerings
registered for a library's own ops (torchtpu.library.register_lowering).

Each route is one RMSNorm op, run in each mode (eager, DeferAndFuse, torch.compile) against
PyTorch's CPU result, forward and backward (with the user's backward); DeferAndFuse must
fuse it with the ops around it (one program), torch.compile must not break the graph.
Then: several kernels and helper functions in one fused program, JAX modules with several
functions and outputs, Pallas, a warm disk cache that never imports jax, and the mistakes
a user can make, each a Python exception.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torchtpu
import torchtpu.kernels as kernels
import torchtpu.library
from torchtpu import metrics
from torchtpu.kernels import KernelError, Spec
from torchtpu.stablehlo.builder import Builder

TPU = torch.device("tpu")
EPS = 1e-6
MODES = ("eager", "defer", "compile")


@pytest.fixture(autouse=True)
def _eager_after():
    yield
    torchtpu.set_eager_mode("eager")


# -- the three routes to one RMSNorm --------------------------------------------------------------
def rms_text(x: Spec, w: Spec, eps: float = EPS) -> str:
    last = x.ndim - 1
    r = f"tensor<{''.join(f'{d}x' for d in x.shape[:-1])}f32>"
    return f"""
module @jit_rms attributes {{mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%x: {x.type} {{mhlo.sharding = "{{replicated}}"}}, %w: {w.type}) -> ({x.type} {{jax.result_info = ""}}) {{
    // the statistics in float32, one per row
    %sq = stablehlo.multiply %x, %x : {x.type}
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [{last}] : ({x.type}, tensor<f32>) -> {r}
    %n = stablehlo.constant dense<{float(x.shape[-1]):.1f}> : {r}
    %mean = stablehlo.divide %sum, %n : {r}
    %eps = stablehlo.constant dense<{eps:.9e}> : {r}
    %inv = call @inverse_root(%mean, %eps) : ({r}, {r}) -> {r}
    %inv_b = stablehlo.broadcast_in_dim %inv, dims = [{", ".join(map(str, range(last)))}] : ({r}) -> {x.type}
    %w_b = stablehlo.broadcast_in_dim %w, dims = [{last}] : ({w.type}) -> {x.type}
    %normed = stablehlo.multiply %x, %inv_b : {x.type}
    %out = stablehlo.multiply %normed, %w_b : {x.type}
    return %out : {x.type}
  }}
  func.func private @inverse_root(%a: {r}, %b: {r}) -> {r} {{
    %s = stablehlo.add %a, %b : {r}
    %r = stablehlo.rsqrt %s : {r}
    return %r : {r}
  }}
}}"""


def rms_jax(x, w, eps: float = EPS):  # noqa: ANN001, ANN201 - jax arrays
    import jax
    import jax.numpy as jnp

    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * w


def rms_rule(L, x, w, eps=EPS):  # noqa: ANN001, ANN201 - a lowering rule
    b, f32 = L.b, torch.float32
    last = x.rank - 1
    (total,) = b.reduce([b.binary("multiply", x, x)], [b.constant(0, f32)], [last], lambda acc, v: [b.binary("add", acc, v)])
    mean = b.binary("divide", total, L.full(x.shape[-1], total.shape, f32))
    inv = b.unary("rsqrt", b.binary("add", mean, L.full(eps, total.shape, f32)))
    normed = b.binary("multiply", x, b.broadcast_in_dim(inv, x.shape, list(range(last))))
    return b.binary("multiply", normed, b.broadcast_in_dim(w, x.shape, [last]))


def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN201
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def backward(ctx, grad):  # noqa: ANN001, ANN201 - the user's backward, in PyTorch ops
    x, w = ctx.saved_tensors
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xhat = x * r
    g = grad * w
    return r * (g - xhat * (g * xhat).mean(-1, keepdim=True)), (grad * xhat).sum(0), None


_ROUTES: dict[str, object] = {}


def route(name: str) -> object:
    """The RMSNorm op of one route, defined on first use (after the device is in use: a
    lowering registered late must work in every mode)."""
    if name in _ROUTES:
        return _ROUTES[name]
    (torch.ones(2, device=TPU) + 1).cpu()
    if name == "stablehlo":
        op = kernels.stablehlo(shape=lambda x, w, eps: x, name="test_rms_stablehlo")(rms_text)
    elif name == "jax":
        pytest.importorskip("jax")
        op = kernels.jax(rms_jax, name="test_rms_jax")  # output shapes from the lowering
    else:
        # a CPU kernel only: on tpu tensors nothing but the registered rule can run it
        op = torch.library.custom_op("torchtpu_test::rms_norm", mutates_args=(), device_types="cpu")(_rms_cpu)
        op.register_fake(lambda x, w, eps=EPS: torch.empty_like(x))
        torchtpu.library.register_lowering(op, rms_rule)
    op.register_autograd(backward, setup_context=setup_context)
    _ROUTES[name] = op
    return op


def _rms_cpu(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def step(op: object, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return op(x * 2, w, EPS) + 1


def cpu_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x * 2, (x.shape[-1],), w, EPS) + 1


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _delta(before: dict, key: str) -> int:
    return metrics.snapshot().get(key, 0) - before.get(key, 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["stablehlo", "jax", "library"])
def test_forward_matches_the_cpu_and_fuses(name: str, mode: str) -> None:
    op = route(name)
    x, w = torch.randn(5, 16), torch.randn(16)
    xt, wt = x.to(TPU), w.to(TPU)
    if mode == "compile":
        breaks = _graph_breaks()
        before = metrics.snapshot()
        out = torch.compile(step, backend="tpu", dynamic=False)(op, xt, wt).cpu()
        assert _graph_breaks() == breaks, "the kernel broke the graph"
        assert _delta(before, "compiled_graphs") == 1 and _delta(before, "executions") == 1
    elif mode == "defer":
        with torchtpu.eager_mode("defer_and_fuse"):
            before = metrics.snapshot()
            out = step(op, xt, wt).cpu()
            # x * 2 -> kernel -> + 1: one graph, one program
            assert _delta(before, "flushes") == 1 and _delta(before, "executions") == 1
            assert _delta(before, "fused_ops") == 3
    else:
        before = metrics.snapshot()
        out = step(op, xt, wt).cpu()
        assert _delta(before, "executions") == 3
    torch.testing.assert_close(out, cpu_step(x, w))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["stablehlo", "jax", "library"])
def test_backward_uses_the_users_formula(name: str, mode: str) -> None:
    op = route(name)
    x, w = torch.randn(4, 8), torch.randn(8)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    cpu_step(xr, wr).sin().sum().backward()

    def loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return step(op, a, b).sin().sum()

    xt, wt = x.to(TPU).requires_grad_(), w.to(TPU).requires_grad_()
    if mode == "compile":
        breaks = _graph_breaks()
        torch.compile(loss, backend="tpu", dynamic=False)(xt, wt).backward()
        assert _graph_breaks() == breaks
    else:
        with torchtpu.eager_mode("defer_and_fuse" if mode == "defer" else "eager"):
            loss(xt, wt).backward()
    torch.testing.assert_close(xt.grad.cpu(), xr.grad)
    torch.testing.assert_close(wt.grad.cpu(), wr.grad)


@pytest.mark.parametrize("mode", ["eager", "defer"])
def test_views_and_integer_tensors(mode: str) -> None:
    op = route("stablehlo")
    x, w = torch.randn(16, 5), torch.randn(1)
    double = kernels.stablehlo(shape=lambda t: t, name=f"test_double_int_{mode}")(_double_text)
    with torchtpu.eager_mode("defer_and_fuse" if mode == "defer" else "eager"):
        out = op(x.to(TPU).t(), w.to(TPU).expand(16), EPS).cpu()  # a transposed and an expanded view
        ints = double(torch.arange(-3, 3, device=TPU)[::2]).cpu()
    torch.testing.assert_close(out, _rms_cpu(x.t(), w.expand(16)))
    assert ints.tolist() == [-6, -2, 2]


# -- several kernels in one program -----------------------------------------------------------------
def _scaled(factor: int) -> str:
    # two kernels whose functions have the same names (@main, @helper) but different bodies
    return f"""
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
  %y = func.call @helper(%x) : (tensor<3xf32>) -> tensor<3xf32>
  return %y : tensor<3xf32>
}}
func.func private @helper(%x: tensor<3xf32>) -> tensor<3xf32> {{
  %c = stablehlo.constant dense<{factor}.0> : tensor<3xf32>
  %y = stablehlo.multiply %x, %c : tensor<3xf32>
  return %y : tensor<3xf32>
}}"""


def test_kernels_used_twice_and_alike_named_functions_share_one_fused_program() -> None:
    double = kernels.stablehlo(_scaled(2), name="test_double")
    triple = kernels.stablehlo(_scaled(3), name="test_triple")
    x = torch.tensor([1.0, -2.0, 0.5])
    xt = x.to(TPU)
    with torchtpu.eager_mode("defer_and_fuse"):
        before = metrics.snapshot()
        out = (double(xt) + double(xt + 1) + triple(xt)).cpu()
        assert _delta(before, "executions") == 1
    torch.testing.assert_close(out, 2 * x + 2 * (x + 1) + 3 * x)
    torch.testing.assert_close(double(xt).cpu(), 2 * x)  # eager


def test_builder_renames_symbols_and_keeps_each_kernel_once() -> None:
    km = kernels.parse(_scaled(2), "k")
    other = kernels.parse(_scaled(3), "k")
    b = Builder()
    x = b.param((3,), torch.float32)
    first = b.add_functions(km.key, km.render)
    again = b.add_functions(km.key, km.render)
    second = b.add_functions(other.key, other.render)
    (y,) = b.call(first, [x], [((3,), torch.float32)])
    (z,) = b.call(second, [y], [((3,), torch.float32)])
    text = b.module([z])
    assert first == again == "k0_main" and second == "k1_main"
    assert text.count("func.func private @k0_helper") == 1 and "@k1_helper" in text
    assert '"func.call"(%arg0) {callee = @k0_main}' in text
    assert "@helper" not in text and "@main(" in text  # every kernel symbol renamed; ours stays


def test_signature_attributes_and_quoted_symbols_are_rewritten() -> None:
    text = """
    module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%arg0: tensor<2xf32> {mhlo.layout_mode = "default", mhlo.sharding = "{replicated}"})
          -> (tensor<2xf32> {jax.result_info = "result[0]"}) {
        %0 = call @"<lambda>"(%arg0) : (tensor<2xf32>) -> tensor<2xf32> loc(#loc3)
        return %0 : tensor<2xf32>
      }
      func.func private @"<lambda>"(%arg0: tensor<2xf32>) -> tensor<2xf32> {
        %0 = stablehlo.negate %arg0 : tensor<2xf32>  // a comment with @main in it
        return %0 : tensor<2xf32>
      }
    }
    #loc3 = loc("x.py":1:0)
    """
    entry, out = kernels.parse(text, "k").render("k5_")
    assert entry == "k5_main"
    assert "@k5__lambda_(%arg0)" in out and "func.func private @k5__lambda_" in out
    for gone in ("sharding", "result_info", "layout_mode", "loc(", "comment", "public"):
        assert gone not in out


# -- JAX -----------------------------------------------------------------------------------------------
def test_jax_module_with_helpers_and_two_outputs_fuses() -> None:
    pytest.importorskip("jax")

    @kernels.jax(num_outputs=2)
    def two(x):  # noqa: ANN001, ANN202
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda a: a * 2)  # a private function, called twice
        return f(x) + f(x + 1), jnp.sum(x, axis=0)

    x = torch.randn(3, 4)
    xt = x.to(TPU)
    with torchtpu.eager_mode("defer_and_fuse"):
        before = metrics.snapshot()
        a, s = two(xt)
        a2, _ = two(a)  # the same kernel again in the same program
        a, s, a2 = a.cpu(), s.cpu(), a2.cpu()
        assert _delta(before, "executions") == 1
    torch.testing.assert_close(a, x * 2 + (x + 1) * 2)
    torch.testing.assert_close(s, x.sum(0))
    torch.testing.assert_close(a2, a * 2 + (a + 1) * 2)


def _pallas_body(x_ref, y_ref, o_ref):  # noqa: ANN001, ANN202
    o_ref[...] = x_ref[...] * 2 + y_ref[...]


@pytest.mark.parametrize("mode", MODES)
def test_pallas_kernel_in_interpret_mode(mode: str) -> None:
    pytest.importorskip("jax")
    op = _ROUTES.get("pallas")
    if op is None:

        @kernels.jax(name="test_pallas_axpy", shape=lambda x, y: x)
        def op(x, y):  # noqa: ANN001, ANN202
            import jax
            from jax.experimental import pallas as pl

            return pl.pallas_call(_pallas_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)

        _ROUTES["pallas"] = op
    x, y = torch.randn(8, 16), torch.randn(8, 16)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return op(a, b.exp()) - 1

    args = (x.to(TPU), y.to(TPU))
    if mode == "compile":
        out = torch.compile(fn, backend="tpu", dynamic=False)(*args).cpu()
    else:
        with torchtpu.eager_mode("defer_and_fuse" if mode == "defer" else "eager"):
            out = fn(*args).cpu()
    torch.testing.assert_close(out, x * 2 + y.exp() - 1)


def test_jax_float64_input_traces_in_64_bit() -> None:
    pytest.importorskip("jax")
    op = route("jax")
    x, w = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    out = op(x.to(TPU), w.to(TPU), EPS)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), _rms_cpu(x, w))


_WARM = """
import importlib.abc, importlib.machinery, sys

class NoJax(importlib.abc.MetaPathFinder, importlib.abc.Loader):  # importing jax fails here
    def find_spec(self, name, path=None, target=None):
        if name == "jax" or name.startswith("jax."):
            return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ModuleNotFoundError(f"no jax in this process ({{module.__name__}})", name=module.__name__)

sys.meta_path.insert(0, NoJax())
import torch, torchtpu, torchtpu.kernels
sys.path.insert(0, {here!r})
from test_custom_kernels import rms_jax
op = torchtpu.kernels.jax(rms_jax, name="warm_rms")
x, w = torch.randn(5, 16), torch.randn(16)
out = op(x.to("tpu"), w.to("tpu"), {eps}).cpu()
torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (16,), w, {eps}))
print("JAX IMPORTED", "jax" in sys.modules)
"""


def test_a_warm_disk_cache_never_imports_jax(tmp_path, monkeypatch) -> None:
    """The lowered text is cached on disk: a process that finds it there runs the kernel
    with jax unimportable (as in a deployment without the jax extra)."""
    pytest.importorskip("jax")
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", str(tmp_path))
    op = kernels.jax(rms_jax, name="warm_rms")  # the child defines the same function
    x, w = torch.randn(5, 16), torch.randn(16)
    op(x.to(TPU), w.to(TPU), EPS).cpu()  # lowers and writes the text (this process)
    assert list(tmp_path.glob("*/kernels/*.mlir")), "no lowered text on disk"
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path), PYTHONWARNINGS="ignore")
    code = _WARM.format(here=os.path.dirname(__file__), eps=EPS)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "JAX IMPORTED False" in p.stdout


# -- mistakes a user can make: Python exceptions, never an abort ----------------------------------
def _double_text(x: Spec) -> str:
    return f"func.func @main(%x: {x.type}) -> {x.type} {{\n  %y = stablehlo.add %x, %x : {x.type}\n  return %y : {x.type}\n}}"


@pytest.mark.parametrize("mode", ["eager", "defer", "compile"])
def test_a_wrong_shape_function_is_reported(mode: str) -> None:
    op = kernels.stablehlo(shape=lambda x: Spec((*x.shape, 1), x.dtype), name=f"test_bad_shape_{mode}")(_double_text)
    xt = torch.randn(4, device=TPU)
    with pytest.raises(Exception, match="shape function says the outputs are \\(tensor<4x1xf32>\\)") as info:
        if mode == "compile":
            torch.compile(lambda a: op(a) + 1, backend="tpu", dynamic=False)(xt).cpu()
        else:
            with torchtpu.eager_mode("defer_and_fuse" if mode == "defer" else "eager"):
                (op(xt) + 1).cpu()
    assert isinstance(info.value, KernelError) or isinstance(info.value.__cause__, KernelError)
    torch.testing.assert_close((xt * 2).cpu(), xt.cpu() * 2)  # the device still works


def test_shape_function_answers_that_are_not_specs() -> None:
    for bad, match in [
        (lambda x: "4", "returned '4'"),
        (lambda x: Spec((-1,), x.dtype), "non-negative"),
        (lambda x: (x, x), "2 output spec"),
    ]:
        op = kernels.stablehlo(shape=bad)(_double_text)
        with pytest.raises(KernelError, match=match):
            op(torch.ones(4, device=TPU))


def test_malformed_text_is_reported_where_the_kernel_is_defined_or_called() -> None:
    with pytest.raises(KernelError, match="malformed StableHLO text"):
        kernels.stablehlo("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32>")
    with pytest.raises(KernelError, match="must take and return ranked tensors of static shape"):
        kernels.stablehlo("func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { return %x : tensor<?xf32> }")

    @kernels.stablehlo(shape=lambda x: x)
    def typo(x: Spec) -> str:
        return f"func.func @main(%x: {x.type}) -> {x.type} {{\n  %y = stablehlo.ad %x, %x : {x.type}\n  return %y : {x.type}\n}}"

    xt = torch.ones(4, device=TPU)
    with torchtpu.eager_mode("defer_and_fuse"):
        with pytest.raises(KernelError, match="XLA rejected the kernel's StableHLO(.|\n)*stablehlo.ad"):
            typo(xt)  # raised at the call, not at a later flush
        assert (xt + 1).cpu().tolist() == [2.0] * 4

    @kernels.stablehlo(shape=lambda x: x)
    def raises(x: Spec) -> str:
        raise ValueError("no text for you")

    with pytest.raises(KernelError, match="text function raised ValueError: no text for you"):
        raises(xt)


def test_a_fixed_text_called_with_other_shapes() -> None:
    op = kernels.stablehlo(_double_text(Spec((4,), torch.float32)), name="test_fixed_double")
    torch.testing.assert_close(op(torch.ones(4, device=TPU)).cpu(), torch.full((4,), 2.0))
    with pytest.raises(KernelError, match=r"takes \(tensor<4xf32>\) but was called with \(tensor<5xf32>\)"):
        op(torch.ones(5, device=TPU))


def test_cpu_tensors_need_a_reference_implementation() -> None:
    op = kernels.stablehlo(shape=lambda x: x, name="test_no_cpu")(_double_text)
    with pytest.raises(NotImplementedError, match="cpu=<function>"):
        op(torch.ones(3))
    ref = kernels.stablehlo(shape=lambda x: x, name="test_with_cpu", cpu=lambda x: x + x)(_double_text)
    torch.testing.assert_close(ref(torch.ones(3)), torch.full((3,), 2.0))


def test_jax_lowering_errors_are_kernel_errors() -> None:
    pytest.importorskip("jax")

    @kernels.jax
    def mismatched(x, y):  # noqa: ANN001, ANN202
        return x @ y

    with pytest.raises(KernelError, match="jax could not lower"):
        mismatched(torch.ones(2, 3, device=TPU), torch.ones(2, 3, device=TPU))


def test_register_lowering_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="already has a tpu lowering"):
        torchtpu.library.register_lowering(torch.ops.aten.add.Tensor, rms_rule)

    @torch.library.custom_op("torchtpu_test::scale_", mutates_args=("x",))
    def scale_(x: torch.Tensor) -> None:
        x.mul_(2)

    with pytest.raises(NotImplementedError, match="mutates or aliases"):
        torchtpu.library.register_lowering(scale_, rms_rule)

    @torch.library.custom_op("torchtpu_test::unlowered", mutates_args=(), device_types="cpu")
    def unlowered(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    with pytest.raises(NotImplementedError, match="torchtpu.library.register_lowering"):
        unlowered(torch.ones(2, device=TPU))


def test_a_library_op_named_like_an_aten_op_is_not_held_to_atens_argument_rules() -> None:
    """aten's argument checks go by op name; ``mylib::scatter(self, src)`` with two dtypes
    is not aten's scatter, which would refuse it ("Expected self.dtype to be equal to src.dtype")."""

    @torch.library.custom_op("torchtpu_test::scatter", mutates_args=())
    def scatter(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return self + src.to(self.dtype)

    @scatter.register_fake
    def _(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(self)

    @torchtpu.library.register_lowering(scatter)
    def _(L, x, y):  # noqa: ANN001, ANN202
        return L.b.binary("add", x, L.to(y, x.dtype))

    x, y = torch.randn(3), torch.tensor([1, 2, 3])
    assert torch.equal(scatter(x.to(TPU), y.to(TPU)).cpu(), scatter(x, y))
