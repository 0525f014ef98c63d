"""Zoo cases of the audio and encoder families: BERT-like text encoders (MLM,
sequence-classification and ELECTRA heads; relative, sparse, local, Nystrom and Fourier
attention), speech recognisers (the wav2vec2 family with CTC, x-vector and utterance
heads; Whisper, Speech2Text, SpeechT5, Moonshine, Parakeet), audio classifiers, neural
codecs (EnCodec, DAC, Mimi), a vocoder (UnivNet), text-to-speech (SpeechT5) and the
MusicGen decoder. Inputs carry padding (attention masks with zeros) and labels for the
task head, so the model's own loss is trained."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .compare import ModelCase, zero_dropout
from .zoo import add, hf_builder

VOCAB = 96

# a small BERT-sized encoder body, spelled the way most BERT-like configs spell it
SMALL_ENCODER = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
)


def padded_mask(length: int) -> torch.Tensor:
    """The attention mask of two sequences, the second padded: its last two tokens are masked out."""
    return torch.tensor([[1] * length, [1] * (length - 2) + [0] * 2])


def _padded_tokens(head: str, length: int, padded: bool = True) -> Callable[[], dict[str, Any]]:
    """Token ids with a padded attention mask and labels for an MLM ("mlm": the padded
    positions are ignored with -100) or sequence-classification ("cls": one class per
    sequence) head."""

    def make() -> dict[str, Any]:
        ids = torch.randint(0, VOCAB, (2, length))
        mask = padded_mask(length) if padded else torch.ones(2, length, dtype=torch.long)
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        out["labels"] = ids.masked_fill(mask == 0, -100) if head == "mlm" else torch.tensor([0, 1])
        return out

    return make


def _encoder(
    name: str,
    config_class: str,
    head: str,
    length: int = 7,
    padded: bool = True,
    base: dict[str, Any] = SMALL_ENCODER,
    fast: bool = False,
    **config: Any,
) -> None:
    """A text encoder with its masked-LM ("mlm") or 2-class sequence-classification ("cls")
    head, on ``length`` tokens; ``config`` overrides ``base``."""
    auto_class = "AutoModelForMaskedLM" if head == "mlm" else "AutoModelForSequenceClassification"
    settings = {**base, **config}
    if head == "cls":
        settings.setdefault("num_labels", 2)
    add(
        ModelCase(
            name, "encoder", hf_builder(auto_class, config_class, **settings), _padded_tokens(head, length, padded), fast=fast
        )
    )


def _class_builder(model_class: str, config_class: str, **config: Any) -> Callable[[str | None], torch.nn.Module]:
    """Like ``hf_builder``, for a model class no auto class maps its config to."""

    def build(attn: str | None) -> torch.nn.Module:
        import transformers

        cfg = zero_dropout(getattr(transformers, config_class)(**config))
        if attn is not None:
            cfg._attn_implementation = attn
        return getattr(transformers, model_class)(cfg)

    return build


# --- text encoders ---------------------------------------------------------------------
_encoder("albert-mlm", "AlbertConfig", "mlm", embedding_size=16)
_encoder("electra-cls", "ElectraConfig", "cls", embedding_size=16)
_encoder("roberta-mlm", "RobertaConfig", "mlm", pad_token_id=1)
_encoder(
    "deberta-v2-cls",
    "DebertaV2Config",
    "cls",
    fast=True,
    relative_attention=True,
    position_buckets=8,
    pos_att_type=["p2c", "c2p"],
    max_relative_positions=16,
)
_encoder("deberta-mlm", "DebertaConfig", "mlm", relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=16)
_encoder(
    "distilbert-cls",
    "DistilBertConfig",
    "cls",
    base={},
    vocab_size=VOCAB,
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=64,
    max_position_embeddings=64,
)
_encoder("xlm-roberta-mlm", "XLMRobertaConfig", "mlm", pad_token_id=1)
_encoder("mpnet-mlm", "MPNetConfig", "mlm")
_encoder(
    "funnel-cls",
    "FunnelConfig",
    "cls",
    length=8,
    base={},
    vocab_size=VOCAB,
    block_sizes=[1, 1],
    d_model=32,
    n_head=4,
    d_head=8,
    d_inner=64,
)
_encoder("longformer-mlm", "LongformerConfig", "mlm", length=8, attention_window=4, pad_token_id=1)
_encoder("big-bird-mlm", "BigBirdConfig", "mlm", attention_type="original_full")
# 8 tokens, 4 landmarks: the Nystrom approximation (not the exact path taken when they are
# equal). Unpadded: its landmark path adds the (B, 1, 1, L) mask to (B, H, landmarks, L)
# scores after HF has expanded it to (B, 1, L, L), which fails on the CPU too.
_encoder("nystromformer-mlm", "NystromformerConfig", "mlm", length=8, padded=False, num_landmarks=4, segment_means_seq_len=8)
_encoder(
    "canine-cls",
    "CanineConfig",
    "cls",
    length=8,
    base={},
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    num_hash_functions=4,
    num_hash_buckets=32,
    downsampling_rate=4,
)
_encoder(
    "modernbert-mlm",
    "ModernBertConfig",
    "mlm",
    global_attn_every_n_layers=2,
    local_attention=4,
    pad_token_id=0,
    cls_token_id=1,
    sep_token_id=2,
    bos_token_id=1,
    eos_token_id=2,
)
_encoder("convbert-mlm", "ConvBertConfig", "mlm", embedding_size=32, head_ratio=2, conv_kernel_size=3)
_encoder(
    "mobilebert-mlm",
    "MobileBertConfig",
    "mlm",
    embedding_size=16,
    intra_bottleneck_size=16,
    true_hidden_size=16,
    num_feedforward_networks=2,
)
_encoder(
    "squeezebert-mlm",
    "SqueezeBertConfig",
    "mlm",
    embedding_size=32,
    q_groups=2,
    k_groups=2,
    v_groups=2,
    post_attention_groups=2,
    intermediate_groups=2,
    output_groups=2,
)
_encoder("roformer-mlm", "RoFormerConfig", "mlm", embedding_size=32)
_encoder("esm-mlm", "EsmConfig", "mlm", pad_token_id=1, mask_token_id=2, position_embedding_type="rotary")
_encoder("rembert-mlm", "RemBertConfig", "mlm", input_embedding_size=16, output_embedding_size=16, bos_token_id=1, eos_token_id=2)
_encoder("megatron-bert-mlm", "MegatronBertConfig", "mlm")
_encoder("ernie-mlm", "ErnieConfig", "mlm")
_encoder("data2vec-text-mlm", "Data2VecTextConfig", "mlm", pad_token_id=1)
_encoder("ibert-mlm", "IBertConfig", "mlm", pad_token_id=1)
_encoder(
    "fnet-mlm",
    "FNetConfig",
    "mlm",
    base={},
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
_encoder("xlm-mlm", "XLMConfig", "mlm", base={}, vocab_size=VOCAB, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64)
_encoder("yoso-mlm", "YosoConfig", "mlm", use_expectation=True)
# block-sparse attention (global + sliding + random blocks): 16 tokens in blocks of 2 is above
# its minimum of (5 + 2 * random blocks) blocks; training draws the random blocks from a fixed seed
_encoder(
    "big-bird-sparse-mlm", "BigBirdConfig", "mlm", length=16, attention_type="block_sparse", block_size=2, num_random_blocks=1
)
# the classification head puts global attention on the first token
_encoder("longformer-cls", "LongformerConfig", "cls", length=8, attention_window=4, pad_token_id=1)
# reversible layers (their own backward recomputes the forward) with chunked local attention;
# the axial position embeddings factor the 8 positions as 2 x 4
_encoder(
    "reformer-mlm",
    "ReformerConfig",
    "mlm",
    length=8,
    base={},
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=4,
    attention_head_size=8,
    attn_layers=["local", "local"],
    local_attn_chunk_length=4,
    feed_forward_size=64,
    axial_pos_shape=(2, 4),
    axial_pos_embds_dim=(16, 16),
    max_position_embeddings=8,
    is_decoder=False,
)
_encoder("xlm-roberta-xl-mlm", "XLMRobertaXLConfig", "mlm", pad_token_id=1)
_encoder("xlnet-cls", "XLNetConfig", "cls", base={}, vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64)
_encoder(
    "perceiver-mlm",
    "PerceiverConfig",
    "mlm",
    base={},
    vocab_size=VOCAB,
    max_position_embeddings=7,  # the decoder queries one output per position: as many as the tokens
    d_model=32,
    d_latents=32,
    num_latents=8,
    num_blocks=1,
    num_self_attends_per_block=2,
    num_self_attention_heads=4,
    num_cross_attention_heads=4,
    qk_channels=32,
    v_channels=32,
)


def _layout_tokens() -> dict[str, Any]:
    """LayoutLM: tokens with their bounding boxes (x0 <= x1, y0 <= y1 in 0..1000)."""
    out = _padded_tokens("mlm", 7)()
    corners = torch.randint(0, 500, (2, 7, 2))
    out["bbox"] = torch.cat([corners, corners + torch.randint(0, 500, (2, 7, 2))], -1)
    return out


add(
    ModelCase(
        "layoutlm-mlm",
        "encoder",
        hf_builder("AutoModelForMaskedLM", "LayoutLMConfig", **SMALL_ENCODER, max_2d_position_embeddings=1024),
        _layout_tokens,
    )
)


def _replaced_token_labels() -> dict[str, Any]:
    """ELECTRA's discriminator: which tokens were replaced (0/1 per token)."""
    out = _padded_tokens("mlm", 7)()
    out["labels"] = torch.randint(0, 2, (2, 7))
    return out


