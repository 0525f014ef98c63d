"""The device RNG state: (seed, counter), kept on the host.

Each random op gets ``[seed, counter]`` as a u64[2] operand and derives its bits with
``stablehlo.rng_bit_generator`` (Philox) from it; the counter then moves on. The same
seed therefore gives the same sequence of random ops, and the state never enters a
cache key.

A ``torch.Generator(device="tpu")`` (C++ hooks, torchtpu/csrc/hooks.cpp) holds a state of
its own, ``[initial_seed(), get_offset()]``, used and moved on the same way by the ops
given ``generator=``: a generator seeded with s draws what ``torch.tpu.manual_seed(s)``
would.
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


def next_state_buffer(generator: torch.Generator | None = None) -> object:
    """The state of one random op: ``generator``'s (a tpu generator), else the device's."""
    if generator is None:
        return reserve_state_buffer(1)
    from ..runtime import pjrt

    with _lock:
        offset = generator.get_offset()
        generator.set_offset(offset + 1)
        state = np.array([generator.initial_seed(), offset], dtype=np.uint64)
    return pjrt.get().put(state)


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


def device_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """The ``generator=`` of a random op on tpu: a tpu generator, or None for the device's
    own state. A generator of another device raises CUDA's error (drawing from the device
    state instead would silently ignore it)."""
    if generator is None or generator.device.type == "tpu":
        return generator
    raise RuntimeError(
        f"Expected a 'tpu' device type for generator but found '{generator.device.type}'. Make the generator on "
        "the device (torch.Generator(device='tpu').manual_seed(...)), seed the device with torch.manual_seed "
        "(or torch.tpu.manual_seed), or draw on the generator's device and move the result with .to('tpu')"
    )
