"""Issue #9, the KV part: ``kv_cache_dtype`` "int8" / "fp8" (e4m3) with fp32 per-token-per-head
scales stored beside the cache (engine/model/kv_quant.py).

Holds: the round trip is within its bound; the paged attention over a quantized cache equals
attention over the dequantized values (it reads exactly what it wrote); copy-on-write copies the
scales; the engine runs every scheduler path on tiny-random with integrity checked after every
step and the same greedy tokens whatever the path; on SmolLM2 the greedy tokens agree with the
fp32-KV run for the first N tokens (see SMOLLM2_AGREE); the pool holds 46,080 / 12,240 = 3.76x
more tokens per byte with int8 than with fp32 KV. (Bytes per token vs the calculator:
test_memory_engine_kv.py; bad values: test_validation.py and the fuzz suite.)
"""
from __future__ import annotations

import pytest
import torch

from engine.model import kv_quant
from engine.model.attention import paged_attention, write_kv
from engine.core.config import SamplingParams
from engine.serving.engine import LLMEngine
from engine.model.forward_batch import build_forward_batch
from engine.model.kv_quant import QuantizedKV
from engine.model.runner import ModelRunner, kv_cache_bytes_per_token
from tests.conftest import run_to_completion
from tests.parity import PROMPTS, run_engine

pytestmark = pytest.mark.usefixtures("torch_single_thread")

QUANT = ["int8", "fp8"]


