"""PyTorch Lightning: ``Trainer(accelerator="tpu")`` and ``Fabric(accelerator="tpu")`` run
on torchtpu's device, as ``accelerator="cuda"`` runs on CUDA.

Lightning's "tpu" accelerator is torch_xla's: without torch_xla it raised
``ModuleNotFoundError: Requirement 'torch_xla>=1.13' not met``, and ``accelerator="auto"``
trained on the CPU. Where torch_xla is not installed, torchtpu registers its own
accelerator under that name and extends the two connectors that turn the flags into a
set-up (the ``Trainer``'s ``_AcceleratorConnector`` and ``Fabric``'s ``_Connector``):

- ``accelerator="auto"`` picks tpu where it is the current accelerator (Lightning picks
  CUDA so), as accelerate and transformers do with torchtpu;
- the strategy for one device is ``SingleDeviceStrategy`` on it, and for several it is
  "ddp" over torch.distributed's "tpu" backend (Lightning would pick torch_xla's
  strategies for "tpu", and for an accelerator instance it does not know it puts the model
  on the CPU);
- DDP wraps the model as ``DistributedDataParallel(model)`` (Lightning would pass device
  ids and build it in a ``torch.cuda.Stream``);
- ``strategy="fsdp"`` (FSDP1) runs on tpu, where Lightning allows it only on a GPU (and
  Fabric swaps in torch_xla's "xla_fsdp"), its mixed precision autocasting on tpu;
- ``precision="16-mixed"``/``"bf16-mixed"`` autocast on tpu (Lightning's rule gives every
  device but the CPU and MPS CUDA's autocast), with a tpu ``GradScaler`` for float16;
- the ``Trainer``'s start-up lines say "TPU available: True, using: 1 TPU cores";
- ``isolate_rng`` (the ``Trainer`` runs its sanity-check validation inside it, and the
  learning-rate finder) and the spawn launchers save and restore the tpu generator, as
  they do CUDA's: a ``validation_step`` that draws tpu random numbers would otherwise
  shift the training's dropout masks, where on CUDA it does not.

Both distributions are covered: the ``lightning`` package (``lightning.pytorch``,
``lightning.fabric``) and the standalone ``pytorch_lightning`` / ``lightning_fabric``.
Nothing is imported here: each extension is applied when its module is first imported.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from ..errors import one_device_error
from . import tpu_is_current_accelerator
from .on_import import Extension, extend_on_import

_NAME = "tpu"
_RNG_KEY = "torch.tpu"  # the entry beside Lightning's "torch.cuda" in its RNG state dicts
_MIXED = ("16-mixed", "bf16-mixed")


def _is_tpu_accelerator(accelerator: Any) -> bool:
    return getattr(type(accelerator), "_torchtpu", False)


def parse_devices(devices: int | str | list[int]) -> int | list[int]:
    """Lightning's ``devices=`` for tpu: a count (``2``, ``"2"``; ``-1`` for all of this
    process's) or indices (``[0]``, ``"0,"``, ``"0,1"``)."""
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        else:
            devices = int(text)
    if devices == -1:
        return torch.tpu.device_count()
    count = isinstance(devices, int) and not isinstance(devices, bool) and devices > 0
    indices = isinstance(devices, list) and len(devices) > 0
    if not (count or indices):
        raise ValueError(f"`devices={devices!r}` is not a valid input for the tpu accelerator: give a positive count or a list of indices.")
    return devices


def parallel_devices(devices: int | list[int]) -> list[torch.device]:
    """One device: the one named (tpu:0 for a count of 1). Several: one process each, and
    each process drives its own ``tpu:0`` (torchtpu's distributed model, docs/distributed.md),
    as Lightning's CPU accelerator lists ``cpu`` once per process."""
    indices = list(range(devices)) if isinstance(devices, int) else list(devices)
    if len(indices) == 1:
        index = indices[0]
        if not 0 <= index < torch.tpu.device_count():
            raise one_device_error(index)
        return [torch.device(_NAME, index)]
    return [torch.device(_NAME, 0)] * len(indices)


