"""nn.Module.to("tpu") and friends behave as they do for "cuda": Parameter objects keep
their identity (tied weights stay tied, optimizers built before the move keep working),
dtype conversions, to_empty and meta-device initialisation, and tpu as default device."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from utils import TPU, assert_close

GRAD_TOL = dict(rtol=1e-3, atol=1e-4)


class TiedLM(nn.Module):
    """An embedding shared with the output projection, as in GPT-2, BERT's MLM head, T5."""

    _tied_weights_keys = ["head.weight"]

    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))


def test_tied_weights_stay_tied_and_keep_identity():
    model = TiedLM()
    weight = model.emb.weight
    params_before = list(model.parameters())
    model.to("tpu")
    assert model.emb.weight is model.head.weight
    assert model.emb.weight is weight and weight.device.type == "tpu"
    assert all(a is b for a, b in zip(params_before, model.parameters()))
    assert isinstance(weight, nn.Parameter) and weight.requires_grad
    model.to("cpu")
    assert model.emb.weight is weight and model.head.weight is weight and weight.device.type == "cpu"


def test_tied_model_trains_like_cpu_with_optimizer_built_before_move():
    cpu_model = TiedLM()
    tpu_model = copy.deepcopy(cpu_model)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.5, momentum=0.9)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=0.5, momentum=0.9)  # before the move, as users do
    tpu_model.to("tpu")
    ids = torch.randint(0, 11, (3, 5))
    for _ in range(2):
        for model, opt, x in ((cpu_model, cpu_opt, ids), (tpu_model, tpu_opt, ids.to(TPU))):
            opt.zero_grad()
            _loss(model, x).backward()
            opt.step()
    # The shared weight's gradient is the sum of both uses; untied copies would each get one.
    assert_close(tpu_model.emb.weight.grad, cpu_model.emb.weight.grad, **GRAD_TOL)
    for (name, a), (_, e) in zip(tpu_model.named_parameters(), cpu_model.named_parameters()):
        assert a.device.type == "tpu", name
        assert_close(a, e, **GRAD_TOL)


def test_gradients_and_hooks_move_with_the_parameters():
    model = nn.Linear(3, 2)
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(o.device.type))
    model.weight.register_hook(lambda g: g * 2)
    model(torch.randn(4, 3)).sum().backward()
    cpu_grad = model.weight.grad.clone()
    weight = model.weight
    model.to("tpu")
    assert model.weight is weight and weight.grad.device.type == "tpu"
    assert_close(weight.grad, cpu_grad)
    weight.grad = None
    x = torch.randn(4, 3)
    model(x.to(TPU)).sum().backward()
    assert seen == ["cpu", "tpu"]
    # the tensor hook registered on the CPU still doubles the gradient
    assert_close(weight.grad, 2 * torch.ones(4, 1).mul(x).sum(0).expand(2, 3))


def test_state_dict_round_trip_of_a_tied_model():
    src = TiedLM().to("tpu")
    sd = src.state_dict()
    assert sd["emb.weight"] is not None and sd["head.weight"].data_ptr() == sd["emb.weight"].data_ptr()
    dst = TiedLM().to("tpu")
    dst.load_state_dict(sd)
    assert dst.emb.weight is dst.head.weight
    assert_close(dst.emb.weight, src.emb.weight)
    cpu = TiedLM()
    cpu.load_state_dict({k: v.cpu() for k, v in sd.items()})
    ids = torch.randint(0, 11, (2, 4))
    assert_close(dst(ids.to(TPU)), cpu(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "convert,dtype",
    [
        (lambda m: m.half(), torch.float16),
        (lambda m: m.bfloat16(), torch.bfloat16),
        (lambda m: m.to(torch.float64), torch.float64),
        (lambda m: m.to("tpu", torch.bfloat16), torch.bfloat16),
    ],
)
def test_dtype_conversions_keep_identity(convert, dtype):
    model = TiedLM().to("tpu")
    weight = model.emb.weight
    reference = weight.detach().cpu().to(dtype)
    convert(model)
    assert model.emb.weight is weight and model.head.weight is weight
    assert weight.dtype == dtype and weight.device.type == "tpu"
    assert model.norm.weight.dtype == dtype
    assert torch.equal(weight.detach().cpu(), reference)


def test_cpu_to_tpu_with_dtype_in_one_call():
    model = TiedLM()
    expected = model.emb.weight.detach().to(torch.bfloat16)
    model.to(device="tpu", dtype=torch.bfloat16)
    assert model.emb.weight is model.head.weight
    assert model.emb.weight.dtype == torch.bfloat16
    assert torch.equal(model.emb.weight.detach().cpu(), expected)


def test_buffers_move_and_batchnorm_trains():
    cpu = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    tpu = copy.deepcopy(cpu).to("tpu")
    assert tpu[1].running_mean.device.type == "tpu"
    x = torch.randn(2, 3, 6, 6)
    assert_close(tpu(x.to(TPU)), cpu(x), rtol=1e-4, atol=1e-4)
    assert_close(tpu[1].running_var, cpu[1].running_var, rtol=1e-4, atol=1e-5)
    assert int(tpu[1].num_batches_tracked) == 1


def test_meta_init_then_to_empty_and_load_state_dict():
    reference = TiedLM()
    with torch.device("meta"):
        model = TiedLM()
    assert model.emb.weight.is_meta
    model.to_empty(device="tpu")
    # to_empty allocates per module (as on CUDA); re-tie the way HF's tie_weights does
    model.head.weight = model.emb.weight
    model.load_state_dict(reference.state_dict())
    assert model.emb.weight.device.type == "tpu" and model.head.weight is model.emb.weight
    ids = torch.randint(0, 11, (2, 3))
    assert_close(model(ids.to(TPU)), reference(ids), rtol=1e-4, atol=1e-4)


def test_to_empty_keeps_shapes_and_dtypes():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3)).to(torch.float64)
    weight = model[0].weight
    model.to_empty(device="tpu")
    assert model[0].weight is weight
    assert weight.device.type == "tpu" and weight.dtype == torch.float64 and weight.shape == (3, 4)


