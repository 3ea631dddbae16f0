"""Must show #1: the calculator reproduces published and derived figures (sizing.md §8).

Exact integer cases are exact; roofline cases are exact given their inputs; figures that depend
on an assumed constant (activations, runtime overhead) get the tolerance the reference suggests.
"""
import pytest

from engine.memory import (GiB, MiB, Settings, Workload, ascend_mask_bytes, estimate, get_model, kv_bytes_per_token,
                           roofline_decode_tokens_per_s, weight_bytes)


# --- T1: Llama-2-7B parameters and weights -------------------------------------------------------
def test_t1_llama2_7b_params_and_fp16_bytes():
    m = get_model("llama-2-7b")
    assert m.params_total == 6_738_415_616
    assert weight_bytes(m, "fp16") == 13_476_831_232  # 13.48 GB
    assert round(weight_bytes(m, "fp16") / GiB, 2) == 12.55  # llama.cpp "LLaMA 7B mostly F16 12.55 GiB"


@pytest.mark.parametrize("fmt, gib, tol", [("q8_0", 6.67, 0.005), ("q4_k_m", 3.80, 0.01), ("q4_0", 3.56, 0.01)])
def test_t1_llama_cpp_file_sizes(fmt, gib, tol):
    # llama.cpp PR #3084 table: Q8_0 6.67 GiB, Q4_0 3.56 GiB, Q4_K_M 3.80 GiB
    assert weight_bytes("llama-2-7b", fmt) / GiB == pytest.approx(gib, rel=tol)


def test_t21_q4_k_m_file_is_4_08_gb():
    assert weight_bytes("llama-2-7b", "q4_k_m") / 1e9 == pytest.approx(4.08, rel=0.01)


def test_t8_t9_other_tools_parameter_conventions():
    m = get_model("llama-2-7b")
    # accelerate counts AutoModel (no lm_head): 6,607,343,616
    assert m.params_total - m.lm_head_params == 6_607_343_616
    # Vidur counts matmul weights only, no embeddings: 6,476,005,376
    assert sum(layer.linear_params for layer in m.layers) == 6_476_005_376


# --- T2: KV bytes per token, FP16 --------------------------------------------------------------------
@pytest.mark.parametrize("model, expected", [
    ("llama-2-7b", 524_288),  # MHA: 512 KiB
    ("llama-2-70b", 320 * 1024),
    ("llama-3-8b", 131_072),  # GQA 8 KV heads: 128 KiB
    ("mistral-7b", 131_072),
    ("qwen3-8b", 147_456),  # head_dim 128, 36 layers: 144 KiB
    ("qwen2.5-7b", 57_344),  # 4 KV heads, 28 layers: 56 KiB
    ("internvl2-8b", 131_072),  # InternLM2.5-7B LLM
])
def test_t2_kv_bytes_per_token(model, expected):
    assert kv_bytes_per_token(model, "fp16") == expected


def test_t2_qwen25_matches_llama_cpp_log():
    # llama.cpp issue #13484: "KV self size = 1792.00 MiB" at kv_size 32768 for Qwen2.5-7B
    est = estimate("qwen2.5-7b", "a100-80gb", Workload(context=32768),
                   Settings(framework="none", kv_dtype="fp16"), detail=False)
    assert est.kv_bytes == 1792 * MiB


# --- T3: DeepSeek-V3 MLA at 32k, q8_0 cache ------------------------------------------------------------
def test_t3_deepseek_v3_mla_kv_32k_q8_0():
    est = estimate("deepseek-v3", "apple-m2-ultra", Workload(context=32768),
                   Settings(framework="none", kv_dtype="q8_0"), detail=False)
    assert est.kv_bytes == 61 * 576 * 32768 * 34 // 32
    assert round(est.kv_bytes / MiB, 2) == 1166.62  # ik_llama.cpp PR #259 "KV self size = 1166.62 MiB"


def test_t3_mla_bf16_per_token_and_naive_formula_is_71x_too_big():
    per_token = kv_bytes_per_token("deepseek-v3", "bf16")
    assert per_token == 61 * 576 * 2
    assert round(per_token / 1024, 1) == 68.6  # 68.6 KiB/token
    naive = 61 * 128 * ((128 + 64) + 128) * 2  # MHA formula: 128 heads, K of 192 + V of 128
    assert round(naive / MiB, 2) == 4.77
    assert naive / per_token == pytest.approx(71, abs=1)


# --- T16: InternVL2-8B -------------------------------------------------------------------------------
def test_t16_internvl2_8b_sizing():
    m = get_model("internvl2-8b")
    assert round(m.params_total / 1e9, 3) == 8.075
    assert m.params_total == 8_075_365_376  # 7,737,782,272 LLM + 304,012,288 ViT + 33,570,816 mlp1
    assert m.llm_params == 7_737_782_272
    assert round(m.vision.params / 1e6) == 304  # InternViT-300M model card: 304 M
    assert round(m.vision.projector_params / 1e6, 1) == 33.6
    fp16 = weight_bytes(m, "fp16")
    assert fp16 == 16_150_730_752 and round(fp16 / 1e9, 2) == 16.15 and round(fp16 / GiB, 2) == 15.04
    assert m.vision.tokens_per_tile == 256
    assert m.vision.max_tiles == 13  # 12 + thumbnail
    est = estimate(m, "a100-80gb", Workload(context=8192, images=1), detail=False)
    assert est.image_tokens == 3328
    assert 3328 * kv_bytes_per_token(m, "fp16") == 416 * MiB


