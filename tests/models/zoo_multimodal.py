"""Vision-language zoo cases: a vision encoder whose image features replace the image
placeholder tokens of a decoder's input (LLaVA, PaliGemma, Qwen2-VL, Qwen2.5-VL,
Idefics3, Gemma 3) or feed its cross-attention layers (Mllama). Each sequence holds
exactly the number of placeholders the model expects for its images, the second one is
padded (attention mask zeros), and the labels ignore the placeholders and the padding
(-100), so the decoder's own cross-entropy trains both towers. Images are 32x32 with
8-pixel patches and every tower has one or two tiny layers, so each case takes seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .compare import ModelCase, zero_dropout
from .zoo import add

FAMILY = "multimodal"
VOCAB = 128
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TEXT_IDS = (4, 100)  # random text tokens come from here: never a special token below
IMAGE_ID = 120  # the image placeholder, inside the vocabulary (its logit and embedding exist)
# the other special tokens: image start/end markers (Qwen2-VL's vision_start/end, Gemma 3's
# boi/eoi), Qwen2-VL's video placeholder
START_ID, END_ID, VIDEO_ID = 121, 122, 123
IGNORE = -100  # the loss's ignore_index

Part = int | tuple[int, ...]  # a run of that many random text tokens, or those exact ids


def vlm_builder(
    model_class: str,
    config_class: str,
    vision: tuple[str, dict[str, Any]],
    text: tuple[str, dict[str, Any]],
    init: Callable[[nn.Module], None] | None = None,
    **config: Any,
) -> Callable[[str | None], nn.Module]:
    """A builder of ``transformers.<model_class>._from_config(<config_class>(vision_config=...,
    text_config=..., **config))``, the two sub-configs built from their classes (a dict
    would take the checkpoint's defaults for whatever it leaves out); ``init`` then
    re-initialises what the model's own initialisation leaves untrainable."""

    def build(attn: str | None) -> nn.Module:
        import transformers

        vision_config = getattr(transformers, vision[0])(**vision[1])
        text_config = getattr(transformers, text[0])(**text[1])
        cfg = zero_dropout(getattr(transformers, config_class)(vision_config=vision_config, text_config=text_config, **config))
        extra = {} if attn is None else {"attn_implementation": attn}
        model = getattr(transformers, model_class)._from_config(cfg, **extra)
        if init is not None:
            with torch.no_grad():
                init(model)
        return model

    return build


def _sequence(parts: tuple[Part, ...]) -> torch.Tensor:
    return torch.cat([torch.randint(*TEXT_IDS, (p,)) if isinstance(p, int) else torch.tensor(p) for p in parts])


def vlm_inputs(
    rows: list[tuple[Part, ...]],
    pixels: Callable[[], dict[str, Any]],
    extra: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]] | None = None,
) -> Callable[[], dict[str, Any]]:
    """Token ids, one row per layout in ``rows`` (the shorter right-padded with ``PAD_ID``
    and masked out), the image inputs from ``pixels``, and labels: the ids, with the
    placeholders, the markers and the padding ignored. ``extra(ids, mask)`` adds the
    model's own per-token inputs (token types, cross-attention masks) or replaces the labels."""

    def make() -> dict[str, Any]:
        seqs = [_sequence(parts) for parts in rows]
        length = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), length), PAD_ID)
        mask = torch.zeros(len(seqs), length, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        labels = ids.masked_fill((ids >= TEXT_IDS[1]) | (mask == 0), IGNORE)
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "labels": labels, **pixels()}
        if extra is not None:
            out.update(extra(ids, mask))
        return out

    return make


def images(*shape: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"pixel_values": torch.randn(*shape)}


def vlm(
    name: str,
    model_class: str,
    config_class: str,
    vision: tuple[str, dict[str, Any]],
    text: tuple[str, dict[str, Any]],
    inputs: Callable[[], dict[str, Any]],
    attn_implementations: tuple[str | None, ...] = (None, "sdpa", "eager"),
    fast: bool = False,
    init: Callable[[nn.Module], None] | None = None,
    **config: Any,
) -> None:
    builder = vlm_builder(model_class, config_class, vision, text, init, **config)
    add(ModelCase(name, FAMILY, builder, inputs, attn_implementations, fast))


# the towers' shared sizes: 32x32 images in 8x8 patches (a 4x4 grid, 16 patches), and a
# Llama-like decoder with grouped-query attention (head_dim 8)
SMALL_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
SMALL_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=PAD_ID,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
)
PATCHES = 16

# --- LLaVA: CLIP patches (the "default" strategy drops CLS) through an MLP projector ---
vlm(
    "llava",
    "LlavaForConditionalGeneration",
    "LlavaConfig",
    ("CLIPVisionConfig", dict(projection_dim=32, **SMALL_VISION)),
    ("LlamaConfig", SMALL_TEXT),
    vlm_inputs([((BOS_ID,), (IMAGE_ID,) * PATCHES, 6), ((BOS_ID,), (IMAGE_ID,) * PATCHES, 4)], images(2, 3, 32, 32)),
    # 8 s eagerly in a warm process (12 s as the first case of a fresh one)
    fast=True,
    image_token_index=IMAGE_ID,
    image_seq_length=PATCHES,
    vision_feature_select_strategy="default",
    # the last layer's features, not LLaVA's default -2: with two layers, -2 would leave
    # the second one out of the loss (no gradient to compare)
    vision_feature_layer=-1,
)


