"""Must show #2: the engine's own KV pool uses exactly the bytes per token the calculator predicts.

Contract with the engine (engine/): ``engine.LLM(model="smollm2-135m")`` exposes
``llm.llm_engine.kv_cache_bytes_per_token`` (K+V over all layers for one token at the pool's
dtype) and ``kv_cache_total_bytes`` (the allocated pool), with ``num_blocks``/``block_size`` in
``llm.llm_engine.config``. SmolLM2-135M: 30 layers x 3 KV heads x head_dim 64, fp32 by default.
"""
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
    assert engine.kv_cache_total_bytes == config.num_blocks * config.block_size * predicted
