"""Zoo cases of the LLM family (decoder-only causal LMs, dense and mixture-of-experts) and
of the seq2seq family (encoder-decoder LMs trained through their decoder labels).

Every model is built from a small config (hidden 32-64, 2 layers) and trained on its own LM
loss. Some cases pad their batch on the left (what generation batches use), some on the
right, so the attention masks are exercised; padded label positions are -100, as a data
collator would set them. MoE configs route each token to 2 of 4 experts, so every expert
gets tokens and gradients (checked when the cases were written), and the models that have
a router auxiliary (load-balancing) loss add it to out.loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .compare import ModelCase
from .zoo import add, hf_builder

VOCAB = 96
LENGTH = 8
# what every Llama-like config below starts from: GQA with 4 query and 2 key/value heads
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
# a mixture of 4 experts, 2 per token, with its auxiliary (load-balancing) loss in out.loss
MOE = dict(num_experts=4, num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.01)


def padding_mask(padding: str | None, batch: int = 2, length: int = LENGTH) -> torch.Tensor | None:
    """1 for real tokens; the second row of the batch has 3 padding positions on the
    ``padding`` side ("left" or "right"); None: no mask."""
    if padding is None:
        return None
    mask = torch.ones(batch, length, dtype=torch.long)
    if padding == "left":
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    return mask


def lm_inputs(vocab: int = VOCAB, padding: str | None = None, length: int = LENGTH) -> Callable[[], dict[str, Any]]:
    """Causal-LM inputs: token ids, labels (the ids, -100 where padded) and the mask."""

    def make() -> dict[str, Any]:
        ids = torch.randint(1, vocab, (2, length))
        out: dict[str, Any] = {"input_ids": ids, "labels": ids.clone()}
        mask = padding_mask(padding, length=length)
        if mask is not None:
            out["attention_mask"] = mask
            out["labels"] = ids.masked_fill(mask == 0, -100)
        return out

    return make


def seq2seq_inputs(vocab: int = VOCAB, source: int = LENGTH, target: int = 5, decoder_start: int | None = None) -> Callable[[], dict[str, Any]]:
    """Encoder ids with right padding and decoder labels (the model shifts them right
    into its decoder inputs); padded label positions are -100. With ``decoder_start``,
    the decoder inputs are given too (the labels shifted right after that token, for
    models that do not derive them from the labels)."""

    def make() -> dict[str, Any]:
        ids = torch.randint(1, vocab, (2, source))
        mask = padding_mask("right", length=source)
        labels = torch.randint(1, vocab, (2, target))
        labels[1, -2:] = -100
        out = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}
        if decoder_start is not None:
            shifted = torch.cat([torch.full((2, 1), decoder_start), labels[:, :-1]], dim=1)
            out["decoder_input_ids"] = shifted.masked_fill(shifted == -100, 0)
        return out

    return make


def with_router_losses(inputs: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The inputs plus ``output_router_logits=True``, for models that add their router
    losses to out.loss only when a call asks for them."""
    return lambda: {**inputs(), "output_router_logits": True}


def with_random_routers(build: Callable[[str | None], nn.Module]) -> Callable[[str | None], nn.Module]:
    """Models whose router weights start at zero score every expert alike, so top-k picks
    among ties, whose order PyTorch leaves unspecified (the CPU's order differs from
    XLA's, lowest index first); a trained router has distinct scores, so give it
    small random weights."""

    def build_with_routers(attn: str | None) -> nn.Module:
        model = build(attn)
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.endswith("router.gate") and not module.weight.any():
                    module.weight.normal_(0.0, 0.2)
        return model

    return build_with_routers


def causal_lm(name: str, config_class: str, inputs: Callable[[], dict[str, Any]] | None = None, fast: bool = False, **config: Any) -> None:
    add(ModelCase(name, "LLM", hf_builder("AutoModelForCausalLM", config_class, **config), inputs or lm_inputs(), fast=fast))


