"""Serialization of tpu tensors, against the same operations on CPU tensors.

torch.save + torch.load (both map_location directions and none, weights_only, mmap),
copy.copy / copy.deepcopy, tied parameters in a state_dict, views of another dtype
(what a restored byte storage is read through), and tensors sent to other processes
(torch.multiprocessing queues, DataLoader workers). Each check compares values, dtypes,
shapes, strides, storage offsets and which tensors share a storage with the CPU result.
"""

from __future__ import annotations

import copy
import io
import itertools
import pickle
import queue
import time

import pytest
import torch
from torch.utils._pytree import tree_flatten
from utils import TPU

# -- helpers --------------------------------------------------------------------------------


def _checkpoint(dev: str) -> dict:
    """Views of every kind over one storage, other dtypes, a Parameter, nested containers:
    built with factories on ``dev`` (the restored storage of a factory tensor was the bug)."""
    base = torch.arange(24, dtype=torch.float32, device=dev).reshape(4, 6)
    flat = torch.arange(20, dtype=torch.int64, device=dev)
    return {
        "base": base,
        "transposed": base.t(),
        "sliced": base[1:, ::2],
        "offset": base.t()[2:],
        "expanded": base[:1].expand(5, -1),
        "row": base[2],
        "reshaped": base.view(-1)[5:17].view(3, 4),
        "param": torch.nn.Parameter(torch.linspace(-1, 1, 6, device=dev).reshape(2, 3)),
        "nested": [
            flat[3:9].view(2, 3),
            (flat[::4], {"complex": (torch.arange(5, device=dev) * (1 - 2j)).to(torch.complex64)}),
        ],
        "bf16": torch.arange(-3, 5, device=dev).to(torch.bfloat16) / 3,
        "bool": torch.arange(7, device=dev) % 3 == 0,
        "int32": torch.arange(-4, 4, dtype=torch.int32, device=dev)[1::3],
        "uint8": torch.arange(250, 256, dtype=torch.uint8, device=dev),
        "f16": torch.linspace(-2, 2, 5, dtype=torch.float16, device=dev),
        "f64": torch.linspace(-2, 2, 5, dtype=torch.float64, device=dev).reshape(5, 1).expand(5, 2),
        "scalar": torch.tensor(2.5, device=dev),
        "empty": torch.empty(0, 3, device=dev),
    }


def _tensors(obj: object) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _sharing(tensors: list[torch.Tensor]) -> list[int]:
    """For each tensor, the index of the first tensor on the same storage."""
    first: dict[int, int] = {}
    return [first.setdefault(t.untyped_storage()._cdata, i) for i, t in enumerate(tensors)]


def assert_matches_cpu(result: object, expected: object, device: str) -> None:
    """``result`` (on ``device``) holds what ``expected`` (CPU) holds, view for view."""
    got, want = _tensors(result), _tensors(expected)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == device, i
        assert type(g) is type(w), i
        assert (g.dtype, g.shape, g.stride(), g.storage_offset()) == (w.dtype, w.shape, w.stride(), w.storage_offset()), i
        assert g.requires_grad == w.requires_grad, i
        assert torch.equal(g.detach().cpu(), w.detach()), i
    assert _sharing(got) == _sharing(want)


def assert_writes_shared(obj: dict) -> None:
    """A write through ``base`` is seen by its views (as on the CPU)."""
    obj["base"][2, 4] = -7.0
    assert obj["transposed"][4, 2].item() == -7.0 and obj["row"][4].item() == -7.0
    assert obj["offset"][2, 2].item() == -7.0 and obj["reshaped"][2, 3].item() == -7.0


# -- views of another dtype (a restored storage is bytes) ----------------------------------

_VIEW_DTYPES = [torch.float32, torch.uint8, torch.int16, torch.bool, torch.bfloat16, torch.complex64, torch.float64]
_PAIRS = [(a, b) for a, b in itertools.permutations(_VIEW_DTYPES, 2)]


