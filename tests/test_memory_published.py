"""Must show #1: the calculator reproduces published and derived figures (sizing.md §8).

Exact integer cases are exact; roofline cases are exact given their inputs; figures that depend
on an assumed constant (activations, runtime overhead) get the tolerance the reference suggests.
"""
import pytest

from engine.memory import (GiB, MiB, Settings, Workload, ascend_mask_bytes, estimate, get_model, kv_bytes_per_token,
                           model_preset_config, roofline_decode_tokens_per_s, weight_bytes)


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
    # sizing.md T14 is derived with V0's accounting (non-KV = weights + ~1.5 GiB, CUDA context included);
    # vLLM V1 on the same H100 is checked against its own log in tests/test_memory_published_v1.py (VL7)
    est = estimate("llama-3-8b", "h100-sxm", Workload(), Settings(framework_version="0.7"), detail=False)
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


# --- T23: vLLM's own startup logs (activation peak, KV pool, refusals) ------------------------------------
# vLLM 0.6.4-0.7.x (V0 engine) logs what its profiling run measured; engine/sizing/activations.py predicts
# it (forward peak T x b x (2h + max(mlp + h, attn)) vs sampler peak T x h x b + S x V x 38.8 B) and the
# presets carry the memory CUDA reports (memory_visible_mib). Tolerances: activations within 3 % (the logs
# print two decimals of GiB; the sampler constant is fitted to two of these logs); KV tokens within 5 %
# (the runtime's non-torch memory is a preset constant, not measured); the verdict exact.
LLAMA_31_8B = model_preset_config("llama-3.1-8b")  # meta-llama/Llama-3.1-8B-Instruct config.json (its preset)
RTX_4060_WSL = {  # the card of vLLM issue #13882: total_gpu_memory 8.00 GiB, non_torch_memory 0.03 GiB (WSL)
    "name": "GeForce RTX 4060 8GB (WSL)", "device_class": "nvidia-consumer", "memory_gib": 8,
    "memory_visible_mib": 8192, "bandwidth_gb_s": 272, "fp16_tflops": 60, "runtime_overhead_mb": 32,
    "default_framework": "vllm",
}
V0_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs: the profiling run samples 256 rows of logits


def _llama31():
    import json
    from engine.sizing.models import parse_config_text
    return parse_config_text(json.dumps(LLAMA_31_8B), "llama-3.1-8b")


def _vllm(model, hardware, *, max_model_len, batched, batch=1, weights="auto", util=None):
    est = estimate(model, hardware, Workload(context=max_model_len, batch=batch),
                   Settings(framework="vllm", framework_version="0.7", max_num_batched_tokens=batched,
                            weights=weights, gpu_memory_utilization=util), detail=False)
    return est.to_dict()


@pytest.mark.parametrize("max_model_len, logged_act_gib, logged_blocks, starts", [
    # https://github.com/vllm-project/vllm/issues/10517 (kaspersiminski, 2024-12-02): RTX 3090,
    # meta-llama/Llama-3.1-8B-Instruct, util 0.90, V0 without chunked prefill (max_num_batched_tokens =
    # max_model_len): total_gpu_memory=23.58GiB, weights 14.9888 GiB, non_torch_memory=0.35GiB;
    # 20k: peak_torch_memory=17.06GiB -> activations 2.07 GiB, kv_cache_size=3.81GiB, "GPU blocks: 1952";
    # 29k: peak_torch_memory=17.98GiB -> 2.99 GiB, 2.89GiB, "# GPU blocks: 1478" and "The model's max seq
    # len (29000) is larger than the maximum number of tokens that can be stored in KV cache (23648)".
    (20_000, 2.07, 1952, True),
    (29_000, 2.99, 1478, False),
])
def test_t23_vllm_10517_llama31_8b_rtx3090(max_model_len, logged_act_gib, logged_blocks, starts):
    from engine.sizing.activations import profile_peak
    model = _llama31()
    act = profile_peak(model, tokens=max_model_len, seqs=V0_MAX_NUM_SEQS).peak
    assert act / GiB == pytest.approx(logged_act_gib, rel=0.03)
    d = _vllm(model, "rtx-3090", max_model_len=max_model_len, batched=max_model_len)
    assert d["device_memory_bytes"] / GiB == pytest.approx(23.58, abs=0.005)
    assert d["kv_room_tokens"] == pytest.approx(logged_blocks * 16, rel=0.05)
    assert d["fits"] is starts  # 20k starts; 29k is refused (KV room < max_model_len)