add(
    ModelCase(
        "electra-pretraining",
        "encoder",
        hf_builder("AutoModelForPreTraining", "ElectraConfig", **SMALL_ENCODER, embedding_size=16),
        _replaced_token_labels,
    )
)
_encoder("luke-mlm", "LukeConfig", "mlm", entity_vocab_size=16, entity_emb_size=16, pad_token_id=1)
_encoder(
    "roc-bert-mlm",
    "RoCBertConfig",
    "mlm",
    pronunciation_vocab_size=16,
    shape_vocab_size=16,
    pronunciation_embed_dim=8,
    shape_embed_dim=8,
)
_encoder(
    "markuplm-cls",
    "MarkupLMConfig",
    "cls",
    max_depth=8,
    xpath_unit_hidden_size=8,
    # no xpaths given: every token gets the padding xpath (tag 216, subscript 1001), which
    # the default embedding tables hold
    pad_token_id=1,
)


def _xmod_tokens() -> dict[str, Any]:
    """X-MOD: tokens with the language of each sequence, which picks its adapter."""
    return {**_padded_tokens("mlm", 7)(), "lang_ids": torch.tensor([0, 1])}


add(
    ModelCase(
        "xmod-mlm",
        "encoder",
        hf_builder(
            "AutoModelForMaskedLM",
            "XmodConfig",
            **SMALL_ENCODER,
            pad_token_id=1,
            languages=["en_XX", "de_DE"],
            default_language="en_XX",
            adapter_reduction_factor=4,
        ),
        _xmod_tokens,
    )
)


