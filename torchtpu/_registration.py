"""Making "tpu" a PyTorch device: PrivateUse1 renamed, torch.tpu, hooks, guard, serialization."""

from __future__ import annotations

from typing import Any

import torch


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_device_count(self) -> int:
        return 1


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def _ser_tag(obj: Any) -> str | None:
    """The location torch.save records for a tpu storage: "tpu:0", as CUDA's is "cuda:0", so
    ``map_location={"tpu:0": "cpu"}`` (the CUDA idiom) applies. Files saved with the old
    bare "tpu" still load."""
    if obj.device.type == "tpu":
        return f"tpu:{obj.device.index or 0}"
    return None


def _ser_restore(storage: Any, location: str) -> Any:
    """torch.load for storages saved on tpu or mapped to it (map_location="tpu").

    The default path would call torch.UntypedStorage(n, device="tpu"), which needs a C++
    allocator we do not have; build the storage from the host bytes instead."""
    if not location.startswith("tpu"):
        return None
    from .device import _index
    from .eager.minimal import from_cpu

    _index(location)
    host = storage if storage.device.type == "cpu" else storage.cpu()
    t = torch.empty(0, dtype=torch.uint8).set_(host)
    return from_cpu(t).untyped_storage()


def _patch_accelerator_synchronize() -> None:
    """torch.accelerator.synchronize() asks the C++ device guard, whose Python binding
    cannot implement synchronizeDevice; route the tpu case to torch.tpu.synchronize."""
    original = torch.accelerator.synchronize
    if getattr(original, "_torchtpu", False):
        return

    def synchronize(device: Any = None) -> None:
        if torch.accelerator.current_accelerator().type == "tpu":
            torch.tpu.synchronize(device)
        else:
            original(device)

    synchronize._torchtpu = True  # type: ignore[attr-defined]
    synchronize.__doc__ = original.__doc__
    torch.accelerator.synchronize = synchronize


def _patch_tensor_printing() -> None:
    """Print a tpu tensor from one host copy, as PyTorch does for xla/lazy/ipu/mtia tensors:
    formatting runs a dozen small ops (summaries, abs, a masked_select, .item() per number
    format), each a program to compile and a host sync on the device (print(t) made 8 syncs).
    Only the contents move: the caller still prints device='tpu:0' and the tensor's own grad_fn."""
    import torch._tensor_str as tensor_str

    original = tensor_str._tensor_str
    if getattr(original, "_torchtpu", False):
        return

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == "tpu":
            with torch.no_grad():
                self = self.to("cpu")
        return original(self, indent)

    _tensor_str._torchtpu = True  # type: ignore[attr-defined]
    tensor_str._tensor_str = _tensor_str


def _patch_storage_clone() -> None:
    """``UntypedStorage.clone`` (used by ``copy.deepcopy`` of tensors and modules) builds
    ``UntypedStorage(n, device="tpu")``, which needs a C++ allocator the tpu device does
    not have (it would crash the process); clone tpu storages through their cell instead."""
    original = torch.UntypedStorage.clone
    if getattr(original, "_torchtpu", False):
        return

    def clone(self: Any) -> Any:
        if self.device.type != "tpu":
            return original(self)
        from .eager.minimal import clone_storage

        return clone_storage(self)

    clone._torchtpu = True  # type: ignore[attr-defined]
    clone.__doc__ = original.__doc__
    torch.UntypedStorage.clone = clone


_NO_DLPACK = (
    "torchtpu: a tpu tensor cannot be exported through DLPack: its memory belongs to this process's XLA runtime, "
    "which hands out no pointer another library could use. Copy it to the host first: t.cpu()"
)


