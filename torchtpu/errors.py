"""Exception types; every message says what failed and what to do."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


class TpuError(RuntimeError):
    """Base class of torchtpu runtime errors."""


class TpuRuntimeError(TpuError):
    """XLA failed to compile or run a program."""


class TpuOutOfMemoryError(TpuRuntimeError, torch.OutOfMemoryError):
    """The device ran out of memory (PjRT's RESOURCE_EXHAUSTED): caught by ``except
    torch.OutOfMemoryError`` and ``except torch.tpu.OutOfMemoryError``, as CUDA's is by
    their CUDA spellings (batch-size finders retry on it)."""


class TpuPlatformError(TpuError):
    """The requested PjRT platform could not be started."""


class CheckMessage(str):
    """The message of a device-side check (``L.check``): the text the CPU gives for the
    same input, the exception type it raises, and how many ``{}`` fields of the text the
    device fills in (the values it read at the first failing element)."""

    exc: type[Exception]
    n_values: int

    def __new__(cls, text: str, exc: type[Exception] = RuntimeError, n_values: int = 0) -> CheckMessage:
        self = super().__new__(cls, text)
        self.exc, self.n_values = exc, n_values
        return self

    def render(self, values: Sequence[int]) -> str:
        """The text with the device's values in its fields."""
        return self.format(*values) if self.n_values else str(self)


def not_implemented(op_name: str, detail: str = "") -> NotImplementedError:
    extra = f" ({detail})" if detail else ""
    return NotImplementedError(
        f"torchtpu: operator '{op_name}' is not implemented for the tpu device{extra}. "
        "To get by, set TORCHTPU_CPU_FALLBACK=1 to run it on the host (slow: the inputs are "
        "copied to the CPU and back), or move the tensors to the CPU for this op with .cpu(); "
        "please report the op so it can be lowered."
    )


def one_device_error(index: object) -> RuntimeError:
    """A device index that names no device of this process's: each drives exactly one."""
    return RuntimeError(
        f"torchtpu: device index {index} is not available: each process drives exactly one device, tpu:0 "
        "(also named tpu:LOCAL_RANK in a process torchrun started). To use several devices, run one process "
        "per device (torchrun --nproc-per-node=N) and use 'tpu' (or 'tpu:0', or 'tpu:LOCAL_RANK') in each."
    )


def names_this_process_device(index: int | None) -> bool:
    """Whether device index ``index`` names the process's device: tpu:0, or, in a process
    torchrun started, tpu:LOCAL_RANK, so the CUDA recipe (``torch.cuda.set_device(local_rank)``,
    ``device=f"cuda:{local_rank}"``, ``DDP(model, device_ids=[local_rank])``) runs unchanged
    with "tpu". Tensors report tpu:0 either way."""
    if index is None or index == 0:
        return True
    local_rank = os.environ.get("LOCAL_RANK")
    return local_rank is not None and local_rank.strip().isdigit() and index == int(local_rank)


def check_device_index(index: int | None) -> None:
    """Raise :func:`one_device_error` unless ``index`` names the process's device."""
    if not names_this_process_device(index):
        raise one_device_error(index)


