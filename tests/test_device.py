"""torch.tpu mirrors torch.cuda; torch.accelerator agrees."""

import gc
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu import _registration


def test_device_module_basics():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    torch.tpu.set_device("tpu:0")
    assert "cpu" in torch.tpu.get_device_name()
    props = torch.tpu.get_device_properties()
    assert props.platform == torchtpu.platform() == "cpu"
    assert torch.tpu.is_bf16_supported()
    with torch.tpu.device(0):
        assert torch.ones(1, device="tpu").device == torch.device("tpu", 0)


def test_one_device_per_process_errors():
    with pytest.raises(RuntimeError, match="one device, tpu:0"):
        torch.tpu.set_device(1)
    with pytest.raises(RuntimeError, match="torchrun"):
        torch.empty(2, device="tpu:1")


ONE_DEVICE = r"device index 1\b.*exactly one device, tpu:0"  # torchtpu.errors' or the device guard's words


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_every_factory_refuses_another_device_index_as_cuda_refuses_an_ordinal(mode):
    """device="tpu:1" made the tensor on tpu:0, silently, in every factory lowered directly
    (randn, arange, full...) once the op kernels were registered, and under a
    ``torch.device("tpu:1")`` context; only the empty-based ones and set_device refused.
    CUDA raises "invalid device ordinal"."""
    torch.ones(1, device="tpu")  # the op kernels are registered: the path that ran on tpu:0
    factories = {
        "randn": lambda: torch.randn(2, device="tpu:1"),
        "arange": lambda: torch.arange(3, device="tpu:1"),
        "full": lambda: torch.full((2,), 1.0, device="tpu:1"),
        "zeros": lambda: torch.zeros(2, device="tpu:1"),
        "tensor": lambda: torch.tensor([1.0], device="tpu:1"),
        "linspace": lambda: torch.linspace(0, 1, 4, device="tpu:1"),
        "eye": lambda: torch.eye(2, device="tpu:1"),
        "module": lambda: torch.nn.Linear(2, 2, device="tpu:1"),
        "ones_like": lambda: torch.ones_like(torch.ones(2), device="tpu:1"),
    }
    with torchtpu.eager_mode(mode):
        for name, make in factories.items():
            with pytest.raises(RuntimeError, match=ONE_DEVICE):
                make()
                pytest.fail(name)
        with pytest.raises(RuntimeError, match=ONE_DEVICE):
            with torch.device("tpu:1"):
                torch.zeros(2)


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_sync_debug_mode_reports_host_syncs_as_cudas_does(mode):
    """torch.tpu.set_sync_debug_mode: "warn" warns and "error" raises at each implicit host
    sync (naming the cause and the user's line), as torch.cuda's does; synchronize() and
    the default mode say nothing."""
    x = torch.arange(6.0, device="tpu")
    syncs = {r"\.item\(\)": lambda: x.sum().item(), r"\.cpu\(\) / print": lambda: x.cpu(), "aten::nonzero": lambda: x.nonzero()}
    assert torch.tpu.get_sync_debug_mode() == 0
    try:
        with torchtpu.eager_mode(mode):
            torch.tpu.set_sync_debug_mode("warn")
            assert torch.tpu.get_sync_debug_mode() == 1
            for cause, sync in syncs.items():
                with pytest.warns(UserWarning, match=rf"called a synchronizing tpu operation \({cause}.*test_device.py"):
                    sync()
            torch.tpu.set_sync_debug_mode(2)
            for cause, sync in syncs.items():
                with pytest.raises(RuntimeError, match=rf"synchronizing tpu operation \({cause}.*set_sync_debug_mode\(0\)"):
                    sync()
            y = x * 2
            torch.tpu.synchronize()  # explicit: never reported
            torch.tpu.set_sync_debug_mode("default")
            assert y.sum().item() == 30.0
            with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
                torch.tpu.set_sync_debug_mode("loud")
    finally:
        torch.tpu.set_sync_debug_mode(0)