@functools.cache
def _accelerator_class(base: type) -> type:
    """The tpu accelerator as a subclass of ``base``, Fabric's or the Trainer's
    ``Accelerator`` (the Trainer's adds ``get_device_stats``): one class per base."""

    class TPUAccelerator(base):  # type: ignore[misc, valid-type]
        """torchtpu's tpu device (not torch_xla's)."""

        _torchtpu = True

        def setup_device(self, device: torch.device) -> None:
            if device.type != _NAME:
                raise ValueError(f"Device should be tpu, got {device} instead.")
            torch.tpu.set_device(device)

        def teardown(self) -> None:
            pass

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return dict(torch.tpu.memory_stats(device))

        @staticmethod
        def parse_devices(devices: int | str | list[int]) -> int | list[int]:
            return parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices: int | list[int]) -> list[torch.device]:
            return parallel_devices(devices)

        @staticmethod
        def auto_device_count() -> int:
            return torch.tpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.tpu.is_available()

        @staticmethod
        def name() -> str:
            return _NAME

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(_NAME, cls, description="torchtpu's tpu device", override=True)

    return TPUAccelerator


def extend_connector(connector: Any, registry: Any) -> None:
    """Register the tpu accelerator in ``registry`` and wrap ``connector``'s choices of
    accelerator, strategy and precision (once). Left alone where torch_xla is installed:
    "tpu" is then Lightning's own."""
    names = connector.__init__.__globals__  # the connector's module: the Lightning classes it uses
    xla = names.get("XLAAccelerator")
    if getattr(connector, "_torchtpu", False) or xla is None or xla.is_available():
        return
    _accelerator_class(names["Accelerator"]).register_accelerators(registry)
    choose_auto, choose_strategy, check_strategy, choose_precision = (
        connector._choose_auto_accelerator,
        connector._choose_strategy,
        connector._check_strategy_and_fallback,
        connector._check_and_init_precision,
    )

    def _choose_auto_accelerator(*args: Any) -> str:
        chosen = choose_auto(*args)
        return _NAME if chosen == "cpu" and tpu_is_current_accelerator() else chosen

    def _choose_strategy(self: Any) -> Any:
        if not _is_tpu_accelerator(self.accelerator):
            return choose_strategy(self)
        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return "ddp"
        return names["SingleDeviceStrategy"](device=self._parallel_devices[0])

    def _check_strategy_and_fallback(self: Any) -> None:
        # Lightning's check lets FSDP run only on a GPU accelerator (and Fabric turns "fsdp" on
        # "tpu" into torch_xla's "xla_fsdp"); FSDP runs on tpu: the check sees tpu as that GPU
        if not _is_tpu_accelerator(self.accelerator):
            return check_strategy(self)
        flag, self._accelerator_flag = self._accelerator_flag, "cuda"
        try:
            check_strategy(self)
        finally:
            self._accelerator_flag = flag

    def _check_and_init_precision(self: Any) -> Any:
        if not _is_tpu_accelerator(self.accelerator):
            return choose_precision(self)
        with warnings.catch_warnings():  # its float16 rules first build CUDA GradScalers, which warn
            warnings.filterwarnings("ignore", message=".*GradScaler is enabled, but CUDA is not available.*")
            precision = choose_precision(self)
        mixed, fsdp = names["MixedPrecision"], names.get("FSDPPrecision")
        if type(precision) is mixed and precision.precision in _MIXED and precision.device != _NAME:
            return mixed(precision=precision.precision, device=_NAME)
        if fsdp is not None and type(precision) is fsdp and precision.precision in _MIXED:
            _fsdp_precision_on_tpu(precision)
        return precision

    connector._choose_auto_accelerator = staticmethod(_choose_auto_accelerator)
    connector._choose_strategy = _choose_strategy
    connector._check_strategy_and_fallback = _check_strategy_and_fallback
    connector._check_and_init_precision = _check_and_init_precision
    connector._torchtpu = True


