"""Vision zoo cases: image classifiers (with labels, so the head's own cross-entropy is
trained), contrastive image-text models (SigLIP, CLIP with ``return_loss=True``) and DETR
(with box labels, so its Hungarian-matching loss is trained). Images are small (32x32 or
64x64) and every model has one or two tiny stages, so each case takes seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .compare import ModelCase, zero_dropout
from .zoo import add

FAMILY = "vision"
NUM_LABELS = 3
NO_ATTENTION = (None,)  # convolutional models: no attn_implementation to choose
PAD_ID, EOS_ID = 0, 3  # not 2: CLIP treats eos_token_id == 2 as "pool at the largest id"


def vision_builder(
    model_class: str, config_class: str, sub_configs: dict[str, tuple[str, dict[str, Any]]] | None = None, **config: Any
) -> Callable[[str | None], nn.Module]:
    """A builder of ``transformers.<model_class>._from_config(<config_class>(**config))``;
    ``sub_configs`` maps a config argument to (config class, its arguments) — e.g. DETR's
    ResNet backbone — so that nested configs are built from classes, not dicts."""

    def build(attn: str | None) -> nn.Module:
        import transformers

        kwargs = dict(config)
        for key, (sub_class, sub_kwargs) in (sub_configs or {}).items():
            kwargs[key] = getattr(transformers, sub_class)(**sub_kwargs)
        cfg = zero_dropout(getattr(transformers, config_class)(**kwargs))
        extra = {} if attn is None else {"attn_implementation": attn}
        return getattr(transformers, model_class)._from_config(cfg, **extra)

    return build


def image_inputs(
    size: int = 32, batch: int = 2, labels: bool = True, channels_last: bool = False, **extra: Any
) -> Callable[[], dict[str, Any]]:
    """Random ``pixel_values`` (and class labels for the classification head's loss)."""

    def make() -> dict[str, Any]:
        pixels = torch.randn(batch, 3, size, size)
        if channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        out: dict[str, Any] = {"pixel_values": pixels}
        if labels:
            # distinct labels: at initialisation every image gets nearly the same logits, so
            # equal labels give every sample the same gradient, which a train-mode
            # BatchNorm's backward then cancels (mean subtraction) down to rounding noise
            out["labels"] = torch.arange(batch) % NUM_LABELS
        out.update({k: v() if callable(v) else v for k, v in extra.items()})
        return out

    return make


def image_text_inputs(
    vocab: int, size: int = 32, batch: int = 2, length: int = 7, padded: bool = True
) -> Callable[[], dict[str, Any]]:
    """Images and token ids (no tokenizer: random ids) for a contrastive loss. Each text
    ends with ``EOS_ID`` (CLIP pools there); with ``padded`` the last one is two tokens
    shorter, padded with ``PAD_ID`` and masked out."""

    def make() -> dict[str, Any]:
        ids = torch.randint(EOS_ID + 1, vocab, (batch, length))
        mask = torch.ones(batch, length, dtype=torch.long)
        if padded:
            mask[-1, length - 2 :] = 0
        ids = ids.masked_fill(mask == 0, PAD_ID)
        ids[torch.arange(batch), mask.sum(1) - 1] = EOS_ID
        out: dict[str, Any] = {"pixel_values": torch.randn(batch, 3, size, size), "input_ids": ids, "return_loss": True}
        if padded:
            out["attention_mask"] = mask
        return out

    return make


def detection_inputs(size: int = 64, batch: int = 2, objects: tuple[int, ...] = (2, 1)) -> Callable[[], dict[str, Any]]:
    """Images and per-image targets (class labels, normalized cx/cy/w/h boxes) for DETR."""

    def make() -> dict[str, Any]:
        targets = []
        for n in objects:
            centers = torch.rand(n, 2) * 0.5 + 0.25
            sizes = torch.rand(n, 2) * 0.3 + 0.1
            targets.append({"class_labels": torch.randint(0, NUM_LABELS, (n,)), "boxes": torch.cat([centers, sizes], dim=1)})
        return {"pixel_values": torch.randn(batch, 3, size, size), "labels": targets}

    return make


def classifier(
    name: str,
    model_class: str,
    config_class: str,
    inputs: Callable[[], dict[str, Any]] | None = None,
    attention: bool = True,
    fast: bool = False,
    **config: Any,
) -> None:
    add(
        ModelCase(
            name,
            FAMILY,
            vision_builder(model_class, config_class, num_labels=NUM_LABELS, **config),
            inputs or image_inputs(),
            attn_implementations=(None, "sdpa", "eager") if attention else NO_ATTENTION,
            fast=fast,
        )
    )


SMALL_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8)
SMALL_TEXT = dict(
    vocab_size=96,
    bos_token_id=1,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=16,
)