def test_device_of_is_cudas():
    with torch.tpu.device_of(torch.ones(1, device="tpu")):
        assert torch.ones(1, device="tpu").device == torch.device("tpu", 0)
    with torch.tpu.device_of(torch.ones(1)):  # a CPU tensor: the current device stays
        assert torch.tpu.current_device() == 0


def test_under_torchrun_tpu_local_rank_names_the_process_device(monkeypatch):
    """The CUDA recipe names each rank's device by LOCAL_RANK (set_device(local_rank),
    device=f"cuda:{local_rank}", a generator there); on tpu that index names the process's one
    device, and tensors report tpu:0. Other indices are still refused."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    torch.tpu.set_device(1)
    device = torch.device("tpu", 1)
    made = [
        torch.randn(2, device=device),
        torch.zeros(2, device=device),
        torch.ones(2).to(device),
        torch.nn.Linear(2, 2).to(device).weight,
        torch.rand(2, device=device, generator=torch.Generator(device=device).manual_seed(0)),
    ]
    with torch.tpu.device(1), torch.device(device):
        made.append(torch.arange(3))
    assert [t.device for t in made] == [torch.device("tpu", 0)] * len(made)
    assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match=r"device index 2\b.*exactly one device, tpu:0"):
        torch.zeros(1, device="tpu:2")
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(RuntimeError, match=ONE_DEVICE):
        torch.zeros(1, device="tpu:1")


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_per_process_memory_fraction_caps_what_tensors_hold(mode):
    """torch.tpu.set_per_process_memory_fraction, as CUDA's: an op, a factory (torch.empty
    too, whose buffer comes at its first write) or a copy to tpu whose result would pass the
    cap raises torch.OutOfMemoryError before anything happens; the process, and a pending
    DeferAndFuse graph, go on; 1.0 lifts the cap. It did not exist."""
    gc.collect()  # storages of earlier tests die now, not inside the measured window
    total = torch.tpu.mem_get_info()[1]
    base = torch.tpu.memory_allocated()
    mib = 2**20
    try:
        torch.tpu.set_per_process_memory_fraction((base + 20 * mib) / total)  # room for 20 MiB more
        assert torch.tpu.get_per_process_memory_fraction() == (base + 20 * mib) / total
        with torchtpu.eager_mode(mode):
            kept = torch.ones(mib, device="tpu")  # 4 MiB: fits
            refused = (
                lambda: torch.ones(6 * mib, device="tpu"),
                lambda: torch.empty(6 * mib, device="tpu"),
                lambda: kept.repeat(6),
                lambda: torch.full((6 * mib,), 3.7, device="tpu"),  # a device operand: the pending graph must not keep it
                lambda: torch.ones(6 * mib).to("tpu"),
            )
            for make in refused:
                with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 24.0 MiB.*set_per_process_memory_fraction"):
                    make()
            assert torch.tpu.memory_allocated() == base + 4 * mib
            assert (kept * 2.5 + 1.25).sum().item() == 3.75 * mib  # the process (and a pending graph) goes on
        torch.tpu.set_per_process_memory_fraction(1.0)
        assert torch.ones(4 * mib, device="tpu").sum().item() == 4 * mib
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        torch.tpu.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError, match="must be `float`"):
        torch.tpu.set_per_process_memory_fraction(1)


def test_accelerator_agrees():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() == 1
    x = torch.ones(3, device="tpu") * 2
    torch.accelerator.synchronize()
    assert x.sum().item() == 6


def test_the_device_guard_answers_for_tpu_0():
    """What the device guard tells PyTorch (the C++ one of csrc/hooks.cpp where built, the
    Python one otherwise): one device, tpu:0, its default stream, and a backward whose
    engine asks it for every node. (Events: test_generic_events_and_streams_are_the_devices.)"""
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_stream().device == torch.device("tpu", 0)
    with torch.device("tpu"):
        w = torch.ones(3, requires_grad=True)
    assert w.device == torch.device("tpu", 0)
    (w * torch.arange(3.0, device="tpu")).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.arange(3.0))


def test_tensor_methods_generated():
    x = torch.ones(2).tpu()
    assert x.is_tpu and x.device.type == "tpu"
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.is_tpu


def test_manual_seed_and_rng_state_roundtrip():
    torch.manual_seed(123)
    assert torch.tpu.initial_seed() == 123
    state = torch.tpu.get_rng_state()
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.rand(5, device="tpu").cpu()
    torch.testing.assert_close(a, b)
    c = torch.rand(5, device="tpu").cpu()
    assert not torch.equal(b, c)
    torch.manual_seed(123)
    torch.testing.assert_close(torch.rand(5, device="tpu").cpu(), a)
    assert torch.tpu.get_rng_state_all()[0].dtype == torch.uint8


def test_memory_stats_track_live_storages():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    x = torch.ones(1024, 256, device="tpu")  # 1 MiB
    assert torch.tpu.memory_allocated() - base == 1024 * 256 * 4
    y = x * 2
    assert torch.tpu.memory_allocated() - base == 2 * 1024 * 256 * 4
    del x, y
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() - base == 2 * 1024 * 256 * 4
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocated_bytes.all.peak"] >= base + 2 * 1024 * 256 * 4
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


@pytest.mark.skipif(not _registration.NATIVE_HOOKS, reason="torch.accelerator reads the allocator entry of csrc/hooks.cpp")
def test_accelerator_memory_functions_read_the_device():
    """torch.accelerator's memory functions (PyTorch's device-generic API) gave an internal
    assert ("Allocator for tpu is not a DeviceAllocator") and PyTorch's C++ storage
    constructor for a tpu storage crashed the process."""
    torch.tpu.synchronize()
    base = torch.accelerator.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.reset_accumulated_memory_stats()
    x = torch.ones(1024, 256, device="tpu")
    y = x * 2
    assert torch.accelerator.memory_allocated() - base == 2 * 2**20 == torch.tpu.memory_allocated() - base
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.allocated"] == 2 and stats["allocation.all.freed"] == 0
    assert stats["allocation.all.current"] == torch.tpu.memory_stats()["allocation.all.current"]
    del x, y
    assert torch.accelerator.memory_allocated() == base
    assert torch.accelerator.max_memory_allocated() - base == 2 * 2**20
    assert torch.accelerator.memory_stats()["allocation.all.freed"] == 2
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base
    torch.accelerator.empty_cache()
    free, total = torch.accelerator.get_memory_info()
    assert (free, total) == pytest.approx(torch.tpu.mem_get_info(), rel=0.05) and 0 < free <= total
    assert total == torch.tpu.get_device_properties().total_memory
    assert "Allocated memory" in torch.tpu.memory_summary()
    with pytest.raises(RuntimeError, match="not allocated through PyTorch's allocator"):
        torch._C.StorageBase.__new__(torch.UntypedStorage, 8, device="tpu")


def test_synchronize_waits_for_results():
    x = torch.randn(256, 256, device="tpu")
    y = x @ x
    torch.tpu.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)


def test_a_factory_op_can_be_the_first_tpu_op():
    """Op kernels are registered on first device use; a factory op with no tensor input
    reaches the dispatcher's fallback before that and must still run."""
    import subprocess
    import sys

    code = "import torch, torchtpu; print(torch.tril_indices(3, 3, device='tpu').cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(torch.tril_indices(3, 3).tolist())


