"""Real tpu tensors: transfers, dtypes, printing, serialization, modules."""

import io
import warnings

import pytest
import torch

import torchtpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_every_dtype(dtype):
    src = (torch.arange(-6, 6).reshape(3, 4) * 3).to(dtype)
    t = src.to("tpu")
    assert t.device.type == "tpu" and t.dtype == dtype and t.shape == src.shape
    assert torch.equal(t.cpu(), src)
    assert t.cpu().tolist() == src.tolist()


def test_item_tolist_and_strided_readback():
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    assert x[1, 2].item() == 6.0
    assert x.t().cpu().tolist() == torch.arange(12.0).reshape(3, 4).t().tolist()
    assert x[:, 1::2].cpu().tolist() == [[1.0, 3.0], [5.0, 7.0], [9.0, 11.0]]
    assert x.tolist() == torch.arange(12.0).reshape(3, 4).tolist()


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4), (2, 0, 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_empty_tensors_come_back_with_the_cpus_strides(shape, dtype):
    """numpy gives an empty array zero strides ((3, 0) float32: (0, 4)); the CPU copy of an
    empty tpu tensor kept them, so ``.view(torch.uint8)`` on it raised."""
    t = torch.zeros(shape, dtype=dtype, device="tpu") + 1  # a buffer a program wrote
    host = t.cpu()
    assert (host.shape, host.stride()) == (torch.Size(shape), torch.zeros(shape).stride())
    assert host.view(torch.uint8).numel() == 0


def test_numpy_raises_like_cuda():
    x = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="cpu()"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0]


def test_dlpack_export_refuses_with_a_message():
    """No DLPack capsule of a tpu tensor: its storage's data pointer is an opaque handle,
    and a consumer reading it would crash the process. CPU tensors still round-trip."""
    import numpy as np

    t = torch.arange(4.0, device="tpu")
    for export in (torch.utils.dlpack.to_dlpack, torch.to_dlpack, torch.from_dlpack, np.from_dlpack, type(t).__dlpack__):
        with pytest.raises(BufferError, match=r"cannot be exported through DLPack.*t\.cpu\(\)"):
            export(t)
    with pytest.raises(BufferError, match="DLPack"):
        t.__dlpack_device__()
    c = torch.arange(3.0)
    assert torch.from_dlpack(torch.utils.dlpack.to_dlpack(c)).tolist() == [0.0, 1.0, 2.0]
    assert np.from_dlpack(c).tolist() == [0.0, 1.0, 2.0]


def test_print_and_repr():
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]], device="tpu")
    r = repr(x)
    assert "device='tpu:0'" in r and "1.5000" in r and "4.2500" in r
    assert "tpu" in str(torch.zeros(0, device="tpu"))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(2000.0),  # summarized
        lambda: torch.randn(3, 4, dtype=torch.float64) * 1e6,  # scientific notation
        lambda: torch.tensor([1.0, 2.5], dtype=torch.bfloat16),
        lambda: torch.tensor([[True, False]]),
        lambda: torch.tensor(7),
        lambda: torch.randn(4, requires_grad=True) * 2,  # grad_fn
    ],
    ids=["summarized", "scientific", "bfloat16", "bool", "0-d", "grad_fn"],
)
def test_printing_formats_like_the_cpu_from_one_host_copy(make):
    """The same text as the CPU tensor's (plus the device), read with one host sync: the
    formatting ops (summaries, abs, masked_select, .item() per number) run on the copy."""
    torch.manual_seed(0)
    cpu = make()
    t = cpu.detach().to("tpu").requires_grad_(cpu.requires_grad)
    if cpu.grad_fn is not None:
        t = t * 1  # a tpu grad_fn of its own
        cpu = cpu * 1
    before = torchtpu.metrics.snapshot()["host_syncs"]
    text = repr(t)
    assert torchtpu.metrics.snapshot()["host_syncs"] - before == 1
    assert "device='tpu:0'" in text

    def squeezed(r: str) -> str:  # the device suffix moves line breaks: compare without whitespace
        return "".join(r.split()).replace("device='tpu:0'", "").replace(",,", ",").replace(",)", ")")

    assert squeezed(text) == squeezed(repr(cpu))


def test_torch_tensor_and_factories():
    t = torch.tensor([1, 2, 3], device="tpu")
    assert t.dtype == torch.int64 and t.cpu().tolist() == [1, 2, 3]
    assert torch.zeros(2, 3, device="tpu").cpu().eq(0).all()
    assert torch.ones(4, dtype=torch.bfloat16, device="tpu").cpu().tolist() == [1.0] * 4
    assert torch.full((2,), 7.0, device="tpu").cpu().tolist() == [7.0, 7.0]
    assert torch.arange(5, device="tpu").cpu().tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(torch.linspace(0, 1, 5, device="tpu").cpu(), torch.linspace(0, 1, 5))
    assert torch.empty(3, 2, device="tpu").shape == (3, 2)


def test_copy_across_devices():
    a = torch.zeros(2, 3, device="tpu")
    a.copy_(torch.arange(6.0).reshape(2, 3))
    assert a.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
    a[0].copy_(torch.tensor([9.0, 9.0, 9.0]))  # host -> device view
    assert a.cpu().tolist() == [[9, 9, 9], [3, 4, 5]]
    c = torch.empty(2, 3)
    c.copy_(a)  # device -> host
    assert c.tolist() == [[9, 9, 9], [3, 4, 5]]
    b = torch.empty(3, dtype=torch.int32, device="tpu")
    b.copy_(a[1])  # device -> device with dtype conversion
    assert b.cpu().tolist() == [3, 4, 5] and b.dtype == torch.int32
    d = torch.empty(2, 3, device="tpu")
    d.copy_(torch.tensor([1.0, 2.0, 3.0]))  # broadcast
    assert d.cpu().tolist() == [[1, 2, 3], [1, 2, 3]]