def _storage(dtype: torch.dtype) -> torch.Tensor:
    """48 bytes of varied bit patterns (bool: 0/1 bytes, the only ones a bool holds)."""
    if dtype is torch.bool:
        return torch.arange(48) % 3 == 1
    raw = (torch.arange(48, dtype=torch.int64) * 37 + 11) % 251
    if dtype is torch.uint8:
        return raw.to(torch.uint8)
    return torch.linspace(-3, 5, 48 // dtype.itemsize, dtype=torch.float64).to(dtype) * (1 if not dtype.is_complex else 1 - 0.5j)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8) if t.dtype is not torch.bool else t.detach().cpu()


def _as_read(cpu_view: torch.Tensor) -> torch.Tensor:
    """What a CPU view reads as: a byte of a bool view is True when not zero."""
    return cpu_view.view(torch.uint8) != 0 if cpu_view.dtype is torch.bool else cpu_view


@pytest.mark.parametrize(("storage", "view"), _PAIRS, ids=[f"{a}-as-{b}".replace("torch.", "") for a, b in _PAIRS])
def test_dtype_view_reads_and_writes_like_cpu(storage, view):
    cpu = _storage(storage)
    tpu = cpu.to(TPU)
    c, t = cpu.view(view), tpu.view(view)
    assert (t.shape, t.stride()) == (c.shape, c.stride())
    # reads: a program reads the view (clone), whole and strided
    assert torch.equal(_bytes(t.clone()), _bytes(_as_read(c)))
    assert torch.equal(_bytes(t[1::2].clone()), _bytes(_as_read(c)[1::2]))
    # writes through the view land in the right bytes of the storage; the others keep theirs
    n = c.shape[0] // 2
    t[:n] = t[n : 2 * n].clone()
    c[:n] = _as_read(c)[n : 2 * n].clone()  # (a CPU bool holding a byte > 1 copies as it likes)
    assert torch.equal(_bytes(tpu), _bytes(cpu))


def test_inplace_ops_through_dtype_views():
    def run(dev: str) -> list[torch.Tensor]:
        f = torch.linspace(-2, 2, 8, device=dev)
        f.view(torch.int32)[::3].add_(1)  # bit arithmetic on floats
        f.view(torch.bfloat16)[1::2].neg_()  # the high halves: the sign of every float
        u = torch.tensor([1.5, -2.0, 3.25], device=dev).view(torch.uint8).clone()
        u.view(torch.float32).mul_(2)  # a byte storage read and written as floats
        c = torch.arange(8, dtype=torch.float32, device=dev)
        c.view(torch.complex64).mul_(1j)
        b = torch.arange(6, dtype=torch.int16, device=dev)
        b.view(torch.bool)[::3] = True
        z = torch.zeros(5, dtype=torch.complex64, device=dev)
        z.view(torch.float32)[1::2] = torch.arange(5.0, device=dev)  # the imaginary parts
        return [f, u, c, b, z]

    for got, want in zip(run(TPU), run("cpu")):
        assert torch.equal(_bytes(got), _bytes(want))


def test_odd_sized_byte_storage_viewed_wider():
    cpu = torch.arange(7, dtype=torch.uint8) * 40
    tpu = cpu.to(TPU)
    assert torch.equal(tpu[:4].view(torch.float32).clone().cpu(), cpu[:4].view(torch.float32))
    cpu[:4].view(torch.int32).add_(5)
    tpu[:4].view(torch.int32).add_(5)
    assert torch.equal(tpu.cpu(), cpu)


# -- torch.save / torch.load ---------------------------------------------------------------------


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("map_location", [None, "cpu", "tpu"])
@pytest.mark.parametrize("saved_on", ["cpu", "tpu"])
def test_save_load_round_trip(tmp_path, saved_on, map_location, weights_only, mmap):
    path = tmp_path / "ckpt.pt"
    torch.save(_checkpoint(saved_on), path)
    loaded = torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    torch.save(_checkpoint("cpu"), tmp_path / "ref.pt")
    expected = torch.load(tmp_path / "ref.pt", weights_only=weights_only, mmap=mmap)
    device = map_location or saved_on
    assert_matches_cpu(loaded, expected, device)
    assert_writes_shared(loaded)
    assert_writes_shared(expected)
    assert_matches_cpu(loaded, expected, device)
    # loaded tensors are ordinary tensors: ops and in-place ops on them work
    assert torch.equal((loaded["base"] * 2 + loaded["transposed"].t()).cpu(), expected["base"] * 3)
    loaded["bf16"].add_(1)
    assert torch.equal(loaded["bf16"].cpu(), expected["bf16"] + 1)


def test_save_load_through_a_buffer_and_map_location_forms():
    buf = io.BytesIO()
    torch.save(_checkpoint(TPU), buf)
    expected = _checkpoint("cpu")
    for ml in (torch.device("tpu"), "tpu:0", {"tpu:0": "cpu"}, lambda s, loc: s):
        buf.seek(0)
        device = "tpu" if isinstance(ml, (str, torch.device)) else "cpu"  # the callable keeps the CPU storage
        assert_matches_cpu(torch.load(buf, map_location=ml), expected, device)


def test_saved_location_names_the_device_index_as_cuda_does(tmp_path):
    """CUDA records "cuda:0", and code moved from CUDA maps it with {"cuda:0": "cpu"}; tpu
    records "tpu:0" (it recorded a bare "tpu", which such a dictionary never matched)."""
    t = torch.arange(3.0, device=TPU)
    assert torch.serialization.location_tag(t.untyped_storage()) == "tpu:0"
    torch.save(t, tmp_path / "t.pt")
    assert torch.load(tmp_path / "t.pt", map_location={"tpu:0": "cpu"}).device.type == "cpu"
    assert torch.load(tmp_path / "t.pt", map_location={"tpu": "cpu"}).device.type == "tpu"  # as {"cuda": ...} misses "cuda:0"


def test_a_file_saved_with_the_bare_tpu_location_still_loads(tmp_path):
    """Files written before the tag named the index ("tpu") load onto tpu, and map to the CPU
    by that name."""
    registry = torch.serialization._package_registry
    i = next(i for i, entry in enumerate(registry) if getattr(entry[1], "__module__", "") == "torchtpu._registration")
    entry = registry[i]
    registry[i] = (entry[0], lambda obj: "tpu" if obj.device.type == "tpu" else None, entry[2])
    try:
        torch.save(torch.arange(3.0, device=TPU), tmp_path / "old.pt")
    finally:
        registry[i] = entry
    loaded = torch.load(tmp_path / "old.pt")
    assert loaded.device.type == "tpu" and torch.equal(loaded.cpu(), torch.arange(3.0))
    assert torch.load(tmp_path / "old.pt", map_location={"tpu": "cpu"}).device.type == "cpu"


def test_mixed_dtypes_on_one_storage_refused_like_cpu():
    for dev in ("cpu", TPU):
        a = torch.arange(6.0, device=dev)
        with pytest.raises(RuntimeError, match="view the same data as different types"):
            torch.save([a, a.view(torch.int32)], io.BytesIO())


def test_loaded_storage_takes_the_tensor_dtype():
    """A restored storage is bytes; the first typed tensor set onto it retypes its cell, so
    loaded parameters run without reinterpreting bytes in every program."""
    from torchtpu.tensor.storage import cell_of

    buf = io.BytesIO()
    torch.save({"w": torch.ones(3, 4, device=TPU), "v": torch.ones(10, device=TPU)[2:5], "b": torch.ones(2, device=TPU) > 0}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert (cell_of(loaded["w"]).dtype, cell_of(loaded["w"]).shape) == (torch.float32, (3, 4))
    assert (cell_of(loaded["v"]).dtype, cell_of(loaded["v"]).shape) == (torch.float32, (10,))
    assert cell_of(loaded["b"]).dtype is torch.uint8  # a bool cell could not hold other bytes
    assert torch.equal(loaded["b"].cpu(), torch.ones(2, dtype=torch.bool))


# -- tied parameters ------------------------------------------------------------------------------


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(5, 4)
        self.out = torch.nn.Linear(4, 5, bias=False)
        self.out.weight = self.emb.weight
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.emb(idx)))


