"""Plain PyTorch recurrent models (nn.LSTM / nn.GRU / nn.RNN, packed sequences) in the zoo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .compare import ModelCase
from .zoo import add


class SequenceTagger(nn.Module):
    """Embedding -> recurrent layer -> per-step classifier, optionally over packed sequences."""

    def __init__(self, kind: str, packed: bool = False, **rnn: Any) -> None:
        super().__init__()
        self.packed = packed
        self.emb = nn.Embedding(30, 12)
        self.rnn = getattr(nn, kind)(12, 16, batch_first=True, **rnn)
        width = rnn.get("proj_size") or 16
        self.head = nn.Linear(width * (2 if rnn.get("bidirectional") else 1), 5)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.emb(ids)
        if self.packed:
            # lengths must be a CPU tensor, as on CUDA
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, state = self.rnn(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        else:
            out, state = self.rnn(x)
        states = state if isinstance(state, tuple) else (state,)
        return {"logits": self.head(out), **{f"state{i}": s for i, s in enumerate(states)}}


def _builder(kind: str, packed: bool = False, **rnn: Any) -> Callable[[str | None], nn.Module]:
    return lambda attn: SequenceTagger(kind, packed, **rnn)


def _inputs() -> dict[str, Any]:
    return {"ids": torch.randint(0, 30, (3, 7)), "lengths": torch.tensor([7, 4, 6])}


for name, kind, packed, rnn in [
    ("lstm-2layer-bidir", "LSTM", False, dict(num_layers=2, bidirectional=True)),
    ("lstm-proj-packed", "LSTM", True, dict(proj_size=8)),
    ("gru-2layer", "GRU", False, dict(num_layers=2)),
    ("gru-bidir-packed", "GRU", True, dict(bidirectional=True)),
    ("rnn-tanh", "RNN", False, dict(num_layers=2)),
    ("rnn-relu-nobias", "RNN", False, dict(nonlinearity="relu", bias=False)),
]:
    add(ModelCase(name, "recurrent", _builder(kind, packed, **rnn), _inputs, attn_implementations=(None,)))