def test_dtype_conversion_on_device():
    x = torch.tensor([1.7, -2.2, 3.5], device="tpu")
    assert x.to(torch.int32).cpu().tolist() == [1, -2, 3]
    assert x.to(torch.bfloat16).dtype == torch.bfloat16
    assert x.double().cpu().dtype == torch.float64
    assert (x > 0).cpu().tolist() == [True, False, True]


@pytest.mark.parametrize("map_location", [None, "cpu", "tpu"])
def test_save_load(map_location, tmp_path):
    x = torch.randn(3, 4).to("tpu")
    path = tmp_path / "t.pt"
    torch.save({"x": x, "v": x[1]}, path)
    loaded = torch.load(path, map_location=map_location, weights_only=True)
    expected_device = "cpu" if map_location == "cpu" else "tpu"
    assert loaded["x"].device.type == expected_device
    torch.testing.assert_close(loaded["x"].cpu(), x.cpu())
    torch.testing.assert_close(loaded["v"].cpu(), x[1].cpu())


def test_load_cpu_checkpoint_onto_tpu():
    buf = io.BytesIO()
    sd = torch.nn.Linear(3, 2).state_dict()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="tpu", weights_only=True)
    assert all(v.device.type == "tpu" for v in loaded.values())
    torch.testing.assert_close(loaded["weight"].cpu(), sd["weight"])


def test_module_to_state_dict_roundtrip():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    assert all(isinstance(p, torch.nn.Parameter) for p in m.parameters())
    sd = m.state_dict()
    for k, v in sd.items():
        torch.testing.assert_close(v.cpu(), ref[k])
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to("tpu")
    m2.load_state_dict(sd)
    x = torch.randn(5, 4)
    torch.testing.assert_close(m2(x.to("tpu")).cpu(), m.cpu()(x))


def test_mixing_devices_is_a_clear_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device="tpu") + torch.ones(3)
    # a 0-d CPU tensor is allowed, as with CUDA
    assert (torch.ones(3, device="tpu") * torch.tensor(2.0)).cpu().tolist() == [2.0, 2.0, 2.0]


# aten::_foobar is PyTorch's own test operator (a CPU kernel only): it stands for any op
# the tpu backend has no lowering for
_UNLOWERED = torch.ops.aten._foobar


def test_missing_op_error_names_op_and_workaround():
    x = torch.randn(8, device="tpu")
    with pytest.raises(NotImplementedError) as e:
        _UNLOWERED(x)
    msg = str(e.value)
    assert "aten::_foobar" in msg and "TORCHTPU_CPU_FALLBACK=1" in msg


def test_cpu_fallback_runs_on_host_with_one_warning(monkeypatch):
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")
    x = torch.randn(8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = _UNLOWERED(x.to("tpu"))
        _UNLOWERED(x.to("tpu"))
    assert sum("aten::_foobar" in str(m.message) or "aten._foobar" in str(m.message) for m in w) == 1
    assert a.device.type == "tpu"
    torch.testing.assert_close(a.cpu(), _UNLOWERED(x))


def test_cpu_fallback_refuses_a_sparse_result(monkeypatch):
    """EmbeddingBag(sparse=True)'s backward falls back to the CPU, whose gradient is sparse:
    the sparse-layout message, not 'unsupported memory format option' from the copy back."""
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum", sparse=True).to("tpu")
    out = bag(torch.tensor([1, 2, 4, 5], device="tpu"), torch.tensor([0, 2], device="tpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match="sparse tensors .* not supported on the tpu device"):
            out.sum().backward()


def test_metrics_second_identical_step_compiles_nothing():
    def step(x):
        return (x * 2 + 1).relu().sum()

    x = torch.randn(16, 16, device="tpu")
    step(x).item()
    torchtpu.metrics.reset()
    step(x).item()
    snap = torchtpu.metrics.snapshot()
    assert snap["compiles"] == 0
    assert snap["cache_hits"] >= 4 and snap["executions"] >= 4
    assert snap["d2h_bytes"] == 4
    for name in ("compiles", "cache_hits", "executions", "h2d_bytes", "d2h_bytes"):
        assert name in snap


def test_scalar_values_do_not_recompile():
    x = torch.randn(4, device="tpu")
    (x * 0.5).cpu()
    torchtpu.metrics.reset()
    for s in (0.25, 3.0, -7.5, 11.0):
        torch.testing.assert_close((x * s).cpu(), x.cpu() * s)
        torch.testing.assert_close(x.add(x, alpha=s).cpu(), x.cpu() + s * x.cpu())
    assert torchtpu.metrics.snapshot()["compiles"] <= 1  # add with alpha once


def test_resize_and_resize_as_keep_the_data_prefix():
    src = torch.arange(6.0)
    x = src.clone().to("tpu")
    x.resize_(2, 2)
    assert x.shape == (2, 2) and torch.equal(x.cpu(), src[:4].view(2, 2))
    x.resize_as_(torch.empty(2, 3).to("tpu"))
    assert x.shape == (2, 3)
    assert torch.equal(x.cpu().flatten()[:4], src[:4])  # grown in place: the old elements stay