# --- speech ----------------------------------------------------------------------------
SAMPLES = 400  # raw audio samples per sequence for the wav2vec2 family: 39 frames


def _waveform(ctc_vocab: int | None, mask: bool = True) -> Callable[[], dict[str, Any]]:
    """Two raw waveforms, the second padded (its last quarter is silence outside the
    attention mask), with CTC labels (padded with -100) when ``ctc_vocab`` is given."""

    def make() -> dict[str, Any]:
        values = torch.randn(2, SAMPLES)
        out: dict[str, Any] = {"input_values": values}
        if mask:
            attention = torch.ones(2, SAMPLES, dtype=torch.long)
            attention[1, SAMPLES * 3 // 4 :] = 0
            values[1, SAMPLES * 3 // 4 :] = 0.0
            out["attention_mask"] = attention
        if ctc_vocab is not None:
            labels = torch.randint(1, ctc_vocab, (2, 6))
            labels[1, 4:] = -100
            out["labels"] = labels
        return out

    return make


# the conv feature encoder: 400 samples -> 79 -> 39 frames
WAV2VEC2_LIKE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_kernel=(10, 3),
    conv_stride=(5, 2),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
    vocab_size=12,
    pad_token_id=0,
    ctc_loss_reduction="mean",
    mask_time_prob=0.0,
    mask_feature_prob=0.0,
)


def _speech_ctc(name: str, config_class: str, fast: bool = False, **config: Any) -> None:
    """A wav2vec2-like speech encoder with its CTC head on padded raw audio."""
    add(
        ModelCase(
            name, "audio", hf_builder("AutoModelForCTC", config_class, **{**WAV2VEC2_LIKE, **config}), _waveform(12), fast=fast
        )
    )


_speech_ctc("wav2vec2-ctc", "Wav2Vec2Config")
# the "layer"-normalised feature encoder is the variant that reads the attention mask
_speech_ctc("hubert-ctc", "HubertConfig", fast=True, feat_extract_norm="layer", do_stable_layer_norm=True)
_speech_ctc("data2vec-audio-ctc", "Data2VecAudioConfig", num_conv_pos_embeddings=2, conv_pos_kernel_size=5)
_speech_ctc("wavlm-ctc", "WavLMConfig", num_buckets=16, max_bucket_distance=32)
_speech_ctc("unispeech-ctc", "UniSpeechConfig", feat_extract_norm="layer", do_stable_layer_norm=True)
_speech_ctc("unispeech-sat-ctc", "UniSpeechSatConfig")
_speech_ctc("sew-ctc", "SEWConfig", squeeze_factor=2)
_speech_ctc("sew-d-ctc", "SEWDConfig", squeeze_factor=2, position_buckets=8, max_position_embeddings=32)
_speech_ctc(
    "wav2vec2-conformer-ctc", "Wav2Vec2ConformerConfig", position_embeddings_type="relative", conv_depthwise_kernel_size=3
)
_speech_ctc(
    "wav2vec2-conformer-rope-ctc", "Wav2Vec2ConformerConfig", position_embeddings_type="rotary", conv_depthwise_kernel_size=3
)

# speaker embeddings: TDNN layers over the frames, trained with the additive-margin softmax loss
add(
    ModelCase(
        "wav2vec2-xvector",
        "audio",
        hf_builder(
            "AutoModelForAudioXVector",
            "Wav2Vec2Config",
            **WAV2VEC2_LIKE,
            num_labels=3,
            tdnn_dim=(16, 16),
            tdnn_kernel=(3, 1),
            tdnn_dilation=(1, 2),
            xvector_output_dim=8,
            # With the default std of 0.02, five stacked small linear layers shrink the
            # x-vector to ~1e-6; the loss L2-normalises it, so its gradient grows to ~1e6
            # and both devices' float32 rounding (1-2 ulp) is amplified up to half the
            # gradient tolerance. A larger init keeps the embedding O(1), as in a trained model.
            initializer_range=0.2,
        ),
        lambda: {**_waveform(None)(), "labels": torch.tensor([0, 2])},
    )
)


def _waveform_class() -> dict[str, Any]:
    out = _waveform(None)()
    out["labels"] = torch.tensor([0, 2])
    return out


# an utterance classifier: mean-pooled over the unpadded frames, no CTC
add(
    ModelCase(
        "wav2vec2-audio-cls",
        "audio",
        hf_builder("AutoModelForAudioClassification", "Wav2Vec2Config", **WAV2VEC2_LIKE, num_labels=3, classifier_proj_size=16),
        _waveform_class,
    )
)

WHISPER = dict(
    vocab_size=VOCAB,
    num_mel_bins=16,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_source_positions=16,
    max_target_positions=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)


def _whisper_inputs() -> dict[str, Any]:
    # 2 * max_source_positions mel frames; labels padded with -100 in the second sequence
    labels = torch.randint(3, VOCAB, (2, 6))
    labels[1, 4:] = -100
    return {"input_features": torch.randn(2, 16, 32), "labels": labels}


add(ModelCase("whisper", "audio", hf_builder("AutoModelForSpeechSeq2Seq", "WhisperConfig", **WHISPER), _whisper_inputs))


# --- audio codec -----------------------------------------------------------------------
ENCODEC = dict(
    hidden_size=16,
    num_filters=4,
    num_residual_layers=1,
    upsampling_ratios=[4, 2],
    codebook_size=32,
    codebook_dim=16,
    num_lstm_layers=2,
    audio_channels=1,
    sampling_rate=800,
    target_bandwidths=[1.5],
    norm_type="weight_norm",
)


def _encodec_inputs() -> dict[str, Any]:
    values = torch.randn(2, 1, 160)
    padding = torch.ones(2, 160, dtype=torch.long)
    padding[1, 120:] = 0
    return {"input_values": values, "padding_mask": padding}


add(
    ModelCase(
        "encodec", "audio", hf_builder("AutoModel", "EncodecConfig", **ENCODEC), _encodec_inputs, attn_implementations=(None,)
    )
)


# --- more speech models ----------------------------------------------------------------
def _features(
    shape: tuple[int, ...], labels: Callable[[], torch.Tensor] | None, mask_len: int | None = None, name: str = "input_features"
) -> Callable[[], dict[str, Any]]:
    """Float features of ``shape`` (batch first), the second item padded to ``mask_len``
    steps of dimension 1 when given, with ``labels()``."""

    def make() -> dict[str, Any]:
        out: dict[str, Any] = {name: torch.randn(shape)}
        if mask_len is not None:
            mask = torch.ones(shape[:2], dtype=torch.long)
            mask[1, mask_len:] = 0
            out["attention_mask"] = mask
        if labels is not None:
            out["labels"] = labels()
        return out

    return make


def _seq_labels(vocab: int = VOCAB, length: int = 6) -> torch.Tensor:
    labels = torch.randint(3, vocab, (2, length))
    labels[1, length - 2 :] = -100
    return labels


SEQ2SEQ_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)