def test_default_device_tpu():
    try:
        torch.set_default_device("tpu")
        model = nn.Linear(4, 2)
        x = torch.randn(3, 4)
        assert model.weight.device.type == "tpu" and x.device.type == "tpu"
        out = model(x)
        assert out.device.type == "tpu"
        expected = F.linear(x.cpu(), model.weight.detach().cpu(), model.bias.detach().cpu())
        assert_close(out, expected, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_default_device(None)
    assert torch.empty(1).device.type == "cpu"


def test_with_device_context_builds_on_tpu():
    with torch.device("tpu"):
        model = TiedLM()
    assert model.emb.weight.device.type == "tpu" and model.head.weight is model.emb.weight


def test_cpu_only_conversions_unchanged():
    """The identity-keeping path is taken only across tpu: CPU dtype conversions still
    use PyTorch's own (set_data) path."""
    model = TiedLM()
    weight = model.emb.weight
    model.double()
    assert model.emb.weight is weight and weight.dtype == torch.float64 and model.head.weight is weight


def test_post_accumulate_grad_hooks_survive_the_move():
    model = nn.Linear(3, 2)
    calls = []
    model.weight.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.device.type))
    model.to("tpu")
    model(torch.randn(2, 3, device="tpu")).sum().backward()
    assert calls == ["tpu"]


def test_weakly_referenced_parameters_keep_their_objects_as_on_cuda():
    """torch.compile and torch.export hold weak references to a model's parameters, which
    swap_tensors refuses: moving such a model to the CPU and back gave it new Parameter
    objects (with a warning), and an optimizer built before the move trained the old ones.
    ``param.data = new`` (CUDA's way, set_data_across) keeps them, as on CUDA."""
    import warnings
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    reference = copy.deepcopy(model)
    refs = [weakref.ref(p) for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not keep the Parameter objects"
        model.to("tpu")
    assert [r() for r in refs] == list(model.parameters())
    assert all(p.device.type == "tpu" for p in model.parameters())
    for m, o, inp in ((model, opt, x.to(TPU)), (reference, ref_opt, x)):
        m(inp).square().sum().backward()
        o.step()
    for a, e in zip(model.parameters(), reference.parameters()):
        assert_close(a, e, **GRAD_TOL)
        assert_close(a.grad, e.grad, **GRAD_TOL)
    model.to("cpu")  # the gradients follow, as on CUDA
    assert [r() for r in refs] == list(model.parameters())
    assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in model.parameters())


def test_assigning_data_to_a_weakly_referenced_parameter_moves_it():
    import weakref

    param = nn.Parameter(torch.arange(3.0))
    ref = weakref.ref(param)
    param.data = param.detach().to(TPU)
    assert ref() is param and param.device.type == "tpu"
    assert_close(param, torch.arange(3.0))


def test_without_the_cpp_extension_parameters_are_swapped(monkeypatch):
    """The pure-Python path (no C++ extension): the same identity through
    torch.utils.swap_tensors, which cannot move a weakly referenced Parameter; that module
    gets new Parameters and the user is told what that means."""
    import weakref

    from torchtpu.device import modules

    monkeypatch.setattr(modules, "set_data_across", None)
    model = TiedLM()
    weight = model.emb.weight
    model.weight_hook_calls = []
    weight.register_hook(lambda g: model.weight_hook_calls.append(g.device.type))
    model.to("tpu")
    assert model.emb.weight is weight and model.head.weight is weight and weight.device.type == "tpu"
    _loss(model, torch.randint(0, 11, (2, 3)).to(TPU)).backward()
    assert model.weight_hook_calls == ["tpu"]
    param = nn.Parameter(torch.ones(2))
    param.data = param.detach().to(TPU)
    assert param.device.type == "tpu"

    linear = nn.Linear(3, 2)
    ref = weakref.ref(linear.weight)
    with pytest.warns(UserWarning, match="tied to other modules are no longer shared"):
        linear.to("tpu")
    assert linear.weight is not ref() and linear.weight.device.type == "tpu" and linear.bias.device.type == "tpu"