@pytest.mark.parametrize("map_location", [None, "cpu", "tpu"])
def test_tied_state_dict_round_trip(tmp_path, map_location):
    cpu_model = _Tied()
    model = copy.deepcopy(cpu_model).to(TPU)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    torch.save(cpu_model.state_dict(), tmp_path / "ref.pt")
    sd = torch.load(tmp_path / "sd.pt", map_location=map_location, weights_only=True)
    expected = torch.load(tmp_path / "ref.pt", weights_only=True)
    assert_matches_cpu(sd, expected, map_location or "tpu")
    assert sd["emb.weight"].untyped_storage()._cdata == sd["out.weight"].untyped_storage()._cdata

    fresh = _Tied().to(TPU)
    fresh.load_state_dict(sd)
    assert fresh.out.weight is fresh.emb.weight
    with torch.no_grad():
        fresh.emb.weight[0, 0] = 3.0  # still one parameter
    assert fresh.out.weight[0, 0].item() == 3.0
    fresh.load_state_dict(sd)
    idx = torch.tensor([0, 3, 4])
    torch.testing.assert_close(fresh(idx.to(TPU)).detach().cpu(), cpu_model(idx).detach())


def test_whole_module_round_trip(tmp_path):
    model = _Tied().to(TPU)
    torch.save(model, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert loaded.out.weight is loaded.emb.weight and loaded.out.weight.device.type == "tpu"
    idx = torch.tensor([1, 2], device=TPU)
    assert torch.equal(loaded(idx).detach().cpu(), model(idx).detach().cpu())
    on_cpu = torch.load(tmp_path / "m.pt", weights_only=False, map_location="cpu")
    assert on_cpu.out.weight is on_cpu.emb.weight and on_cpu.out.weight.device.type == "cpu"


# -- copy, deepcopy, pickle --------------------------------------------------------------------------


def test_copy_and_deepcopy_match_cpu():
    for fn in (copy.copy, copy.deepcopy):
        got, want = fn(_checkpoint(TPU)), fn(_checkpoint("cpu"))
        assert_matches_cpu(got, want, "tpu")
        assert_writes_shared(got)
        assert_writes_shared(want)
        assert_matches_cpu(got, want, "tpu")
    # a shallow copy of a tensor shares its storage, as on the CPU; a deep copy does not
    t = torch.arange(6.0, device=TPU).reshape(2, 3)
    assert copy.copy(t.t()).untyped_storage()._cdata == t.untyped_storage()._cdata
    assert copy.deepcopy(t).untyped_storage()._cdata != t.untyped_storage()._cdata


def test_deepcopy_of_tied_module():
    model = _Tied().to(TPU)
    clone = copy.deepcopy(model)
    assert clone.out.weight is clone.emb.weight and clone.emb.weight is not model.emb.weight
    idx = torch.tensor([4, 0], device=TPU)
    assert torch.equal(clone(idx).detach().cpu(), model(idx).detach().cpu())


def _bn_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 1))


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_deepcopy_keeps_its_values_while_the_original_trains(mode):
    """``ema = copy.deepcopy(model)``, then training steps on the original that rewrite its
    parameters and BatchNorm statistics in place (a compiled step donates their old buffers
    to XLA). The copy's tensors (parameters through ``clone``, buffers through
    ``UntypedStorage.clone``) must be its own: before the fix, the copy's running statistics
    shared the original's buffers and a compiled step deleted them under it."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

    def run(dev: str) -> tuple[torch.nn.Module, torch.nn.Module, list[float]]:
        model = _bn_net().to(dev)
        ema = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(inp: torch.Tensor) -> torch.Tensor:
            loss = model(inp).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        if mode == "compile" and dev == TPU:
            step = torch.compile(step, backend="tpu")
        losses = [float(step(x.to(dev))) for _ in range(3)]
        return model, ema, losses

    model, ema, losses = run(TPU)
    cpu_model, cpu_ema, cpu_losses = run("cpu")
    torch.testing.assert_close(losses, cpu_losses)
    for (name, got), want in zip(ema.state_dict().items(), cpu_ema.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, msg=f"ema {name}")
    for (name, got), want in zip(model.state_dict().items(), cpu_model.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, msg=f"model {name}")
    assert not torch.equal(ema[1].running_mean.cpu(), model[1].running_mean.cpu())
    ema.eval()
    torch.testing.assert_close(ema(x.to(TPU)).detach().cpu(), cpu_ema.eval()(x))


def test_a_cloned_storage_survives_an_in_place_compiled_update_of_the_original():
    t = torch.arange(8.0, device=TPU) * 2
    clone = torch.empty(0, device=TPU).set_(t.untyped_storage().clone())

    @torch.compile(backend="tpu")
    def bump(a: torch.Tensor) -> None:
        a.add_(100)

    bump(t)
    bump(t)
    assert torch.equal(clone.cpu(), torch.arange(8.0) * 2)
    assert torch.equal(t.cpu(), torch.arange(8.0) * 2 + 200)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_matches_cpu(protocol):
    got = pickle.loads(pickle.dumps(_checkpoint(TPU), protocol=protocol))
    want = pickle.loads(pickle.dumps(_checkpoint("cpu"), protocol=protocol))
    assert_matches_cpu(got, want, "tpu")  # plain pickle does not keep sharing between tensors, on the CPU either


# -- other processes -----------------------------------------------------------------------------------

_TIMEOUT = 120  # a spawned child imports torch and starts its own XLA client


def _queue_child(inbox: object, outbox: object, arg: torch.Tensor) -> None:
    got = inbox.get(timeout=_TIMEOUT)
    got["arg"] = arg  # a process argument travels the same way
    report = {k: (v.device.type, v.detach().cpu(), v.stride(), v.storage_offset(), type(v).__name__) for k, v in got.items()}
    got["base"][1, 2] = 50.0  # the transposed view shares the rebuilt storage
    report["shared"] = got["transposed"][2, 1].item()
    outbox.put(report)
    made = torch.arange(6.0, device="tpu").reshape(2, 3)
    outbox.put({"made": made, "made_t": made.t(), "complex": (made[0] * 1j).to(torch.complex64)})


def _answer(box: object, child: object) -> object:
    """The child's next message; fails as soon as the child has died, or after _TIMEOUT."""
    deadline = time.monotonic() + _TIMEOUT
    while True:
        try:
            return box.get(timeout=1)
        except queue.Empty:
            if not child.is_alive():
                pytest.fail(f"the child exited (code {child.exitcode}) without answering; its stderr is above")
            if time.monotonic() > deadline:
                pytest.fail(f"no answer from the child within {_TIMEOUT}s")