def test_t23_vllm_10511_llama3_8b_h100():
    # https://github.com/vllm-project/vllm/pull/10511 (youkaichao, 2024-12-13, vLLM 0.6.5.dev V0):
    # `vllm serve meta-llama/Meta-Llama-3-8B` on an H100 80GB: total_gpu_memory 79.22GiB, util 0.90,
    # weights 14.96GiB, non_torch_memory 1.79GiB, "PyTorch activation peak memory 1.26GiB",
    # available_kv_cache_memory 53.29GiB (= 436,551 tokens of 128 KiB). max_model_len 8192 -> the profiling
    # forward runs 8,192 tokens; the sampler's 256 x 128,256 logits dominate (forward alone: 0.84 GiB).
    from engine.sizing.activations import profile_peak
    act = profile_peak(get_model("llama-3-8b"), tokens=8192, seqs=V0_MAX_NUM_SEQS)
    assert act.sampler > act.forward
    assert act.peak / GiB == pytest.approx(1.26, rel=0.03)
    d = _vllm("llama-3-8b", "h100-sxm", max_model_len=32, batched=8192, batch=V0_MAX_NUM_SEQS)
    assert d["device_memory_bytes"] / GiB == pytest.approx(79.22, abs=0.005)
    # +2.2 %: this build logged 1.79 GiB of non-torch memory; the preset assumes 650 MB
    assert d["kv_room_tokens"] == pytest.approx(53.29 * GiB / 131072, rel=0.05)


def test_t23_vllm_13882_qwen25_7b_awq_refused_on_8gb():
    # https://github.com/vllm-project/vllm/issues/13882 (vLLM 0.7.x V0): Qwen2.5-7B-Instruct-AWQ on an 8 GB
    # RTX 4060 under WSL, util 0.70, max_model_len 4096: total_gpu_memory 8.00GiB, weights 5.20GiB,
    # non_torch_memory 0.03GiB, "PyTorch activation peak memory takes 1.42GiB", KV -1.05GiB, "# cuda
    # blocks: 0" -> refuses to start. The sampler dominates (256 x 152,064 logits).
    from engine.memory import hardware_from_dict
    from engine.sizing.activations import profile_peak
    act = profile_peak(get_model("qwen2.5-7b"), tokens=4096, seqs=V0_MAX_NUM_SEQS)
    assert act.peak / GiB == pytest.approx(1.42, rel=0.03)
    hw = hardware_from_dict(RTX_4060_WSL, "rtx-4060-wsl")
    d = _vllm("qwen2.5-7b", hw, max_model_len=4096, batched=4096, batch=V0_MAX_NUM_SEQS, weights="int4", util=0.7)
    assert d["weight_bytes"] / GiB == pytest.approx(5.20, rel=0.01)
    assert d["kv_room_tokens"] == 0 and d["kv_pool_bytes"] == 0  # "No available memory for the cache blocks"
    one = _vllm("qwen2.5-7b", hw, max_model_len=4096, batched=4096, weights="int4", util=0.7)
    assert one["fits"] is False


def test_t23_activation_formula_is_physical():
    # Llama-3-8B forward: the MLP holds gate_up (2I) + act (I) + down output (h) next to the residual and
    # the normalised input (2h): 2 B x (3 x 4096 + 3 x 14336) = 110,592 B per token; the two #10517 logs
    # give 111,132 and 110,706 B per token (two-decimal GiB rounding: +-0.5 %).
    from engine.sizing.activations import forward_bytes_per_token
    assert forward_bytes_per_token(get_model("llama-3-8b"), 2) == 2 * (3 * 4096 + 3 * 14336) == 110_592
    assert 2.07 * GiB / 20_000 == pytest.approx(110_592, rel=0.01)
    assert 2.99 * GiB / 29_000 == pytest.approx(110_592, rel=0.01)
