"""pickle / copy of tpu tensors: values, dtype, shape, strides and storage offset
round-trip, and the result lives on tpu (as a CUDA tensor's pickle restores on CUDA)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from utils import TPU


def _views(t: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"plain": t, "transposed": t.t(), "sliced": t[1:, ::2], "offset": t.t()[1:], "expanded": t[:1].expand(3, -1)}


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("made_on", ["cpu", "tpu"])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_pickle_round_trip_keeps_geometry_and_values(dtype, made_on):
    cpu_base = torch.arange(12).reshape(3, 4).to(dtype)
    # made on tpu by a program (not by .to): its storage's cell is typed by the program
    base = cpu_base.to(TPU) if made_on == "cpu" else torch.arange(12, device=TPU).reshape(3, 4).to(dtype)
    cpu_views = _views(cpu_base)
    for name, t in _views(base).items():
        r = pickle.loads(pickle.dumps(t))
        want = pickle.loads(pickle.dumps(cpu_views[name]))
        assert r.device.type == "tpu" and r.dtype == want.dtype, name
        assert (r.shape, r.stride(), r.storage_offset()) == (want.shape, want.stride(), want.storage_offset()), name
        assert torch.equal(r.cpu(), want), name
        # the result is an ordinary tpu tensor: programs read it and write it
        assert torch.equal(r.clone().cpu(), want), name
        if dtype is not torch.bool:
            assert torch.equal((r + r).cpu(), want + want), name


def test_unpickled_factory_tensor_is_usable():
    """The reported bug: a restored storage is bytes (a uint8 cell); reading the float32
    tensor on it raised 'viewing a torch.uint8 storage as torch.float32'."""
    r = pickle.loads(pickle.dumps(torch.ones(2, device=TPU)))
    assert "tensor([1., 1.], device='tpu:0')" == repr(r)
    r.mul_(3)
    assert torch.equal((r + 1).cpu(), torch.full((2,), 4.0))
    assert torch.equal(r.view(torch.uint8).cpu(), torch.full((2,), 3.0).view(torch.uint8))


def test_pickle_parameter_and_containers():
    p = torch.nn.Parameter(torch.randn(2, 3, device=TPU))
    obj = {"w": p, "list": [torch.ones(2, device=TPU), 3], "nested": {"t": torch.zeros(1, device=TPU)}}
    r = pickle.loads(pickle.dumps(obj))
    assert isinstance(r["w"], torch.nn.Parameter) and r["w"].requires_grad and r["w"].device.type == "tpu"
    assert torch.equal(r["w"].detach().cpu(), p.detach().cpu())
    assert r["list"][1] == 3 and torch.equal(r["nested"]["t"].cpu(), torch.zeros(1))


def test_copy_and_deepcopy():
    t = torch.randn(3, 4, device=TPU)
    shallow = copy.copy({"t": t})
    assert shallow["t"] is t
    deep = copy.deepcopy({"t": t, "v": t[1]})
    assert torch.equal(deep["t"].cpu(), t.cpu()) and deep["t"].data_ptr() != t.data_ptr()
    # deepcopy keeps the view relation, as on the CPU
    deep["t"][1].fill_(7.0)
    assert torch.equal(deep["v"].cpu(), torch.full((4,), 7.0))


def test_pickle_a_tpu_storage():
    t = torch.arange(6, dtype=torch.float32, device=TPU)
    s = pickle.loads(pickle.dumps(t.untyped_storage()))
    assert s.device.type == "tpu" and s.nbytes() == 24
    assert torch.equal(torch.empty(0, device=TPU).set_(s).cpu(), torch.arange(6, dtype=torch.float32))
