"""device="cuda": the engine on a GPU, with the Triton backend compiled (issue #24, item 2).

On a machine without a CUDA GPU (this project's CI) only the refusal runs: choosing the device is a
ValueError naming it, at start, and nothing is loaded. Where a GPU is visible the rest runs: greedy
outputs on CUDA (Triton backend, compiled; and the torch backend) equal Hugging Face ``generate`` on
CPU for SmolLM2 and the CPU engine for tiny-random, through chunked prefill, prefix hits and
preemption, with every manager's integrity checked after every step; and the compiled kernels equal
the float64 reference on the interpreter tests' cases (tests/kernel_cases.py).

Run this module alone on a GPU: tests/test_kernels.py sets TRITON_INTERPRET=1 for its whole process,
and kernels built for the interpreter are not the compiled ones (such a run skips the GPU tests).
``python -m pytest tests/test_cuda.py`` and ``python -m tests.bench kernels``."""
from __future__ import annotations

import pytest
import torch

from engine import LLMEngine
from engine.core.trace import StepTrace
from tests.kernel_cases import CASES, TOL, Request, paged_case
from tests.parity import PROMPTS, assert_matches_hf, run_engine

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none is visible to torch here)")
MAX_TOKENS = 12
# Chunked prefill (budget 48), prefix hits (shared prompts, caching on) and preemption (a pool of 24
# blocks x 4 tokens, the prompts that fit it: as tests/test_parity.py).
PATHS = {"chunked": {"max_num_batched_tokens": 48}, "prefix": {"enable_prefix_caching": True},
         "preempt": {"num_blocks": 24, "block_size": 4, "max_num_batched_tokens": 64}}
# PROMPTS share prefixes of 32+ tokens (the in-batch prefix check makes the later ones hit).
PATH_PROMPTS = {"chunked": PROMPTS, "prefix": PROMPTS, "preempt": PROMPTS[:4] + PROMPTS[5:9]}


def _took_path(path: str, traces: list[StepTrace]) -> bool:
    """The run went through ``path``: a prefill chunk after a first one, a prefix hit, a preemption."""
    if path == "chunked":
        return any(c.kind == "prefill" and c.start > 0 for t in traces for c in t.scheduled)
    if path == "prefix":
        return any(look.num_cached_tokens > 0 for t in traces for look in t.prefix.lookups)
    return any(t.preempted for t in traces)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is visible: the refusal cannot happen here")
def test_cuda_without_a_gpu_is_refused_naming_the_device() -> None:
    with pytest.raises(ValueError, match=r"^device: 'cuda' needs a CUDA GPU"):
        LLMEngine("tiny-random", device="cuda")


@pytest.fixture(autouse=True)
def compiled_kernels() -> None:
    """On a GPU the Triton backend must be the compiled kernels, not the interpreter's."""
    if HAS_CUDA:
        from engine import kernels
        if kernels.INTERPRETED:
            pytest.skip("TRITON_INTERPRET=1 in this process (tests/test_kernels.py): run tests/test_cuda.py alone")


@gpu
@pytest.mark.parametrize("requests,block_size,heads,kv_heads,head_dim,segments", CASES,
                         ids=[f"bs{c[1]}-gqa{c[2] // c[3]}-d{c[4]}-seg{c[5]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_compiled_kernel_equals_the_float64_reference(requests: list[Request], block_size: int, heads: int,
                                                      kv_heads: int, head_dim: int, segments: int,
                                                      dtype: torch.dtype) -> None:
    """fp32: within 1e-5 (tl.dot in IEEE fp32, no TF32); fp16 / bf16 (tensor-core products, P in
    that dtype): within 2^-8 of the largest output."""
    from engine.kernels import paged_attention, paged_attention_reference
    args = paged_case(requests, block_size, heads, kv_heads, head_dim, dtype=dtype)
    ref = paged_attention_reference(*args)
    on_gpu = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for n in sorted({1, segments}):
        out = paged_attention(*on_gpu, num_segments=n, block_n=16)
        assert isinstance(out, torch.Tensor) and out.device.type == "cuda" and out.dtype == dtype
        tol = TOL if dtype == torch.float32 else 2 ** -8 * ref.abs().max().item()
        assert (out.cpu().double() - ref).abs().max().item() <= tol


@gpu
def test_compiled_write_kv_scatters_into_the_slots() -> None:
    from engine.kernels import write_kv
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.zeros(9, 4, 3, 16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(36, generator=gen)[:20]
    k, v = torch.randn(2, 20, 3, 16, generator=gen)
    write_kv(k_cache, v_cache, k.cuda(), v.cuda(), slots.cuda())
    assert torch.equal(k_cache.view(-1, 3, 16)[slots.cuda()].cpu(), k)
    assert torch.equal(v_cache.view(-1, 3, 16)[slots.cuda()].cpu(), v)


@gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("path", list(PATHS))
def test_tiny_random_on_cuda_equals_the_cpu_engine(backend: str, path: str) -> None:
    prompts = PATH_PROMPTS[path]
    want, _ = run_engine(LLMEngine("tiny-random", **PATHS[path]), prompts, MAX_TOKENS)
    engine = LLMEngine("tiny-random", device="cuda", attention_backend=backend, **PATHS[path])
    assert engine.config.device == "cuda" and engine.shared.model.device.type == "cuda"
    got, traces = run_engine(engine, prompts, MAX_TOKENS)
    assert got == want
    assert _took_path(path, traces)


@gpu
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("path", list(PATHS))
def test_smollm2_on_cuda_equals_hf(path: str, backend: str) -> None:
    engine = LLMEngine("smollm2-135m", device="cuda", attention_backend=backend, **PATHS[path])
    assert engine.config.attention_backend == ("triton" if backend == "auto" else "torch")  # triton: CUDA's default
    outputs, traces = run_engine(engine, PATH_PROMPTS[path], MAX_TOKENS)
    assert_matches_hf("smollm2-135m", PATH_PROMPTS[path], outputs, MAX_TOKENS)
    assert _took_path(path, traces)
