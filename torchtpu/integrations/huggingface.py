"""Hugging Face: make ``accelerate`` pick the tpu device, as transformers already does, and
make the ``Trainer``'s checkpoints carry the tpu generator's state, as they carry CUDA's;
accelerate's set-up under torchrun; transformers' flex_attention switch.

transformers (>= 5.23) selects "tpu" by itself: ``TrainingArguments.device`` asks
``torch.accelerator.current_accelerator()``, and pipelines accept ``device="tpu"``. The
``Trainer`` also hands the model to accelerate's ``Accelerator``, which moves it to
``PartialState().device``; accelerate (1.15) knows a fixed list of device types and
answers "cpu" for any other, so the Trainer would train on the CPU and then fail on the
tpu inputs. accelerate's own switch for other devices, ``ACCELERATE_TORCH_DEVICE``, would
also override ``use_cpu=True``; so torchtpu extends ``PartialState.default_device``
instead: where accelerate found no device it knows and tpu is the current accelerator, the
default device is tpu. ``use_cpu=True`` (``cpu=True``) and ``ACCELERATE_TORCH_DEVICE`` keep
their meaning, and an accelerate that learns ``torch.accelerator`` itself (its PR #4278)
makes this a no-op.

The ``Trainer`` saves the random generators' states in each checkpoint (``rng_state.pth``)
and restores them on ``train(resume_from_checkpoint=...)``, so that a resumed run draws the
dropout masks the uninterrupted run would have drawn. It knows CUDA, XLA, NPU, HPU, MLU and
MUSA by name; for tpu it saved nothing, and a resumed run with dropout trained on different
masks (its losses and weights departed from the uninterrupted run's, where the CPU's and
CUDA's match exactly). torchtpu adds a ``"tpu"`` entry to that file after the Trainer writes
it and restores it after the Trainer reads it, with ``torch.tpu``'s generator functions, as
the Trainer does for ``torch.cuda``. accelerate's ``Accelerator.save_state``/``load_state``
had the same gap (its RNG file, ``random_states_<process>.pkl``, knows CUDA, XPU, MLU, HPU,
...), closed the same way with a ``"torch_tpu_manual_seed"`` entry.

accelerate applies FSDP only to the device types it knows as GPUs: the Trainer's
``fsdp=...`` on tpu (as on the CPU) trains with DDP, a replicated model. torchtpu warns once
where that happens, and says what shards.

Neither library is imported here: each extension is applied when its module
(``accelerate.state``, ``accelerate.checkpointing``, ``transformers.trainer``,
``transformers.utils.import_utils``) is first imported, or at once if it already was.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import tpu_is_current_accelerator
from .on_import import Extension, extend_on_import

_STATE_MODULE = "accelerate.state"
_CHECKPOINTING_MODULE = "accelerate.checkpointing"
_TRAINER_MODULE = "transformers.trainer"
_IMPORT_UTILS_MODULE = "transformers.utils.import_utils"
# the entry accelerate's RNG file gets, named as accelerate names CUDA's ("torch_cuda_manual_seed")
_ACCELERATE_TPU_KEY = "torch_tpu_manual_seed"


def extend_default_device(state_module: Any) -> None:
    """Wrap ``state_module.PartialState.default_device`` (once)."""
    cls = getattr(state_module, "PartialState", None)
    original = getattr(cls, "default_device", None) if cls is not None else None
    if not isinstance(original, property) or getattr(original.fget, "_torchtpu", False):
        return  # an accelerate without this property: leave it alone

    def default_device(self: Any) -> torch.device:
        device = original.fget(self)
        if device.type == "cpu" and tpu_is_current_accelerator():
            return torch.device("tpu", torch.accelerator.current_device_index())
        return device

    default_device._torchtpu = True  # type: ignore[attr-defined]
    cls.default_device = property(default_device, doc=original.__doc__)
    extend_distributed_setup(state_module)
    extend_fsdp_notice(state_module)


def extend_distributed_setup(state_module: Any) -> None:
    """Wrap ``PartialState._prepare_backend`` and ``set_device`` (once): under torchrun
    (``LOCAL_RANK`` set) accelerate picks a backend and a distributed type only for the
    devices it knows, and for any other device answered "no distributed training": each
    rank of ``torchrun --nproc-per-node=2`` then trained alone, on its own data, as process
    0 of 1, silently. For tpu it now picks torch.distributed's "tpu" backend and puts each
    process on its local rank's tpu device. The distributed type is accelerate's
    MULTI_CPU: its DDP is ``DistributedDataParallel(model)``, which follows the module's
    own device, where MULTI_GPU's passes ``device_ids=[local rank]`` and so assumes every
    process sees all devices (on the cpu platform each process has one tpu device, and rank
    1 asked for tpu:1); its collectives, samplers and autocast (``state.device.type``) are
    those of the other multi-process types."""
    cls, kinds = state_module.PartialState, getattr(state_module, "DistributedType", None)
    prepare, set_device = getattr(cls, "_prepare_backend", None), getattr(cls, "set_device", None)
    if prepare is None or set_device is None or not hasattr(kinds, "MULTI_CPU"):
        return  # an accelerate without these: leave it alone

    def _prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None) -> Any:
        chosen, kind = prepare(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if kind == kinds.NO and launched and not cpu and tpu_is_current_accelerator():
            return backend or "tpu", kinds.MULTI_CPU
        return chosen, kind

    def _set_device(self: Any) -> None:
        if self.device is None and self.backend is not None and self.backend.split(":")[-1] == "tpu":
            self.device = torch.device("tpu", self.local_process_index % torch.tpu.device_count())
            torch.tpu.set_device(self.device)
            return
        set_device(self)

    cls._prepare_backend, cls.set_device = _prepare_backend, _set_device


def extend_fsdp_notice(state_module: Any) -> None:
    """Wrap ``AcceleratorState.__init__`` (once) to warn where FSDP was asked for on tpu.
    accelerate turns FSDP on (an ``fsdp_plugin``, as the Trainer's ``fsdp=...`` passes, or
    ``ACCELERATE_USE_FSDP`` from ``accelerate launch --use_fsdp``) only for the device types
    it knows as GPUs; for MULTI_CPU, the CPU's type and the one tpu gets, it trains with DDP,
    silently. The numbers are the same, but every rank holds the whole model."""
    cls, kinds = getattr(state_module, "AcceleratorState", None), getattr(state_module, "DistributedType", None)
    original = getattr(cls, "__init__", None)
    if original is None or not hasattr(kinds, "MULTI_CPU") or getattr(original, "_torchtpu", False):
        return

    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        plugin = signature.bind(self, *args, **kwargs).arguments.get("fsdp_plugin")
        asked = plugin is not None or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if asked and self.distributed_type == kinds.MULTI_CPU and self.device.type == "tpu" and not __init__.warned:
            __init__.warned = True  # once per process: accelerate builds this shared state again and again
            warnings.warn(
                "torchtpu: accelerate applies FSDP only to the devices it knows as GPUs, so on tpu (as on the CPU) "
                "it trains with DDP: the model is replicated on every rank, not sharded (the numbers are the same). "
                "To shard it, use PyTorch's FSDP directly (torch.distributed.fsdp.fully_shard or "
                "FullyShardedDataParallel), or Lightning's ModelParallelStrategy.",
                stacklevel=2,
            )

    __init__._torchtpu = True  # type: ignore[attr-defined]
    __init__.warned = False  # type: ignore[attr-defined]
    cls.__init__ = __init__


def extend_rng_checkpoints(trainer_module: Any) -> None:
    """Wrap ``trainer_module.Trainer._save_rng_state`` and ``_load_rng_state`` (once)."""
    cls = getattr(trainer_module, "Trainer", None)
    save, load = getattr(cls, "_save_rng_state", None), getattr(cls, "_load_rng_state", None)
    if save is None or load is None or getattr(save, "_torchtpu", False):
        return  # a transformers without these methods: leave it alone

    def read(path: str) -> dict[str, Any]:  # as the Trainer reads it (weights only; numpy's state allowed)
        with trainer_module.safe_globals():
            return torch.load(path, weights_only=True)

    def _save_rng_state(self: Any, output_dir: str) -> None:
        save(self, output_dir)
        _add_tpu_rng_state(_rng_file(self, output_dir), "tpu", read, every_device=_distributed(self, trainer_module))

    def _load_rng_state(self: Any, checkpoint: str | None) -> None:
        load(self, checkpoint)
        if checkpoint is not None:
            _restore_tpu_rng_state(_rng_file(self, checkpoint), "tpu", read, every_device=_distributed(self, trainer_module))

    _save_rng_state._torchtpu = True  # type: ignore[attr-defined]
    cls._save_rng_state, cls._load_rng_state = _save_rng_state, _load_rng_state


def _rng_file(trainer: Any, directory: str) -> str:
    """The file ``Trainer._save_rng_state`` writes in ``directory`` and ``_load_rng_state``
    reads (transformers 5.23): one per process when training on several."""
    name = "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"
    return os.path.join(directory, name)


def _distributed(trainer: Any, trainer_module: Any) -> bool:
    """The Trainer saves every device's state of the process when distributed (its CUDA rule)."""
    return trainer.args.parallel_mode == trainer_module.ParallelMode.DISTRIBUTED


