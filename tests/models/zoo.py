"""The model zoo: Hugging Face architectures from small configs (no downloads), plain
PyTorch models, each with its inputs. ``CASES`` is what tests/test_models.py and
tests/models/report.py run. Families add their cases from their own modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .compare import ModelCase, zero_dropout

CASES: list[ModelCase] = []


def hf_builder(auto_class: str, config_class: str, **config: Any) -> Callable[[str | None], nn.Module]:
    """A builder of ``transformers.<auto_class>.from_config(<config_class>(**config))``."""

    def build(attn: str | None) -> nn.Module:
        import transformers

        cfg = zero_dropout(getattr(transformers, config_class)(**config))
        kwargs = {} if attn is None else {"attn_implementation": attn}
        return getattr(transformers, auto_class).from_config(cfg, **kwargs)

    return build


def token_inputs(vocab: int, batch: int = 2, length: int = 7, labels: bool = True, **extra: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        ids = torch.randint(0, vocab, (batch, length))
        out: dict[str, Any] = {"input_ids": ids}
        if labels:
            out["labels"] = ids.clone()
        out.update({k: v() if callable(v) else v for k, v in extra.items()})
        return out

    return make


def add(case: ModelCase) -> None:
    if any(c.name == case.name for c in CASES):
        raise ValueError(f"duplicate zoo case {case.name}")
    CASES.append(case)


def _load_families() -> None:
    # each family module registers its cases with add() when imported
    from . import zoo_audio_text, zoo_llm, zoo_multimodal, zoo_recurrent, zoo_torchvision, zoo_vision  # noqa: F401


# a small decoder config shared by the Llama-like families
SMALL_LM = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

add(ModelCase("llama", "LLM", hf_builder("AutoModelForCausalLM", "LlamaConfig", **SMALL_LM), token_inputs(96), fast=True))
add(
    ModelCase(
        "gpt2",
        "LLM",
        hf_builder("AutoModelForCausalLM", "GPT2Config", vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        token_inputs(96),
        fast=True,
    )
)
add(
    ModelCase(
        "bert-mlm",
        "encoder",
        hf_builder("AutoModelForMaskedLM", "BertConfig", vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64),
        token_inputs(96, attention_mask=lambda: torch.tensor([[1] * 7, [1] * 5 + [0] * 2])),
        fast=True,
    )
)

_load_families()
