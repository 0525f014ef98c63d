"""``torch.tpu``: the device module, mirroring ``torch.cuda``.

One device per process (``tpu:0``), as on the reference system; multi-device work runs
one process per device under torchrun.
"""

from __future__ import annotations

import types
from collections import OrderedDict, namedtuple
from typing import Any

import torch

from ..errors import check_device_index
from ..runner.precision import Precision, get_precision, precision  # noqa: F401 - torch.tpu.precision
from ..runtime import memory as _memory
from ..runtime import pjrt as _pjrt
from ..runtime import platforms as _platforms
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: F401 - torch.tpu API

_DeviceProperties = namedtuple("_DeviceProperties", ["name", "platform", "type", "total_memory", "supports_float64"])


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"expected a tpu device, got {d}")
        idx = 0 if d.index is None else d.index
    check_device_index(idx)  # tpu:0, or tpu:LOCAL_RANK under torchrun: the same device
    return 0


def is_available() -> bool:
    """True when a platform to run on is found (always the embedded cpu one, unless
    TORCHTPU_PLATFORM names one that is missing). Like ``torch.cuda.is_available()``, it
    does not start the device: under the xla collectives transport the client must first
    be created by ``init_process_group``, and ``if torch.tpu.is_available():`` before it
    is the usual pattern."""
    if _pjrt.started():
        return True
    try:
        _platforms.choose()
    except Exception:  # noqa: BLE001 - a bad TORCHTPU_PLATFORM means "not available"
        return False
    return True


def is_initialized() -> bool:
    return _pjrt.started()


def init() -> None:
    _pjrt.get()


def __getattr__(name: str) -> Any:
    # ``torch.cuda._initialized`` is a flag PyTorch reads through the device module:
    # torch.utils.checkpoint stashes and restores the device's RNG state only when it is
    # true, so without it every checkpointed dropout redraws its mask in the backward.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device: Any) -> None:
    """Select the device. Each process drives one device, tpu:0; under torchrun the
    common ``torch.tpu.set_device(LOCAL_RANK)`` (what DeviceMesh does) selects it too."""
    import os

    local_rank = os.environ.get("LOCAL_RANK")
    idx = device if isinstance(device, int) or device is None else torch.device(device).index
    if local_rank is not None and idx is not None and idx == int(local_rank):
        return
    _index(device)


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager selecting the device (only tpu:0 exists in a process)."""

    def __init__(self, device: Any):
        self.idx = _index(device) if device is not None else None

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


class device_of(device):  # noqa: N801 - mirrors torch.cuda.device_of
    """Context manager selecting the device of tensor ``obj`` (tpu:0); a CPU tensor leaves
    the current device as it is."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """What an implicit host sync does (``.item()``, ``.cpu()``, printing, ``.tolist()``, an
    op whose result shape depends on values): 0 / "default" nothing, 1 / "warn" warn, 2 /
    "error" raise, naming the cause and the line, as ``torch.cuda.set_sync_debug_mode``
    does. ``torch.tpu.synchronize()`` is never reported."""
    from ..eager import minimal

    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError('invalid value of debug_mode, expected one of "default", "warn", "error"')
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    minimal.sync_debug_mode = min(max(int(debug_mode), 0), 2)


def get_sync_debug_mode() -> int:
    """The mode set by :func:`set_sync_debug_mode` (0, 1 or 2)."""
    from ..eager import minimal

    return minimal.sync_debug_mode


def synchronize(device: Any = None) -> None:
    """Wait until every computation enqueued on the device has finished."""
    if device is not None:
        _index(device)
    _synchronize_all()


def _synchronize_all() -> None:
    # eager/ sits above this module: bound on first use, then called directly (an import
    # statement per call cost a microsecond of a ~4 us synchronize)
    global _synchronize_all
    from ..eager.dispatch import synchronize as _synchronize_all

    _synchronize_all()


def get_device_name(device: Any = None) -> str:
    _index(device)
    return _pjrt.get().device_name()


def get_device_properties(device: Any = None) -> _DeviceProperties:
    _index(device)
    rt = _pjrt.get()
    return _DeviceProperties(rt.device_name(), rt.platform, "tpu", rt.memory_info().total, rt.supports_f64)


def get_device_capability(device: Any = None) -> tuple[int, int]:
    _index(device)
    return (0, 0)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    from ..runtime import pjrt

    return pjrt.in_bad_fork()


# -- random ---------------------------------------------------------------------------------
def manual_seed(seed: int) -> None:
    from ..eager import rng

    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    import random

    manual_seed(random.getrandbits(63))


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    from ..eager import rng

    return rng.initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    from ..eager import rng

    _index(device)
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    from ..eager import rng

    _index(device)
    rng.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    set_rng_state(new_states[0])


# -- memory ---------------------------------------------------------------------------------
# ``except torch.tpu.OutOfMemoryError`` as CUDA code writes ``except torch.cuda.OutOfMemoryError``
# (PyTorch's torch.OutOfMemoryError, which the device's out-of-memory error is)
OutOfMemoryError = torch.OutOfMemoryError  # runtime/pjrt.py raises errors.TpuOutOfMemoryError, a subclass
def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tpu storages."""
    _index(device)
    return _memory.current()