def _fsdp_precision_on_tpu(precision: Any) -> None:
    """Lightning's FSDP precision autocasts with ``torch.autocast("cuda")`` and scales float16
    losses with a CUDA ``ShardedGradScaler``, whatever the device: on tpu, tpu's."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    dtype = torch.bfloat16 if precision.precision == "bf16-mixed" else torch.float16
    precision.forward_context = lambda: torch.autocast(_NAME, dtype=dtype)
    if precision.scaler is not None:
        precision.scaler = ShardedGradScaler(device=_NAME)


def _ddp_extension(method_name: str) -> Extension:
    """Wrap ``DDPStrategy.<method_name>``, the device ids it gives ``DistributedDataParallel``
    (once): None on tpu, where Lightning gives ``[root_device.index]`` to every device but
    the CPU and then builds the model in a ``torch.cuda.Stream``, which fails without CUDA.
    ``DistributedDataParallel(model)`` follows the module's own device."""

    def extend(ddp_module: Any) -> None:
        cls = getattr(ddp_module, "DDPStrategy", None)
        device_ids = getattr(cls, method_name, None)
        if device_ids is None or getattr(device_ids, "_torchtpu", False):
            return

        @functools.wraps(device_ids)
        def wrapped(self: Any) -> list[int] | None:
            return None if self.root_device.type == _NAME else device_ids(self)

        wrapped._torchtpu = True  # type: ignore[attr-defined]
        setattr(cls, method_name, wrapped)

    return extend


def extend_device_info(setup_module: Any) -> None:
    """Make the ``Trainer``'s start-up lines (``setup._log_device_info``) report the tpu
    accelerator where they report torch_xla's: "TPU available: True, using: 1 TPU cores",
    not "False, using: 0" while training on tpu, and "TPU available but not used" where an
    explicit ``accelerator="cpu"`` leaves it idle, as CUDA's "GPU available but not used"."""
    xla = getattr(setup_module, "XLAAccelerator", None)
    if xla is None or xla.is_available() or getattr(xla, "_torchtpu", False):
        return
    setup_module.XLAAccelerator = _accelerator_class(setup_module.pl.accelerators.Accelerator)


def extend_rng_states(seed_module: Any) -> None:
    """Wrap ``seed_module._collect_rng_states`` and ``_set_rng_states`` (once) to carry the
    tpu generator's state where they carry CUDA's. Their importers (``isolate_rng``, the
    spawn launchers) import them after this module, so they get the wrapped ones."""
    collect, restore = getattr(seed_module, "_collect_rng_states", None), getattr(seed_module, "_set_rng_states", None)
    if collect is None or restore is None or getattr(collect, "_torchtpu", False):
        return

    @functools.wraps(collect)
    def _collect_rng_states(include_cuda: bool = True) -> dict[str, Any]:
        states = collect(include_cuda)
        if include_cuda and tpu_is_current_accelerator():
            states[_RNG_KEY] = torch.tpu.get_rng_state_all()
        return states

    @functools.wraps(restore)
    def _set_rng_states(rng_state_dict: dict[str, Any]) -> None:
        restore(rng_state_dict)
        if _RNG_KEY in rng_state_dict and tpu_is_current_accelerator():
            torch.tpu.set_rng_state_all(rng_state_dict[_RNG_KEY])

    _collect_rng_states._torchtpu = True  # type: ignore[attr-defined]
    seed_module._collect_rng_states, seed_module._set_rng_states = _collect_rng_states, _set_rng_states


def _connector_extension(class_name: str, registry_name: str) -> Extension:
    def extend(module: Any) -> None:
        extend_connector(getattr(module, class_name), getattr(module, registry_name))

    return extend


def _extensions(trainer_package: str, fabric_package: str) -> dict[str, Extension]:
    return {
        f"{trainer_package}.trainer.connectors.accelerator_connector": _connector_extension("_AcceleratorConnector", "AcceleratorRegistry"),
        f"{trainer_package}.trainer.setup": extend_device_info,
        f"{trainer_package}.strategies.ddp": _ddp_extension("determine_ddp_device_ids"),
        f"{fabric_package}.connector": _connector_extension("_Connector", "ACCELERATOR_REGISTRY"),
        f"{fabric_package}.strategies.ddp": _ddp_extension("_determine_ddp_device_ids"),
        f"{fabric_package}.utilities.seed": extend_rng_states,
    }


# module name -> what extends it once loaded, for both distributions
_EXTENSIONS: dict[str, Extension] = {
    **_extensions("lightning.pytorch", "lightning.fabric"),
    **_extensions("pytorch_lightning", "lightning_fabric"),
}


def install() -> None:
    """Apply ``_EXTENSIONS`` now where their modules are loaded, else when first imported."""
    extend_on_import(_EXTENSIONS)

