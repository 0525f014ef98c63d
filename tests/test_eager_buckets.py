"""Bounded dynamism for eager ops (torchtpu/eager/buckets.py): data-dependent lengths
(nonzero's positions) run through a program per bucket, with the CPU's numbers, in eager
and DeferAndFuse modes."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtpu
from torchtpu import metrics
from torchtpu.eager import buckets
from torchtpu.eager.minimal import upload_bucketed

MODES = ("eager", "defer_and_fuse")
# lengths inside one bucket (512 rows) and across its boundary (1024)
LENGTHS = (0, 1, 2, 37, 200, 511, 513, 700)


def compiles() -> int:
    torch.tpu.synchronize()
    return metrics.snapshot()["compiles"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest):
    with torchtpu.eager_mode(request.param):
        yield request.param


def bucketed(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the device in a bucketed storage, as nonzero's positions are (the tests of
    ops on lengths the data decides, without routing every tensor through a nonzero)."""
    out = upload_bucketed(t)
    assert out is not None and buckets.bucket_of(out.untyped_storage()._cell) is not None
    return out


@pytest.fixture
def fresh_upload_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """No 1-d upload seen before: which lengths varied is per process (buckets.varies)."""
    monkeypatch.setattr(buckets, "_UPLOAD_LENGTHS", {})


def twin_of(t: torch.Tensor) -> torch.Tensor | None:
    return buckets._twin_view(t)