# --- Llama-like decoders ---------------------------------------------------------------
causal_lm("qwen2", "Qwen2Config", lm_inputs(padding="left"), **DECODER)
causal_lm("qwen3", "Qwen3Config", lm_inputs(padding="right"), head_dim=16, **DECODER)
causal_lm("mistral", "MistralConfig", lm_inputs(padding="left"), sliding_window=4, **DECODER)
causal_lm("gemma", "GemmaConfig", lm_inputs(padding="right"), head_dim=8, **DECODER)
# soft-capped attention logits and final logits, every other layer a 4-token sliding window
causal_lm(
    "gemma2",
    "Gemma2Config",
    lm_inputs(padding="left"),
    fast=True,
    head_dim=8,
    sliding_window=4,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    query_pre_attn_scalar=8,
    layer_types=["sliding_attention", "full_attention"],
    **DECODER,
)
causal_lm(
    "gemma3",
    "Gemma3TextConfig",
    lm_inputs(padding="right"),
    head_dim=8,
    sliding_window=4,
    query_pre_attn_scalar=8,
    layer_types=["sliding_attention", "full_attention"],
    **DECODER,
)
causal_lm("stablelm", "StableLmConfig", lm_inputs(padding="left"), partial_rotary_factor=0.5, use_qkv_bias=True, **DECODER)
causal_lm("phi3", "Phi3Config", lm_inputs(padding="right"), pad_token_id=0, **DECODER)

# --- mixtures of experts -----------------------------------------------------------------
causal_lm("mixtral", "MixtralConfig", lm_inputs(padding="left"), num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.01, **DECODER)
causal_lm(
    "qwen3-moe",
    "Qwen3MoeConfig",
    lm_inputs(padding="right"),
    head_dim=16,
    moe_intermediate_size=32,
    decoder_sparse_step=1,
    norm_topk_prob=True,
    **MOE,
    **DECODER,
)
# multi-head latent attention (low-rank q and kv, a decoupled rotary part), the first
# layer dense, then 4 routed experts in 2 groups plus a shared expert
causal_lm(
    "deepseek-v3",
    "DeepseekV3Config",
    lm_inputs(padding="left"),
    moe_intermediate_size=32,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=2,
    first_k_dense_replace=1,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    **{**DECODER, "num_key_value_heads": 4},  # MLA expands its latent to every head's keys and values
)

# --- GPT-style decoders ------------------------------------------------------------------
causal_lm("gpt-j", "GPTJConfig", lm_inputs(padding="left"), vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)
causal_lm("gpt-neox", "GPTNeoXConfig", lm_inputs(padding="right"), vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.5, max_position_embeddings=64)
causal_lm("opt", "OPTConfig", lm_inputs(padding="right"), vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64)
# attention with linear position biases (alibi) instead of position embeddings
causal_lm("bloom", "BloomConfig", lm_inputs(padding="left"), vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
# multi-query attention: 4 query heads share one key/value head
causal_lm("falcon-mqa", "FalconConfig", lm_inputs(padding="right"), vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False)

# --- seq2seq -------------------------------------------------------------------------------
SMALL_T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0, pad_token_id=0)
add(ModelCase("t5", "seq2seq", hf_builder("AutoModelForSeq2SeqLM", "T5Config", **SMALL_T5), seq2seq_inputs()))
# gated-GELU feed-forward, untied LM head
add(ModelCase("mt5", "seq2seq", hf_builder("AutoModelForSeq2SeqLM", "MT5Config", feed_forward_proj="gated-gelu", tie_word_embeddings=False, **SMALL_T5), seq2seq_inputs()))

