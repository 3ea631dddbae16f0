"""SmoothQuant for w8a8 (engine/model/smoothing.py, knob ``quantization_smoothing_strength``).

Under test: the fold leaves the fp32 model's function unchanged (logits to fp32 rounding); the
scales follow s_j = max|X_j|^a / max|W_j|^(1-a) and the records say what moved; on SmolLM2 the
qkv inputs' channel spread (max / median of the per-channel absmax, channel 247 the known
outlier of layers 12-24) drops, measured on the smoothed model; w8a8 + smoothing matches
Hugging Face run on the smoothed, dequantized weights; bad strengths name the knob.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import torch

from engine import LLMEngine
from engine.studies.evaluation import activation_stats
from engine.core.config import EngineConfig
from engine.model.shared import SharedModel, get_shared_model
from engine.model.forward_batch import build_forward_batch
from engine.model.runner import ModelRunner
from engine.model.llama import LlamaModel
from engine.model.loader import load_model
from engine.model.quantization import QuantConfig, dequantized_weights
from engine.model.smoothing import apply_smoothing, smoothing_scales
from tests.parity import PROMPTS, hf_from_weights, hf_outputs, run_engine

ALPHA = 0.5


def _shared(name: str, alpha: float = ALPHA) -> SharedModel:
    return get_shared_model(name, quantization="w8a8", quantization_smoothing_strength=alpha)


@lru_cache(maxsize=2)
def _fp32_smoothed(name: str) -> SharedModel:
    """The fp32 model on the very weights the w8a8 + smoothing model was quantized from."""
    loaded = load_model(name)
    smoothing = _shared(name).model.smoothing
    assert smoothing is not None
    model = LlamaModel(loaded.config, apply_smoothing(loaded.weights, smoothing), torch.float32)
    return SharedModel(loaded.name, model, loaded.tokenizer)


def _logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Every position's logits of one prefill of ``ids``: [T, V] fp32."""
    runner = ModelRunner(model, len(ids), 1, model.dtype)
    batch = build_forward_batch([ids], [0], [list(range(len(ids)))], [True])
    batch = batch.__class__(**{**batch.__dict__, "logits_indices": torch.arange(len(ids), dtype=torch.long)})
    return runner.execute(batch)


# -- 1. the math is unchanged --------------------------------------------------------------

# fp32 logits: the fold moves a factor s between two fp32 products (norm * x / s, then
# (x / s) @ (W * s)), each rounding once more (2^-24 relative) per layer; over 30 layers that
# stays near 1e-6 of the logit scale. Bound: 1e-5 of the largest |logit|.
FP32_RTOL = 1e-5


