"""``torch.nn.attention.flex_attention`` on tpu.

flex_attention checks the device of its inputs against a fixed list (CUDA, CPU, HPU, MPS;
``_validate_device``) before anything runs, and refused tpu tensors. Past that check it is
ordinary PyTorch on tpu: in eager mode its higher-order op runs the dense reference
implementation (the score and mask modifications applied to the full score matrix) with
tpu ops and its autograd formula, and under ``torch.compile(backend="tpu")`` the same
dense form becomes part of the XLA program (torchtpu/compile/flex_attention.py). So the
check lets tpu through, with backward (the CPU refuses backward); every other device is
checked as before.

(transformers turned its ``attn_implementation="flex_attention"`` off for any device named
"tpu", for Google's TorchTPU; integrations/huggingface.py turns it back on for torchtpu's.)
"""

from __future__ import annotations

from typing import Any

import torch

from .on_import import extend_on_import

_MODULE = "torch.nn.attention.flex_attention"


def extend(module: Any) -> None:
    """Wrap ``module._validate_device`` (once)."""
    original = getattr(module, "_validate_device", None)
    if original is None or getattr(original, "_torchtpu", False):
        return  # a torch without this check: leave it alone

    def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "tpu":
            original(query, key, value)

    _validate_device._torchtpu = True  # type: ignore[attr-defined]
    module._validate_device = _validate_device


def install() -> None:
    extend_on_import({_MODULE: extend})