# --- transformers ---
classifier("vit", "ViTForImageClassification", "ViTConfig", fast=True, **SMALL_VIT)
classifier(
    "dinov2",
    "Dinov2ForImageClassification",
    "Dinov2Config",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=2,
    image_size=32,
    patch_size=8,
)
classifier("siglip-vision", "SiglipForImageClassification", "SiglipConfig", vision_config=SMALL_VIT, text_config=SMALL_TEXT)
add(
    ModelCase(
        "siglip",
        FAMILY,
        vision_builder("SiglipModel", "SiglipConfig", vision_config=SMALL_VIT, text_config=SMALL_TEXT),
        image_text_inputs(96, padded=False),
    )
)
classifier(
    "clip-vision", "CLIPForImageClassification", "CLIPConfig", vision_config=SMALL_VIT, text_config=SMALL_TEXT, projection_dim=16
)
add(
    ModelCase(
        "clip",
        FAMILY,
        vision_builder("CLIPModel", "CLIPConfig", vision_config=SMALL_VIT, text_config=SMALL_TEXT, projection_dim=16),
        image_text_inputs(96),
    )
)
classifier(
    "swin",
    "SwinForImageClassification",
    "SwinConfig",
    image_size=32,
    patch_size=4,
    embed_dim=16,
    depths=[1, 1],
    num_heads=[2, 2],
    window_size=4,
)

# --- convolutional ---
classifier(
    "convnext",
    "ConvNextForImageClassification",
    "ConvNextConfig",
    attention=False,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    num_stages=2,
)
classifier(
    "resnet",
    "ResNetForImageClassification",
    "ResNetConfig",
    attention=False,
    embedding_size=8,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    layer_type="bottleneck",
)
classifier(
    "resnet-channels-last",
    "ResNetForImageClassification",
    "ResNetConfig",
    inputs=image_inputs(channels_last=True),
    attention=False,
    fast=True,
    embedding_size=8,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    layer_type="basic",
)
# The MobileNets take 128x128 images, not 64x64: their 32x downsampling leaves a 4x4 map
# (2x2 at 64), so the deepest train-mode BatchNorms normalise 32 values per channel, not 8.
# At 8, each BatchNorm backward cancels most of its input and float32 gradients of the
# stem were ~1e-3 (relative) from float64 on both devices alike (MobileNetV2: over the 21
# elements missing rtol 1e-3, sum |cpu-f64| 3.5e-3, |tpu-f64| 5.0e-3; MobileNetV1: a ReLU6
# input within rounding of its kink, |cpu-f64| 0.443, |tpu-f64| 0.444), which no device
# could pass. At 128 both match the CPU (seeds 0/1, 5 and 9 checked).
classifier(
    "mobilenet-v2",
    "MobileNetV2ForImageClassification",
    "MobileNetV2Config",
    inputs=image_inputs(128),
    attention=False,
    depth_multiplier=0.25,
    image_size=128,
    finegrained_output=False,
)
classifier(
    "mobilevit",
    "MobileViTForImageClassification",
    "MobileViTConfig",
    inputs=image_inputs(64),
    attention=False,
    image_size=64,
    hidden_sizes=[16, 24, 32],
    neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
    num_attention_heads=2,
)
classifier(
    "efficientnet",
    "EfficientNetForImageClassification",
    "EfficientNetConfig",
    inputs=image_inputs(64),
    attention=False,
    image_size=64,
    width_coefficient=0.25,
    depth_coefficient=0.3,
    hidden_dim=320,  # the head's BatchNorm width: round_filters(1280) at width 0.25
)
classifier(
    "levit",
    "LevitForImageClassification",
    "LevitConfig",
    attention=False,
    image_size=64,
    hidden_sizes=[16, 32, 48],
    num_attention_heads=[2, 4, 4],
    depths=[1, 1, 1],
    key_dim=[8, 8, 8],
    mlp_ratio=[2, 2, 2],
    attention_ratio=[2, 2, 2],
    inputs=image_inputs(64, batch=8),
)

# --- detection ---
add(
    ModelCase(
        "detr",
        FAMILY,
        vision_builder(
            "DetrForObjectDetection",
            "DetrConfig",
            sub_configs={
                "backbone_config": (
                    "ResNetConfig",
                    dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"]),
                )
            },
            num_labels=NUM_LABELS,
            num_queries=5,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            # at the default init_std (0.02) every query predicts the same box to within
            # 6e-8, so the Hungarian matching is decided by rounding (float32 and float64
            # on the CPU already match different queries); at 0.2 the boxes spread by ~3e-3
            init_std=0.2,
        ),
        detection_inputs(),
    )
)

