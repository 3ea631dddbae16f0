"""Must show #2: the engine's own KV pool uses exactly the bytes per token the calculator predicts.

Contract with the engine (engine/): ``engine.LLM(model="smollm2-135m")`` exposes
``llm.llm_engine.kv_cache_bytes_per_token`` (K+V over all layers for one token at the pool's
dtype) and ``kv_cache_total_bytes`` (the allocated pool), with ``num_blocks``/``block_size`` in
``llm.llm_engine.config``. SmolLM2-135M: 30 layers x 3 KV heads x head_dim 64, fp32 by default.
"""
import pytest

from engine.memory import kv_bytes_per_token


def test_calculator_kv_per_token_for_the_engine_model():
    # 2 (K and V) x 30 layers x 3 KV heads x 64 head_dim x 4 bytes
    assert kv_bytes_per_token("smollm2-135m", "fp32") == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_bytes_per_token("smollm2-135m", "bf16") == 23040


def test_engine_kv_pool_matches_calculator():
    from engine import LLM

    llm = LLM(model="smollm2-135m")
    engine = llm.llm_engine
    predicted = kv_bytes_per_token("smollm2-135m", "fp32")
    assert engine.kv_cache_bytes_per_token == predicted
    config = engine.config
    assert engine.kv_cache_total_bytes == config.cache_config.num_blocks * config.cache_config.block_size * predicted


def test_calculator_counts_quantized_kv_scales():
    # int8 / fp8 with one fp32 scale per token, KV head and K|V: 2 x 30 x 3 x (64 x 1 + 4)
    from engine.model.kv_quant import SIZING_KV_DTYPES

    assert kv_bytes_per_token("smollm2-135m", SIZING_KV_DTYPES["int8"]) == 2 * 30 * 3 * (64 + 4) == 12240
    assert kv_bytes_per_token("smollm2-135m", SIZING_KV_DTYPES["fp8"]) == 12240
    # the calculator's own "fp8" is vLLM's: per-tensor scale, no per-token bytes
    assert kv_bytes_per_token("smollm2-135m", "fp8") == 2 * 30 * 3 * 64 == 11520


@pytest.mark.parametrize("kv", ["float32", "bfloat16", "int8", "fp8"])
def test_engine_kv_pool_matches_calculator_per_dtype(kv):
    """The engine's bytes per token (which also sizes its memory estimate) equals the calculator's
    for the same dtype, and the allocated pool (scales included) is exactly that per slot."""
    from engine import LLMEngine
    from engine.model.kv_quant import SIZING_KV_DTYPES

    engine = LLMEngine("smollm2-135m", kv_cache_dtype=kv, num_blocks=8, block_size=16)
    predicted = kv_bytes_per_token("smollm2-135m", SIZING_KV_DTYPES[kv])
    assert engine.kv_cache_bytes_per_token == predicted == engine.snapshot().kv_bytes_per_token
    assert engine.kv_cache_total_bytes == 8 * 16 * predicted == engine.memory_need.kv_cache


@pytest.mark.parametrize("kv", ["float32", "bfloat16", "int8", "fp8"])
def test_framework_inferscope_sizes_the_engines_own_kv_formats(kv):
    """Issue #21: ``--framework inferscope`` speaks the engine's KV formats (its fp8 keeps per-token-head
    scales: 12,240 B/token for SmolLM2, where vLLM's fp8 is 11,520), and the engine its command builds
    holds exactly that many bytes per token."""
    from engine.memory import Settings, estimate

    est = estimate("smollm2-135m", "h100-sxm", settings=Settings(framework="inferscope", kv_dtype=kv))
    code = est.serve_command.split('"')[1]  # python -c "<code>"
    assert code.startswith("from engine import LLM; llm = LLM('smollm2-135m'")
    scope: dict = {}
    exec(code, scope)  # the command's own Python: the real engine with the printed pool
    engine = scope["llm"].llm_engine
    assert engine.kv_cache_bytes_per_token == est.kv_bytes_per_token
    assert engine.config.cache_config.block_size * engine.config.cache_config.num_blocks >= est.context
    if kv == "fp8":
        assert est.kv_bytes_per_token == 12240 != estimate("smollm2-135m", "h100-sxm",
                                                           settings=Settings(kv_dtype="fp8")).kv_bytes_per_token
