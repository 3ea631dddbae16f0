"""The fused C decode step (engine/model/cpu_decode.py): the same hidden states and the same K/V
writes as the torch layers (``LlamaModel.run_layers``, the reference), up to summation order, on
GQA ratios 1 / 3 / 4, head dims 16 and 64, biases, dimensions that are not a multiple of the vector
width, 1..16 rows in one or several decode groups; the int4 format within bf16 rounding; the same
bits at every thread count; taken only where it applies; and an engine's greedy tokens unchanged
with it on (SmolLM2 against Hugging Face: tests/test_parity.py and, for int4,
tests/test_quantization.py, which run through it)."""
from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model import cpu_decode, cpu_gemv
from engine.core.config import QuantConfig
from engine.model.forward_batch import ForwardBatch, build_forward_batch
from engine.model.llama import LlamaModel, rms_norm
from engine.model.loader import TINY_RANDOM_CONFIG, tiny_random_weights
from engine.model.model_config import ModelConfig

pytestmark = pytest.mark.skipif(cpu_gemv.status() != "ready", reason=f"the C library: {cpu_gemv.status()}")

CONFIGS: dict[str, dict[str, Any]] = {
    "mha-d16": {"num_attention_heads": 4, "num_key_value_heads": 4},
    "gqa3-bias": {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "attention_bias": True},
    "gqa4-d64": {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64},
    "odd-widths": {"hidden_size": 40, "intermediate_size": 72},  # K % 16 != 0: the scalar tails
    "tiny": {},  # tiny-random's own shapes (GQA 2)
}


def _model(name: str, seed: int = 0, int4: bool = False) -> LlamaModel:
    cfg = {**TINY_RANDOM_CONFIG, **CONFIGS[name]}
    if int4:  # the int4 format: int4 projections, bf16 everything else
        return LlamaModel(ModelConfig.from_hf(cfg), tiny_random_weights(cfg, seed), dtype=torch.bfloat16,
                          quantization=QuantConfig("int4", group_size=32))
    return LlamaModel(ModelConfig.from_hf(cfg), tiny_random_weights(cfg, seed))


