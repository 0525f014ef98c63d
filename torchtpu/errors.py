"""Exception types; every message says what failed and what to do."""

from __future__ import annotations


class TpuError(RuntimeError):
    """Base class of torchtpu runtime errors."""


class TpuRuntimeError(TpuError):
    """XLA failed to compile or run a program."""


class TpuPlatformError(TpuError):
    """The requested PjRT platform could not be started."""


def not_implemented(op_name: str, detail: str = "") -> NotImplementedError:
    extra = f" ({detail})" if detail else ""
    return NotImplementedError(
        f"torchtpu: operator '{op_name}' is not implemented for the tpu device{extra}. "
        "To get by, set TORCHTPU_CPU_FALLBACK=1 to run it on the host (slow: the inputs are "
        "copied to the CPU and back), or move the tensors to the CPU for this op with .cpu(); "
        "please report the op so it can be lowered."
    )