def test_user_uploads_keep_storages_of_their_own_size(fresh_upload_history: None) -> None:
    """A tensor a user moves to the device has PyTorch's storage size at any length. A
    1-d upload whose length varied before (ids of another batch: a second length in its
    dtype's bucket) also gets a bucketed twin for padded ops; one uploaded at one length
    (a bias, a fixed batch of labels) does not."""
    for n in (5, 37, 40, 37, 600):
        for t in (torch.arange(n), torch.rand(n)):
            d = t.to("tpu")
            assert d.untyped_storage().nbytes() == t.untyped_storage().nbytes()
            assert buckets.bucket_of(d.untyped_storage()._cell) is None and torch.equal(d.cpu(), t)
    assert twin_of(torch.arange(600).to("tpu")) is None  # its bucket (1024 rows) saw one length
    assert twin_of(torch.rand(7).to("tpu")) is not None  # float32 in 512 rows saw 5, 37 and 40
    ids = torch.arange(9).to("tpu")
    twin = twin_of(ids)
    assert twin is not None and twin.shape == (9,) and twin.untyped_storage().nbytes() == 512 * 8
    assert torch.equal(twin.cpu(), torch.arange(9))
    assert twin_of(torch.nn.Parameter(torch.rand(9)).to("tpu")) is None
    # a dtype view of the storage reads other elements than the twin holds: never the twin
    for n in (3, 4):
        torch.zeros(n, dtype=torch.uint8).to("tpu")
    raw = torch.tensor([0, 1, 2, 0, 5, 9], dtype=torch.uint8)
    d = raw.to("tpu")
    assert twin_of(d) is not None and twin_of(d.view(torch.bool)) is None
    assert torch.equal(d.view(torch.bool).clone().cpu(), raw.view(torch.bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_a_twin_holds_the_values_of_the_upload(dtype: torch.dtype, fresh_upload_history: None) -> None:
    """The twin is uploaded when a padded op first reads it, from a host copy taken at the
    upload: a CPU tensor the user changes in between (a reused batch buffer) does not
    reach it. Its spare rows hold zeros."""
    torch.arange(5).to(dtype).to("tpu")  # a second length in the bucket: uploads vary
    host = torch.arange(1, 12).to(dtype)
    d = host.to("tpu")
    expected = host.clone()
    host.fill_(-1)
    twin = twin_of(d)
    assert twin is not None and twin.dtype == dtype
    assert torch.equal(twin.cpu(), expected) and torch.equal(d.cpu(), expected)
    storage = twin.as_strided((512,), (1,), 0).cpu()
    assert torch.equal(storage[:11], expected) and not storage[11:].any()
    # what a bucketed graph reads (compile/dynamic.py): the same storage at its full rows, one tensor per twin
    entry = buckets.bucketed_twin(d, d.untyped_storage()._cell)
    full = entry.full_tensor()
    assert full is entry.full_tensor() and full.shape == (512,) and full.untyped_storage()._cell is twin.untyped_storage()._cell
    assert torch.equal(full.cpu(), storage)


def test_a_written_upload_drops_its_twin(mode: str, fresh_upload_history: None) -> None:
    """Ops read the twin only while the storage holds what was uploaded: after an in-place
    write (run or pending), the ids' own storage is read, with the new values."""
    for n in (3, 4):
        torch.arange(n).to("tpu")
    table = torch.rand(20, 4)
    ids = torch.tensor([1, 5, 7, 2, 2])
    t = ids.to("tpu")
    assert twin_of(t) is not None
    t.add_(3)
    assert twin_of(t) is None
    torch.testing.assert_close(F.embedding(t, table.to("tpu")).cpu(), F.embedding(ids + 3, table))
    # an op that writes an uploaded tensor writes the user's storage, not the twin
    u = torch.zeros(6).to("tpu")
    u.index_put_((torch.tensor([0, 4]).to("tpu"),), torch.tensor([1.0, 2.0]).to("tpu"))
    assert torch.equal(u.cpu(), torch.tensor([1.0, 0, 0, 0, 2.0, 0]))


def test_a_twin_leaves_the_upload_buffer_its_storage_s_alone(fresh_upload_history: None) -> None:
    """The twin remembers the uploaded buffer weakly: the storage is still its buffer's only
    holder, so an in-place write takes the buffer over (donation) instead of copying it."""
    for n in (3, 4):
        torch.arange(n).to("tpu")
    t = torch.arange(9).to("tpu")
    plain = torch.arange(600).to("tpu")  # no twin: its bucket saw one length
    assert twin_of(t) is not None and twin_of(plain) is None
    cell, plain_cell = t.untyped_storage()._cell, plain.untyped_storage()._cell
    assert sys.getrefcount(cell._buf) == sys.getrefcount(plain_cell._buf)
    t.add_(1)
    assert twin_of(t) is None and torch.equal(t.cpu(), torch.arange(1, 10))


def _check_bag_step(bag: torch.nn.EmbeddingBag, dbag: torch.nn.EmbeddingBag, got: torch.Tensor, want: torch.Tensor) -> None:
    """The tpu bag's output and weight gradient equal the CPU bag's."""
    torch.testing.assert_close(got.cpu(), want)
    bag.zero_grad()
    dbag.zero_grad()
    (want * want).sum().backward()
    (got * got).sum().backward()
    torch.testing.assert_close(dbag.weight.grad.cpu(), bag.weight.grad)


def test_embedding_bag_with_uploaded_ids_compiles_per_bucket(mode: str, fresh_upload_history: None) -> None:
    """A recommender's batches: another total of ids per step, uploaded with .to("tpu").
    The bag runs padded on the ids' twins: the CPU's numbers and gradients, and new totals
    in the bucket compile nothing."""
    torch.manual_seed(6)
    bag = torch.nn.EmbeddingBag(50, 6, mode="sum")
    dbag = torch.nn.EmbeddingBag(50, 6, mode="sum").to("tpu")
    dbag.load_state_dict(bag.state_dict())
    before = None
    for step in range(6):
        lengths = torch.randint(1, 4, (8,))
        ids = torch.randint(0, 50, (int(lengths.sum()),))
        offsets = torch.cumsum(lengths, 0) - lengths
        psw = torch.rand(len(ids))
        want = bag(ids, offsets, per_sample_weights=psw)
        got = dbag(ids.to("tpu"), offsets.to("tpu"), per_sample_weights=psw.to("tpu"))
        _check_bag_step(bag, dbag, got, want)
        if step == 2:
            before = compiles()
    assert compiles() == before


def test_bucketed_ids_read_like_ordinary_ones() -> None:
    ids = torch.tensor([3, 1, 4, 1, 5])
    t = bucketed(ids)
    assert t.shape == (5,) and t.untyped_storage().nbytes() == 512 * 8
    assert torch.equal(t.cpu(), ids) and t[2].item() == 4 and t.tolist() == ids.tolist()
    assert str(t) == "tensor([3, 1, 4, 1, 5], device='tpu:0')"
    assert torch.equal(t[1:4].cpu(), ids[1:4]) and torch.equal(t.flip(0).cpu(), ids.flip(0))
    assert buckets.bucket_of(t.untyped_storage()._cell) == buckets.Bucket(5, 512, 1)
    assert upload_bucketed(torch.arange(512)) is None  # a length that is its bucket stays ordinary


def test_nonzero_positions_are_bucketed(mode: str) -> None:
    cond = torch.rand(40, 3) > 0.5
    nz = torch.nonzero(cond.to("tpu"))
    assert nz.shape == torch.nonzero(cond).shape and nz.untyped_storage().nbytes() == 512 * 2 * 8
    assert torch.equal(nz.cpu(), torch.nonzero(cond))
    rows, cols = torch.where(cond.to("tpu"))
    want = torch.where(cond)
    assert torch.equal(rows.cpu(), want[0]) and torch.equal(cols.cpu(), want[1])
    assert repr(cols.cpu()) == repr(want[1])


def _gather_mlp(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, token: torch.Tensor, gate: torch.Tensor, slot: torch.Tensor
) -> torch.Tensor:
    """The mixture-of-experts pattern: gather rows, an MLP, weights gathered by two
    index tensors, scattered back with index_add_."""
    y = F.silu(x[token] @ w1) @ w2 * gate[token, slot, None]
    out = torch.zeros_like(x)
    out.index_add_(0, token, y)
    r = torch.linspace(-1, 1, out.numel(), device=x.device).view(out.shape)
    return (out * r).sum() + y.sum(0).sum() / 8 + (F.softmax(y, dim=0) * y).sum()


def _routing(n_tokens: int, routed: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    choice = torch.zeros(2, n_tokens, dtype=torch.bool)
    picks = torch.randperm(2 * n_tokens, generator=g)[:routed]
    choice.view(-1)[picks] = True
    return choice, torch.rand(n_tokens, 2, generator=g)


@pytest.mark.parametrize("routed", LENGTHS)
def test_routed_mlp_matches_the_cpu_with_gradients(mode: str, routed: int) -> None:
    torch.manual_seed(routed)
    n_tokens = 400
    x, w1, w2 = torch.randn(n_tokens, 8) / 2, torch.randn(8, 16) / 4, torch.randn(16, 8) / 4
    choice, gate = _routing(n_tokens, routed, routed)
    cpu = [t.clone().requires_grad_() for t in (x, w1, w2, gate)]
    dev = [t.to("tpu").requires_grad_() for t in (x, w1, w2, gate)]
    slot, token = torch.where(choice)
    want = _gather_mlp(cpu[0], cpu[1], cpu[2], token, cpu[3], slot)
    want.backward()
    dslot, dtoken = torch.where(choice.to("tpu"))
    assert dtoken.shape == (routed,)
    got = _gather_mlp(dev[0], dev[1], dev[2], dtoken, dev[3], dslot)
    got.backward()
    torch.testing.assert_close(got.cpu(), want)
    for d, c in zip(dev, cpu):
        torch.testing.assert_close(d.grad.cpu(), c.grad)


def test_routed_mlp_compiles_per_bucket_not_per_length(mode: str) -> None:
    torch.manual_seed(0)
    n_tokens = 400
    x, w1, w2 = (torch.randn(n_tokens, 8).to("tpu"), torch.randn(8, 16).to("tpu"), torch.randn(16, 8).to("tpu"))
    gate = torch.rand(n_tokens, 2).to("tpu")

    def step(routed: int) -> None:
        choice, _ = _routing(n_tokens, routed, routed)
        slot, token = torch.where(choice.to("tpu"))
        params = [t.detach().requires_grad_() for t in (x, w1, w2, gate)]
        _gather_mlp(params[0], params[1], params[2], token, params[3], slot).backward()
        torch.tpu.synchronize()

    step(100)
    step(101)
    before = compiles()
    for routed in (37, 0, 1, 2, 150, 299, 480):  # every length in the same bucket, 0-2 included
        step(routed)
    assert compiles() == before


@pytest.mark.parametrize("mode_", ["sum", "mean", "max"])
def test_embedding_bag_with_bucketed_ids_matches_the_cpu(mode: str, mode_: str) -> None:
    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(50, 6, mode=mode_)
    dbag = torch.nn.EmbeddingBag(50, 6, mode=mode_).to("tpu")
    dbag.load_state_dict(bag.state_dict())
    before = None
    for step, batch in enumerate((7, 9, 7, 9, 7)):
        lengths = torch.randint(1, 4, (batch,))
        ids = torch.randint(0, 50, (int(lengths.sum()),))
        offsets = torch.cumsum(lengths, 0) - lengths
        psw = torch.rand(len(ids)) if mode_ == "sum" else None
        want = bag(ids, offsets, per_sample_weights=psw)
        got = dbag(bucketed(ids), offsets.to("tpu"), per_sample_weights=None if psw is None else bucketed(psw))
        _check_bag_step(bag, dbag, got, want)
        if step == 2:
            before = compiles()
    assert compiles() == before  # new id totals, same bucket: nothing new


def test_in_place_ops_and_views_of_bucketed_tensors(mode: str) -> None:
    ids = torch.tensor([4, 0, 2, 2, 7, 1])
    t = bucketed(ids)
    t.add_(1)
    t[1:3].mul_(3)
    ids = ids + 1
    ids[1:3] *= 3
    assert torch.equal(t.cpu(), ids)
    v = t.view(2, 3)  # a view that folds the length: runs at exact shapes
    assert torch.equal((v * 2).sum(1).cpu(), (ids.view(2, 3) * 2).sum(1))
    assert torch.equal(t[::2].cpu(), ids[::2]) and t[-1].item() == ids[-1].item()
    f = torch.rand(6)
    ft = bucketed(f)
    ft.exp_()
    torch.testing.assert_close(ft.cpu(), f.exp())
    torch.testing.assert_close((ft * 2 + ft.sum()).cpu(), f.exp() * 2 + f.exp().sum())


def test_mixed_with_ordinary_tensors(mode: str) -> None:
    torch.manual_seed(2)
    a = torch.rand(37)
    b = torch.rand(37)
    ta = bucketed(a)
    tb = b.reshape(1, 37).to("tpu").view(37)  # an ordinary storage of the same length
    torch.testing.assert_close((ta * tb).cpu(), a * b)
    torch.testing.assert_close((ta + 1.5).mean().cpu(), (a + 1.5).mean())
    torch.testing.assert_close(torch.cumsum(ta, 0).cpu(), torch.cumsum(a, 0))
    torch.testing.assert_close(torch.cat([ta, tb]).cpu(), torch.cat([a, b]))
    torch.testing.assert_close(ta.sort().values.cpu(), a.sort().values)
    torch.testing.assert_close((ta[:, None] * torch.ones(3).to("tpu")).cpu(), a[:, None] * torch.ones(3))
    # division and pow run at exact shapes (XLA cannot compile them padded): same numbers
    torch.testing.assert_close((ta / tb).cpu(), a / b)
    torch.testing.assert_close((ta / 3).cpu(), a / 3)
    torch.testing.assert_close((ta**2).cpu(), a**2)
    torch.testing.assert_close(F.softsign(ta).cpu(), F.softsign(a))
    ti = bucketed(torch.arange(1, 38))
    assert torch.equal((ti**3).cpu(), torch.arange(1, 38) ** 3)
    idx = bucketed(torch.tensor([5, 3]))  # two bucketed lengths in one call
    torch.testing.assert_close(ta[idx].cpu(), a[[5, 3]])


def test_negative_indices_into_a_bucketed_tensor(mode: str) -> None:
    """An indexed tensor is never padded along its indexed dim: -1 is its last live row."""
    a = torch.rand(37)
    ta = bucketed(a)
    idx = torch.tensor([-1, 0, -37, 5])
    torch.testing.assert_close(ta[bucketed(idx)].cpu(), a[idx])
    torch.testing.assert_close(
        ta.index_select(0, bucketed(torch.tensor([36, 0]))).cpu(), a.index_select(0, torch.tensor([36, 0]))
    )
    x = torch.rand(5, 37)
    torch.testing.assert_close(x.to("tpu")[:, bucketed(idx)].cpu(), x[:, idx])


def test_index_put_with_bucketed_indices(mode: str) -> None:
    torch.manual_seed(3)
    for n in (5, 300):
        idx = torch.randint(0, 20, (n,))
        vals = torch.rand(n)
        for accumulate in (False, True):
            want = torch.zeros(20).index_put_((idx,), vals, accumulate=accumulate)
            # values in a bucketed storage, and of the length in an ordinary one (that
            # call runs at exact shapes)
            for values in (bucketed(vals), vals.to("tpu")):
                got = torch.zeros(20).to("tpu").index_put_((bucketed(idx),), values, accumulate=accumulate)
                if accumulate:
                    torch.testing.assert_close(got.cpu(), want)
                else:  # duplicate positions: any one of the writes, as on CUDA
                    assert torch.isin(got.cpu()[idx], vals).all()


def test_lengths_that_equal_static_sizes(mode: str) -> None:
    """A length of 1 or 2 next to static dims of that size, or of the bucket's size: the
    padded call runs only where it means the exact one on more rows (checked at two
    bucket sizes), and either way the numbers are the CPU's."""
    torch.manual_seed(4)
    one, row, wide = torch.rand(1), torch.rand(1, 8), torch.rand(512)
    t = bucketed(one)
    torch.testing.assert_close((t + wide.to("tpu")).cpu(), one + wide)  # broadcast against 512 rows
    torch.testing.assert_close((t[:, None] * row.to("tpu")).cpu(), one[:, None] * row)
    two, table = torch.rand(2, 3), torch.rand(2, 3)
    t2 = bucketed(two)
    torch.testing.assert_close((t2 * table.to("tpu")).cpu(), two * table)
    torch.testing.assert_close((t2 @ table.T.to("tpu")).cpu(), two @ table.T)
    torch.testing.assert_close(t2.sum(0).cpu(), two.sum(0))
    slots = bucketed(torch.tensor([1, 0]))
    torch.testing.assert_close(table.to("tpu")[slots, slots].cpu(), table[[1, 0], [1, 0]])


def test_index_add_of_a_source_padded_outside_dim_runs_exact(mode: str, fresh_upload_history: None) -> None:
    """An id vector uploaded at varying lengths gets a twin, so ``v[None] * w`` is padded
    along v's length: a [1, 8] result over [1, cap] rows (found with a float feature vector
    in nn.LinearCrossEntropyLoss on unbatched inputs; float uploads no longer run padded
    outside the ops that name their padded arguments). index_add_ of it along dim 0 into
    an exact [4, 8] tensor must not pad: the meta kernel does not compare source and self
    (the CPU kernel does), and the padded program failed to lower ("source tensor shape
    must match self tensor shape")."""
    for n in (5, 9):
        torch.randint(0, 9, (n,)).to("tpu")
    g = torch.Generator().manual_seed(0)
    v, w, into = (torch.randint(0, 9, shape, generator=g) for shape in ((8,), (1, 1), (4, 8)))  # w: 2-d, no twin
    on_tpu = v.to("tpu")
    src = on_tpu[None] * w.to("tpu")
    assert twin_of(on_tpu) is not None and src.stride() == (512, 1)  # src is a padded result
    got = into.to("tpu").index_add_(0, torch.tensor([2]).to("tpu"), src, alpha=-1)
    torch.testing.assert_close(got.cpu(), into.index_add(0, torch.tensor([2]), v[None] * w, alpha=-1))


def test_a_float_upload_of_varying_length_is_read_at_its_length(mode: str, fresh_upload_history: None) -> None:
    """Float 1-d uploads whose lengths vary within a bucket (OpInfo's samples: layer norm
    weights of length 2, then 1) got twins that every padding-safe op read padded: a layer
    norm's weight of length 1 went in as 512 rows against normalized_shape [1], which XLA
    refused to compile and, after other calls, gave values 123 off. Ops that do not name
    their padded arguments read float uploads at their length. (Compared with float64: at
    length 1 the weight's gradient is exactly 0, which tpu gives; the CPU's kernel 2.3e-5.)"""
    g = torch.Generator().manual_seed(0)
    for rows, n in ((1, 2), (3, 1), (0, 1)):  # an empty batch: PyTorch's meta kernels then check nothing
        x, w, b = torch.randn(rows, n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)
        xt, wt, bt = (t.to("tpu").requires_grad_() for t in (x, w, b))
        xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
        yt = torch.nn.functional.layer_norm(xt, (n,), wt, bt)
        yd = torch.nn.functional.layer_norm(xd, (n,), wd, bd)
        torch.testing.assert_close(yt.cpu(), yd.float())
        for a, d in zip(torch.autograd.grad(yt.sum() * 2, (xt, wt, bt)), torch.autograd.grad(yd.sum() * 2, (xd, wd, bd))):
            torch.testing.assert_close(a.cpu(), d.float())


def test_a_padded_calls_meta_checks_run_once_per_geometry(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a call may run padded is asked of PyTorch's meta kernels (three calls, a
    third of a DLRM step when asked every time) once per op, length, bucket and argument
    geometry: the same call again is not asked, another length is, and the answers keep
    the CPU's numbers (a length of 1 broadcasts where 37 would not)."""
    buckets._RESULT_DIMS.clear()
    asked: list[int] = []
    real = buckets._result_dims

    def counted(plan, values, dims, n, cap):  # noqa: ANN001, ANN202 - the patched function's own signature
        asked.append(n)
        return real(plan, values, dims, n, cap)

    monkeypatch.setattr(buckets, "_result_dims", counted)
    torch.manual_seed(5)
    for n in (37, 37, 1, 1):
        x = torch.rand(n)
        torch.testing.assert_close((bucketed(x) * 3).cpu(), x * 3)
    assert asked == [37, 1]


class _Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(h)))


def test_a_compiled_expert_between_eager_routing_ops() -> None:
    """torch.compile breaks the graph at torch.where, so a compiled expert runs between
    eager routing ops (what Dynamo does with a MoE layer). Its automatic-dynamic graph
    takes the bucket of the eager storage it is given (read as it is, no host padding)
    and hands back bucketed outputs, so the eager ops after it stay padded too: the
    routed counts of one bucket compile nothing new, forward and backward."""
    torch._dynamo.reset()
    torch.manual_seed(5)
    n_tokens = 400
    cpu_expert = _Expert()
    expert = _Expert().to("tpu")
    expert.load_state_dict(cpu_expert.state_dict())
    compiled = torch.compile(expert, backend="tpu")
    x, gate = torch.randn(n_tokens, 8), torch.rand(n_tokens, 2)

    def step(routed: int) -> None:
        choice, _ = _routing(n_tokens, routed, routed)
        results = []
        for dev, run in ((False, cpu_expert), (True, compiled)):
            xs, gs = (x.to("tpu"), gate.to("tpu")) if dev else (x.clone(), gate)
            xs.requires_grad_()
            slot, token = torch.where(choice.to("tpu") if dev else choice)
            y = run(xs[token]) * gs[token, slot, None]
            out = torch.zeros_like(xs).index_add_(0, token, y)
            (out * out).sum().backward()
            results.append((out.detach().cpu(), xs.grad.cpu()))
        (want, want_grad), (got, got_grad) = results
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grad, want_grad)

    try:
        for routed in (100, 101, 37):
            step(routed)
        before = compiles()
        for routed in (150, 2, 299, 480):
            step(routed)
        assert compiles() == before
    finally:
        torch._dynamo.reset()


def test_an_embedding_gradient_read_at_its_exact_length_is_not_padded_with_its_ids() -> None:
    """Uploaded ids at varying lengths get a bucketed twin, and an embedding's backward may
    run padded: its ids and its grad_output together. When the gradient reaching it has
    its exact length (here through a linear layer whose backward ran exact), padding the
    ids alone paired gradient rows with padding: the program did not compile ("number of
    output elements (3072) doesn't match expected number of elements (30)"). It runs exact."""
    torch.arange(32).to("tpu")  # 1-d int64 uploads of two lengths in one bucket: twins from now on
    g = torch.Generator().manual_seed(0)
    ids, target = torch.randint(0, 10, (5,), generator=g), torch.randint(0, 3, (5,), generator=g)

    def grads(dev: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        emb, lin = nn.Embedding(10, 6, max_norm=1.0, padding_idx=0).to(dev), nn.Linear(6, 3).to(dev)
        F.cross_entropy(lin(emb(ids.to(dev))), target.to(dev)).backward()
        return [emb.weight.grad.cpu(), lin.weight.grad.cpu(), emb.weight.detach().cpu()]

    for got, want in zip(grads("tpu"), grads("cpu")):
        torch.testing.assert_close(got, want)
