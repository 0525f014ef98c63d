"""The device RNG state: (seed, counter), kept on the host.

Each random op gets ``[seed, counter]`` as a u64[2] operand and derives its bits with
``stablehlo.rng_bit_generator`` (Philox) from it; the counter then moves on. The same
seed therefore gives the same sequence of random ops, and the state never enters a
cache key.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

STATE_KEY = "rng"
_lock = threading.Lock()
_seed = 67280421310721  # PyTorch's default CPU seed
_counter = 0


def manual_seed(seed: int) -> None:
    global _seed, _counter
    with _lock:
        _seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        _counter = 0


def initial_seed() -> int:
    return _seed


def next_state_buffer() -> object:
    return reserve_state_buffer(1)


def reserve_state_buffer(n: int) -> object:
    """Reserve ``n`` consecutive states (a compiled graph's random ops, in order: the
    states eager execution of the same ops would use); the buffer holds the first."""
    global _counter
    from ..runtime import pjrt

    with _lock:
        state = np.array([_seed, _counter], dtype=np.uint64)
        _counter += n
    return pjrt.get().put(state)


def get_state() -> torch.Tensor:
    return torch.from_numpy(np.array([_seed, _counter], dtype=np.uint64).view(np.uint8).copy())


def set_state(state: torch.Tensor) -> None:
    global _seed, _counter
    arr = state.detach().cpu().contiguous().numpy().view(np.uint64)
    if arr.size != 2:
        raise ValueError(f"torch.tpu.set_rng_state expects the 16-byte tensor get_rng_state returns, got {state.numel()} bytes")
    with _lock:
        _seed, _counter = int(arr[0]), int(arr[1])


def check_generator(generator: torch.Generator | None) -> None:
    """A random op on tpu given ``generator=``: CUDA's error for a generator of another
    device. Every generator is one (tpu has none of its own: ``torch.Generator("tpu")``
    needs C++ hooks), and drawing from the device state instead would silently ignore it."""
    if generator is None:
        return
    raise RuntimeError(
        f"Expected a 'tpu' device type for generator but found '{generator.device.type}'. torchtpu draws every "
        "random op from the device's own state: seed it with torch.manual_seed (or torch.tpu.manual_seed), "
        "save and restore it with torch.tpu.get_rng_state/set_rng_state, or draw on the generator's device "
        "and move the result with .to('tpu')"
    )