# --- more decoders that transformers ships --------------------------------------------------
# Llama-like configs (DECODER plus the architecture's own features)
LLAMA_LIKE: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "phi": ("PhiConfig", "left", dict(partial_rotary_factor=0.5, qk_layernorm=True)),
    "cohere": ("CohereConfig", "right", dict(use_qk_norm=True, logit_scale=0.5)),
    "cohere2": ("Cohere2Config", "left", dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "olmo": ("OlmoConfig", "right", dict(clip_qkv=0.5)),
    "olmo2": ("Olmo2Config", "left", {}),
    "olmo3": ("Olmo3Config", "right", dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "granite": ("GraniteConfig", "left", dict(embedding_multiplier=2.0, logits_scaling=4.0, residual_multiplier=0.5, attention_multiplier=0.25)),
    "starcoder2": ("Starcoder2Config", "right", dict(sliding_window=4, use_bias=True)),
    "persimmon": ("PersimmonConfig", "left", dict(qk_layernorm=True, num_key_value_heads=4)),
    "nemotron": ("NemotronConfig", "right", dict(partial_rotary_factor=0.5)),
    "smollm3": ("SmolLM3Config", "left", dict(no_rope_layer_interval=2, pad_token_id=0)),
    "ministral": ("MinistralConfig", "right", dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "glm": ("GlmConfig", "left", dict(head_dim=8, partial_rotary_factor=0.5, pad_token_id=0)),
    "glm4": ("Glm4Config", "right", dict(head_dim=8, partial_rotary_factor=0.5, pad_token_id=0)),
    "helium": ("HeliumConfig", "left", dict(head_dim=8)),
    "exaone4": ("Exaone4Config", "right", dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "arcee": ("ArceeConfig", "left", {}),
    "apertus": ("ApertusConfig", "right", {}),
    "ernie4_5": ("Ernie4_5Config", "left", dict(head_dim=8, use_bias=True)),
    "hunyuan-dense": ("HunYuanDenseV1Config", "right", dict(head_dim=8)),
    "seed-oss": ("SeedOssConfig", "left", dict(head_dim=8, attention_bias=True)),
    "diffllama": ("DiffLlamaConfig", "right", dict(head_dim=8)),
    "bitnet": ("BitNetConfig", "left", {}),
    "vaultgemma": ("VaultGemmaConfig", "right", dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "cwm": ("CwmConfig", "left", dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "nanochat": ("NanoChatConfig", "right", dict(final_logit_softcapping=15.0)),
}
for _name, (_config, _padding, _extra) in LLAMA_LIKE.items():
    causal_lm(_name, _config, lm_inputs(padding=_padding), **{**DECODER, **_extra})

# mixtures of experts: 4 experts, 2 per token
MOE_LIKE: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "qwen2-moe": ("Qwen2MoeConfig", "left", dict(MOE, moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1)),
    "olmoe": ("OlmoeConfig", "right", dict(MOE)),
    "granite-moe": ("GraniteMoeConfig", "left", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "granite-moe-shared": ("GraniteMoeSharedConfig", "right", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, shared_intermediate_size=32)),
    "phimoe": ("PhimoeConfig", "left", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, router_jitter_noise=0.0, input_jitter_noise=0.0)),
    "flex-olmo": ("FlexOlmoConfig", "right", dict(MOE, pad_token_id=0)),
    "ernie4_5-moe": ("Ernie4_5_MoeConfig", "left", dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1, moe_layer_start_index=0, output_router_logits=True)),
    "hunyuan-moe": ("HunYuanMoEV1Config", "right", dict(head_dim=8, num_experts=4, moe_topk=2)),
    "minimax-m2": ("MiniMaxM2Config", "left", dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "glm4-moe": ("Glm4MoeConfig", "right", dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=2, first_k_dense_replace=1, use_qk_norm=True)),
    "dots1": ("Dots1Config", "left", dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=2, first_k_dense_replace=1)),
    "gpt-oss": ("GptOssConfig", "right", dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4, output_router_logits=True)),
    "jetmoe": ("JetMoeConfig", "left", dict(kv_channels=8, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "deepseek-v2": (
        "DeepseekV2Config",
        "right",
        dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4),
    ),
    "llama4": ("Llama4TextConfig", "left", dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=4, no_rope_layer_interval=2)),
}
for _name, (_config, _padding, _extra) in MOE_LIKE.items():
    causal_lm(_name, _config, lm_inputs(padding=_padding), **{**DECODER, **_extra})