def test_is_available_does_not_start_the_device():
    """As torch.cuda.is_available(): asking must not create the client, which under the xla
    collectives transport only init_process_group may create."""
    code = (
        "import torch; from torchtpu.runtime import pjrt; "
        "assert torch.tpu.is_available() and torch.accelerator.is_available(); "
        "assert not pjrt.started(), 'is_available() started the device'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def _generic_event(enable_timing: bool = False) -> torch.Event:
    if not _registration.NATIVE_HOOKS:
        pytest.skip("torch.Event reaches the device through the C++ device guard (csrc/hooks.cpp), not built here")
    return torch.Event(device="tpu", enable_timing=enable_timing)


# torch.tpu.Event (torch.cuda.Event's API) and PyTorch's device-generic torch.Event, which
# asks the device guard: both mark, query, wait for and time the device's work alike
EVENTS = {"torch.tpu.Event": torch.tpu.Event, "torch.Event": _generic_event}


def test_streams_and_events_as_cuda_code_uses_them():
    """CUDA-style code runs unchanged: a side stream, an event marking work, waiting on it."""
    s = torch.tpu.Stream()
    assert torch.tpu.current_stream() == s == torch.tpu.default_stream()  # one in-order queue
    x = torch.randn(256, 256, device="tpu")
    with torch.tpu.stream(s):
        y = x @ x
    done = torch.tpu.Event()
    assert done.query()  # not recorded: nothing to wait for
    done.record()
    torch.tpu.current_stream().wait_event(done)
    done.synchronize()
    assert done.query()
    assert s.record_event().query() is not None
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1.3e-6 * 256, atol=1e-4)


