"""Exception types; every message says what failed and what to do."""

from __future__ import annotations

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
    """A device index other than 0: each process drives exactly one device."""
    return RuntimeError(
        f"torchtpu: device index {index} is not available: each process drives exactly one device, tpu:0. "
        "To use several devices, run one process per device (torchrun --nproc-per-node=N) and use 'tpu' "
        "(or 'tpu:0') in each."
    )
