"""The PjRT adapter: the ONLY module that calls jaxlib.

jaxlib's Python API beyond ``make_cpu_client`` is internal and changes between
releases, so every call lives here, behind a handful of small functions:
``put``, ``compile``, ``execute``, ``to_numpy``, ``block``. The package pins
``jaxlib==0.10.2``; ``tests/test_runtime.py`` smoke-tests each call.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import warnings
from typing import Any

import numpy as np

from ..errors import TpuPlatformError, TpuRuntimeError
from . import platforms

# XLA debug options every program is compiled with. XLA by default lets a fused program
# skip the float32 -> bfloat16 -> float32 round trips between 16-bit ops ("excess
# precision"), so a DeferAndFuse or compiled program would round differently from the same
# ops run one by one (eager, and PyTorch on the CPU or CUDA). Off: all three modes give the
# eager numbers.
COMPILE_OVERRIDES: dict[str, bool] = {"xla_allow_excess_precision": False}


class _NoJax:
    """Fails ``import jax`` instantly when jax is not installed.

    For every array it creates, jaxlib's C++ tries ``import jax._src.sharding_impls``.
    Without jax that failing import walks sys.path each time (~40 us per array). This
    finder makes it fail at once, and unlike putting None into sys.modules it leaves
    ``"jax" not in sys.modules`` true.
    """

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "jax" or name.startswith("jax."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _install_no_jax_finder() -> None:
    if importlib.util.find_spec("jax") is None and _NoJax not in sys.meta_path:
        sys.meta_path.insert(0, _NoJax)
        # The per-array lookup is of this exact name: a None entry makes Python fail it
        # without walking the import machinery (7.9 us per execute instead of 20 us),
        # while "jax" itself never enters sys.modules.
        sys.modules.setdefault("jax._src.sharding_impls", None)


Buffer = Any  # jaxlib ArrayImpl; opaque outside this module
Executable = Any


class Runtime:
    """One PjRT client and the one device this process drives (``tpu:0``)."""

    def __init__(self) -> None:
        choice = platforms.choose()
        platforms.verify_xla_flags()
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        _install_no_jax_finder()
        from jaxlib import _jax, xla_client

        self._jax = _jax
        self._xc = xla_client
        self.platform = choice.name
        try:
            self.client = self._make_client(choice)
        except TpuPlatformError:
            raise
        except Exception as e:  # noqa: BLE001 - plugin load errors come in many types
            if choice.explicit or choice.name == "cpu":
                raise TpuPlatformError(
                    f"could not start the {choice.name} PjRT client ({type(e).__name__}: {e}). "
                    "Check that the plugin matches jaxlib 0.10.2 and that the hardware is present, "
                    "or set TORCHTPU_PLATFORM=cpu."
                ) from e
            warnings.warn(
                f"torchtpu: found a {choice.name} PjRT plugin but could not start it ({e}); using the cpu platform",
                stacklevel=2,
            )
            self.platform = "cpu"
            self.client = self._make_client(platforms.PlatformChoice("cpu", None, False))
        self.device = self.client.local_devices()[0]
        self._device_list = _jax.DeviceList((self.device,))
        self._sharding = _make_sharding_class(_jax, xla_client)(self.device)
        self._copy = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
        self.supports_f64 = self.platform != "tpu"
        # LAPACK custom calls (linalg) exist only in XLA's CPU client
        self.has_lapack = self.platform == "cpu" and _register_lapack(xla_client)
        self._avals: dict[tuple, Any] = {}

    def _make_client(self, choice: platforms.PlatformChoice) -> Any:
        xc = self._xc
        if choice.name == "cpu":
            return xc.make_cpu_client(asynchronous=True)
        if not os.path.exists(choice.plugin_path or ""):
            raise TpuPlatformError(f"PjRT plugin for {choice.name} not found at {choice.plugin_path!r}")
        xc.load_pjrt_plugin_dynamically(choice.name, choice.plugin_path)
        if hasattr(xc, "initialize_pjrt_plugin"):
            xc.initialize_pjrt_plugin(choice.name)
        return xc.make_c_api_client(choice.name)

    # -- description ----------------------------------------------------------
    def device_name(self) -> str:
        kind = getattr(self.device, "device_kind", "") or self.platform
        return f"{kind} (XLA {self.platform} via PjRT)"

    # -- transfers --------------------------------------------------------------
    def _aval(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        key = (shape, dtype)
        aval = self._avals.get(key)
        if aval is None:
            aval = self._avals[key] = _Aval(shape, dtype)
        return aval

    def put(self, array: np.ndarray) -> Buffer:
        """Copy a host array to the device (the host array may be reused afterwards)."""
        return self._jax.batched_device_put(
            self._aval(array.shape, array.dtype), self._sharding, [array], [self.device], True, False, self._copy,
            enable_x64=True,
        )

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        """Wait for ``buf`` and return its value (read-only; may alias device memory on CPU)."""
        try:
            arr, _ = buf._single_device_array_to_np_array_did_copy()
        except self._jax.JaxRuntimeError as e:
            raise TpuRuntimeError(f"torchtpu: a device computation failed: {e}") from e
        return arr

    # -- programs ----------------------------------------------------------------
    def compile(self, text: str, what: str) -> Executable:
        opts = self._xc.CompileOptions()
        opts.device_assignment = self._xc.DeviceAssignment.create(np.array([[self.device.id]]))
        opts.env_option_overrides = list(COMPILE_OVERRIDES.items())
        try:
            return self.client.compile_and_load(text, self._device_list, opts)
        except Exception as e:  # noqa: BLE001 - JaxRuntimeError / ValueError from the MLIR parser
            raise TpuRuntimeError(
                f"torchtpu: XLA could not compile the program for {what}: {str(e).strip()[:2000]}\n"
                "This is a torchtpu bug; please report it with the op and shapes above."
            ) from e

    def execute(self, exe: Executable, args: list[Buffer]) -> list[Buffer]:
        """Enqueue one execution; returns the output buffers at once (asynchronous)."""
        try:
            return exe.execute(args)
        except self._jax.JaxRuntimeError as e:
            raise TpuRuntimeError(f"torchtpu: running a device program failed: {e}") from e

    def block(self, bufs: list[Buffer]) -> None:
        if bufs:
            try:
                self._jax.batched_block_until_ready(bufs)
            except self._jax.JaxRuntimeError as e:
                raise TpuRuntimeError(f"torchtpu: a device computation failed: {e}") from e

    @staticmethod
    def is_ready(buf: Buffer) -> bool:
        return buf.is_deleted() or buf.is_ready()

    @staticmethod
    def nbytes(buf: Buffer) -> int:
        return buf.on_device_size_in_bytes()

    # -- persistent artifacts -------------------------------------------------------
    def serialize(self, exe: Executable) -> bytes:
        return self.client.serialize_executable(exe)

    def deserialize(self, blob: bytes) -> Executable:
        return self.client.deserialize_executable(blob, self._device_list, None)

    def compile_options_fingerprint(self) -> str:
        """What besides the program text decides the executable (part of disk-cache keys)."""
        overrides = ",".join(f"{k}={v}" for k, v in COMPILE_OVERRIDES.items())
        return f"{self.device_name()}|replicas=1|{overrides}|XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"

    @property
    def jaxlib_version(self) -> str:
        import jaxlib

        return jaxlib.__version__


class _Aval:
    """What ``batched_device_put`` reads of jax's abstract value."""

    __slots__ = ("shape", "dtype", "weak_type")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = False