def max_memory_allocated(device: Any = None) -> int:
    _index(device)
    return _memory.peak()


def reset_peak_memory_stats(device: Any = None) -> None:
    _index(device)
    _memory.reset_peak()


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def memory_reserved(device: Any = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the counts of allocations and frees (``allocation.all.allocated``/``freed``)."""
    _index(device)
    _memory.reset_accumulated()


def memory_stats(device: Any = None) -> OrderedDict[str, int]:
    """CUDA's statistics where the tpu device has them, sorted by name as CUDA's are.
    Device buffers are allocated one per storage and freed with it, so reserved and active
    memory are the allocated memory."""
    _index(device)
    s = _memory.snapshot()
    stats = {
        "allocation.all.allocated": s["num_allocs"],
        "allocation.all.freed": s["num_frees"],
        "allocation.all.current": s["num_live"],
    }
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{name}.all.current"] = s["allocated_bytes"]
        stats[f"{name}.all.peak"] = s["peak_bytes"]
    return OrderedDict(sorted(stats.items()))


_memory_fraction = [1.0]  # set_per_process_memory_fraction's, for get_per_process_memory_fraction


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap the memory this process's tensors may hold at ``fraction`` of the device's total
    (``mem_get_info()[1]``), as ``torch.cuda.set_per_process_memory_fraction``: an op (eager
    or DeferAndFuse), a copy to tpu or a factory whose new tensors would pass it raises
    ``torch.OutOfMemoryError`` (``TpuOutOfMemoryError``) before anything happens, and the
    process goes on. A compiled graph's results are counted in ``memory_allocated`` but
    not refused. 1.0 lifts the cap."""
    _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    total = mem_get_info()[1]
    limit = int(fraction * total)
    _memory_fraction[0] = fraction

    def over_limit(nbytes: int) -> None:
        from ..errors import TpuOutOfMemoryError

        raise TpuOutOfMemoryError(
            f"torchtpu: tpu out of memory. Tried to allocate {_mib(nbytes)}; this process's tensors hold "
            f"{_mib(_memory.current())} and torch.tpu.set_per_process_memory_fraction({fraction}) allows "
            f"{_mib(limit)} of the device's {_mib(total)}. Free the tensors you no longer need (del, "
            "optimizer.zero_grad(set_to_none=True)), use a smaller batch, or raise the fraction."
        )

    _memory.set_limit(None if fraction == 1.0 else limit, over_limit)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by :func:`set_per_process_memory_fraction` (1.0 by default)."""
    _index(device)
    return _memory_fraction[0]


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device, as ``torch.cuda.mem_get_info`` (on the cpu
    platform, the host's available and physical memory)."""
    _index(device)
    return tuple(_pjrt.get().memory_info())  # type: ignore[return-value]


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A short table of the memory statistics (CUDA's lists its allocator's pools too)."""
    stats = memory_stats(device)
    free, total = mem_get_info(device)
    rows = {
        "Allocated memory": _mib(stats["allocated_bytes.all.current"]),
        "Peak allocated memory": _mib(stats["allocated_bytes.all.peak"]),
        "Live device buffers": str(stats["allocation.all.current"]),
        "Device memory free": _mib(free),
        "Device memory total": _mib(total),
    }
    return "".join(f"{name:<24}{value:>16}\n" for name, value in rows.items())


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def empty_cache() -> None:
    """Nothing to release: device buffers are freed when their last tensor dies."""


def _resize_storage(storage: Any, nbytes: int) -> int:
    """The C++ hooks' storage resize (``untyped_storage().resize_``) asks here."""
    from ..eager import minimal

    return minimal.resize_storage(storage, nbytes)


def make_module() -> types.ModuleType:
    """The object installed as ``torch.tpu``."""
    import sys

    return sys.modules[__name__]