# 2 stride-2 convolutions: 24 frames of 2x8 features -> 6 encoder positions
add(
    ModelCase(
        "speech2text",
        "audio",
        hf_builder(
            "AutoModelForSpeechSeq2Seq",
            "Speech2TextConfig",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_source_positions=64,
            max_target_positions=32,
            num_conv_layers=2,
            conv_kernel_sizes=[5, 5],
            conv_channels=16,
            input_feat_per_channel=8,
            input_channels=2,
            **SEQ2SEQ_TOKENS,
        ),
        _features((2, 24, 16), _seq_labels, mask_len=18),
    )
)
add(
    ModelCase(
        "whisper-audio-cls",
        "audio",
        hf_builder("AutoModelForAudioClassification", "WhisperConfig", **WHISPER, num_labels=3, classifier_proj_size=16),
        _features((2, 16, 32), lambda: torch.tensor([1, 2])),
    )
)
add(
    ModelCase(
        "ast-audio-cls",
        "audio",
        hf_builder(
            "AutoModelForAudioClassification",
            "ASTConfig",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            patch_size=8,
            frequency_stride=8,
            time_stride=8,
            max_length=32,
            num_mel_bins=16,
            num_labels=3,
        ),
        _features((2, 32, 16), lambda: torch.tensor([1, 2]), name="input_values"),
    )
)
add(
    ModelCase(
        "wav2vec2-bert-ctc",
        "audio",
        hf_builder(
            "AutoModelForCTC",
            "Wav2Vec2BertConfig",
            **{**WAV2VEC2_LIKE, "feature_projection_input_dim": 16, "conv_depthwise_kernel_size": 3},
        ),
        _features((2, 20, 16), lambda: _seq_labels(12, 6), mask_len=15),
    )
)
add(
    ModelCase(
        "speecht5-asr",
        "audio",
        hf_builder(
            "AutoModelForSpeechSeq2Seq",
            "SpeechT5Config",
            vocab_size=VOCAB,
            hidden_size=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            conv_dim=(16, 16),
            conv_kernel=(10, 3),
            conv_stride=(5, 2),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
            max_speech_positions=64,
            max_text_positions=32,
            **SEQ2SEQ_TOKENS,
        ),
        lambda: {**_waveform(None)(), "labels": _seq_labels()},
    )
)
add(
    ModelCase(
        "moonshine",
        "audio",
        hf_builder(
            "AutoModelForSpeechSeq2Seq",
            "MoonshineConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            encoder_num_hidden_layers=2,
            decoder_num_hidden_layers=2,
            encoder_num_attention_heads=4,
            decoder_num_attention_heads=4,
            encoder_num_key_value_heads=4,
            decoder_num_key_value_heads=4,
            max_position_embeddings=64,
            **SEQ2SEQ_TOKENS,
        ),
        lambda: {"input_values": torch.randn(2, 1600), "labels": _seq_labels()},
    )
)
add(
    ModelCase(
        "parakeet-ctc",
        "audio",
        hf_builder(
            "AutoModelForCTC",
            "ParakeetCTCConfig",
            vocab_size=12,
            pad_token_id=0,
            encoder_config=dict(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                conv_kernel_size=3,
                subsampling_factor=4,
                subsampling_conv_channels=8,
                num_mel_bins=16,
                max_position_embeddings=64,
                # a nested config zero_dropout does not reach
                dropout=0.0,
                dropout_positions=0.0,
                activation_dropout=0.0,
                attention_dropout=0.0,
                layerdrop=0.0,
                # The depthwise convolution feeds a training-mode BatchNorm, so its bias's
                # gradient is exactly 0 and both devices return float32 rounding noise: with
                # gradients up to 110 at the convolution's output (a per-channel sum of |g|
                # of 200-750), CPU and tpu give up to 9.5e-5 and 8.0e-5 (2.7e-7 and 2.3e-7 of
                # that sum), different noise that exceeds atol=1e-4 in the eager-attention run.
                # Without those biases every compared gradient is well conditioned.
                convolution_bias=False,
            ),
        ),
        _features((2, 40, 16), lambda: _seq_labels(12, 4), mask_len=32),
    )
)