def test_hugging_face_tied_lm_head():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    model.to("tpu")
    assert model.lm_head.weight is model.transformer.wte.weight and model.lm_head.weight.device.type == "tpu"
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))


def test_to_tpu_preserves_channels_last_like_cuda() -> None:
    """``.to("tpu")`` is memory_format=preserve_format: a dense tensor keeps its strides
    (channels-last inputs and a channels-last model's weights stay channels-last), as with
    ``.to("cuda")``; they were made contiguous. The copy back keeps them too."""
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    t = x.to("tpu")
    assert t.stride() == x.stride() and torch.equal(t.cpu(), x) and t.cpu().stride() == x.stride()
    assert t.to("tpu", memory_format=torch.contiguous_format).is_contiguous()
    assert x.to("tpu", dtype=torch.float64).stride() == x.stride()
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last).to("tpu")
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    y = torch.randn(4, 6).t()  # dense, transposed
    assert y.to("tpu").stride() == y.stride() and torch.equal(y.to("tpu").cpu(), y)
    z = torch.randn(4, 6)[:, ::2]  # not dense: contiguous on the device, as on CUDA
    assert z.to("tpu").is_contiguous() and torch.equal(z.to("tpu").cpu(), z)
    torch.testing.assert_close(conv(t).cpu(), conv.cpu()(x))


def test_to_tpu_keeps_the_stride_of_a_size_1_dim_like_cuda() -> None:
    """A dense tensor keeps its exact strides across ``.to("tpu")`` and back, a size-1
    dim's included: a channels-last 1x1 convolution's weight [128, 64, 1, 1] has strides
    (64, 1, 64, 64) on the CPU and CUDA, and a depthwise one [16, 1, 3, 3] (9, 1, 3, 1).
    They came out contiguous ((64, 1, 1, 1), (9, 9, 3, 1)): PyTorch calls those tensors
    contiguous, so the copy took contiguous strides, and a channels-last MobileNet's
    parameters and gradients had other strides than on the CPU."""
    for shape in ((128, 64, 1, 1), (16, 1, 3, 3), (1, 3, 4, 5)):
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
        t = x.to("tpu")
        assert t.stride() == x.stride(), shape
        assert t.cpu().stride() == x.stride() and torch.equal(t.cpu(), x)
        assert t.clone().stride() == x.clone().stride() and torch.empty_like(t).stride() == torch.empty_like(x).stride()
        assert (t * 2).stride() == (x * 2).stride()
    model = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 16, 1)).to(memory_format=torch.channels_last)
    on_tpu = copy.deepcopy(model).to("tpu")
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    model(x).square().sum().backward()
    on_tpu(x.to("tpu")).square().sum().backward()
    for p, q in zip(model.parameters(), on_tpu.parameters()):
        assert q.stride() == p.stride() and q.grad.stride() == p.grad.stride()
        assert_close(q.grad, p.grad)


def test_lazy_modules_move_before_their_first_forward_like_cuda():
    """``nn.LazyLinear(...).to("tpu")`` keeps the UninitializedParameter (same object and
    class, now on tpu), so the first forward materializes it there; copying it used to read
    ``.shape`` of the placeholder (which raises) and the swap left a plain Parameter of
    shape [0] that the lazy hook no longer replaced."""
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2), nn.LazyBatchNorm1d())
    weight = model[0].weight
    model.to(TPU)
    assert model[0].weight is weight and isinstance(weight, nn.UninitializedParameter) and weight.device.type == "tpu"
    assert isinstance(model[4].running_mean, nn.UninitializedBuffer) and model[4].running_mean.device.type == "tpu"
    x = torch.randn(5, 3, 6, 6)
    out = model(x.to(TPU))
    assert out.shape == (5, 2) and model[0].weight is weight and type(weight) is nn.Parameter
    assert all(t.device.type == "tpu" for t in list(model.parameters()) + list(model.buffers()))
    reference = copy.deepcopy(model).cpu()  # the tpu-initialized weights, run on the CPU
    assert_close(out, reference(x))
    back = nn.LazyLinear(3).to(TPU).cpu()
    assert isinstance(back.weight, nn.UninitializedParameter) and back.weight.device.type == "cpu"