def test_multiprocessing_queue_both_directions():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    arg = torch.arange(4, device=TPU)[1::2]
    child = ctx.Process(target=_queue_child, args=(inbox, outbox, arg), daemon=True)
    child.start()
    try:
        base = torch.arange(6.0, device=TPU).reshape(2, 3)
        sent = {
            "base": base,
            "transposed": base.t(),
            "param": torch.nn.Parameter(torch.ones(2, device=TPU)),
            "bool": torch.tensor([True, False], device=TPU),
            "bf16": torch.arange(3, device=TPU).to(torch.bfloat16)[1:],
        }
        inbox.put(sent)
        report = _answer(outbox, child)
        made = _answer(outbox, child)
        for k, v in {**sent, "arg": arg}.items():
            device, value, stride, offset, kind = report[k]
            assert (device, stride, offset, kind) == ("tpu", v.stride(), v.storage_offset(), type(v).__name__), k
            assert torch.equal(value, v.detach().cpu()), k
        assert report["shared"] == 50.0
        assert base[1, 2].item() == 5.0  # the child had a copy: a write there is not seen here
        assert made["made"].device.type == "tpu" and made["made_t"].stride() == (1, 3)
        assert torch.equal(made["made_t"].cpu(), torch.arange(6.0).reshape(2, 3).t())
        assert made["made"].untyped_storage()._cdata == made["made_t"].untyped_storage()._cdata
        assert torch.equal(made["complex"].cpu(), (torch.arange(3.0) * 1j).to(torch.complex64))
    finally:
        child.join(_TIMEOUT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_non_leaf_requiring_grad_refused_like_cpu():
    from multiprocessing.reduction import ForkingPickler

    for dev in ("cpu", TPU):
        x = torch.ones(2, device=dev, requires_grad=True) * 2
        with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
            ForkingPickler.dumps(x)


class _TpuDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2, 3), float(i), device="tpu").t(), "y": torch.tensor(i, device="tpu")}


