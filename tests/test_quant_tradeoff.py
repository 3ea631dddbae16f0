"""The quantization trade-off (engine/studies/quant_tradeoff.py) and its views (visualizers/quant_tradeoff.py)
on tiny-random with the TINY settings (one decode step, a few perplexity tokens): one run of
every scheme and one KV-dtype sweep, shared by the tests below. (smollm2-135m: ``make bench``'s
bench_quant runs the same code.)
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from engine.model import kv_quant
from engine.model.runner import kv_cache_bytes_per_token
from engine.model.loader import load_model
from engine.studies.quant_tradeoff import (MODES, TINY, KVTradeoffRow, TradeoffResult, agreement_prompts, decode_read_bytes,
                                   kv_tradeoff, measure_tradeoffs)
from engine.sizing import kv_bytes_per_token as calculator_kv_bytes
from engine.sizing.arch import model_from_config
from tests.parity import LONG, PROMPTS
from visualizers.figures import validated
from visualizers.quant_tradeoff import KV_COLUMNS, TRADEOFF_COLUMNS, kv_figure, kv_frame, tradeoff_figure, tradeoff_frame

pytestmark = pytest.mark.usefixtures("torch_single_thread")

MODEL = "tiny-random"
POOL = 64 * 1024  # bytes


@pytest.fixture(scope="module")
def run() -> tuple[TradeoffResult, list[tuple[str, float]]]:
    calls: list[tuple[str, float]] = []
    result = measure_tradeoffs(MODEL, TINY, progress=lambda msg, f: calls.append((msg, f)))
    return result, calls


@pytest.fixture(scope="module")
def kv_rows() -> tuple[KVTradeoffRow, ...]:
    return kv_tradeoff(MODEL, pool_bytes=POOL, gen_tokens=6)


def _spec():
    return model_from_config(load_model(MODEL).config.to_hf(), MODEL)


def test_every_mode_gives_a_row(run) -> None:
    result, _ = run
    assert [r.label for r in result.rows] == [m.label for m in MODES]
    assert [r.knobs for r in result.rows] == [m.knobs for m in MODES]
    assert result.num_prompts == len(PROMPTS) and result.model == MODEL and result.settings is TINY
    for r in result.rows:
        assert r.batch1_tok_s > 0 and r.bound_tok_s > 0 and r.ppl > 1 and r.load_s >= 0
        assert r.decode_steps == 1 and 0 <= r.agreement <= r.agreement_of
        # tiny-random has no calculator preset: described from its engine config, with a note
        assert r.calculator_expected_tok_s is not None and r.calculator_roofline_tok_s is not None
    assert any("no preset for 'tiny-random'" in n for n in result.notes)


def test_fp32_is_the_reference(run) -> None:
    fp32 = run[0].row("fp32")
    assert fp32.ppl_ratio == 1.0 and fp32.agreement == fp32.agreement_of == TINY.agree_tokens
    fp8 = run[0].row("fp8")  # slow: fewer tokens, compared over those
    assert fp8.agreement_of == TINY.slow_agree_tokens


def test_weight_bytes_order_and_fp32_count(run) -> None:
    w = {r.label: r.weight_bytes for r in run[0].rows}
    assert w["fp32"] > w["bf16"] > w["int8"] > w["int4 g32"] > w["int4 g64"]
    assert w["int8"] == w["fp8"] == w["w8a8"]
    # fp32: every layer tensor, the final norm and the (untied) LM head, 4 bytes each; no embedding
    weights = load_model(MODEL).weights
    counted = sum(t.numel() for k, t in weights.items() if k != "model.embed_tokens.weight")
    assert w["fp32"] == 4 * counted
    assert w["bf16"] == 2 * counted


def test_kv_bytes_per_token_equal_the_calculators(run) -> None:
    spec = _spec()
    config = load_model(MODEL).config
    for m, r in zip(MODES, run[0].rows):
        assert r.kv_bytes_per_token == kv_cache_bytes_per_token(config, m.dtype)
        assert r.kv_bytes_per_token == calculator_kv_bytes(spec, kv_quant.SIZING_KV_DTYPES[m.dtype])


def test_progress_is_reported_and_ends_at_one(run) -> None:
    _, calls = run
    fractions = [f for _, f in calls]
    assert len(calls) > len(MODES) and fractions == sorted(fractions)
    assert all(0.0 <= f <= 1.0 for f in fractions) and fractions[-1] == 1.0
    assert fractions[:-1] and max(fractions[:-1]) < 1.0
    assert all(isinstance(m, str) and m for m, _ in calls)


def test_decode_read_bytes_counts_quantized_codes_and_scales() -> None:
    from engine.model.shared import get_shared_model

    shared = get_shared_model(MODEL, "bfloat16", "int8")
    assert decode_read_bytes(shared.model) < decode_read_bytes(get_shared_model(MODEL, "bfloat16").model)


def test_prompts_are_the_parity_prompts() -> None:
    assert list(agreement_prompts()) == PROMPTS and LONG in PROMPTS and len(LONG) > 400


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="modes"):
        measure_tradeoffs(MODEL, TINY, modes=[m for m in MODES if m.label != "fp32"])
    with pytest.raises(ValueError, match="settings"):
        measure_tradeoffs(MODEL, "quick")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="settings.decode_steps"):
        measure_tradeoffs(MODEL, replace(TINY, decode_steps=0))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_tradeoff(MODEL, dtypes=("float32", "int3"))
    with pytest.raises(ValueError, match="pool_bytes"):
        kv_tradeoff(MODEL, pool_bytes=0)
    with pytest.raises(ValueError, match="pool_bytes"):
        kv_tradeoff(MODEL, pool_bytes=10)  # less than one float32 token
    with pytest.raises(ValueError, match="dtypes"):
        kv_tradeoff(MODEL, dtypes="int8")


def test_kv_capacity(kv_rows) -> None:
    by = {r.kv_cache_dtype: r for r in kv_rows}
    assert list(by) == ["float32", "bfloat16", "int8", "fp8"]
    config = load_model(MODEL).config
    spec = _spec()
    for name, r in by.items():
        assert r.bytes_per_token == kv_cache_bytes_per_token(config, name) == r.calculator_bytes_per_token
        assert r.bytes_per_token == calculator_kv_bytes(spec, kv_quant.SIZING_KV_DTYPES[name])
        assert r.tokens == POOL // r.bytes_per_token and r.pool_bytes == POOL
    # 2 layers x 2 KV heads x (K, V) x head_dim 16: 4 B -> 512 B/token; int8/fp8 1 B + a 4 B scale -> 160
    assert by["float32"].bytes_per_token == 512 and by["int8"].bytes_per_token == by["fp8"].bytes_per_token == 160
    assert by["float32"].capacity_ratio == 1.0 and by["bfloat16"].capacity_ratio == 2.0
    assert by["int8"].capacity_ratio == pytest.approx((POOL // 160) / (POOL // 512))


def test_kv_error(kv_rows) -> None:
    by = {r.kv_cache_dtype: r for r in kv_rows}
    f = by["float32"]
    assert (f.k_rel_error, f.v_rel_error, f.k_max_abs_error, f.v_max_abs_error, f.max_logit_diff) == (0, 0, 0, 0, 0)
    assert f.agreement == f.agreement_of == 6
    for name in ("bfloat16", "int8", "fp8"):
        r = by[name]
        assert 0 < r.k_rel_error < 0.1 and 0 < r.v_rel_error < 0.1, name
        assert r.k_max_abs_error > 0 and r.v_max_abs_error > 0 and r.max_logit_diff > 0, name
        assert 0 <= r.agreement <= r.agreement_of and r.prompt_tokens == f.prompt_tokens


def test_kv_error_is_the_round_trip_of_the_written_cache() -> None:
    """The K error recomputed by hand from the engine's own float32 cache after the prompt and one
    greedy token (what kv_tradeoff prefills with gen_tokens=1): the int8 round trip's error."""
    from engine import SamplingParams
    from engine.serving.engine import LLMEngine
    from engine.model.shared import get_shared_model

    prompt = "The lighthouse keeper climbed the stairs."
    e = LLMEngine(get_shared_model(MODEL, "float32"), num_blocks=8, block_size=16)
    e.add_request(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    e.step()  # prefill: the prompt's K/V, samples token 1
    e.step()  # decode: token 1's K/V
    n = len(prompt.encode()) + 1
    ks = [k.reshape(-1, k.shape[2], k.shape[3])[:n] for k, _ in e.runner.kv_caches]  # [n, kvh, d] each
    num = sum(float((kv_quant.dequantize(*kv_quant.quantize(k, "int8"), torch.float32) - k).square().sum()) for k in ks)
    den = sum(float(k.square().sum()) for k in ks)
    row = kv_tradeoff(MODEL, dtypes=("int8",), pool_bytes=POOL, prompt=prompt, gen_tokens=1)[0]
    assert row.k_rel_error == pytest.approx((num / den) ** 0.5, rel=1e-5)


def test_tradeoff_frame_and_figure(run) -> None:
    result, _ = run
    frame = tradeoff_frame(result)
    assert list(frame.columns) == TRADEOFF_COLUMNS and len(frame) == len(MODES)
    assert frame["batch-1 tok/s"].tolist() == [r.batch1_tok_s for r in result.rows]
    assert frame["weight MB"].tolist() == [r.weight_bytes / 1e6 for r in result.rows]
    assert frame.loc[0, "ppl vs fp32"] == 1.0 and frame.loc[0, "greedy agreement"] == "4.0 of 4"
    assert frame["share of bound"].tolist() == pytest.approx([r.batch1_tok_s / r.bound_tok_s for r in result.rows])
    fig = validated(tradeoff_figure(result, font_size=15))
    json.loads(fig.to_json())
    names = [t.name for t in fig.data]
    assert names == ["measured batch-1 decode", "calculator (expected)", "bandwidth bound", "perplexity vs fp32"]
    bars, calc, bound, ppl = fig.data
    assert list(bars.x) == [r.label for r in result.rows] and list(bars.y) == [r.batch1_tok_s for r in result.rows]
    assert list(calc.y) == [r.calculator_expected_tok_s for r in result.rows]
    assert list(bound.y) == [r.bound_tok_s for r in result.rows]
    assert list(ppl.y) == [r.ppl_ratio for r in result.rows] and ppl.yaxis == "y2"
    assert fig.layout.font.size == 15 and fig.layout.yaxis.type == "log"


def test_kv_frame_and_figure(kv_rows) -> None:
    frame = kv_frame(kv_rows)
    assert list(frame.columns) == KV_COLUMNS and len(frame) == 4
    assert frame["tokens in pool"].tolist() == [r.tokens for r in kv_rows]
    assert frame.loc[0, "K error %"] == 0 and (frame["K error %"][1:] > 0).all()
    fig = validated(kv_figure(kv_rows, font_size=14))
    json.loads(fig.to_json())
    cap, k, v = fig.data
    assert list(cap.y) == [r.tokens for r in kv_rows] and cap.xaxis == "x"
    assert list(k.y) == [100 * r.k_rel_error for r in kv_rows] and k.xaxis == "x2"
    assert list(v.y) == [100 * r.v_rel_error for r in kv_rows]
    assert [t.text for t in fig.data[:1]][0] == tuple(f"{r.capacity_ratio:.2f}x" for r in kv_rows)