def _make_sharding_class(_jax: Any, xc: Any) -> type:
    class _DeviceSharding(_jax.SingleDeviceSharding):
        """What jax adds to the C++ SingleDeviceSharding (read by device_put)."""

        def _to_xla_hlo_sharding(self, num_dimensions: int) -> Any:
            return xc.HloSharding.replicate()

        @property
        def memory_kind(self) -> Any:
            return self._memory_kind

    return _DeviceSharding


_lapack_registered = False


def _register_lapack(xc: Any) -> bool:
    """Register jaxlib's LAPACK FFI handlers (``lapack_sgetrf_ffi``, ...) with XLA's CPU
    client, as jax does on import; without this the linalg custom calls fail with NOT_FOUND.
    Returns whether they are available."""
    global _lapack_registered
    if _lapack_registered:
        return True
    try:
        from jaxlib import lapack
    except ImportError:
        return False
    try:
        # binds the handlers to scipy's LAPACK (scipy is a jaxlib dependency)
        lapack._lapack.initialize()
    except Exception:  # noqa: BLE001 - then linalg ops raise NotImplementedError
        return False
    for name, fn, api_version in lapack.registrations()["cpu"]:
        xc.register_custom_call_target(name, fn, platform="cpu", api_version=api_version)
    _lapack_registered = True
    return True


_runtime: Runtime | None = None
_lock = threading.Lock()


def get() -> Runtime:
    """The process's runtime, started on first use (never at ``import torch``)."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def started() -> bool:
    return _runtime is not None


class _ForkedRuntime:
    """The runtime of a process forked after its parent started one: the client's threads
    and device state did not survive the fork (using it would hang), so every use raises."""

    def __getattr__(self, name: str) -> Any:
        raise TpuRuntimeError(
            "torchtpu: the tpu device cannot be used in a process forked after its parent used it "
            "(the XLA runtime does not survive fork). Start the process with the 'spawn' method: "
            "torch.multiprocessing.set_start_method('spawn'), or DataLoader(..., multiprocessing_context='spawn')."
        )


_inherited: Runtime | None = None  # the parent's runtime, kept so that nothing tears it down in the child


def _after_fork_in_child() -> None:
    global _runtime, _inherited
    if isinstance(_runtime, Runtime):
        _inherited, _runtime = _runtime, _ForkedRuntime()  # type: ignore[assignment]


def in_bad_fork() -> bool:
    """Whether this process was forked from one that had started the runtime."""
    return isinstance(_runtime, _ForkedRuntime)


os.register_at_fork(after_in_child=_after_fork_in_child)