# --- more transformers vision backbones ---
classifier("deit", "DeiTForImageClassification", "DeiTConfig", **SMALL_VIT)
classifier(
    "beit", "BeitForImageClassification", "BeitConfig", use_relative_position_bias=True, use_mean_pooling=True, **SMALL_VIT
)
classifier(
    "data2vec-vision",
    "Data2VecVisionForImageClassification",
    "Data2VecVisionConfig",
    use_relative_position_bias=True,
    **SMALL_VIT,
)
classifier(
    "dinov2-registers",
    "Dinov2WithRegistersForImageClassification",
    "Dinov2WithRegistersConfig",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=2,
    image_size=32,
    patch_size=8,
    num_register_tokens=2,
)
classifier("vit-msn", "ViTMSNForImageClassification", "ViTMSNConfig", **SMALL_VIT)
classifier("ijepa", "IJepaForImageClassification", "IJepaConfig", **SMALL_VIT)
add(
    ModelCase(
        "vit-mae",
        FAMILY,
        vision_builder(
            "ViTMAEForPreTraining",
            "ViTMAEConfig",
            decoder_hidden_size=32,
            decoder_num_hidden_layers=1,
            decoder_num_attention_heads=4,
            decoder_intermediate_size=64,
            **SMALL_VIT,
        ),
        # the random patch mask comes from `noise` (else torch.rand, which differs by device)
        image_inputs(labels=False, noise=lambda: torch.rand(2, 16)),
    )
)
classifier(
    "swinv2",
    "Swinv2ForImageClassification",
    "Swinv2Config",
    image_size=32,
    patch_size=4,
    embed_dim=16,
    depths=[1, 1],
    num_heads=[2, 2],
    window_size=4,
)
classifier(
    "hiera",
    "HieraForImageClassification",
    "HieraConfig",
    attention=False,
    image_size=[64, 64],
    patch_size=[7, 7],
    patch_stride=[4, 4],
    patch_padding=[3, 3],
    embed_dim=16,
    depths=[1, 1, 1, 1],
    num_heads=[1, 1, 2, 2],
    masked_unit_size=[8, 8],
    inputs=image_inputs(64),
)
classifier(
    "focalnet",
    "FocalNetForImageClassification",
    "FocalNetConfig",
    attention=False,
    image_size=32,
    patch_size=4,
    embed_dim=16,
    depths=[1, 1],
    focal_levels=[2, 2],
    focal_windows=[3, 3],
)
classifier(
    "pvt",
    "PvtForImageClassification",
    "PvtConfig",
    attention=False,
    image_size=32,
    num_encoder_blocks=2,
    depths=[1, 1],
    sequence_reduction_ratios=[2, 1],
    hidden_sizes=[16, 32],
    patch_sizes=[4, 2],
    strides=[4, 2],
    num_attention_heads=[1, 2],
    mlp_ratios=[2, 2],
)
classifier(
    "pvt-v2",
    "PvtV2ForImageClassification",
    "PvtV2Config",
    attention=False,
    image_size=32,
    num_encoder_blocks=2,
    depths=[1, 1],
    sr_ratios=[2, 1],
    hidden_sizes=[16, 32],
    patch_sizes=[7, 3],
    strides=[4, 2],
    num_attention_heads=[1, 2],
    mlp_ratios=[2, 2],
)
classifier(
    "segformer",
    "SegformerForImageClassification",
    "SegformerConfig",
    attention=False,
    num_encoder_blocks=2,
    depths=[1, 1],
    sr_ratios=[2, 1],
    hidden_sizes=[16, 32],
    patch_sizes=[7, 3],
    strides=[4, 2],
    num_attention_heads=[1, 2],
    mlp_ratios=[2, 2],
)
classifier(
    "cvt",
    "CvtForImageClassification",
    "CvtConfig",
    attention=False,
    embed_dim=[16, 32],
    num_heads=[1, 2],
    depth=[1, 2],
    patch_sizes=[7, 3],
    patch_stride=[4, 2],
    patch_padding=[2, 1],
    mlp_ratio=[2.0, 2.0],
    qkv_bias=[True, True],
    cls_token=[False, True],
    qkv_projection_method=["dw_bn", "dw_bn"],
    kernel_qkv=[3, 3],
    padding_kv=[1, 1],
    stride_kv=[2, 2],
    padding_q=[1, 1],
    stride_q=[1, 1],
    attention_drop_rate=[0.0, 0.0],
    drop_rate=[0.0, 0.0],
    drop_path_rate=[0.0, 0.0],
    inputs=image_inputs(64, batch=4),
)

# --- more convolutional ---
classifier(
    "convnext-v2",
    "ConvNextV2ForImageClassification",
    "ConvNextV2Config",
    attention=False,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    num_stages=2,
)
classifier(
    "regnet",
    "RegNetForImageClassification",
    "RegNetConfig",
    attention=False,
    embedding_size=8,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    groups_width=4,
    inputs=image_inputs(64),
)
classifier(
    "poolformer",
    "PoolFormerForImageClassification",
    "PoolFormerConfig",
    attention=False,
    num_encoder_blocks=2,
    depths=[1, 1],
    hidden_sizes=[16, 32],
    patch_sizes=[7, 3],
    strides=[4, 2],
    padding=[2, 1],
    mlp_ratio=2.0,
)
classifier(
    "mobilenet-v1",
    "MobileNetV1ForImageClassification",
    "MobileNetV1Config",
    attention=False,
    depth_multiplier=0.25,
    image_size=128,
    inputs=image_inputs(128),
)
classifier(
    "bit",
    "BitForImageClassification",
    "BitConfig",
    attention=False,
    embedding_size=8,
    hidden_sizes=[8, 16],
    depths=[1, 1],
    layer_type="bottleneck",
    num_groups=2,
    inputs=image_inputs(64),
)
