"""torchvision's models in the zoo: plain PyTorch models (torchvision.models, randomly
initialised, 10 classes) -- image classifiers and segmentation models on 4 random 64x64
images, video classifiers on 4 clips of 4 32x32 frames, RAFT's optical flow on 2 pairs of
128x128 frames -- judged like every other case (eval forward, gradients of a fixed
projection of the outputs, one SGD step). Registered only when torchvision is installed
(``pip install -e '.[vision]'``)."""

from __future__ import annotations

import dataclasses
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


def _builder(name: str, kwargs: dict[str, Any], channels_last: bool) -> Callable[[str | None], nn.Module]:
    """``name``: a builder of ``torchvision.models`` (``"segmentation.fcn_resnet50"``)."""

    def build(attn: str | None) -> nn.Module:
        builder: Any = _torchvision_models()
        for part in name.split("."):
            builder = getattr(builder, part)
        model = _no_dropout(builder(**kwargs))
        return model.to(memory_format=torch.channels_last) if channels_last else model

    return build


def _in_channels_last(inputs: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        return {k: v.contiguous(memory_format=torch.channels_last) if isinstance(v, torch.Tensor) and v.dim() == 4 else v for k, v in inputs().items()}

    return make


def _images() -> dict[str, Any]:
    # 4 images, not 2: a train-mode BatchNorm over 2 images of a 2x2 map normalises 8
    # values, and a pre-activation within float32 rounding of a ReLU's or max-pool's
    # boundary flips the gradient of a whole layer by chance (ShuffleNet at 2 images:
    # perturbing every float64 weight by a relative 1e-7 moved its last stage's input
    # gradient by 7.7% of its largest value; float32 runs land on either side, the CPU's too)
    return {"x": torch.randn(4, 3, 64, 64)}


def _images_named_input() -> dict[str, Any]:
    return {"input": _images()["x"]}  # LRASPP.forward(input)


def _video() -> dict[str, Any]:
    return {"x": torch.randn(4, 3, 4, 32, 32)}  # 4 clips of 4 frames, 32x32


def _image_pairs() -> dict[str, Any]:
    # RAFT: two frames (its correlation pyramid needs sides of at least 128) and a few
    # refinement steps of its update GRU
    return {"image1": torch.randn(2, 3, 128, 128), "image2": torch.randn(2, 3, 128, 128), "num_flow_updates": 3}


@dataclasses.dataclass(frozen=True)
class TorchvisionModel:
    name: str  # the builder's name under torchvision.models
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    inputs: Callable[[], dict[str, Any]] = _images
    fast: bool = False  # also in `make test`
    channels_last: bool = False  # the model's weights and its image inputs

    @property
    def case_name(self) -> str:
        return f"tv-{self.name.rsplit('.', 1)[-1]}" + ("-channels-last" if self.channels_last else "")


CLASSES = {"num_classes": NUM_CLASSES}
NO_BACKBONE_WEIGHTS = {"num_classes": NUM_CLASSES, "weights_backbone": None}  # no download
MODELS: tuple[TorchvisionModel, ...] = (
    TorchvisionModel("mobilenet_v3_small", CLASSES),
    TorchvisionModel("mobilenet_v2", CLASSES),
    TorchvisionModel("squeezenet1_1", CLASSES),
    TorchvisionModel("shufflenet_v2_x0_5", CLASSES),
    TorchvisionModel("mnasnet0_5", CLASSES),
    TorchvisionModel("efficientnet_b0", CLASSES),
    TorchvisionModel("regnet_y_400mf", CLASSES),
    # BatchNorm, residuals, max-pooling: the first model a user tries (20 s in all modes)
    TorchvisionModel("resnet18", CLASSES, fast=True),
    TorchvisionModel("resnext50_32x4d", CLASSES),
    TorchvisionModel("googlenet", {**CLASSES, "aux_logits": False, "init_weights": True}),
    TorchvisionModel("densenet121", CLASSES),
    TorchvisionModel("convnext_tiny", CLASSES),
    TorchvisionModel("swin_t", CLASSES),
    TorchvisionModel("vit_b_16", {**CLASSES, "image_size": 64}),
    # channels-last (strides NHWC), as users train convolutional networks on GPUs: the same
    # values; ConvNeXt's LayerNorm permutes to channels-last and back
    TorchvisionModel("resnet18", CLASSES, channels_last=True),
    TorchvisionModel("mobilenet_v3_small", CLASSES, channels_last=True),
    TorchvisionModel("convnext_tiny", CLASSES, channels_last=True),
    # segmentation: dilated convolutions, ASPP's image pooling, bilinear upsampling
    TorchvisionModel("segmentation.lraspp_mobilenet_v3_large", NO_BACKBONE_WEIGHTS, _images_named_input),
    TorchvisionModel("segmentation.deeplabv3_mobilenet_v3_large", NO_BACKBONE_WEIGHTS),
    TorchvisionModel("segmentation.fcn_resnet50", NO_BACKBONE_WEIGHTS),
    # video: Conv3d, BatchNorm3d, (2+1)D factorised convolutions
    TorchvisionModel("video.r3d_18", CLASSES, _video),
    TorchvisionModel("video.r2plus1d_18", CLASSES, _video),
    # optical flow: correlation volumes, grid_sample lookups, a convolutional GRU
    TorchvisionModel("optical_flow.raft_small", {}, _image_pairs),
)

if _torchvision_models() is not None:
    for _model in MODELS:
        _inputs = _in_channels_last(_model.inputs) if _model.channels_last else _model.inputs
        _build = _builder(_model.name, _model.kwargs, _model.channels_last)
        add(ModelCase(_model.case_name, FAMILY, _build, _inputs, attn_implementations=(None,), fast=_model.fast))