def _decode_step(model: LlamaModel, contexts: list[int], block_size: int, seed: int
                 ) -> tuple[ForwardBatch, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A decode-only batch (one new token after ``contexts[i]`` cached ones each) over scrambled
    block tables, and caches holding random K/V at every slot."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    c = model.config
    needs = [-(-(n + 1) // block_size) for n in contexts]
    blocks = list(range(sum(needs) + 2))
    rng.shuffle(blocks)
    tables, at = [], 0
    for need, n in zip(needs, contexts):
        table, at = blocks[at: at + need], at + need
        tables.append([table[p // block_size] * block_size + p % block_size for p in range(n + 1)])
    shape = (len(blocks), block_size, c.num_key_value_heads, c.head_dim)
    caches = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in model.layers]
    tokens = [[rng.randrange(c.vocab_size)] for _ in contexts]
    return build_forward_batch(tokens, list(contexts), tables, [1] * len(contexts)), caches


def _layers(model: LlamaModel, batch: ForwardBatch, caches: list[tuple[torch.Tensor, torch.Tensor]], fused: bool
            ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    own = [(k.clone(), v.clone()) for k, v in caches]
    with cpu_decode.enabled(fused), torch.inference_mode():
        assert cpu_decode.applies(model.config, model.layers, model.embed(batch), batch, own, True, "torch") == fused
        return model.run_layers(model.embed(batch), batch, own), own


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("contexts, block_size", [([7], 4), ([3, 40, 41], 16), ([5, 300, 6, 7, 8, 9, 10, 290], 1),
                                                  (list(range(2, 34, 2)), 4)],
                         ids=["1-row", "3-rows", "8-rows-2-groups", "16-rows"])
def test_equals_the_torch_layers(name: str, contexts: list[int], block_size: int) -> None:
    model = _model(name)
    batch, caches = _decode_step(model, contexts, block_size, seed=len(contexts))
    if len(contexts) == 8:
        assert len(batch.decode_groups) == 2  # the C step pads the groups into one context table
    want, want_caches = _layers(model, batch, caches, fused=False)
    got, got_caches = _layers(model, batch, caches, fused=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (k, v), (wk, wv) in zip(got_caches, want_caches):  # this step's K/V in their slots, the rest untouched
        torch.testing.assert_close(k, wk, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, wv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["mha-d16", "tiny"])
def test_int4_equals_the_torch_layers_within_bf16_rounding(name: str, kv_dtype: torch.dtype) -> None:
    """The int4 format (bf16 activations, every op rounded to bf16; a bf16 cache or a fp32 one
    holding bf16 values): within a few bf16 roundings of the torch layers, two layers deep."""
    model = _model(name, int4=True)
    batch, caches = _decode_step(model, [3, 40, 41], 4, seed=1)
    caches = [(k.to(torch.bfloat16).to(kv_dtype), v.to(torch.bfloat16).to(kv_dtype)) for k, v in caches]
    want, want_caches = _layers(model, batch, caches, fused=False)
    got, got_caches = _layers(model, batch, caches, fused=True)
    assert got.dtype == torch.bfloat16
    top = float(want.float().abs().max())
    assert float((got.float() - want.float()).abs().max()) <= 2 ** -6 * top  # ~2 bf16 ulps of the largest
    for (k, v), (wk, wv) in zip(got_caches, want_caches):
        assert k.dtype == kv_dtype
        for a, b in ((k, wk), (v, wv)):
            assert float((a.float() - b.float()).abs().max()) <= 2 ** -6 * float(b.float().abs().max())


def test_the_same_bits_at_every_thread_count() -> None:
    model = _model("gqa3-bias")
    batch, caches = _decode_step(model, [3, 40, 41, 200], 4, seed=1)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(_layers(model, batch, caches, fused=True)[0])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_taken_only_where_it_applies() -> None:
    model = _model("mha-d16")
    c = model.config
    batch, caches = _decode_step(model, [5, 9], 4, seed=2)
    hidden = model.embed(batch)

    def applies(hidden: torch.Tensor = hidden, batch: ForwardBatch = batch, caches: list = caches,
                whole: bool = True, backend: str = "torch") -> bool:
        return cpu_decode.applies(c, model.layers, hidden, batch, caches, whole, backend)
    assert applies()
    assert not applies(backend="triton")
    assert not applies(whole=False)  # a layer range, a pipeline stage, tensor parallel or an observer
    assert not applies(hidden=hidden.bfloat16())
    assert not applies(caches=[(k.half(), v.half()) for k, v in caches])  # a 16-bit KV cache in fp32
    int4 = _model("mha-d16", int4=True)
    bf16 = [(k.bfloat16(), v.bfloat16()) for k, v in caches]
    for kv in (bf16, caches):  # the int4 format: a bf16 cache, or a fp32 one
        assert cpu_decode.applies(c, int4.layers, hidden.bfloat16(), batch, kv, True, "torch")
    assert not cpu_decode.applies(c, int4.layers, hidden, batch, bf16, True, "torch")  # fp32 rows
    odd = _model("gqa3-bias", int4=True)  # qkv has 160 rows: not whole 64-row int4pack blocks
    assert not cpu_decode.applies(odd.config, odd.layers, odd.embed(batch), batch, bf16, True, "torch")
    mixed = build_forward_batch([[1], [2, 3, 4]], [5, 0], [list(range(6)), list(range(3))], [1, 1])
    assert not applies(model.embed(mixed), mixed)  # a prefill in the batch
    nine, nine_caches = _decode_step(model, [2] * (cpu_decode.MAX_ROWS + 1), 4, seed=3)
    assert not applies(model.embed(nine), nine, nine_caches)
    with cpu_decode.enabled(False):
        assert not applies()


def test_engine_tokens_are_unchanged_with_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy tiny-random generations (decodes of 1..3 rows after chunked prefills) with the fused
    step and without it: the same tokens, and the fused step really ran."""
    calls = []
    real = cpu_decode.run_layers
    monkeypatch.setattr(cpu_decode, "run_layers", lambda *a: calls.append(1) or real(*a))
    llm = LLM("tiny-random", max_num_batched_tokens=16)
    prompts = ["The quick brown fox jumps over the lazy dog.", "Hi", "Paged attention, step by step."]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with cpu_decode.enabled(False):
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert not calls
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert calls and got == want


def test_the_step_table_is_kept_per_model_and_cache_list() -> None:
    """Worked out once per (layers, K/V caches) pair: the same lists give the same table; an
    engine with its own caches over the same weights gets its own K/V pointers."""
    model = _model("tiny")
    batch, caches = _decode_step(model, [5, 9], 4, seed=2)
    other = [(k.clone(), v.clone()) for k, v in caches]
    first = cpu_decode._step_table(model.layers, caches, torch.float32)
    assert first is not None and cpu_decode._step_table(model.layers, caches, torch.float32) is first
    second = cpu_decode._step_table(model.layers, other, torch.float32)
    assert second is not None and second is not first
    assert [e.k_cache for e in second.table] == [k.data_ptr() for k, _ in other]
    assert [e.k_cache for e in first.table] == [k.data_ptr() for k, _ in caches]
    assert cpu_decode._step_table(model.layers, [(k.half(), v.half()) for k, v in caches], torch.float32) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden", [(1, 576), (3, 40), (16, 96)])
def test_final_norm_equals_torch_rms_norm(dtype: torch.dtype, rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype)
    weight = torch.rand(hidden, generator=gen).to(dtype) + 0.5
    assert cpu_decode.norm_applies(x, weight)
    got, want = cpu_decode.final_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5)
    assert got.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # every value a bf16 one, at most one bf16 rounding away (the sum of squares' order)
        assert float((got.float() - want.float()).abs().max()) <= 2 ** -7 * float(want.float().abs().max())
    assert not cpu_decode.norm_applies(x.half(), weight.half())
    assert not cpu_decode.norm_applies(torch.randn(cpu_decode.MAX_ROWS + 1, hidden).to(dtype), weight)
    with cpu_decode.enabled(False):
        assert not cpu_decode.norm_applies(x, weight)


def test_the_greedy_pick_is_torch_argmax() -> None:
    """The C pick against torch.argmax: ties to the first index, -0.0 == 0.0, vocabularies that are
    not a multiple of the vector width; None for a row with NaN, +inf or -inf; torch's pick where
    the C one does not apply (fp16, or the fused step off)."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (49152, 13, 8, 1):
        logits = torch.randn(5, vocab, generator=gen)
        if vocab > 3:
            logits[1, vocab - 1] = logits[1, 2] = logits[1].max() + 1  # a tie: the first wins
            logits[2] = 0.0
            logits[2, 1] = -0.0
        assert cpu_decode.greedy_tokens(logits) == torch.argmax(logits, dim=-1).tolist()
    for bad in (float("nan"), float("inf"), float("-inf")):
        logits = torch.randn(3, 100, generator=gen)
        logits[1, 97] = bad
        assert cpu_decode.greedy_tokens(logits) is None
    logits = torch.randn(2, 50, generator=gen)
    assert cpu_decode.greedy_tokens(logits.half()) == torch.argmax(logits.half(), dim=-1).tolist()  # torch_greedy
    want = torch.argmax(logits, dim=-1).tolist()
    with cpu_decode.enabled(False):
        assert cpu_decode.greedy_tokens(logits) == want


@pytest.mark.parametrize("name", ["tiny", "gqa4-d64"])
def test_rope_table_rows_equal_the_per_step_arithmetic(name: str) -> None:
    """``LlamaModel.rope`` reads a table of positions; every row is bit-equal to computing the
    step's positions on their own (position x inv_freq, cat, cos / sin), at 1, 37 and 300 new
    tokens, past the table's first size (it grows)."""
    model = _model(name)
    first = model._rope.shape[1]
    for new, starts in ((1, range(0, 3 * first, 97)), (37, (0, 500, first - 5)), (300, (0, 2 * first))):
        for start in starts:
            batch = build_forward_batch([list(range(new))], [start], [list(range(start + new))], [1])
            freqs = batch.positions.float().unsqueeze(1) * model._inv_freq.unsqueeze(0)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = model.rope(batch)
            assert torch.equal(cos, emb.cos().unsqueeze(1)) and torch.equal(sin, emb.sin().unsqueeze(1))
    assert model._rope.shape[1] >= 3 * first