def test_dataloader_worker_returns_tpu_tensors():
    loader = torch.utils.data.DataLoader(
        _TpuDataset(), batch_size=2, num_workers=1, multiprocessing_context="spawn", timeout=_TIMEOUT
    )
    batches = list(loader)
    assert len(batches) == 2
    for k, batch in enumerate(batches):
        assert batch["x"].device.type == "tpu" and batch["x"].shape == (2, 3, 2)
        want = torch.stack([torch.full((2, 3), float(2 * k + j)).t() for j in range(2)])
        assert torch.equal(batch["x"].cpu(), want)
        assert torch.equal(batch["y"].cpu(), torch.tensor([2 * k, 2 * k + 1]))


# -- storages built directly, forked children, dtype views under torch.compile ---------------
def test_untyped_storage_constructor_on_tpu() -> None:
    """``torch.UntypedStorage(n, device="tpu")`` needs a C++ allocator a Python backend
    cannot register; it crashed the process. It builds a zeroed tpu storage now."""
    s = torch.UntypedStorage(8, device=TPU)
    assert s.device.type == "tpu" and s.size() == 8 and s.cpu().tolist() == [0] * 8
    assert torch.UntypedStorage([1, 2, 3], device=TPU).cpu().tolist() == [1, 2, 3]
    x = torch.empty(0, device=TPU).set_(torch.UntypedStorage(16, device=TPU), 0, (4,), (1,))
    assert torch.equal(x.add(1).cpu(), torch.ones(4))