# --- music -----------------------------------------------------------------------------
def _musicgen_inputs() -> dict[str, Any]:
    # 2 sequences x 4 codebooks of 6 audio tokens; labels (batch, length, codebooks)
    ids = torch.randint(0, 64, (2 * 4, 6))
    return {"input_ids": ids, "labels": ids.reshape(2, 4, 6).transpose(1, 2).clone()}


add(
    ModelCase(
        "musicgen-decoder",
        "audio",
        _class_builder(
            "MusicgenForCausalLM",
            "MusicgenDecoderConfig",
            vocab_size=64,
            max_position_embeddings=64,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=4,
            hidden_size=32,
            num_codebooks=4,
            pad_token_id=64,
            bos_token_id=64,
        ),
        _musicgen_inputs,
    )
)


# --- more codecs ---------------------------------------------------------------------
class _MeanLoss(torch.nn.Module):
    """DAC returns its commitment + codebook loss per item (shape (batch,)); training uses
    its mean."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: Any) -> Any:
        out = self.model(**inputs)
        out.loss = out.loss.mean()
        return out


def _mean_loss(build: Callable[[str | None], torch.nn.Module]) -> Callable[[str | None], torch.nn.Module]:
    return lambda attn: _MeanLoss(build(attn))


add(
    ModelCase(
        "dac",
        "audio",
        _mean_loss(
            hf_builder(
                "AutoModel",
                "DacConfig",
                encoder_hidden_size=4,
                downsampling_ratios=[2, 2],
                decoder_hidden_size=16,
                n_codebooks=2,
                codebook_size=16,
                codebook_dim=4,
                hop_length=4,
            )
        ),
        lambda: {"input_values": torch.randn(2, 1, 64)},
        attn_implementations=(None,),
    )
)
add(
    ModelCase(
        "mimi",
        "audio",
        hf_builder(
            "AutoModel",
            "MimiConfig",
            hidden_size=32,
            num_filters=4,
            num_residual_layers=1,
            upsampling_ratios=[4, 2],
            codebook_size=16,
            codebook_dim=16,
            num_quantizers=2,
            num_semantic_quantizers=1,
            vector_quantization_hidden_dimension=16,
            num_hidden_layers=2,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=8,
            max_position_embeddings=64,
            sliding_window=16,
            sampling_rate=800,
            frame_rate=25,
            upsample_groups=32,
        ),
        lambda: {"input_values": torch.randn(2, 1, 256)},
    )
)


# --- speech synthesis ------------------------------------------------------------------
# a vocoder whose convolutions take kernels predicted from the mel spectrogram
add(
    ModelCase(
        "univnet",
        "audio",
        hf_builder(
            "AutoModel",
            "UnivNetConfig",
            model_in_channels=8,
            model_hidden_channels=8,
            num_mel_bins=16,
            resblock_kernel_sizes=[3, 3],
            resblock_stride_sizes=[2, 2],
            resblock_dilation_sizes=[[1, 2], [1, 2]],
            kernel_predictor_num_blocks=1,
            kernel_predictor_hidden_channels=8,
        ),
        lambda: {"input_features": torch.randn(2, 10, 16), "noise_sequence": torch.randn(2, 10, 8)},
        attn_implementations=(None,),
    )
)


def _tts_inputs() -> dict[str, Any]:
    """Padded text in, a mel spectrogram of 8 frames (2 per decoder step) as labels."""
    out = _padded_tokens("cls", 7)()
    out["labels"] = torch.randn(2, 8, 16)
    out["speaker_embeddings"] = torch.randn(2, 8)
    return out


add(
    ModelCase(
        "speecht5-tts",
        "audio",
        hf_builder(
            "AutoModelForTextToSpectrogram",
            "SpeechT5Config",
            vocab_size=VOCAB,
            hidden_size=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_mel_bins=16,
            speech_decoder_prenet_units=16,
            speaker_embedding_dim=8,
            speech_decoder_postnet_units=16,
            speech_decoder_postnet_kernel=3,
            reduction_factor=2,
            max_speech_positions=64,
            max_text_positions=32,
            **SEQ2SEQ_TOKENS,
        ),
        _tts_inputs,
    )
)
