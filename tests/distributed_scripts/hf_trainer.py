"""The Hugging Face Trainer under torchrun: ``hf_trainer.py cpu|tpu``. Each rank reports
what accelerate set up (backend, world size, its process index, device) and rank 0 the
logged losses and a few classifier weights after three steps of DDP training."""

from __future__ import annotations

import os
import sys
import warnings

import torch
from _common import report

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids, self.labels = torch.randint(0, 64, (32, 12), generator=g), torch.randint(0, 2, (32,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main(device: str) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    args = transformers.TrainingArguments(
        output_dir=os.path.join(os.environ["TORCHTPU_TEST_OUT"], device),
        per_device_train_batch_size=4,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=device == "cpu",
    )
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args, train_dataset=Tokens())
    trainer.train()
    report(
        {
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "world_size": args.world_size,
            "process_index": args.process_index,
            "device": str(next(trainer.model.parameters()).device),
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "weights": trainer.model.classifier.weight.detach().cpu().flatten()[:8].tolist(),
        }
    )


if __name__ == "__main__":
    main(sys.argv[1])