def test_storage_tpu_method_moves_a_storage_as_storage_cuda_does() -> None:
    """``storage.cuda()`` has a tpu twin: ``untyped_storage().tpu()`` and ``TypedStorage.tpu()``
    (they did not exist), with ``is_tpu``; a tpu storage returns itself."""
    host = torch.arange(4.0).untyped_storage()
    moved = host.tpu()
    assert moved.is_tpu and not host.is_tpu and moved.device.type == "tpu" and moved.size() == host.size()
    assert bytes(moved.cpu()) == bytes(host)
    assert moved.tpu() is moved
    typed = torch.arange(3, dtype=torch.int16).storage().tpu()
    assert typed.is_tpu and typed.dtype == torch.int16 and typed.tolist() == [0, 1, 2]


_FORKED_CHILD = """
import torch, torchtpu
from torch.utils.data import DataLoader, Dataset

class DS(Dataset):
    def __len__(self): return 2
    def __getitem__(self, i): return torch.full((2,), float(i), device="tpu")

torch.ones(2, device="tpu").add(1).cpu()  # the parent has started the runtime
try:
    list(DataLoader(DS(), num_workers=1, timeout=60))  # fork: the default start method
    print("NO ERROR")
except Exception as e:
    print("RAISED", "spawn" in str(e))
print("PARENT", torch.ones(2, device="tpu").add(1).cpu().tolist())
"""


def test_forked_child_raises_instead_of_hanging() -> None:
    """A child forked after the parent used the device cannot use it (the XLA runtime does
    not survive fork; it hung): it raises, naming the 'spawn' start method, and the parent
    carries on."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FORKED_CHILD], capture_output=True, text=True, timeout=240)
    assert "RAISED True" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "PARENT [2.0, 2.0]" in out.stdout


def test_view_dtype_of_another_element_size_under_compile() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.view(torch.uint8).float().sum(-1), x.view(torch.complex64)

    x = torch.randn(3, 4)
    expected = f(x)
    got = torch.compile(f, backend="tpu")(x.to(TPU))
    for e, g in zip(expected, got):
        assert torch.equal(g.cpu(), e)
