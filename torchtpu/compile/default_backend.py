"""``torch.compile(model)``, PyTorch's default backend (inductor), on tpu tensors.

Inductor generates kernels per device type, and PyTorch 2.13 registers Pallas code
generation for the device type "tpu" (Google's TorchTPU, the ``torch_tpu`` package). A graph
of torchtpu's tpu tensors compiled the default way therefore failed deep in inductor with
``ModuleNotFoundError: No module named 'torch_tpu'`` -- ``torch.compile(model)``,
``model.compile()`` and the Hugging Face Trainer's ``torch_compile=True`` alike. On CUDA
none of them needs a backend argument.

So the default backend hands a graph that computes on tpu to backend "tpu": the same XLA
programs as ``torch.compile(model, backend="tpu")``. Graphs on other devices go to
inductor as before. Inductor's own settings (``mode="max-autotune"``,
``mode="reduce-overhead"``'s CUDA graphs, ``options={...}``) are about inductor's code
generation; they do not apply to XLA's, and a warning says so once.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

_warned = [False]


def install() -> None:
    """Wrap ``torch._TorchCompileInductorWrapper.__call__`` (once): torch.compile's
    "inductor" backend object, which Dynamo calls with each graph."""
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    original = cls.__dict__.get("__call__") if cls is not None else None
    if original is None or getattr(original, "_torchtpu", False):
        return  # a torch without this wrapper: leave it alone

    def __call__(self: Any, model_: torch.fx.GraphModule, inputs_: Sequence[Any], **kwargs: Any) -> Any:
        if not computes_on_tpu(model_, inputs_):
            return original(self, model_, inputs_, **kwargs)
        if getattr(self, "config", None) and not _warned[0]:
            _warned[0] = True
            warnings.warn(
                f"torchtpu: torch.compile's inductor settings {sorted(self.config)} do not apply on tpu: "
                "the graph compiles with backend 'tpu' (XLA), as torch.compile(model, backend='tpu') does",
                stacklevel=2,
            )
        from .backend import tpu_backend

        return tpu_backend(model_, inputs_)

    __call__._torchtpu = True  # type: ignore[attr-defined]
    cls.__call__ = __call__


def computes_on_tpu(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether a graph takes tpu tensors (parameters are inputs too) or makes any."""
    if any(_is_tpu_tensor(t) for t in inputs):
        return True
    # Dynamo's graphs record each node's fake value as "example_value", AOTAutograd's as "val"
    return any(_is_tpu_tensor(node.meta.get("example_value", node.meta.get("val"))) for node in gm.graph.nodes)


def _is_tpu_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "tpu"