def _patch_dlpack_export() -> None:
    """DLPack export of a tpu tensor (``t.__dlpack__()``, ``__dlpack_device__``,
    ``torch.utils.dlpack.to_dlpack``) refuses with a message. PyTorch's exporter would hand
    out the storage's opaque data pointer (storage.py: no memory lies behind it) as an
    "extension device" address: a consumer that reads it crashes the process, and
    ``torch.from_dlpack`` made a tpu tensor without a buffer."""
    import torch.utils.dlpack as dlpack

    original = torch.Tensor.__dlpack__
    if getattr(original, "_torchtpu", False):
        return

    def __dlpack__(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - the protocol's name
        if self.device.type == "tpu":
            raise BufferError(_NO_DLPACK)
        return original(self, *args, **kwargs)

    device_of = torch.Tensor.__dlpack_device__

    def __dlpack_device__(self: torch.Tensor) -> Any:  # noqa: N807 - the protocol's name
        if self.device.type == "tpu":  # asked first by every consumer (torch.from_dlpack, numpy)
            raise BufferError(_NO_DLPACK)
        return device_of(self)

    export = dlpack.to_dlpack

    def to_dlpack(tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            raise BufferError(_NO_DLPACK)
        return export(tensor)

    __dlpack__._torchtpu = True  # type: ignore[attr-defined]
    __dlpack__.__doc__ = original.__doc__
    to_dlpack.__doc__ = export.__doc__
    torch.Tensor.__dlpack__ = __dlpack__  # type: ignore[method-assign]
    torch.Tensor.__dlpack_device__ = __dlpack_device__  # type: ignore[method-assign]
    dlpack.to_dlpack = torch.to_dlpack = to_dlpack  # type: ignore[attr-defined]


def _patch_storage_constructor() -> None:
    """``torch.UntypedStorage(n, device="tpu")`` asks PyTorch's C++ allocator registry for a
    tpu allocator, which a Python backend cannot register: the process would crash. Build
    tpu storages from host bytes instead: zeros for a size, or the given byte sequence."""
    original = torch.UntypedStorage.__new__
    if getattr(original, "_torchtpu", False):
        return

    def new(cls: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is None or torch.device(device).type != "tpu":
            return original(cls, *args, **({"device": device} if device is not None else {}), **kwargs)
        if kwargs or len(args) > 1:
            raise TypeError(f"torch.UntypedStorage(): unsupported arguments for a tpu storage: {args}, {kwargs}")
        size_or_bytes = args[0] if args else 0
        if isinstance(size_or_bytes, int):
            host = torch.zeros(size_or_bytes, dtype=torch.uint8).untyped_storage()
        else:
            host = torch.UntypedStorage(size_or_bytes)
        return _ser_restore(host, str(torch.device(device)))

    new._torchtpu = True  # type: ignore[attr-defined]
    torch.UntypedStorage.__new__ = new  # type: ignore[method-assign]


def _restore_untyped_storage(host: torch.Tensor) -> Any:
    """Unpickle a tpu storage from a CPU tensor holding its bytes."""
    return _ser_restore(host.untyped_storage(), "tpu")


def _restore_typed_storage(host: torch.Tensor, dtype: torch.dtype) -> Any:
    return torch.TypedStorage(wrap_storage=_restore_untyped_storage(host), dtype=dtype, _internal=True)


def _patch_storage_pickle() -> None:
    """``pickle`` of a tpu tensor pickles its storage, whose ``__reduce__`` runs a legacy
    ``torch.save`` that reads the bytes through a C++ path with no device buffer behind it.
    Pickle tpu storages as their host bytes instead (what a CUDA storage's legacy save
    writes) and restore them onto tpu; ``copy``, ``multiprocessing`` and DataLoader workers
    go through the same path."""
    from .eager.minimal import storage_to_host

    for cls in (torch.UntypedStorage, torch.TypedStorage):
        original = cls.__reduce__
        if getattr(original, "_torchtpu", False):
            continue

        def __reduce__(self: Any, _original: Any = original) -> Any:
            untyped = self._untyped_storage if isinstance(self, torch.TypedStorage) else self
            if untyped.device.type != "tpu":
                return _original(self)
            if isinstance(self, torch.TypedStorage):
                return (_restore_typed_storage, (storage_to_host(untyped), self.dtype))
            return (_restore_untyped_storage, (storage_to_host(untyped),))

        __reduce__._torchtpu = True  # type: ignore[attr-defined]
        __reduce__.__doc__ = original.__doc__
        cls.__reduce__ = __reduce__


def _install_native_hooks() -> bool:
    """Register the C++ hooks (torchtpu/csrc/hooks.cpp: tpu generators, pinned host memory,
    the allocator entry behind torch.accelerator's memory functions, the device guard)
    when the extension was built; False when it was not (Python hooks and guard objects
    then)."""
    try:
        from . import _hooks  # type: ignore[attr-defined]
    except ImportError:
        return False
    from . import device
    from .device import streams

    _hooks.install(streams, device)
    return True


NATIVE_HOOKS = False  # set by register_device: whether the C++ hooks are in


def _backward_on_the_calling_thread() -> None:
    """Run backward passes on the thread that calls ``backward()``, as for CPU tensors.

    The autograd engine gives every non-CPU device a worker thread, so that a CUDA GPU's
    backward can run while the CPU's does. A tpu op is already an asynchronous enqueue
    (eager) or a record (DeferAndFuse), so the worker only adds two thread hand-offs per
    backward and splits a DeferAndFuse step's graph between two threads: measured on the
    minGPT step, 0.25 ms of 1.9 ms compiled and 1.3 ms of 6.9 ms under DeferAndFuse. This
    sets PyTorch's own switch (``torch.autograd.set_multithreading_enabled``) for the thread
    that imports torch; other threads, and a program that sets it back, keep the worker."""
    torch.autograd.set_multithreading_enabled(False)


def register_device() -> None:
    """PyTorch's ``_setup_privateuseone_for_python_backend``, with C++ hooks where built."""
    global NATIVE_HOOKS
    from . import device

    torch.utils.rename_privateuse1_backend("tpu")
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)  # storage.tpu() too, as storage.cuda()
    torch._register_device_module("tpu", device.make_module())
    NATIVE_HOOKS = _install_native_hooks()
    if not NATIVE_HOOKS:  # the C++ extension registers its own hooks and device guard
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    torch.serialization.register_package(5, _ser_tag, _ser_restore)
    _patch_accelerator_synchronize()
    _patch_tensor_printing()
    _patch_storage_clone()
    _patch_storage_pickle()
    _patch_storage_constructor()
    _patch_dlpack_export()
    from .eager import sharing

    sharing.install()  # torch.multiprocessing / DataLoader workers: tpu tensors travel as bytes
    from .runner.precision import install_torch_hook

    install_torch_hook()
    from .device import amp

    amp.register()  # torch.autocast("tpu"): CUDA's cast policy, bfloat16 by default
    from .device import modules

    modules.install()
    from .device import data_parallel

    data_parallel.install()  # nn.DataParallel(model) as on one CUDA device
    if not NATIVE_HOOKS:  # the C++ hooks pin for real
        from .device import pinned_memory

        pinned_memory.install()
    from .eager import nested

    nested.install()  # nn.TransformerEncoder's nested-tensor inference path
    from .integrations import huggingface

    huggingface.install()
    from .integrations import lightning

    lightning.install()  # Trainer(accelerator="tpu") and Fabric on torchtpu's device
    from .integrations import flex_attention

    flex_attention.install()  # flex_attention's device check lets tpu through
    from .compile import default_backend

    default_backend.install()  # torch.compile(model) with inductor, the default, on tpu tensors
    _backward_on_the_calling_thread()
