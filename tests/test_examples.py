"""The examples (examples/<name>/) as a user runs them: ``--size tiny --compare`` in each
mode, in a process of their own. Each run must match the CPU (the script exits 1
otherwise) and compile nothing in its last steps. ``make test`` runs minGPT eager and compiled;
``make test-examples`` runs them all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("eager", "defer", "compile")
STEPS = "5"

# example -> (script, extra arguments): every training script, and its variants.
TRAINING = {
    "mingpt": ("examples/mingpt/train.py", []),
    "llama": ("examples/llama/train.py", []),
    "qwen": ("examples/qwen/train.py", []),
    "qwen-moe": ("examples/qwen/train.py", ["--moe"]),
    "resnet18": ("examples/resnet/train.py", ["--arch", "resnet18"]),
    "resnet50-channels-last": ("examples/resnet/train.py", ["--arch", "resnet50", "--channels-last"]),
    "dlrm-sgd": ("examples/dlrm/train.py", ["--optimizer", "sgd"]),
    "dlrm-adagrad": ("examples/dlrm/train.py", ["--optimizer", "adagrad"]),
    "unet": ("examples/unet/train.py", []),
}
# The subset make test runs (the rest: make test-examples): minGPT compiled (eager and
# DeferAndFuse training have their own tests in tests/test_deferred.py and elsewhere).
FAST = {("mingpt", "compile")}
# (example, mode) runs whose last steps still compile, and why (each a backend limitation,
# not the example's): the check asserts they do, so a fix shows up as a failure to update here.
_ROUTED = (
    "Dynamo breaks the graph at torch.where and compiles each expert call as its own graph; it specializes "
    "sizes 0 and 1, so an expert routed 0 or 1 tokens is a static graph of its own whose outputs have exact "
    "storages, and the eager ops after it compile once for each of those two counts (other counts share the "
    "bucket's programs: eager/buckets.py and compile/dynamic.py). The tiny run sees its first such counts "
    "within its last steps; by 12 steps it compiles nothing (eager and DeferAndFuse settle within 5)"
)
RECOMPILES = {
    ("qwen-moe", "compile"): _ROUTED,
}


def run_example(script: str, *args: str) -> str:
    """Run ``script`` with ``args``; its output, after checking it exited 0."""
    # an empty disk cache of its own: programs an earlier run compiled must not hide a compile
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCHTPU_CACHE_DIR=tempfile.mkdtemp(prefix="torchtpu-example-"))
    p = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, f"{script} {' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def settled_compiles(output: str) -> int:
    m = re.search(r"(\d+) programs compiled in the last \d+ steps", output)
    assert m, f"no summary line in:\n{output[-2000:]}"
    return int(m.group(1))


def _cases() -> list:
    out = []
    for name, (script, extra) in TRAINING.items():
        for mode in MODES:
            marks = () if (name, mode) in FAST else (pytest.mark.slow,)
            out.append(pytest.param(name, script, extra, mode, id=f"{name}-{mode}", marks=marks))
    return out


@pytest.mark.parametrize(("name", "script", "extra", "mode"), _cases())
def test_training_matches_the_cpu(name: str, script: str, extra: list[str], mode: str) -> None:
    out = run_example(script, "--size", "tiny", "--compare", "--mode", mode, "--steps", STEPS, *extra)
    assert "same as the CPU" in out
    if (name, mode) in RECOMPILES:
        assert settled_compiles(out) > 0, f"{name} {mode} no longer recompiles: remove it from RECOMPILES"
    else:
        assert settled_compiles(out) == 0, out[-2000:]


GENERATION = {"llama": "examples/llama/generate.py", "qwen": "examples/qwen/generate.py"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GENERATION)
def test_generation_matches_the_cpu_with_bounded_programs(name: str, mode: str) -> None:
    """Greedy generation with a static KV cache for prompts of several lengths: the CPU's
    tokens, and the last prompt (its power-of-two bucket already seen) compiles nothing."""
    out = run_example(GENERATION[name], "--size", "tiny", "--compare", "--mode", mode, "--steps", "3")
    assert "same as the CPU" in out
    m = re.search(r"\((\d+) for the last prompt", out)
    assert m and int(m.group(1)) == 0, out[-2000:]


INFERENCE = {"resnet-infer": "examples/resnet/infer.py", "unet-sample": "examples/unet/sample.py"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", INFERENCE)
def test_inference_matches_the_cpu(name: str, mode: str) -> None:
    """ResNet eval-mode logits and DDPM samples from the same weights on tpu and the CPU."""
    out = run_example(INFERENCE[name], "--size", "tiny", "--compare", "--mode", mode)
    assert "same as the CPU" in out