def _pending_work() -> torch.Tensor:
    """About a second of device work, enqueued: not finished when the call returns."""
    x = torch.randn(1024, 1024, device="tpu") / 32
    (x @ x).sum().item()  # compiled and warm
    y = x
    for _ in range(25):
        y = y @ x
    return y


def _finished(t: torch.Tensor) -> bool:
    from torchtpu.runtime import pjrt

    return pjrt.Runtime.is_ready(t.untyped_storage()._cell.buf)


@pytest.mark.parametrize("kind", EVENTS)
def test_an_event_marks_the_work_enqueued_before_it(kind: str):
    """``query()`` is False while the work before the mark runs and True once it is done;
    ``synchronize()`` waits for exactly that (torch.Event used to answer True at once and
    to refuse synchronize())."""
    e = EVENTS[kind]()
    assert e.query()  # not recorded: nothing to wait for
    y = _pending_work()
    e.record()
    assert not e.query() and not _finished(y)
    e.synchronize()
    assert e.query() and _finished(y)


@pytest.mark.parametrize("kind", EVENTS)
def test_an_event_waits_for_work_whose_results_were_dropped(kind: str, monkeypatch: pytest.MonkeyPatch):
    """``model(x)`` in a timing loop drops its results at once: the event recorded after it
    still waits for that work (through the execution's runtime token), so a timing event
    measures it and ``synchronize()`` returns after it."""
    from torchtpu.runner import program
    from torchtpu.runtime import pjrt

    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    x @ x  # dropped at once
    (dropped,) = [e.done for e in program._pending if all(r() is None for r in e.results)]
    waited: list = []
    wait = pjrt.Runtime.wait
    monkeypatch.setattr(pjrt.Runtime, "wait", lambda self, done: (waited.extend(done), wait(self, done))[1])
    e = EVENTS[kind]()
    e.record()
    e.synchronize()
    assert any(d is dropped for d in waited) and e.query()


def test_generic_streams_are_the_devices_queue():
    """``torch.Stream(device="tpu")`` is the device's one in-order queue: it records events
    on it, and ``query``/``synchronize`` see the work enqueued so far."""
    _generic_event()  # skips without the C++ guard
    s = torch.Stream(device="tpu")
    assert s.device == torch.device("tpu", 0) and s == torch.accelerator.current_stream()
    y = _pending_work()
    assert not s.query()
    s.synchronize()
    assert s.query() and _finished(y)
    e = s.record_event()
    e.wait(s)
    e.synchronize()
    assert e.query()