@pytest.mark.parametrize("name", ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_smoothing_preserves_fp32_logits(name: str) -> None:
    plain = get_shared_model(name).model
    smoothed = _fp32_smoothed(name).model
    tok = get_shared_model(name).tokenizer
    ids = tok(PROMPTS[4], add_special_tokens=False).input_ids[:24]
    ref, got = _logits(plain, ids), _logits(smoothed, ids)
    # The weights did move (otherwise the test would be vacuous).
    assert not torch.equal(plain.layers[0].input_layernorm, smoothed.layers[0].input_layernorm)
    drift = float((got - ref).abs().max()) / float(ref.abs().max())
    assert drift <= FP32_RTOL, drift
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_scales_follow_the_rule_and_records_say_what_moved() -> None:
    loaded = load_model("tiny-random")
    smoothing = _shared("tiny-random").model.smoothing
    assert smoothing is not None and smoothing.strength == ALPHA
    assert [(e.layer, e.linear) for e in smoothing.linears] == [
        (i, lin) for i in range(loaded.config.num_hidden_layers) for lin in ("qkv", "gate_up", "down")]
    w = loaded.weights
    e = smoothing.of(1, "qkv")
    w_qkv = torch.cat([w[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"])  # [N, h]
    act = torch.tensor(e.act_absmax_before)
    s = torch.tensor(e.scales)
    want = act.clamp(min=1e-5).sqrt() / w_qkv.abs().amax(0).clamp(min=1e-5).sqrt()
    torch.testing.assert_close(s, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.tensor(e.act_absmax_after), act / s, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.tensor(e.weight_absmax_after), w_qkv.abs().amax(0) * s, rtol=1e-6, atol=0)
    # alpha = 0.5 balances the two: max|X'_j| = max|W'_j| = sqrt(max|X_j| max|W_j|).
    torch.testing.assert_close(torch.tensor(e.act_absmax_after), torch.tensor(e.weight_absmax_after), rtol=1e-5,
                               atol=0)
    # The extremes: alpha 0 leaves max|W'_j| = 1, alpha 1 leaves max|X'_j| = 1.
    assert torch.allclose((w_qkv * smoothing_scales(act, w_qkv, 0.0)).abs().amax(0), torch.ones(len(act)))
    assert torch.allclose(act / smoothing_scales(act, w_qkv, 1.0), torch.ones(len(act)))
    # Where s went: the norm weight divided, every q/k/v column multiplied.
    smoothed = apply_smoothing(w, smoothing)
    torch.testing.assert_close(smoothed["model.layers.1.input_layernorm.weight"] * s,
                               w["model.layers.1.input_layernorm.weight"], rtol=1e-6, atol=0)
    d = smoothing.of(0, "down")
    assert d.folded_into == "up_proj"
    g = smoothing.of(0, "gate_up")  # up_proj's columns took gate_up's s, its rows down's 1/s
    torch.testing.assert_close(smoothed["model.layers.0.mlp.up_proj.weight"] * torch.tensor(d.scales)[:, None],
                               w["model.layers.0.mlp.up_proj.weight"] * torch.tensor(g.scales)[None, :],
                               rtol=1e-5, atol=1e-12)


def test_calibration_is_deterministic_and_alpha_is_part_of_the_cache_key() -> None:
    a = _shared("tiny-random", 0.5)
    assert _shared("tiny-random", 0.5) is a
    b = _shared("tiny-random", 0.8)
    plain = get_shared_model("tiny-random", quantization="w8a8")
    assert b is not a and plain is not a and plain.model.smoothing is None
    assert a.model.quantization == QuantConfig("w8a8", smoothing_strength=0.5)
    assert a.model.smoothing is not None and b.model.smoothing is not None
    assert a.model.smoothing.of(0, "qkv").scales != b.model.smoothing.of(0, "qkv").scales
    from engine.model.shared import calibrated_smoothing

    _, again = calibrated_smoothing("tiny-random", 0.5)
    assert again == a.model.smoothing  # frozen records of plain floats: equal means bit-equal
    with pytest.raises(ValueError, match="^quantization:"):
        LLMEngine(a, quantization="w8a8", quantization_smoothing_strength=0.8)
    with pytest.raises(ValueError, match="^quantization:"):
        LLMEngine(a, quantization="w8a8")


# -- 2. the range moves: SmolLM2's qkv outliers --------------------------------------------

@pytest.mark.slow
def test_smoothing_shrinks_smollm2_qkv_channel_spread() -> None:
    """Measured on the smoothed fp32 model (not taken from the record): in layers 12-24, where
    channel 247 of the qkv input is an outlier, max / median of the per-channel absmax drops,
    and the measured absmax equals the record's before / s (the fold is exact). "Before" is
    the record's calibration absmax: activation_stats of the unsmoothed fp32 model on the
    same prompts (tests/test_activations.py checks that function against a manual forward)."""
    name = "smollm2-135m"
    smoothing = _shared(name).model.smoothing
    assert smoothing is not None
    after = activation_stats(LLMEngine(_fp32_smoothed(name), num_blocks=16)).absmax_of("qkv")
    for layer in range(12, 25):
        b, a = torch.tensor(smoothing.of(layer, "qkv").act_absmax_before), torch.tensor(after[layer])
        assert int(b.argmax()) == 247, layer
        spread_b, spread_a = float(b.max() / b.median()), float(a.max() / a.median())
        assert spread_a < spread_b / 2, (layer, spread_b, spread_a)
        rec = smoothing.of(layer, "qkv")
        assert rec.act_spread()[1] < rec.act_spread()[0]
        torch.testing.assert_close(a, torch.tensor(rec.act_absmax_after), rtol=1e-4, atol=1e-6)


# -- 3. parity: w8a8 + smoothing vs Hugging Face on the smoothed, dequantized weights --------

@lru_cache(maxsize=2)
def _hf_reference(name: str) -> Any:
    loaded = load_model(name)
    smoothing = _shared(name).model.smoothing
    assert smoothing is not None
    smoothed = apply_smoothing(loaded.weights, smoothing)
    return hf_from_weights(name, dequantized_weights(smoothed, QuantConfig("w8a8"))).to(torch.bfloat16)


# As tests/test_quantization.py's w8a8 case: both sides run bf16 through every layer (a few bf16
# ulps of the logit scale apart), and the engine quantizes activations per token, which HF does
# not model: 10% of the largest |logit|. Greedy: the first 8 tokens (no near-ties on these prompts).
LOGIT_TOL = 0.10
N_TOKENS = 8


@pytest.mark.parametrize("name", ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_w8a8_smoothed_parity_with_hf_on_smoothed_dequantized_weights(name: str) -> None:
    shared = _shared(name)
    tok = shared.tokenizer
    hf = _hf_reference(name)
    ids = tok(PROMPTS[4], add_special_tokens=False).input_ids[:24]
    ours = _logits(shared.model, ids)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    drift = float((ours - ref).abs().max()) / float(ref.abs().max())
    assert drift <= LOGIT_TOL, drift
    prompts = PROMPTS[:3] if name == "tiny-random" else PROMPTS[:1]
    engine = LLMEngine(shared, quantization="w8a8", quantization_smoothing_strength=ALPHA, num_blocks=64)
    outputs, _ = run_engine(engine, prompts, N_TOKENS)
    for prompt, got, want in zip(prompts, outputs, hf_outputs(hf, shared, prompts, N_TOKENS)):
        n = min(len(got), len(want))
        assert got[:n] == want[:n], f"{prompt[:30]!r}: engine {got} != HF {want}"


# -- 4. bad values ---------------------------------------------------------------------------

@pytest.mark.parametrize("knobs", [
    {"quantization": "w8a8", "quantization_smoothing_strength": -0.1},
    {"quantization": "w8a8", "quantization_smoothing_strength": 1.5},
    {"quantization": "w8a8", "quantization_smoothing_strength": float("nan")},
    {"quantization": "w8a8", "quantization_smoothing_strength": float("inf")},
    {"quantization": "w8a8", "quantization_smoothing_strength": "0.5"},
    {"quantization": "w8a8", "quantization_smoothing_strength": True},
    {"quantization": "int8", "quantization_smoothing_strength": 0.5},
    {"quantization": "int4", "quantization_smoothing_strength": 0.5},
    {"quantization": "fp8", "quantization_smoothing_strength": 0.5},
    {"quantization": None, "quantization_smoothing_strength": 0.5},
])
def test_bad_smoothing_strength_names_the_knob(knobs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="^quantization_smoothing_strength:"):
        EngineConfig.from_knobs(**knobs)
    with pytest.raises(ValueError, match="^quantization_smoothing_strength:"):
        get_shared_model("tiny-random", **knobs)


def test_edge_strengths_accepted() -> None:
    for alpha in (0, 1, 0.0, 1.0):
        assert EngineConfig.from_knobs(quantization="w8a8", quantization_smoothing_strength=alpha).dtype == "bfloat16"