# --- T17: roofline decode ------------------------------------------------------------------------------
def test_t17_roofline_arithmetic_is_exact():
    # 16.15 GB of FP16 weights at 204.8 GB/s: 12.68 tok/s = 78.9 ms/token (sizing.md T17)
    tps = roofline_decode_tokens_per_s(16_150_730_752, 204.8e9)
    assert round(tps, 1) == 12.7
    assert round(1000 / tps, 1) == 78.9


@pytest.mark.parametrize("hardware, settings, expected", [
    ("atlas-300v-pro", Settings(), 12.7),
    ("atlas-300i-pro", Settings(), 12.7),
    ("atlas-300i-duo", Settings(), 25.3),  # TP2 over the two chips
    ("rtx-4090", Settings(), 62.4),
    ("a100-80gb", Settings(), 126),
    ("atlas-300v-pro", Settings(weights="w8a8"), 25.4 * 0.9),  # embeddings/LM head stay 16-bit here
])
def test_t17_end_to_end_decode_bound(hardware, settings, expected):
    # The published figure divides bandwidth by all 16.15 GB (vision tower included); we read the
    # LLM's 15.48 GB plus the KV of a 4,096-token context (0.54 GB): 16.01 GB. Within 2 %.
    est = estimate("internvl2-8b", hardware, Workload(), settings, detail=False)
    assert est.bound == "memory"
    assert est.decode_tokens_per_s_roofline == pytest.approx(expected, rel=0.02)


def test_t17_efficiency_is_applied_on_top_of_the_roofline():
    est = estimate("internvl2-8b", "atlas-300v-pro", detail=False)
    assert est.decode_tokens_per_s == pytest.approx(est.decode_tokens_per_s_roofline * est.efficiency_memory)
    slower = estimate("internvl2-8b", "atlas-300v-pro", Workload(), Settings(eta_memory=0.3), detail=False)
    assert slower.decode_tokens_per_s == pytest.approx(est.decode_tokens_per_s_roofline * 0.3)


# --- T18/T19: Ascend 310P rules ---------------------------------------------------------------------------
@pytest.mark.parametrize("length, expected", [(8192, 128 * MiB), (16384, 512 * MiB), (32768, 2 * GiB)])
def test_t18_ascend_mask(length, expected):
    assert ascend_mask_bytes(length) == expected
    est = estimate("internvl2-8b", "atlas-300v-pro", Workload(context=length), detail=False)
    assert est.mask_bytes == expected


def test_t18_mask_only_on_310p_with_vllm_ascend():
    assert estimate("internvl2-8b", "ascend-910b", detail=False).mask_bytes == 0
    assert estimate("internvl2-8b", "atlas-300v-pro", Workload(), Settings(framework="none"), detail=False).mask_bytes == 0


def test_t19_kv_budget_halved_on_310p():
    big = estimate("internvl2-8b", "atlas-300v-pro", detail=False)
    assert big.usable_bytes_per_device == int(0.9 * 48 * GiB)  # 43.2 GiB requested
    assert big.kv_pool_bytes / GiB == pytest.approx(13.6, rel=0.03)
    assert big.kv_room_tokens == pytest.approx(111_000, rel=0.03)
    small = estimate("internvl2-8b", "atlas-300i-pro", detail=False)
    assert small.kv_pool_bytes / GiB == pytest.approx(2.8, rel=0.10)
    assert small.kv_room_tokens == pytest.approx(22_800, rel=0.10)
    # the halving itself: without it the pool would be twice as large
    assert big.kv_pool_bytes * 2 == pytest.approx(
        big.usable_bytes_per_device - big.weight_bytes - big.activation_bytes - big.mask_bytes - big.overhead_bytes,
        abs=2)


# --- T14: vLLM pool for Llama-3-8B on H100 ------------------------------------------------------------------
def test_t14_vllm_pool_llama3_8b_h100():
    est = estimate("llama-3-8b", "h100-sxm", detail=False)
    assert est.weight_bytes / GiB == pytest.approx(14.96, abs=0.01)
    assert 54.5 <= est.kv_pool_bytes / GiB <= 55.8
    assert 449_000 <= est.kv_room_tokens <= 458_000
    assert est.kv_room_tokens // 16 == pytest.approx(28_000, rel=0.03)  # blocks of 16


# --- T22: llm-analysis KV cross-check ------------------------------------------------------------------------
def test_t22_kv_for_544_tokens():
    est = estimate("llama-2-7b", "a100-80gb", Workload(context=544, output=32),
                   Settings(framework="none"), detail=False)
    assert est.kv_bytes == 285_212_672


# --- T20: measured llama.cpp decode lands within ±30 % of the estimate ---------------------------------------
@pytest.mark.parametrize("hardware, weights, measured", [
    ("rtx-4090", "fp16", 54.34), ("rtx-3090", "fp16", 46.51), ("apple-m2-ultra", "fp16", 36.25),
    ("apple-m3-max", "fp16", 22.39), ("rtx-4090", "q4_k_m", 127.74), ("rtx-3090", "q4_k_m", 111.74),
    ("apple-m2-ultra", "q4_k_m", 76.28), ("apple-m3-max", "q4_k_m", 50.74),
])
def test_t20_measured_llama_cpp_decode(hardware, weights, measured):
    est = estimate("llama-3-8b", hardware, Workload(context=1024, output=1023),
                   Settings(framework="none", weights=weights), detail=False)
    assert est.decode_tokens_per_s == pytest.approx(measured, rel=0.30)