# GPT-style configs with their own field names
causal_lm("gpt-bigcode", "GPTBigCodeConfig", lm_inputs(padding="left"), vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True)
causal_lm("codegen", "CodeGenConfig", lm_inputs(padding="right"), vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, n_ctx=64)
causal_lm("gpt-neo", "GPTNeoConfig", lm_inputs(padding="left"), vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64)
causal_lm("xglm", "XGLMConfig", lm_inputs(padding="right"), vocab_size=VOCAB, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4, max_position_embeddings=64)
causal_lm("biogpt", "BioGptConfig", lm_inputs(padding="left"), vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
causal_lm("mpt", "MptConfig", lm_inputs(padding="right"), vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64)
causal_lm("ctrl", "CTRLConfig", lm_inputs(padding="left"), vocab_size=VOCAB, n_embd=32, dff=64, n_layer=2, n_head=4, n_positions=64)
causal_lm("openai-gpt", "OpenAIGPTConfig", lm_inputs(), vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
# Falcon's other attention layouts: grouped key/value heads ("new decoder architecture"), and alibi
causal_lm("falcon", "FalconConfig", lm_inputs(padding="left"), vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True)
causal_lm("falcon-alibi", "FalconConfig", lm_inputs(padding="right"), vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True, multi_query=False, new_decoder_architecture=False)

# --- more seq2seq models ----------------------------------------------------------------------
BART_LIKE = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=2)
SEQ2SEQ: dict[str, tuple[str, dict[str, Any]]] = {
    "bart": ("BartConfig", BART_LIKE),
    "mbart": ("MBartConfig", BART_LIKE),
    "plbart": ("PLBartConfig", BART_LIKE),
    "mvp": ("MvpConfig", BART_LIKE),
    "pegasus": ("PegasusConfig", BART_LIKE),
    "marian": ("MarianConfig", dict(BART_LIKE, decoder_vocab_size=VOCAB)),
    "blenderbot": ("BlenderbotConfig", BART_LIKE),
    "blenderbot-small": ("BlenderbotSmallConfig", BART_LIKE),
    "m2m100": ("M2M100Config", BART_LIKE),
    # local attention blocks of 4 tokens plus 2 global tokens in the encoder
    "pegasus-x": ("PegasusXConfig", dict(BART_LIKE, block_size=4, num_global_tokens=2)),
    # sliding-window (4 tokens) encoder attention
    "led": ("LEDConfig", dict({k: v for k, v in BART_LIKE.items() if k != "max_position_embeddings"}, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, attention_window=4)),
    "umt5": ("UMT5Config", SMALL_T5),
    # transient-global encoder attention over blocks of 4 tokens
    "longt5": ("LongT5Config", dict(SMALL_T5, encoder_attention_type="transient-global", local_radius=2, global_block_size=4)),
    # a switch (top-1) mixture of 4 experts in every other layer, its router losses in out.loss
    "switch-transformers": ("SwitchTransformersConfig", dict(SMALL_T5, num_experts=4, expert_capacity=16, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, router_jitter_noise=0.0)),
    "nllb-moe": ("NllbMoeConfig", dict(BART_LIKE, num_experts=4, expert_capacity=16, encoder_sparse_step=1, decoder_sparse_step=1, output_router_logits=True)),
    "fsmt": ("FSMTConfig", dict(langs=["en", "de"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=2)),
    "prophetnet": ("ProphetNetConfig", dict(vocab_size=VOCAB, hidden_size=32, num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, ngram=2, num_buckets=8, relative_max_distance=16, pad_token_id=0, decoder_start_token_id=2)),
}
for _name, (_config, _kwargs) in SEQ2SEQ.items():
    # FSMT takes its decoder inputs from input_ids unless they are given
    _inputs = seq2seq_inputs(decoder_start=2) if _name == "fsmt" else seq2seq_inputs()
    if _name == "switch-transformers":
        _inputs = with_router_losses(_inputs)  # Switch adds its router losses to out.loss only when asked per call
    add(ModelCase(_name, "seq2seq", hf_builder("AutoModelForSeq2SeqLM", _config, **_kwargs), _inputs))

# --- multi-head latent attention, more MoE routers, and hybrids (linear attention, state-space
# and convolution layers next to attention layers) -----------------------------------------------
HYBRID: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "jais2": ("Jais2Config", "right", dict(head_dim=8)),
    "minicpm3": ("MiniCPM3Config", "left", dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=16, scale_emb=2.0, scale_depth=1.4, dim_model_base=16)),
    "youtu": ("YoutuConfig", "right", dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
    "glm4-moe-lite": (
        "Glm4MoeLiteConfig",
        "left",
        dict(num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=2, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, mlp_layer_types=["dense", "sparse"]),
    ),
    "longcat-flash": (
        "LongcatFlashConfig",
        "right",
        dict(num_layers=1, num_key_value_heads=4, ffn_hidden_size=64, expert_ffn_hidden_size=32, n_routed_experts=4, moe_topk=2, zero_expert_num=2, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8),
    ),
    "exaone-moe": ("ExaoneMoeConfig", "left", dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"], mlp_layer_types=["dense", "sparse"], moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_shared_experts=1, n_group=2, topk_group=2)),
    "solar-open": ("SolarOpenConfig", "right", dict(head_dim=8, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=2)),
    "afmoe": ("AfmoeConfig", "left", dict(head_dim=8, moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, num_shared_experts=1, sliding_window=4, global_attn_every_n_layers=2)),
    "hunyuan-v3": ("HYV3Config", "right", dict(head_dim=8, num_experts=4, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32, mlp_layer_types=["dense", "sparse"])),
    "gemma3n-text": ("Gemma3nTextConfig", "left", dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8, laurel_rank=4, num_kv_shared_layers=0, activation_sparsity_pattern=[0.95, 0.0], altup_num_inputs=2)),
    "lfm2": ("Lfm2Config", "right", dict(layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False)),
    "lfm2-moe": ("Lfm2MoeConfig", "left", dict(layer_types=["conv", "full_attention"], moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2)),
    "minimax": ("MiniMaxConfig", "right", dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, layer_types=["linear_attention", "full_attention"], block_size=4)),
    "qwen3-next": (
        "Qwen3NextConfig",
        "left",
        dict(head_dim=8, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, output_router_logits=True),
    ),
    "qwen3.5-text": ("Qwen3_5TextConfig", "right", dict(head_dim=8, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)),
    "recurrent-gemma": ("RecurrentGemmaConfig", None, dict(lru_width=32, attention_window_size=4, block_types=["recurrent", "attention"])),
    "jamba": ("JambaConfig", "left", dict(num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, use_mamba_kernels=False, mamba_d_state=4, output_router_logits=True)),
    "bamba": ("BambaConfig", "right", dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4)),
    "falcon-h1": ("FalconH1Config", "left", dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4, mamba_d_ssm=64)),
    "granite-moe-hybrid": (
        "GraniteMoeHybridConfig",
        "right",
        dict(layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4, output_router_logits=True),
    ),
}
for _name, (_config, _padding, _extra) in HYBRID.items():
    if _name == "afmoe":  # its router gate starts at zero
        _build = with_random_routers(hf_builder("AutoModelForCausalLM", _config, **{**DECODER, **_extra}))
        add(ModelCase(_name, "LLM", _build, lm_inputs(padding=_padding)))
        continue
    causal_lm(_name, _config, lm_inputs(padding=_padding), **{**DECODER, **_extra})

# state-space and recurrent language models: no attention, no attention mask
causal_lm("mamba", "MambaConfig", lm_inputs(), vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, use_mambapy=False)
causal_lm("mamba2", "Mamba2Config", lm_inputs(), vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, num_heads=4, head_dim=16, n_groups=1, chunk_size=4)
causal_lm("falcon-mamba", "FalconMambaConfig", lm_inputs(), vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2)
causal_lm("rwkv", "RwkvConfig", lm_inputs(), vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, context_length=64)
causal_lm("gpt-neox-japanese", "GPTNeoXJapaneseConfig", lm_inputs(padding="left"), vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2, max_position_embeddings=64)
causal_lm("modernbert-decoder", "ModernBertDecoderConfig", lm_inputs(padding="right"), vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, local_attention=4, max_position_embeddings=64, pad_token_id=0)