def extend_accelerate_checkpoints(checkpointing: Any) -> None:
    """Wrap ``checkpointing.save_accelerator_state`` and ``load_accelerator_state`` (once),
    and rebind them in ``accelerate.accelerator`` if it imported them already."""
    save, load = getattr(checkpointing, "save_accelerator_state", None), getattr(checkpointing, "load_accelerator_state", None)
    if save is None or load is None or getattr(save, "_torchtpu", False):
        return
    save_signature, load_signature = inspect.signature(save), inspect.signature(load)

    def save_accelerator_state(*args: Any, **kwargs: Any) -> Any:
        output_dir = save(*args, **kwargs)
        path = _accelerate_rng_file(checkpointing, save_signature.bind(*args, **kwargs).arguments)
        _add_tpu_rng_state(path, _ACCELERATE_TPU_KEY, checkpointing.load, every_device=True)
        return output_dir

    def load_accelerator_state(*args: Any, **kwargs: Any) -> Any:
        overrides = load(*args, **kwargs)
        path = _accelerate_rng_file(checkpointing, load_signature.bind(*args, **kwargs).arguments)
        _restore_tpu_rng_state(path, _ACCELERATE_TPU_KEY, checkpointing.load, every_device=True)
        return overrides

    save_accelerator_state._torchtpu = True  # type: ignore[attr-defined]
    functools.update_wrapper(save_accelerator_state, save)
    functools.update_wrapper(load_accelerator_state, load)
    checkpointing.save_accelerator_state, checkpointing.load_accelerator_state = save_accelerator_state, load_accelerator_state
    accelerator = sys.modules.get("accelerate.accelerator")
    if accelerator is not None:  # it holds the functions by name
        accelerator.save_accelerator_state, accelerator.load_accelerator_state = save_accelerator_state, load_accelerator_state


