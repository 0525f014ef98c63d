"""torchvision's image classifiers in the zoo: plain PyTorch models (torchvision.models,
randomly initialised, 10 classes) on 4 random 64x64 images, judged like every other case
(eval forward, gradients of a fixed projection of the logits, one SGD step). Registered only
when torchvision is installed (``pip install -e '.[vision]'``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .compare import ModelCase
from .zoo import add

FAMILY = "torchvision"
NUM_CLASSES = 10

# The C++ operators torchvision's own Python registers fake kernels for at import
# (torchvision/_meta_registrations.py). PyPI's torchvision 0.28.0 wheel carries a C++
# extension built against another build of torch 2.13.0 than the CPU one these tests run
# on; it does not load, these operators do not exist, and ``import torchvision`` raises
# "operator torchvision::nms does not exist". The classifiers below never call them, so
# their schemas are declared (no kernels) and the import goes on.
_DETECTION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, "
    "SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_library: torch.library.Library | None = None  # kept alive: the declared schemas live as long as it


def _torchvision_models() -> Any:
    """``torchvision.models``, or None when torchvision is not installed."""
    global _library
    try:
        return importlib.import_module("torchvision.models")
    except ModuleNotFoundError:
        return None
    except RuntimeError as e:
        if "torchvision::" not in str(e) or _library is not None:
            raise
    for name in [m for m in list(sys.modules) if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the failed import's half-initialised modules
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _DETECTION_OPS:
        _library.define(schema)
    return importlib.import_module("torchvision.models")


def _no_dropout(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth draw different random numbers on tpu than on the CPU:
    every such probability (``p``) is set to 0."""
    for module in model.modules():
        if isinstance(getattr(module, "p", None), float):
            module.p = 0.0
    return model


def _builder(name: str, **kwargs: Any) -> Callable[[str | None], nn.Module]:
    def build(attn: str | None) -> nn.Module:
        return _no_dropout(getattr(_torchvision_models(), name)(num_classes=NUM_CLASSES, **kwargs))

    return build


def _images() -> dict[str, Any]:
    # 4 images, not 2: a train-mode BatchNorm over 2 images of a 2x2 map normalises 8
    # values, and a pre-activation within float32 rounding of a ReLU's or max-pool's
    # boundary flips the gradient of a whole layer by chance (ShuffleNet at 2 images:
    # perturbing every float64 weight by a relative 1e-7 moved its last stage's input
    # gradient by 7.7% of its largest value; float32 runs land on either side, the CPU's too)
    return {"x": torch.randn(4, 3, 64, 64)}


CLASSIFIERS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    # name, builder arguments, fast (also in `make test`)
    ("mobilenet_v3_small", {}, False),
    ("mobilenet_v2", {}, False),
    ("squeezenet1_1", {}, False),
    ("shufflenet_v2_x0_5", {}, False),
    ("mnasnet0_5", {}, False),
    ("efficientnet_b0", {}, False),
    ("regnet_y_400mf", {}, False),
    ("resnet18", {}, True),  # BatchNorm, residuals, max-pooling: the first model a user tries (20 s in all modes)
    ("resnext50_32x4d", {}, False),
    ("googlenet", {"aux_logits": False, "init_weights": True}, False),
    ("densenet121", {}, False),
    ("convnext_tiny", {}, False),
    ("swin_t", {}, False),
    ("vit_b_16", {"image_size": 64}, False),
)

if _torchvision_models() is not None:
    for _name, _kwargs, _fast in CLASSIFIERS:
        add(ModelCase(f"tv-{_name}", FAMILY, _builder(_name, **_kwargs), _images, attn_implementations=(None,), fast=_fast))
