"""The PjRT adapter: the ONLY module that calls jaxlib.

jaxlib's Python API beyond ``make_cpu_client`` is internal and changes between
releases, so every call lives here, behind a handful of small functions:
``put``, ``compile``, ``execute``, ``to_numpy``, ``block``. The package pins
``jaxlib==0.10.2``; ``tests/test_runtime.py`` smoke-tests each call.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _spans, config, metrics
from ..errors import TpuOutOfMemoryError, TpuPlatformError, TpuRuntimeError
from . import platforms

_PROFILER = _spans.PROFILER  # torch's fast "a profiler records" flag, tested per execution

# XLA debug options every program is compiled with. XLA by default lets a fused program
# skip the float32 -> bfloat16 -> float32 round trips between 16-bit ops ("excess
# precision"), so a DeferAndFuse or compiled program would round differently from the same
# ops run one by one (eager, and PyTorch on the CPU or CUDA). Off: all three modes give the
# eager numbers.
COMPILE_OVERRIDES: dict[str, bool] = {"xla_allow_excess_precision": False}


def _host_view(buf: Buffer) -> np.ndarray | None:
    """A cpu-platform buffer's memory as a read-only numpy array (the buffer protocol waits
    for the buffer and keeps it alive), or None where it exports none."""
    try:
        arr = np.asarray(memoryview(buf))
    except (BufferError, TypeError, ValueError):
        return None
    if arr.dtype.hasobject:  # a format numpy cannot read (bfloat16, the float8 types)
        return None
    arr.flags.writeable = False  # device memory: programs may read it
    return arr


def _failed(what: str, e: Exception) -> TpuRuntimeError:
    """The error for a runtime failure ``e`` while doing ``what``: out of memory as an
    ``OutOfMemoryError`` that says what to do, anything else as it came."""
    if "RESOURCE_EXHAUSTED" in str(e):
        return TpuOutOfMemoryError(
            f"torchtpu: out of device memory ({what}): {str(e).rstrip('.')}. Free the tensors you no longer need (del, "
            "optimizer.zero_grad(set_to_none=True)), use a smaller batch, or see what is held with "
            "torch.tpu.memory_summary()."
        )
    return TpuRuntimeError(f"torchtpu: {what} failed: {e}")


class MemoryInfo(NamedTuple):
    free: int
    total: int


def _host_memory_info() -> MemoryInfo:
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    free = os.sysconf("SC_AVPHYS_PAGES") * page  # MemFree: where /proc/meminfo is not there
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        free = int(fields["MemAvailable"].split()[0]) * 1024  # what can be had without swapping
    except (OSError, KeyError, ValueError):
        pass
    return MemoryInfo(free, total)


class Launched(NamedTuple):
    """One enqueued execution: its output buffers, and what ``Runtime.wait`` waits on for it
    (a PjRt token: it holds no buffer, so it keeps no result alive or shared)."""

    outs: list[Buffer]
    done: Any


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


class _JaxOnDemand:
    """With jax installed, keeps jaxlib from importing it behind the user's back.

    jaxlib's C++ imports ``jax._src.sharding_impls`` for every array it creates and
    ``jax.core`` when it takes one apart: with jax installed, the first execution would
    import all of jax (a second of start-up, and "training never imports jax" broken).
    None entries for those two names make both lookups fail at once; when the user (or
    ``torchtpu.kernels.jax``) imports jax itself, this finder removes them first, so jax
    imports normally and jaxlib then finds it.
    """

    NAMES = ("jax._src.sharding_impls", "jax.core")

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> None:
        if name == "jax":
            for n in cls.NAMES:
                if n in sys.modules and sys.modules[n] is None:
                    del sys.modules[n]
        return None  # the ordinary finders import it

    @classmethod
    def block(cls) -> None:
        if "jax" not in sys.modules:
            for n in cls.NAMES:
                sys.modules.setdefault(n, None)


def _install_no_jax_finder() -> None:
    if importlib.util.find_spec("jax") is not None:
        if _JaxOnDemand not in sys.meta_path:
            sys.meta_path.insert(0, _JaxOnDemand)
        _JaxOnDemand.block()
        return
    if _NoJax not in sys.meta_path:
        sys.meta_path.insert(0, _NoJax)
        # The per-array lookup is of this exact name: a None entry makes Python fail it
        # without walking the import machinery (7.9 us per execute instead of 20 us),
        # while "jax" itself never enters sys.modules.
        sys.modules.setdefault("jax._src.sharding_impls", None)


Buffer = Any  # jaxlib ArrayImpl; opaque outside this module
Executable = Any
ResultHandlers = Any  # from result_handlers(); opaque outside this module


class Runtime:
    """One PjRT client and the one device this process drives (``tpu:0``)."""

    def __init__(self, cluster: Any = None) -> None:
        # cluster: a runtime/distributed.Cluster when this process is one node of a
        # multi-process runtime (TORCHTPU_COLLECTIVES=xla); None when it runs alone.
        self.cluster = cluster
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
        # the same for every program: made once (made per call, jaxlib kept ~50 bytes of
        # every twentieth set of options for ever)
        self._compile_options = self.compile_options([self.device.id])
        self._avals: OrderedDict[tuple, Any] = OrderedDict()  # (shape, dtype) -> _Aval
        # id(executable) -> program name, for profiler spans; every executable is made by
        # compile or deserialize, which (re)write the entry, so a reused id is never stale
        self._names: dict[int, str] = {}

    def _make_client(self, choice: platforms.PlatformChoice) -> Any:
        xc = self._xc
        joined = self.cluster.client_kwargs(choice.name) if self.cluster is not None else {}
        if choice.name == "cpu":
            return xc.make_cpu_client(asynchronous=True, **joined)
        if not os.path.exists(choice.plugin_path or ""):
            raise TpuPlatformError(f"PjRT plugin for {choice.name} not found at {choice.plugin_path!r}")
        xc.load_pjrt_plugin_dynamically(choice.name, choice.plugin_path)
        if hasattr(xc, "initialize_pjrt_plugin"):
            xc.initialize_pjrt_plugin(choice.name)
        return xc.make_c_api_client(choice.name, **joined)

    # -- description ----------------------------------------------------------
    def device_name(self) -> str:
        kind = getattr(self.device, "device_kind", "") or self.platform
        return f"{kind} (XLA {self.platform} via PjRT)"

    def memory_info(self) -> MemoryInfo:
        """The device's free and total bytes: its allocator's limit and use where PjRT
        reports them (GPU, TPU); on the cpu platform, whose device memory is the host's,
        the host's available and physical memory."""
        try:
            stats = self.device.memory_stats()
        except self._jax.JaxRuntimeError:  # a plugin without the query: as the cpu client
            stats = None
        if stats and "bytes_limit" in stats:
            total = int(stats["bytes_limit"])
            return MemoryInfo(total - int(stats.get("bytes_in_use", 0)), total)
        return _host_memory_info()

    # -- transfers --------------------------------------------------------------
    def _aval(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        key = (shape, dtype)
        aval = self._avals.get(key)
        if aval is None:
            aval = self._avals[key] = _Aval(shape, dtype)
            # one per array type ever put or made: bounded like every host-side cache (the
            # limit read here, as BoundedCache does, so that tests can lower it)
            while len(self._avals) > int(config.get("TORCHTPU_MAX_PROGRAMS")):
                self._avals.popitem(last=False)
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
            if self.platform == "cpu":
                # the buffer's memory through the buffer protocol: the same read-only view,
                # 10 us where the conversion takes 32-35 us (a program's check flags, read at
                # every synchronize; .item())
                arr = _host_view(buf)
                if arr is not None:
                    return arr
            arr, _ = buf._single_device_array_to_np_array_did_copy()
        except self._jax.JaxRuntimeError as e:
            raise _failed("a device computation", e) from e
        return arr

    def host_memory(self, buf: Buffer, nbytes: int) -> memoryview | None:
        """``buf``'s own memory as writable bytes, on the cpu platform (where a device
        buffer is host memory); None on other platforms. Writing is only safe into a buffer
        no program reads or will read meanwhile -- one the caller owns alone, made ready
        (``runner.program.claim``); the view keeps ``buf`` alive."""
        if self.platform != "cpu":
            return None
        try:
            address = buf.unsafe_buffer_pointer()
        except self._jax.JaxRuntimeError as e:
            raise _failed("a device computation", e) from e
        raw = (ctypes.c_char * nbytes).from_address(address)
        raw.owner = buf  # ctypes keeps no reference to the memory's owner itself
        return memoryview(raw).cast("B")

    # -- programs ----------------------------------------------------------------
    def compile_options(self, device_ids: Sequence[int]) -> Any:
        """XLA's options for a program run as one replica on each device of ``device_ids``."""
        opts = self._xc.CompileOptions()
        opts.num_replicas, opts.num_partitions = len(device_ids), 1
        opts.device_assignment = self._xc.DeviceAssignment.create(np.array([[i] for i in device_ids]))
        opts.env_option_overrides = list(COMPILE_OVERRIDES.items())
        return opts

    def compile(self, text: str, what: str) -> Executable:
        """Compile StableHLO ``text``; its HLO module is named after ``what`` (every module
        is written as ``@main``), which is how XLA's own profiler shows the program."""
        name = program_name(what)
        if text.startswith(_MAIN_MODULE):
            text = f"module @{name} {text[len(_MAIN_MODULE) :]}"
        try:
            exe = self.client.compile_and_load(text, self._device_list, self._compile_options)
        except Exception as e:  # noqa: BLE001 - JaxRuntimeError / ValueError from the MLIR parser
            raise TpuRuntimeError(
                f"torchtpu: XLA could not compile the program for {what}: {str(e).strip()[:2000]}\n"
                "This is a torchtpu bug; please report it with the op and shapes above."
            ) from e
        self._names[id(exe)] = name
        return exe

    def result_handlers(self, types: Sequence[tuple[tuple[int, ...], np.dtype]]) -> ResultHandlers:
        """What ``execute`` needs to wrap a program's results (one ``(shape, dtype)`` per
        result) directly as buffers: about 15 µs less per call than letting the runtime
        disassemble them, which is most of a small op's time."""
        return [self._jax.array_result_handler(self._aval(shape, dtype), self._sharding, True, True) for shape, dtype in types]

    def execute(self, exe: Executable, args: list[Buffer], handlers: ResultHandlers) -> Launched:
        """Enqueue one execution; returns its output buffers at once (asynchronous) and
        what waits for it (``wait``)."""
        if _PROFILER._is_profiler_enabled:
            return self._execute_traced(exe, args, handlers)
        try:
            return self._run(exe, args, handlers)
        except self._jax.JaxRuntimeError as e:
            raise _failed("running a device program", e) from e

    @staticmethod
    def _run(exe: Executable, args: list[Buffer], handlers: ResultHandlers) -> Launched:
        results = exe.execute_sharded(args, with_tokens=True)
        done = results.consume_token()  # before the results: consuming them consumes the token too
        return Launched._make((results.consume_with_handlers(handlers), done))  # _make: no Python-level __new__

    def _execute_traced(self, exe: Executable, args: list[Buffer], handlers: ResultHandlers) -> Launched:
        """``execute`` under a profiler: a span for the enqueue and, with
        ``torchtpu.profiler.device_timing(True)``, one for waiting on the results."""
        name = self._names.get(id(exe), "program")
        with _spans.span("torchtpu::execute", program=name):
            try:
                launched = self._run(exe, args, handlers)
            except self._jax.JaxRuntimeError as e:
                raise _failed("running a device program", e) from e
        if _spans.device_timing:
            t0 = time.perf_counter()
            with _spans.span("torchtpu::device_wait", program=name):
                self.wait([launched.done])
            metrics.add("device_wait_seconds", time.perf_counter() - t0)
        return launched

    def wait(self, executions: Sequence[Any]) -> None:
        """Wait for enqueued executions (``Launched.done`` of each), whose results may be
        gone: a program's outputs dropped as soon as it was enqueued still take its time."""
        try:
            for done in executions:
                done.block_until_ready()
            # jaxlib frees the Python objects its threads released (results dropped while
            # their execution ran) when a buffer wait runs, not a token's: ~100 bytes per
            # execution stayed behind until one did (tests/test_bounded_memory.py)
            self._jax.batched_block_until_ready([])
        except self._jax.JaxRuntimeError as e:
            raise _failed("a device computation", e) from e

    def block(self, bufs: list[Buffer]) -> None:
        if bufs:
            try:
                self._jax.batched_block_until_ready(bufs)
            except self._jax.JaxRuntimeError as e:
                raise _failed("a device computation", e) from e

    @staticmethod
    def is_ready(buf: Buffer) -> bool:
        return buf.is_deleted() or buf.is_ready()

    @staticmethod
    def nbytes(buf: Buffer) -> int:
        return buf.on_device_size_in_bytes()

    # -- persistent artifacts -------------------------------------------------------
    def serialize(self, exe: Executable) -> bytes:
        return self.client.serialize_executable(exe)

    def deserialize(self, blob: bytes, what: str = "program") -> Executable:
        exe = self.client.deserialize_executable(blob, self._device_list, None)
        self._names[id(exe)] = program_name(what)
        return exe

    def forget(self, exe: Executable) -> None:
        """``exe`` is being dropped (the executable cache evicted it): forget its name."""
        self._names.pop(id(exe), None)

    def compile_options_fingerprint(self) -> str:
        """What besides the program text decides the executable (part of disk-cache keys)."""
        overrides = ",".join(f"{k}={v}" for k, v in COMPILE_OVERRIDES.items())
        fp = f"{self.device_name()}|replicas=1|{overrides}|XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"
        # a serialized executable keeps its device: in a cluster each rank has its own
        return fp if self.cluster is None else f"{fp}|device={self.device.id}"

    @property
    def runtime_version(self) -> str:
        """The version of jaxlib, the XLA runtime library this adapter drives."""
        import jaxlib

        return jaxlib.__version__


_MAIN_MODULE = "module @main "
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.]+")


def program_name(what: str) -> str:
    """A program's name from its description: "aten::mm.default [(2, 3), (3, 4)]" ->
    "aten_mm.default", "fused graph of 12 ops" -> "fused_graph_of_12_ops"."""
    head = what.split(" [", 1)[0]
    return _NOT_NAME.sub("_", head).strip("_")[:80] or "program"


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


def start(cluster: Any) -> Runtime:
    """Start the runtime as one node of a multi-process runtime (``runtime/distributed.py``
    calls this at ``init_process_group`` with TORCHTPU_COLLECTIVES=xla)."""
    global _runtime
    with _lock:
        if _runtime is not None:
            raise TpuRuntimeError("torchtpu: the runtime was already started; it cannot join a cluster now")
        _runtime = Runtime(cluster)
    return _runtime


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