@pytest.mark.parametrize("kind", EVENTS)
def test_event_marks_deferred_work(kind: str):
    """Under DeferAndFuse the pending graph runs at record(), so the mark covers it."""
    x = torch.ones(8, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = (x * 3).sum()
        e = EVENTS[kind]()
        e.record()
    e.synchronize()
    assert e.query() and y.item() == 24.0


@pytest.mark.parametrize("kind", EVENTS)
def test_event_timing_measures_the_work_between_records(kind: str):
    """``start.elapsed_time(end)`` in milliseconds: more work between the marks takes longer."""
    x = torch.randn(512, 512, device="tpu")
    (x @ x).sum().item()  # compiled and warm

    def timed(n: int) -> float:
        start, end = EVENTS[kind](enable_timing=True), EVENTS[kind](enable_timing=True)
        start.record()
        y = x
        for _ in range(n):
            y = y @ x
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    one, many = min(timed(1) for _ in range(3)), min(timed(40) for _ in range(3))
    assert 0 < one < many


# torch.cuda.Event's errors are RuntimeErrors; PyTorch's generic torch.Event checks the
# same two things itself, before asking the device, and raises ValueError on every device
TIMING_ERRORS = {"torch.tpu.Event": RuntimeError, "torch.Event": ValueError}


@pytest.mark.parametrize("kind", EVENTS)
def test_event_timing_errors_like_cuda(kind: str):
    start, end = EVENTS[kind](enable_timing=True), EVENTS[kind](enable_timing=True)
    start.record()
    with pytest.raises(TIMING_ERRORS[kind], match="Both events must be recorded"):
        start.elapsed_time(end)
    plain = EVENTS[kind]()
    plain.record()
    with pytest.raises(TIMING_ERRORS[kind], match="enable_timing=True"):
        start.elapsed_time(plain)


def test_cuda_style_amp_spellings():
    """Code ported from CUDA by renaming the device: ``torch.tpu.amp.autocast()``,
    ``GradScaler()``, ``custom_fwd``/``custom_bwd`` (deprecated aliases, as CUDA's are)."""
    a = torch.ones(2, 2, device="tpu")
    with pytest.warns(FutureWarning, match=r"torch\.amp\.autocast\('tpu'"):
        with torch.tpu.amp.autocast():
            assert (a @ a).dtype == torch.bfloat16
    with pytest.warns(FutureWarning):
        with torch.tpu.amp.autocast(dtype=torch.float16):
            assert (a @ a).dtype == torch.float16
    with pytest.warns(FutureWarning, match=r"torch\.amp\.GradScaler\('tpu'"):
        scaler = torch.tpu.amp.GradScaler(init_scale=8.0)
    assert scaler.scale(torch.ones(1, device="tpu")).item() == 8.0

    class Double(torch.autograd.Function):
        @staticmethod
        @torch.tpu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @torch.tpu.amp.custom_bwd
        def backward(ctx, g):
            return g * 2

    with torch.autocast("tpu"):
        assert Double.apply(torch.ones(2, device="tpu", dtype=torch.bfloat16)).dtype == torch.float32


def test_tpu_streams_are_torch_streams():
    """``t.record_stream(torch.tpu.current_stream())`` (CUDA code that hands tensors between
    streams) raised "unknown parameter type"; with a generic torch.Stream the op had no tpu
    kernel."""
    t = torch.ones(2, device="tpu")
    for stream in (torch.tpu.current_stream(), torch.tpu.Stream(), torch.Stream("tpu"), torch.accelerator.current_stream()):
        assert isinstance(stream, torch.Stream) and stream.device == torch.device("tpu", 0)
        t.record_stream(stream)
    assert torch.tpu.Stream() == torch.tpu.current_stream() == torch.accelerator.current_stream()
    assert (t * 2).cpu().tolist() == [2.0, 2.0]


def test_out_of_memory_is_torch_out_of_memory_error():
    """What a batch-size finder catches (``except torch.cuda.OutOfMemoryError`` on CUDA);
    it was a plain RuntimeError. The device keeps working afterwards."""
    with pytest.raises(torch.tpu.OutOfMemoryError, match="out of device memory .* smaller batch") as info:
        torch.ones(2**44, dtype=torch.uint8, device="tpu")[0].item()  # 16 TiB
    assert isinstance(info.value, torch.OutOfMemoryError) and isinstance(info.value, RuntimeError)
    assert torch.ones(3, device="tpu").sum().item() == 3.0