# --- PaliGemma: SigLIP patches, then a Gemma prefix-LM: the prefix (image, prompt) attends
# bidirectionally (token type 0), the suffix causally (type 1) and only it is trained ---
PREFIX = PATCHES + 4  # the image, BOS and a 3-token prompt


def _prefix_lm(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    suffix = (torch.arange(ids.shape[1]) >= PREFIX).long().expand_as(ids)
    return {"token_type_ids": suffix * mask, "labels": ids.masked_fill((suffix == 0) | (mask == 0), IGNORE)}


GEMMA_TEXT = dict(SMALL_TEXT, head_dim=8)  # Gemma's own default is 256
# SigLIP without its attention-pooling head, as PaliGemma and Gemma 3 have it (they take
# every patch, so a head would only add parameters without a gradient)
SIGLIP_PATCHES = dict(SMALL_VISION, vision_use_head=False)
vlm(
    "paligemma",
    "PaliGemmaForConditionalGeneration",
    "PaliGemmaConfig",
    ("SiglipVisionConfig", SIGLIP_PATCHES),
    ("GemmaConfig", GEMMA_TEXT),
    vlm_inputs(
        [((IMAGE_ID,) * PATCHES, (BOS_ID,), 3, 5), ((IMAGE_ID,) * PATCHES, (BOS_ID,), 3, 3)], images(2, 3, 32, 32), _prefix_lm
    ),
    image_token_index=IMAGE_ID,
    projection_dim=32,  # the projector's output: the text width
)


# --- Qwen2-VL and Qwen2.5-VL: pixel_values are the images' patches flattened into rows of
# channels x temporal_patch_size x patch x patch values (one row per patch, all images
# concatenated), image_grid_thw each image's (frames, rows, columns) of patches; every
# 2x2 patches merge into one token. Two images of different shapes: 32x32 (4 tokens) and
# 32x64 (8 tokens), so the 3D (M-RoPE) positions of the second differ in height and width ---
QWEN_GRID = [[1, 4, 4], [1, 4, 8]]
QWEN_PATCH_VALUES = 3 * 2 * 8 * 8


def _qwen_images() -> dict[str, Any]:
    patches = sum(t * h * w for t, h, w in QWEN_GRID)
    return {"pixel_values": torch.randn(patches, QWEN_PATCH_VALUES), "image_grid_thw": torch.tensor(QWEN_GRID)}


def _qwen_token_types(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    # which tokens are image placeholders (1): M-RoPE gives them 3D positions
    return {"mm_token_type_ids": (ids == IMAGE_ID).int()}


QWEN_INPUTS = vlm_inputs(
    [(2, (START_ID,), (IMAGE_ID,) * 4, (END_ID,), 6), (2, (START_ID,), (IMAGE_ID,) * 8, (END_ID,), 1)],
    _qwen_images,
    _qwen_token_types,
)
QWEN_TOKENS = dict(image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, vision_start_token_id=START_ID, vision_end_token_id=END_ID)
# M-RoPE splits each head's 4 rotary frequencies into temporal, height and width sections
QWEN_TEXT = dict(SMALL_TEXT, rope_parameters=dict(rope_type="default", mrope_section=[2, 1, 1]))
QWEN_VISION = dict(depth=2, num_heads=2, patch_size=8, spatial_merge_size=2, temporal_patch_size=2)
vlm(
    "qwen2-vl",
    "Qwen2VLForConditionalGeneration",
    "Qwen2VLConfig",
    ("Qwen2VLVisionConfig", dict(embed_dim=32, hidden_size=32, mlp_ratio=2, **QWEN_VISION)),
    ("Qwen2VLTextConfig", QWEN_TEXT),
    QWEN_INPUTS,
    **QWEN_TOKENS,
)
vlm(
    "qwen2.5-vl",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2_5_VLConfig",
    # windows of 32x32 pixels (2x2 merged tokens) in the first layer, full attention in the
    # second: the 32x64 image splits into two windows
    (
        "Qwen2_5_VLVisionConfig",
        dict(hidden_size=32, intermediate_size=64, out_hidden_size=32, window_size=32, fullatt_block_indexes=[1], **QWEN_VISION),
    ),
    ("Qwen2_5_VLTextConfig", QWEN_TEXT),
    QWEN_INPUTS,
    **QWEN_TOKENS,
)


# --- Idefics3: SigLIP-like patches, pixel-shuffled 2x2 into one token (4 per image). Up to
# two images per sample, padded: the first sample's second image is 32x24 (its last rows
# masked by pixel_attention_mask, whole patch rows out of the vision attention), the second
# sample has one image and an all-zero padding image that the model drops ---
IDEFICS_TOKENS = PATCHES // 4


def _idefics_images() -> dict[str, Any]:
    pixels = torch.randn(2, 2, 3, 32, 32)
    mask = torch.ones(2, 2, 32, 32, dtype=torch.bool)
    mask[0, 1, 24:] = False
    mask[1, 1] = False
    pixels = pixels * mask[:, :, None]
    return {"pixel_values": pixels, "pixel_attention_mask": mask}


# <fake_token_around_image> (START_ID) before each image and after the last
IDEFICS_IMAGE = ((START_ID,), (IMAGE_ID,) * IDEFICS_TOKENS)
vlm(
    "idefics3",
    "Idefics3ForConditionalGeneration",
    "Idefics3Config",
    ("Idefics3VisionConfig", SMALL_VISION),
    ("LlamaConfig", SMALL_TEXT),
    vlm_inputs(
        [((BOS_ID,), 2, *IDEFICS_IMAGE, *IDEFICS_IMAGE, (START_ID,), 5), ((BOS_ID,), 2, *IDEFICS_IMAGE, (START_ID,), 6)],
        _idefics_images,
    ),
    image_token_id=IMAGE_ID,
    scale_factor=2,
)


# --- Gemma 3: SigLIP patches average-pooled 2x2 into 4 tokens between boi/eoi markers;
# the image tokens attend to each other bidirectionally (token type 1) inside the causal,
# partly sliding-window, text attention ---
GEMMA3_TOKENS = 4


def _image_token_types(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    return {"token_type_ids": (ids == IMAGE_ID).long()}


def _random_projection(model: nn.Module) -> None:
    # Gemma 3 initialises its image projection to zeros, which would leave the whole vision
    # tower without a gradient: draw it as the other linear layers are
    nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.02)


vlm(
    "gemma3-vl",
    "Gemma3ForConditionalGeneration",
    "Gemma3Config",
    ("SiglipVisionConfig", SIGLIP_PATCHES),
    (
        "Gemma3TextConfig",
        dict(GEMMA_TEXT, sliding_window=4, query_pre_attn_scalar=8, layer_types=["sliding_attention", "full_attention"]),
    ),
    vlm_inputs(
        [
            ((BOS_ID, START_ID), (IMAGE_ID,) * GEMMA3_TOKENS, (END_ID,), 6),
            ((BOS_ID, START_ID), (IMAGE_ID,) * GEMMA3_TOKENS, (END_ID,), 4),
        ],
        images(2, 3, 32, 32),
        _image_token_types,
    ),
    init=_random_projection,
    mm_tokens_per_image=GEMMA3_TOKENS,
    boi_token_index=START_ID,
    eoi_token_index=END_ID,
    image_token_index=IMAGE_ID,
)


# --- Mllama: one <|image|> token; the image (up to two 32x32 tiles, a CLS token each, the
# local encoder's intermediate layers concatenated to the global encoder's output) enters
# through the decoder's cross-attention layer (layer 1). The first sample's image has two
# tiles (aspect ratio 1x2), the second's one (1x1, the second tile masked) ---
def _mllama_images() -> dict[str, Any]:
    return {
        "pixel_values": torch.randn(2, 1, 2, 3, 32, 32),
        "aspect_ratio_ids": torch.tensor([[2], [1]]),  # 1 + the index in supported_aspect_ratios
        "aspect_ratio_mask": torch.tensor([[[1, 1]], [[1, 0]]]),
    }


def _open_gates(model: nn.Module) -> None:
    # Mllama initialises its tanh gates to zero (the cross-attention layer's attention and
    # MLP, the tile embeddings'), which closes the decoder's only path to the image: no
    # gradient would reach the vision model. Half open (tanh(0.5) = 0.46), as trained.
    for name, param in model.named_parameters():
        if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate", "embedding.gate")):
            param.fill_(0.5)


def _cross_attention_mask(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    # every token from the image token on sees the image's real tiles; BOS before it sees
    # nothing (a fully masked row, which the model zeroes)
    after = (torch.arange(ids.shape[1]) >= 1).long()[None, :, None, None]
    return {"cross_attention_mask": after * torch.tensor([[[1, 1]], [[1, 0]]])[:, None]}


vlm(
    "mllama",
    "MllamaForConditionalGeneration",
    "MllamaConfig",
    (
        "MllamaVisionConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_global_layers=1,
            attention_heads=2,
            image_size=32,
            patch_size=8,
            max_num_tiles=2,
            supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
            intermediate_layers_indices=[0, 1],
            vision_output_dim=32 * 3,  # the output and the two intermediate layers
        ),
    ),
    ("MllamaTextConfig", dict(SMALL_TEXT, cross_attention_layers=[1])),
    vlm_inputs([((BOS_ID, IMAGE_ID), 7), ((BOS_ID, IMAGE_ID), 5)], _mllama_images, _cross_attention_mask),
    init=_open_gates,
    image_token_index=IMAGE_ID,
)
