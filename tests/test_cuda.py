"""device="cuda": the engine on a GPU, with the Triton backend compiled (issue #24, item 2).

On a machine without a CUDA GPU (this project's CI) only the refusal runs: choosing the device is a
ValueError naming it, at start, and nothing is loaded. Where a GPU is visible the rest runs: greedy
outputs on CUDA (Triton backend, compiled; and the torch backend) equal Hugging Face ``generate`` on
CPU for SmolLM2 and the CPU engine for tiny-random, through chunked prefill, prefix hits and
preemption, with every manager's integrity checked after every step."""
from __future__ import annotations

import pytest
import torch

from engine import LLMEngine
from tests.parity import PROMPTS, assert_matches_hf, run_engine

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none is visible to torch here)")
MAX_TOKENS = 12
# Chunked prefill (budget 48), prefix hits (shared prompts, caching on) and preemption (a pool of 24 blocks).
PATHS = {"chunked": {"max_num_batched_tokens": 48}, "prefix": {"enable_prefix_caching": True},
         "preempt": {"num_blocks": 24, "block_size": 4, "max_num_seqs": 8}}


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is visible: the refusal cannot happen here")
def test_cuda_without_a_gpu_is_refused_naming_the_device() -> None:
    with pytest.raises(ValueError, match=r"^device: 'cuda' needs a CUDA GPU"):
        LLMEngine("tiny-random", device="cuda")


@gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("path", list(PATHS))
def test_tiny_random_on_cuda_equals_the_cpu_engine(backend: str, path: str) -> None:
    prompts = PROMPTS[:6] + [PROMPTS[0] + " and more", PROMPTS[1] + " again"]  # shared prefixes
    want, _ = run_engine(LLMEngine("tiny-random", **PATHS[path]), prompts, MAX_TOKENS)
    engine = LLMEngine("tiny-random", device="cuda", attention_backend=backend, **PATHS[path])
    assert engine.config.device == "cuda" and engine.shared.model.device.type == "cuda"
    got, _ = run_engine(engine, prompts, MAX_TOKENS)
    assert got == want


@gpu
@pytest.mark.parametrize("path", list(PATHS))
def test_smollm2_on_cuda_with_triton_equals_hf(path: str) -> None:
    engine = LLMEngine("smollm2-135m", device="cuda", **PATHS[path])
    assert engine.config.attention_backend == "triton"  # the default on CUDA
    outputs, _ = run_engine(engine, PROMPTS, MAX_TOKENS)
    assert_matches_hf("smollm2-135m", PROMPTS, outputs, MAX_TOKENS)