def _values(seed: int, tokens: int = 64, kvh: int = 3, d: int = 64) -> torch.Tensor:
    """[tokens, kvh, d] with magnitudes spread over 1e-3 .. 1e3 per token-head, one all-zero row
    and one row with a single outlier (absmax far above the rest)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, kvh, d, generator=gen)
    x *= 10.0 ** (torch.rand(tokens, kvh, 1, generator=gen) * 6 - 3)
    x[0, 0] = 0.0
    x[1, 1, 5] = 1e4
    return x


@pytest.mark.parametrize("name", QUANT)
def test_round_trip_within_bound(name: str) -> None:
    """int8: |x - x~| <= scale / 2 (round to nearest). fp8 e4m3: |x - x~| <= |x|/16 + scale * 2**-10
    (3 mantissa bits: relative half-spacing 2**-4 for normals; subnormal spacing 2**-9 in units
    of scale). The absmax element is exact up to the fp32 division; zeros stay zeros."""
    x = _values(1)
    q, scale = kv_quant.quantize(x, name)
    assert q.dtype == kv_quant.KV_QUANT_DTYPES[name][0] and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == x.shape[:2]
    back = kv_quant.dequantize(q, scale, torch.float32)
    err = (x - back).abs()
    s = scale.unsqueeze(-1)
    slack = 1e-6 * x.abs() + 1e-30  # fp32 rounding of x / scale and q * scale
    if name == "int8":
        assert (err <= s / 2 + slack).all()
        assert q.abs().max() == 127 and q.min() >= -127
    else:
        assert (err <= x.abs() / 16 + s * 2 ** -10 + slack).all()
        assert q.float().abs().max() == 448
    assert torch.equal(back[0, 0], torch.zeros(64)) and scale[0, 0] == 0
    torch.testing.assert_close(back[1, 1, 5], x[1, 1, 5], rtol=1e-6, atol=0)
    # Relative to each token-head's absmax the error is small: int8 <= 1/254, fp8 <= 1/16.
    rel = (err / (s * kv_quant.KV_QUANT_DTYPES[name][1]).clamp_min(1e-30)).max().item()
    assert rel <= (1 / 254 if name == "int8" else 1 / 16) + 1e-6


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("block_size", [1, 4])
def test_paged_attention_reads_exactly_what_it_wrote(name: str, block_size: int) -> None:
    """A mixed batch (cached prefix + prefill chunk, decodes of different lengths) over a
    quantized cache equals the same attention over a float cache holding the dequantized values
    (written through the same slots), to float tolerance."""
    gen = torch.Generator().manual_seed(7)
    heads, kvh, d = 6, 2, 16
    requests = [(5, 7), (11, 1), (0, 9), (3, 1)]  # (cached positions, new tokens this step)
    slots, at = [], 0
    for start, n in requests:  # disjoint slot ranges in reverse order inside the pool
        slots.append([at + p for p in range(start + n)][::-1])
        at += start + n
    num_blocks = -(-at // block_size) + 1
    shape = (num_blocks, block_size, kvh, d)
    qk, qv = kv_quant.allocate(shape, name), kv_quant.allocate(shape, name)
    assert isinstance(qk, QuantizedKV) and isinstance(qv, QuantizedKV)
    # The cached prefixes: written in an earlier "step" through the same path.
    prefix = [s[:start] for s, (start, _) in zip(slots, requests)]
    flat_prefix = torch.tensor([p for ps in prefix for p in ps], dtype=torch.long)
    write_kv(qk, qv, torch.randn(len(flat_prefix), kvh, d, generator=gen) * 3,
             torch.randn(len(flat_prefix), kvh, d, generator=gen), flat_prefix)
    batch = build_forward_batch([[1] * n for _, n in requests], [s for s, _ in requests], slots,
                                [True] * len(requests))
    T = batch.num_tokens
    q = torch.randn(T, heads, d, generator=gen)
    k_new, v_new = torch.randn(T, kvh, d, generator=gen) * 3, torch.randn(T, kvh, d, generator=gen)
    write_kv(qk, qv, k_new, v_new, batch.slot_mapping)
    ours = paged_attention(q, qk, qv, batch, d ** -0.5)
    fk = kv_quant.dequantize(qk.data, qk.scale, torch.float32)  # the values the cache holds
    fv = kv_quant.dequantize(qv.data, qv.scale, torch.float32)
    torch.testing.assert_close(ours, paged_attention(q, fk, fv, batch, d ** -0.5), rtol=1e-6, atol=1e-6)
    # ... and they are the written values, quantized once.
    want, _ = kv_quant.quantize(k_new, name)
    got = qk.data.view(-1, kvh, d).view(torch.uint8)[batch.slot_mapping]
    assert torch.equal(got, want.view(torch.uint8))


@pytest.mark.parametrize("name", QUANT)
def test_copy_blocks_copies_data_and_scales(tiny, name: str) -> None:
    runner = ModelRunner(tiny.model, 6, 4, name)
    c = tiny.model.config
    gen = torch.Generator().manual_seed(3)
    for k, v in runner.kv_caches:
        for cache in (k, v):
            write_kv(cache, cache, torch.randn(24, c.num_key_value_heads, c.head_dim, generator=gen),
                     torch.randn(24, c.num_key_value_heads, c.head_dim, generator=gen), torch.arange(24))
    runner.copy_blocks([(1, 4), (2, 0)])
    for layer in runner.kv_caches:
        for cache in layer:
            assert isinstance(cache, QuantizedKV)
            for src, dst in ((1, 4), (2, 0)):
                assert torch.equal(cache.data[dst].view(torch.uint8), cache.data[src].view(torch.uint8))
                assert torch.equal(cache.scale[dst], cache.scale[src]) and cache.scale[dst].abs().sum() > 0
    assert runner.kv_cache_total_bytes == 6 * 4 * kv_cache_bytes_per_token(c, name)


TINY_PROMPTS = [list(range(60, 60 + n)) for n in (10, 3, 17, 6)]
MAX_TOKENS = 12


def _greedy(tiny, prompts: list[list[int]], **knobs: object) -> tuple[list[tuple[int, ...]], list]:
    engine = LLMEngine(tiny, **knobs)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
           for p in prompts]
    traces = run_to_completion(engine)  # check_integrity after every step
    return [engine.get_output(i).outputs[0].token_ids for i in ids], traces


@pytest.mark.parametrize("name", QUANT)
def test_every_scheduler_path_gives_the_same_tokens_on_tiny_random(tiny, name: str) -> None:
    """With a quantized cache every path (one big batch, chunked prefill with budget 5,
    preemption in a 12-block pool, prefix caching with a shared prefix) still writes and reads
    the same quantized values, so greedy tokens equal those of the plain run."""
    kv = {"kv_cache_dtype": name, "block_size": 4}
    plain, _ = _greedy(tiny, TINY_PROMPTS, **kv, enable_prefix_caching=False)
    chunked, traces = _greedy(tiny, TINY_PROMPTS, **kv, max_num_batched_tokens=5, enable_prefix_caching=False)
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in traces)
    preempt, traces = _greedy(tiny, TINY_PROMPTS, **kv, num_blocks=12, enable_prefix_caching=False)
    assert any(t.preempted for t in traces), "the small pool never preempted"
    shared = [TINY_PROMPTS[2], TINY_PROMPTS[2][:13] + [9, 8, 7]]  # 3 full blocks in common
    cached, traces = _greedy(tiny, shared, **kv, max_num_batched_tokens=17)
    assert sum(t.prefix.num_cached_tokens for t in traces) >= 12
    assert chunked == plain and preempt == plain
    assert cached[0] == plain[2]
    assert cached[1] == _greedy(tiny, shared[1:], **kv, enable_prefix_caching=False)[0][0]


@pytest.mark.parametrize("name", QUANT)
def test_parallel_sampling_copy_on_write_carries_the_scales(tiny, name: str) -> None:
    """n=2 greedy with prefix caching: the shared partial prompt block is copied at the first
    write (data and scales); both sequences then equal the n=1 output."""
    engine = LLMEngine(tiny, kv_cache_dtype=name, block_size=4, num_blocks=32)
    rid = engine.add_request(TINY_PROMPTS[0], SamplingParams(temperature=0, n=2, max_tokens=MAX_TOKENS,
                                                             ignore_eos=True))
    traces = run_to_completion(engine)
    assert any(t.prefix.copies for t in traces), "no copy-on-write happened"
    out = engine.get_output(rid).outputs
    single, _ = _greedy(tiny, TINY_PROMPTS[:1], kv_cache_dtype=name, block_size=4, enable_prefix_caching=False)
    assert [o.token_ids for o in out] == [single[0], single[0]]


def test_quantized_kv_is_close_to_float_kv_on_tiny_random(tiny) -> None:
    """Not exact, but close: int8 KV logits within 5% of the logit range of fp32 KV; the
    SmolLM2 figures are in docs/quantization.md (KV-cache quantization)."""
    ids = TINY_PROMPTS[2]

    def logits(kv: str) -> torch.Tensor:
        runner = ModelRunner(tiny.model, 5, 4, kv)
        batch = build_forward_batch([ids], [0], [list(range(len(ids)))], [True])
        batch = batch.__class__(**{**batch.__dict__, "logits_indices": torch.arange(len(ids))})
        return runner.execute(batch)

    ref = logits("float32")
    for kv, bound in (("int8", 0.01), ("fp8", 0.05)):
        err = (logits(kv) - ref).abs().max() / ref.abs().max()
        assert 0 < err < bound, (kv, err)


# SmolLM2, one case per dtype: all 16 parity prompts in one batch, greedy, fp32 weights.
# Measured over 32 tokens (torch 2.13 CPU), index of the first token that differs from the
# fp32-KV run, per prompt (- = all 32 equal):
#   int8  -, -, 6, -, 13, 10, -, 26, 20, -, 14, -, 24, 29, 31, -    (7 of 16 prompts identical)
#   fp8   -, 15, 6, -, 7, 6, 13, -, 20, 9, -, -, 24, -, 22, 7      (6 of 16 identical)
# The earliest divergence is token 6 for both (prompt 2, a near-tie of the top two logits), so
# the first 5 tokens are held equal on every prompt: one token of margin below the measured 6.
SMOLLM2_TOKENS = 5


@pytest.mark.parametrize("name", QUANT)
def test_smollm2_greedy_agrees_with_fp32_kv(name: str) -> None:
    """Quantized KV cannot be exact; greedy tokens agree with the fp32-KV run for the first
    SMOLLM2_TOKENS tokens on every parity prompt (measured agreement above)."""
    knobs = {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "enable_prefix_caching": False}
    ref, _ = run_engine(LLMEngine("smollm2-135m", **knobs), PROMPTS, SMOLLM2_TOKENS)
    got, _ = run_engine(LLMEngine("smollm2-135m", kv_cache_dtype=name, **knobs), PROMPTS, SMOLLM2_TOKENS)
    assert got == ref


def test_pool_holds_more_tokens_for_the_same_bytes(tiny) -> None:
    """Same byte budget: int8 KV holds 46,080 / 12,240 = 3.76x the tokens of fp32 KV on SmolLM2
    (fp8 the same, it stores the same fp32 scales); the engine's memory estimate charges the
    pool by the same bytes per token."""
    from engine.model.shared import get_shared_model
    mc = get_shared_model("smollm2-135m").model.config
    fp32, int8, fp8 = (kv_cache_bytes_per_token(mc, n) for n in ("float32", "int8", "fp8"))
    assert (fp32, int8, fp8) == (46_080, 12_240, 12_240)
    budget = 256 * 1024 * 1024
    assert budget // int8 / (budget // fp32) == pytest.approx(46_080 / 12_240, rel=1e-3)
    e32 = LLMEngine(tiny, num_blocks=16, block_size=4)
    e8 = LLMEngine(tiny, num_blocks=16, block_size=4, kv_cache_dtype="int8")
    assert e32.memory_need.kv_cache == 64 * e32.kv_cache_bytes_per_token == e32.kv_cache_total_bytes
    assert e8.memory_need.kv_cache == 64 * e8.kv_cache_bytes_per_token == e8.kv_cache_total_bytes
    assert e8.snapshot().kv_bytes_per_token == e8.kv_cache_bytes_per_token < e32.kv_cache_bytes_per_token