def _accelerate_rng_file(checkpointing: Any, arguments: dict[str, Any]) -> str:
    """accelerate's RNG file of this call's directory and process (accelerate 1.15)."""
    directory = arguments.get("output_dir", arguments.get("input_dir"))
    return os.path.join(directory, f"{checkpointing.RNG_STATE_NAME}_{arguments['process_index']}.pkl")


def _add_tpu_rng_state(path: str, key: str, read: Callable[[str], dict[str, Any]], every_device: bool) -> None:
    """Add the tpu generator's state under ``key`` to the RNG file a library just wrote at
    ``path`` (read back with ``read``, the library's own loader): every device's state
    (``get_rng_state_all``) where the library saves CUDA's so, else the current device's."""
    if tpu_is_current_accelerator() and os.path.isfile(path):
        states = read(path)
        states[key] = torch.tpu.get_rng_state_all() if every_device else torch.tpu.get_rng_state()
        torch.save(states, path)


def _restore_tpu_rng_state(path: str, key: str, read: Callable[[str], dict[str, Any]], every_device: bool) -> None:
    """Restore the tpu generator from the RNG file at ``path``, if it has ``key``: a file
    written without this extension has not, and the library's own reproducibility caveat
    holds then."""
    if not tpu_is_current_accelerator() or not os.path.isfile(path):
        return
    state = read(path).get(key)
    if state is None:
        return
    if every_device:
        torch.tpu.set_rng_state_all(state)
    else:
        torch.tpu.set_rng_state(state)


def extend_flex_attention_switch(import_utils: Any) -> None:
    """Wrap ``import_utils.is_torch_flex_attn_available`` (once), where transformers said
    "not available" for any device named tpu -- Google's TorchTPU, whose tensors
    flex_attention refuses -- and raised "PyTorch Flex Attention is not supported on TPU"
    for ``attn_implementation="flex_attention"``. torchtpu's tpu runs flex_attention
    (integrations/flex_attention.py), so where it is the current accelerator the answer is
    torch's. ``transformers.utils`` re-exports the function: rebound there too when it has
    it already (transformers can be imported before torch, hence before torchtpu)."""
    original = getattr(import_utils, "is_torch_flex_attn_available", None)
    if original is None or getattr(original, "_torchtpu", False):
        return

    @functools.lru_cache
    def is_torch_flex_attn_available() -> bool:
        return import_utils.is_torch_available() if tpu_is_current_accelerator() else original()

    is_torch_flex_attn_available._torchtpu = True  # type: ignore[attr-defined]
    constant = getattr(import_utils, "_make_compile_constant", None)  # Dynamo folds the answer, as it folds the original
    wrapped = constant(is_torch_flex_attn_available) if constant is not None else is_torch_flex_attn_available
    import_utils.is_torch_flex_attn_available = wrapped
    utils = sys.modules.get("transformers.utils")
    if utils is not None and getattr(utils, "is_torch_flex_attn_available", None) is original:
        utils.is_torch_flex_attn_available = wrapped


# module name -> what extends it once loaded
_EXTENSIONS: dict[str, Extension] = {
    _STATE_MODULE: extend_default_device,
    _CHECKPOINTING_MODULE: extend_accelerate_checkpoints,
    _TRAINER_MODULE: extend_rng_checkpoints,
    _IMPORT_UTILS_MODULE: extend_flex_attention_switch,
}


def install() -> None:
    """Apply ``_EXTENSIONS`` now where their modules are loaded, else when first imported."""
    extend_on_import(_EXTENSIONS)