# -- tensor.data = ... across tpu ------------------------------------------------------------
def test_assigning_data_across_tpu_keeps_the_parameter_as_set_data_does_on_cuda():
    """``param.data = param.to("tpu")``: PyTorch's ``set_data`` refuses a CPU tensor and a
    PrivateUse1 one ("incompatible tensor type"); on CUDA it moves the parameter in place.
    The Parameter keeps its identity, class, attributes, ``requires_grad`` and hooks, shares
    the new tensor's storage, and trains; and back to the CPU."""
    param = nn.Parameter(torch.arange(3.0))
    param.tag = "kept"
    calls = []
    param.register_hook(lambda g: calls.append(g.device.type))
    identity = id(param)
    moved = param.detach().to(TPU)
    param.data = moved
    assert (id(param), type(param), param.tag, param.requires_grad, param.is_leaf) == (identity, nn.Parameter, "kept", True, True)
    assert param.device.type == "tpu" and param.untyped_storage().data_ptr() == moved.untyped_storage().data_ptr()
    (param * 2).sum().backward()
    assert calls == ["tpu"]
    assert_close(param.grad, torch.full((3,), 2.0))
    param.data = param.data.cpu()
    assert param.device.type == "cpu" and param.grad is None  # a grad of the old device no longer fits
    assert_close(param, torch.arange(3.0))


def test_assigning_data_keeps_pytorchs_errors_and_same_device_behaviour():
    needs_grad = nn.Parameter(torch.ones(2))
    with pytest.raises(RuntimeError, match="floating point or complex"):
        needs_grad.data = torch.ones(2, dtype=torch.long, device=TPU)
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        torch.ones(2).data = torch.ones(2).to_sparse()  # not about tpu: PyTorch's own refusal
    same = torch.zeros(2, device=TPU)
    same.data = torch.ones(3, device=TPU)
    assert_close(same, torch.ones(3))


def test_fully_shard_moves_a_module_built_on_the_cpu_to_a_tpu_mesh(tmp_path):
    """FSDP2's ``fully_shard`` moves a CPU module's states to its mesh's device with
    ``tensor.data = tensor.to(device)`` (on CUDA too): a world of one, three AdamW steps
    against the same module on the CPU without FSDP."""
    import subprocess
    import sys

    code = (
        "import torch, torch.nn as nn, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.fsdp import fully_shard\n"
        f"dist.init_process_group('tpu', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
        "def run(shard):\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n"
        "    if shard:\n"
        "        mesh = init_device_mesh('tpu', (1,))\n"
        "        fully_shard(m[0], mesh=mesh); fully_shard(m, mesh=mesh)\n"
        "        assert all(p.device.type == 'tpu' for p in m.parameters())\n"
        "    dev = 'tpu' if shard else 'cpu'\n"
        "    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)\n"
        "    g = torch.Generator().manual_seed(1)\n"
        "    x, y = torch.randn(16, 8, generator=g).to(dev), torch.randn(16, 1, generator=g).to(dev)\n"
        "    losses = []\n"
        "    for _ in range(3):\n"
        "        loss = nn.functional.mse_loss(m(x), y); loss.backward(); opt.step(); opt.zero_grad(); losses.append(loss.item())\n"
        "    return losses\n"
        "sharded, plain = run(True), run(False)\n"
        "torch.testing.assert_close(sharded, plain, rtol=1e-5, atol=1e-6)\n"
        "print('OK', sharded)\n"
        "dist.destroy_process_group()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr[-3000:]


@pytest.mark.parametrize("input_device", ["cpu", "tpu"])
def test_data_parallel_wraps_a_tpu_model_as_on_one_cuda_device(input_device):
    """``nn.DataParallel(model)`` (older training scripts wrap unconditionally) failed at its
    first call: its scatter and gather call ``torch._C._scatter``/``_gather``, which only a
    CUDA build has. On tpu it trains as the bare model does on the CPU, and the gradient of
    a CPU input comes back to the CPU, as with one CUDA device."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    tpu = copy.deepcopy(cpu).to(TPU)
    wrapped = nn.DataParallel(tpu)
    assert wrapped.device_ids == [0]
    cpu_opt, tpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1), torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(6, 4), torch.randn(6, 2)
        x_cpu, x_in = x.clone().requires_grad_(), (x if input_device == "cpu" else x.to(TPU)).requires_grad_()
        for model, opt, inp, target in ((cpu, cpu_opt, x_cpu, y), (wrapped, tpu_opt, x_in, y.to(TPU))):
            opt.zero_grad()
            out = model(inp)
            ((out - target) ** 2).mean().backward()
            opt.step()
        assert out.device.type == "tpu"
        assert x_in.grad.device.type == input_device
        assert_close(x_in.grad, x_cpu.grad, **GRAD_TOL)
    for a, e in zip(tpu.parameters(), cpu.parameters()):
        assert_close(a, e, **GRAD_TOL)
