"""Calculator behaviour: architectures, parallelism, budget rules, searches, inputs, advice."""
import json
import struct
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.memory import (GiB, MiB, Plan, Settings, SizingError, Workload, checkpoint_from_folder, custom_hardware,
                           estimate, get_hardware, get_model, kv_bytes_per_token, measure_this_machine,
                           model_from_config, model_from_folder, model_from_path, parse_config_text,
                           read_safetensors_header,
                           weight_format)
from engine.memory import WEIGHT_FORMATS, kv_dtype

NONE = Settings(framework="none")


def plan(model, hw, workload=Workload(), s=Settings()):
    return Plan(get_model(model), get_hardware(hw), workload, s)


# --- formats --------------------------------------------------------------------------------------------
def test_format_bytes_per_param():
    assert weight_format("int4").bytes_per_param == Fraction(1, 2) + Fraction(2, 128) + Fraction(1, 256)
    assert float(weight_format("awq").bytes_per_param) == pytest.approx(0.5195, abs=1e-4)
    assert weight_format("q8_0").bytes_per_param == Fraction(34, 32)
    assert weight_format("q4_k_m").bits_per_param == pytest.approx(4.84)
    assert weight_format("Q4_0").key == "q4_0" and weight_format("W4A16").key == "int4"
    assert float(weight_format("nf4").bytes_per_param) == pytest.approx(0.516, abs=1e-3)
    for key in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "nf4", "q8_0", "q6_k", "q5_k", "q4_k_m", "q4_0",
                "q4_1", "q3_k", "q2_k"):
        assert key in WEIGHT_FORMATS or weight_format(key)


def test_quantised_formats_keep_embeddings_16_bit_but_gguf_does_not():
    m = get_model("llama-2-7b")
    emb = m.embed_params + m.lm_head_params
    int4 = estimate(m, "a100-80gb", settings=Settings(weights="int4"), detail=False).weight_bytes
    q4 = estimate(m, "a100-80gb", settings=Settings(weights="q4_0", framework="none"), detail=False).weight_bytes
    linear = sum(layer.linear_params for layer in m.layers)
    norms = m.params_total - linear - emb  # 65 RMSNorm vectors: 16-bit (F32 in GGUF)
    assert int4 == linear * 0.51953125 + emb * 2 + norms * 2
    assert q4 == (linear + emb) * 18 / 32 + norms * 4


def test_kv_dtypes_and_per_head_scales():
    fp16 = kv_bytes_per_token("llama-3-8b", "fp16")
    assert kv_bytes_per_token("llama-3-8b", "fp8") == fp16 // 2
    # int8 per-token-head quantisation adds an fp32 scale per (layer, head, K|V)
    assert kv_bytes_per_token("llama-3-8b", "int8") == fp16 // 2 + 32 * 2 * 8 * 4
    assert kv_bytes_per_token("llama-3-8b", "int4") == fp16 // 4 + 32 * 2 * 8 * 4
    assert kv_dtype("float16").key == "fp16"
    with pytest.raises(SizingError):
        kv_dtype("fp5")


# --- architectures --------------------------------------------------------------------------------------
def test_gqa_is_four_times_smaller_than_mha():
    assert kv_bytes_per_token("llama-2-7b") == 4 * kv_bytes_per_token("llama-3-8b")


def test_explicit_head_dim_is_used():
    m = get_model("gemma-2-9b")
    assert m.head_dim == 256 != m.hidden // m.num_heads
    assert kv_bytes_per_token(m, "bf16") == 42 * 2 * 8 * 256 * 2


def test_sliding_window_caps_kv():
    long = estimate("mistral-7b", "a100-80gb", Workload(context=16384), NONE, detail=False)
    short = estimate("mistral-7b", "a100-80gb", Workload(context=4096), NONE, detail=False)
    assert long.kv_bytes == short.kv_bytes == 4096 * kv_bytes_per_token("mistral-7b", "bf16")
    g = estimate("gemma-2-9b", "a100-80gb", Workload(context=8192), NONE, detail=False)
    per_layer = 2 * 8 * 256 * 2
    assert g.kv_bytes == 21 * per_layer * 8192 + 21 * per_layer * 4096  # 21 global + 21 sliding layers


def test_sliding_window_room_counts_saturated_layers():
    est = estimate("gemma-2-9b", "h100-sxm", detail=False)
    # the pool holds more context than pool / full-rate-per-token, because half the layers stop at 4,096
    assert est.kv_room_tokens > est.kv_pool_bytes // est.kv_bytes_per_token


@pytest.mark.parametrize("model", ["mistral-7b", "starcoder2-3b"])
def test_window_on_every_layer_reports_token_slots_not_the_search_cap(model, capsys):
    """calc-arch's report: with a sliding window on every layer the KV room printed 16,777,216 tokens
    (the context search's cap: a sequence's KV stops growing at the window, so every context "fits").
    Now it is the pool's token slots, pool / KV per token, and the answer says what that means."""
    from engine.memory import MAX_CONTEXT, main
    e = estimate(model, "rtx-4090")
    assert e.kv_window == 4096 and e.kv_room_unit == "token slots"
    slots = e.kv_pool_bytes // (e.kv_bytes_per_token_per_device * 16) * 16
    assert e.kv_room_tokens == slots < MAX_CONTEXT
    assert e.kv_window_sequences == e.kv_pool_bytes // (4096 * e.kv_bytes_per_token_per_device)
    assert e.kv_window_sequences >= e.max_batch  # the batch search also pays activations per sequence
    assert all(a.kv_room_tokens < MAX_CONTEXT for a in e.alternatives)
    assert "not the longest context" in " ".join(e.notes) and "token slots" in e.formulas["kv_room"]
    assert main(["--model", model, "--hardware", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    room = next(line for line in out.splitlines() if line.startswith("  KV room"))
    assert f"= {slots:,} token slots (with a window on every layer a sequence keeps at most its last 4,096" in room
    assert "16,777,216" not in out
    assert main(["--model", model, "--hardware", "rtx-4090", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_room_tokens"] == slots and "kv_window" not in d  # the JSON contract keeps its keys
    # a window on only some layers (Gemma-2) or none: the longest context, as before
    assert estimate("gemma-2-9b", "rtx-4090", detail=False).kv_window is None
    assert estimate("llama-3-8b", "rtx-4090", detail=False).kv_room_unit == "tokens"


def test_mamba_state_is_constant_in_context():
    a = estimate("mamba-1.4b", "l4", Workload(context=1024), detail=False)
    b = estimate("mamba-1.4b", "l4", Workload(context=65536), detail=False)
    assert a.kv_bytes_per_token == 0
    assert a.kv_bytes == b.kv_bytes == 48 * (4096 * 3 + 4096 * 16) * 2
    assert a.max_context >= 65536


def test_moe_total_vs_active_and_expert_reads_grow_with_batch():
    m = get_model("mixtral-8x7b")
    assert m.params_total == 46_702_792_704
    assert m.params_active == pytest.approx(12.9e9, rel=0.01)
    one = estimate(m, "h200", Workload(batch=1), detail=False)
    many = estimate(m, "h200", Workload(batch=64, context=1024), detail=False)
    assert one.fits and many.fits and one.tp == 1
    assert one.decode_bytes_per_step - one.kv_bytes < 0.4 * one.weight_bytes  # 2 of 8 experts per layer
    assert many.decode_bytes_per_step - many.kv_bytes > 0.95 * many.weight_bytes  # every expert touched


def test_deepseek_v2_lite_mla_and_shared_experts():
    m = get_model("deepseek-v2-lite")
    assert m.params_total == 15_706_484_224
    assert kv_bytes_per_token(m, "bf16") == 27 * (512 + 64) * 2
    assert m.layers[0].num_experts == 0 and m.layers[1].num_experts == 64  # first layer dense


def test_tied_vs_untied_embeddings():
    tied = get_model("smollm2-135m")
    assert tied.tied and tied.lm_head_params == 0
    cfg = {k: v for k, v in json.loads(open("presets/models/smollm2-135m.json").read()).items()}
    untied = model_from_config({**cfg, "tie_word_embeddings": False})
    assert untied.params_total - tied.params_total == 49152 * 576


def test_vision_language_text_config_form_parses():
    cfg = {"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000},
           "vision_config": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "patch_size": 14, "image_size": 224}}
    m = model_from_config(cfg)
    assert m.vision is not None and m.vision.tokens_per_tile == 256
    assert m.params_total > m.llm_params
    assert any("approximate" in n for n in m.notes)


# --- parallelism ----------------------------------------------------------------------------------------------
def test_tp_shards_kv_heads_and_replicates_when_tp_exceeds_them():
    base = kv_bytes_per_token("llama-3-8b", "bf16")
    e2 = estimate("llama-3-8b", "h100-sxm", settings=Settings(tp=2), detail=False)
    e16 = estimate("llama-3-8b", "h100-sxm", settings=Settings(tp=16), detail=False)
    assert e2.kv_bytes_per_token_per_device == base // 2
    assert e16.kv_bytes_per_token_per_device == base // 8  # 8 KV heads: one per device, replicated
    assert any("replicated" in n for n in e16.notes)


def test_mla_latent_is_replicated_on_every_tp_rank():
    e = estimate("deepseek-v2-lite", "h100-sxm", settings=Settings(tp=4), detail=False)
    assert e.kv_bytes_per_token_per_device == e.kv_bytes_per_token


def test_pipeline_stages_split_like_vllm():
    p = plan("llama-3-8b", "h100-sxm")
    assert p.stage_sizes(3) == [11, 11, 10]
    assert p.stage_sizes(4) == [8, 8, 8, 8]
    e = estimate("llama-3-8b", "h100-sxm", settings=Settings(pp=2), detail=False)
    assert len(e.stages) == 2 and e.devices == 2
    assert e.weight_bytes_per_device < e.weight_bytes * 0.55


def test_tied_head_is_copied_to_the_last_stage():
    e1 = estimate("smollm2-135m", "t4", detail=False)
    e2 = estimate("smollm2-135m", "t4", settings=Settings(pp=2), detail=False)
    emb = 49152 * 576 * 2
    assert sum(s.weights for s in e2.stages) == pytest.approx(e1.weight_bytes + emb, abs=4)


def test_duo_card_defaults_to_two_chips():
    e = estimate("internvl2-8b", "atlas-300i-duo", detail=False)
    assert e.tp == 2 and e.device_unit == "chip"
    assert e.decode_tokens_per_s_roofline == pytest.approx(25.3, rel=0.02)


def test_invalid_parallel_sizes():
    with pytest.raises(SizingError, match="does not divide"):
        estimate("llama-3-8b", "h100-sxm", settings=Settings(tp=3))
    with pytest.raises(SizingError, match="layers"):
        estimate("smollm2-135m", "t4", settings=Settings(pp=31))


# --- budget rules -----------------------------------------------------------------------------------------------
def test_vllm_budget_is_utilisation_of_total():
    hw = get_hardware("h100-sxm")
    e = estimate("llama-3-8b", hw, detail=False)
    assert e.usable_bytes_per_device == int(0.9 * hw.memory_bytes)
    e5 = estimate("llama-3-8b", hw, settings=Settings(gpu_memory_utilization=0.5), detail=False)
    assert e5.usable_bytes_per_device == int(0.5 * hw.memory_bytes)
    # activations profiled at max_num_batched_tokens (8,192 on >= 70 GiB devices): the MLP's live tensors
    # T x 2 B x (3h + 3I) (engine/sizing/activations.py) + the RoPE cache max_position x head_dim x 2 B
    assert e.activation_bytes == 8192 * 2 * (3 * 4096 + 3 * 14336) + 8192 * 128 * 2


def test_sglang_fraction_and_reserve():
    hw = get_hardware("a100-80gb")
    e = estimate("llama-3-8b", hw, settings=Settings(framework="sglang"), detail=False)
    # SGLang measures its total as the free memory when weights start loading (after the CUDA context):
    # weights + pool = 0.88 x (total - context); what is left of the device is held back
    static = int(0.88 * (hw.memory_bytes - hw.runtime_overhead_bytes))
    assert e.reserve_bytes == max(0, hw.memory_bytes - static - e.activation_bytes - e.overhead_bytes)
    assert e.kv_pool_bytes == static - e.weight_bytes
    assert "--mem-fraction-static 0.88" in e.serve_command


def test_plain_rule_uses_unified_memory_share():
    hw = get_hardware("apple-m2-ultra")
    e = estimate("llama-3-70b", hw, detail=False)
    assert e.framework == "none" and e.usable_bytes_per_device == int(0.75 * hw.memory_bytes)


def test_vllm_ascend_310p_rules():
    e = estimate("internvl2-8b", "atlas-300v-pro", detail=False)
    assert e.reserve_bytes == e.kv_bytes_per_device  # halving: the other half is held back
    assert e.mask_bytes == 4096 * 4096 * 2
    assert "--block-size 128" in e.serve_command and "--enforce-eager" not in e.serve_command  # default = latest image: graph mode
    assert "PYTORCH_NPU_ALLOC_CONF=max_split_size_mb:256" in e.serve_command
    e910 = estimate("internvl2-8b", "ascend-910b", detail=False)
    assert e910.framework == "vllm-ascend" and e910.reserve_bytes == 0 and e910.mask_bytes == 0


def test_bf16_is_converted_to_fp16_where_missing():
    e = estimate("llama-3-8b", "atlas-300i-pro", settings=Settings(weights="bf16"), detail=False)
    assert e.weights_format == "fp16" and e.kv_dtype == "fp16"
    assert any("no BF16" in w for w in e.warnings)
    t4 = estimate("llama-3-8b", "t4", detail=False)
    assert t4.weights_format == "fp16" and "--dtype float16" in t4.serve_command


def test_framework_checks():
    with pytest.raises(SizingError, match="Ascend"):
        estimate("llama-3-8b", "h100-sxm", settings=Settings(framework="vllm-ascend"))
    e = estimate("llama-3-8b", "atlas-300v-pro", settings=Settings(framework="vllm"), detail=False)
    assert e.framework == "vllm-ascend"
    with pytest.raises(SizingError, match="gpu_memory_utilization"):
        estimate("llama-3-8b", "h100-sxm", settings=Settings(gpu_memory_utilization=0))


# --- verdict and searches ------------------------------------------------------------------------------------------
def test_max_context_is_the_exact_boundary():
    p = plan("llama-2-7b", "rtx-4090", Workload(context=2048), Settings(framework="none"))
    e = estimate("llama-2-7b", "rtx-4090", Workload(context=2048), Settings(framework="none"))
    # Llama-2's limit is 4,096 and it fits there, so raise the batch until the KV binds
    e8 = estimate("llama-2-7b", "rtx-4090", Workload(batch=8, context=512), Settings(framework="none"))
    p8 = plan("llama-2-7b", "rtx-4090", Workload(batch=8, context=512), Settings(framework="none"))
    assert 0 < e8.max_context < 4096
    assert p8.fits(8, e8.max_context) and not p8.fits(8, e8.max_context + 1)
    assert e.max_context == 4096 and p.fits(1, 4096)


def test_max_batch_is_the_exact_boundary():
    e = estimate("llama-3-8b", "l40s", Workload(context=8192), detail=False)
    p = plan("llama-3-8b", "l40s", Workload(context=8192))
    assert e.max_batch > 1
    assert p.fits(e.max_batch, 8192) and not p.fits(e.max_batch + 1, 8192)


def test_devices_needed_is_minimal_among_engine_layouts():
    """Fewest devices as engines lay them out: TP in {1, 2, 4, 8} within a node, then TP 8 x PP
    across nodes (issue 7; the old search allowed any TP x PP, e.g. TP 1 x PP 11)."""
    e = estimate("llama-3-70b", "rtx-4090", detail=False)
    p = plan("llama-3-70b", "rtx-4090")
    n, tp, pp = e.devices_needed, e.devices_needed_tp, e.devices_needed_pp
    assert not e.fits and e.verdict_key == "needs_more_devices" and n == tp * pp
    assert p.fits(1, 4096, tp, pp)
    for t in (1, 2, 4, 8):  # no smaller TP within the node fits
        if t < tp and p.tp_valid(t):
            assert not p.fits(1, 4096, t, 1)
    assert (n, tp, pp) == (8, 8, 1)


def test_deepseek_v3_fp8_on_h100_is_two_nodes_of_eight():
    """The known deployment: 2 x 8 H100 (TP 8 x PP 2); fewer only as a pipeline-only layout,
    which the answer names along with the memory it assumes."""
    e = estimate("deepseek-v3", "h100-sxm", settings=Settings(weights="fp8"))
    assert (e.devices_needed, e.devices_needed_tp, e.devices_needed_pp) == (16, 8, 2)
    assert "PP 2 across nodes" in e.devices_note and "memory alone would fit 11 (TP 1 x PP 11)" in e.devices_note
    assumed = next(n for n in e.notes if n.startswith("fewest devices"))
    assert "71.30 GiB usable of 79.22 GiB per device" in assumed and "weights 40.40 GiB" in assumed
    assert e.at_devices_needed is not None and e.at_devices_needed.tp == 8 and e.at_devices_needed.pp == 2
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in e.at_devices_needed.serve_command
    assert not plan("deepseek-v3", "h100-sxm", s=Settings(weights="fp8")).fits(1, 4096, 8, 1)


def test_a_model_that_fits_on_tp_2():
    e = estimate("llama-3-70b", "h100-sxm", Workload(), Settings(framework_version="0.10"), detail=False)
    assert (e.devices_needed, e.devices_needed_tp, e.devices_needed_pp) == (2, 2, 1)
    assert e.devices_note.startswith("TP 2 within one node")
    # vLLM >= 0.21 also sets aside its CUDA-graph estimate (80 layers x 26.9 MiB): 70B BF16 then needs 4 H100s
    newest = estimate("llama-3-70b", "h100-sxm", detail=False)
    assert newest.budget_rule == "v1-graphs" and newest.devices_needed == 4


def test_a_model_that_needs_pipeline_stages_across_nodes():
    e = estimate("llama-3.1-405b", "h100-sxm", detail=False)  # BF16: ~756 GiB
    assert e.devices_needed_tp == 8 and e.devices_needed_pp >= 2
    assert e.devices_needed == 8 * e.devices_needed_pp
    assert plan("llama-3.1-405b", "h100-sxm").fits(1, 4096, 8, e.devices_needed_pp)
    assert not plan("llama-3.1-405b", "h100-sxm").fits(1, 4096, 8, e.devices_needed_pp - 1)


def test_pipeline_only_layout_is_named():
    """SmolLM2 has 9 heads: no TP in {2, 4, 8} divides them, so only PP can spread it."""
    tiny = custom_hardware(0.7, 100, 10, overhead_mb=10, framework="none")
    e = estimate("smollm2-135m", tiny, settings=Settings(weights="fp32"), detail=False)
    assert not e.fits and e.devices_needed_tp == 1 and e.devices_needed_pp == e.devices_needed >= 2
    assert "pipeline-only" in e.devices_note
    assert any(n.startswith(f"fewest devices ({e.devices_needed}: pipeline-only, tp 1") for n in e.notes)


def test_does_not_fit_anywhere():
    e = estimate("llama-3.1-405b", "t4", settings=Settings(weights="fp32"), detail=True)
    assert e.verdict_key == "does_not_fit" and e.devices_needed is None and not e.fits
    assert e.suggestions  # something is always said


def test_suggestions_are_computed_not_guessed():
    e = estimate("llama-3-8b", "t4")
    assert not e.fits
    fmt_lines = [s for s in e.suggestions if s.startswith("use ") and "devices" not in s]
    assert fmt_lines
    chosen = next(a for a in e.alternatives if a.fits and not a.current)
    assert estimate("llama-3-8b", "t4", settings=Settings(weights=chosen.format), detail=False).fits
    assert any(f"use {e.devices_needed} devices" in s for s in e.suggestions)


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["llama-3-8b", "gemma-2-9b", "deepseek-v2-lite", "internvl2-8b", "mamba-1.4b"]),
       hw=st.sampled_from(["rtx-4090", "atlas-300v-pro", "h100-sxm", "apple-m3-max"]),
       batch=st.integers(1, 64), context=st.integers(2, 40000), extra_b=st.integers(0, 8), extra_s=st.integers(0, 5000))
def test_memory_grows_with_batch_and_context(model, hw, batch, context, extra_b, extra_s):
    p = plan(model, hw)
    a = max(s.total for s in p.memory(batch, context))
    b = max(s.total for s in p.memory(batch + extra_b, context + extra_s))
    assert b >= a


# --- inputs -------------------------------------------------------------------------------------------------------
def _write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, size) in tensors.items():
        n = 1
        for x in shape:
            n *= x
        nbytes = n * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        blobs.append(b"\0" * nbytes)
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


TINY = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"}


def test_model_folder_gives_exact_bytes_from_safetensors_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    _write_safetensors(tmp_path / "model.safetensors", {
        "model.embed_tokens.weight": ("BF16", [10, 16], 2),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [16, 16], 2),
        "model.layers.0.self_attn.k_proj.weight": ("BF16", [8, 16], 2),
        "model.layers.0.self_attn.v_proj.weight": ("BF16", [8, 16], 2),
        "model.layers.0.self_attn.o_proj.weight": ("BF16", [16, 16], 2),
        "model.layers.0.mlp.gate_proj.weight": ("BF16", [32, 16], 2),
        "model.layers.0.mlp.up_proj.weight": ("BF16", [32, 16], 2),
        "model.layers.0.mlp.down_proj.weight": ("BF16", [16, 32], 2),
        "model.layers.0.input_layernorm.weight": ("BF16", [16], 2),
        "model.layers.0.post_attention_layernorm.weight": ("BF16", [16], 2),
        "model.norm.weight": ("F32", [16], 4),  # stored in fp32: 32 bytes more than the formula thinks
    })
    header = read_safetensors_header(tmp_path / "model.safetensors")
    assert header["model.norm.weight"]["dtype"] == "F32"
    ck = checkpoint_from_folder(tmp_path)
    m = model_from_folder(tmp_path)
    assert ck.numel == m.params_total  # float tensors: exact count == formula
    assert ck.stored_bytes == 2 * m.params_total + 16 * 2
    e = estimate(str(tmp_path), "t4", Workload(context=64), NONE, detail=False)
    assert e.weight_bytes == ck.stored_bytes
    e8 = estimate(str(tmp_path), "t4", Workload(context=64), Settings(framework="none", weights="int8"), detail=False)
    assert e8.weight_bytes < ck.stored_bytes  # an explicit format re-sizes from the parameter count


def test_bad_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10 ** 9) + b"{}")
    with pytest.raises(SizingError, match="header length"):
        model_from_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"nope!")
    with pytest.raises(SizingError, match="not valid JSON"):
        model_from_folder(tmp_path)


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"), ("{", "malformed"), ("42", "JSON object"), ('{"model_type": "llama"}', "missing 'hidden_size'"),
    ('{"model_type": "llama", "hidden_size": 64.5, "num_hidden_layers": 2, "num_attention_heads": 2,'
     ' "vocab_size": 9, "intermediate_size": 3}', "integer"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 9,'
     ' "intermediate_size": 3, "vision_config": 5}', "vision_config"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 9,'
     ' "intermediate_size": 3}', "missing 'model_type'"),
    ('{"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 9}', "'num_heads' x 'head_dim'"),
])
def test_pasted_config_errors(text, fragment):
    with pytest.raises(SizingError, match=fragment):
        parse_config_text(text)


@pytest.mark.parametrize("model_type", ["brandnew", "rwkv", "mpt", "nemotron_h", "t5"])
def test_a_family_the_calculator_does_not_count_is_refused_by_name(model_type):
    """Issue #21: never counted as another family (Jamba as Llama was +78% parameters, 8x the KV)."""
    with pytest.raises(SizingError, match=rf"^model_type '{model_type}' is not a family the calculator sizes.*"
                                          r"Supported: .*\bllama\b.*\bmamba\b"):
        parse_config_text(json.dumps({**TINY, "model_type": model_type}))


def test_models_by_display_name_and_hub_id():
    assert get_model("InternVL2-8B").key == "internvl2-8b"
    assert get_model("meta-llama/Llama-2-7b-hf").key == "llama-2-7b"
    with pytest.raises(SizingError):
        get_model("")


def test_custom_hardware_and_validation():
    hw = custom_hardware(48, 204.8, 70, int8_tops=140, bf16=False)
    e = estimate("internvl2-8b", hw, detail=False)
    assert e.device_memory_bytes == 48 * GiB and e.weights_format == "fp16"
    for bad in (dict(memory_gib=0, bandwidth_gb_s=1, fp16_tflops=1), dict(memory_gib=1, bandwidth_gb_s=-1, fp16_tflops=1),
                dict(memory_gib=1, bandwidth_gb_s=1, fp16_tflops=float("nan"))):
        with pytest.raises(SizingError):
            custom_hardware(**bad)
    with pytest.raises(SizingError):
        custom_hardware(1, 1, 1, eta_memory=1.5)


def test_hardware_file_path(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps({"name": "My NPU", "memory_gib": 32, "bandwidth_gb_s": 400, "fp16_tflops": 100}))
    hw = get_hardware(str(path))
    assert hw.name == "My NPU" and hw.memory_bytes == 32 * GiB
    path.write_text("{")
    with pytest.raises(SizingError, match="not valid JSON"):
        get_hardware(str(path))


def test_hardware_presets_carry_sources_and_confidence():
    from engine.memory import hardware_info, hardware_presets

    for key in hardware_presets():
        info = hardware_info(key)
        for field in ("memory_gib", "bandwidth_gb_s", "fp16_tflops"):
            assert info[field]["source"], (key, field)
            assert info[field]["confidence"], (key, field)
        assert info["efficiency"]["source"]


def test_this_machine_is_measured():
    m = measure_this_machine()
    assert m.memory_total > 0 and m.bandwidth > 1e8 and m.flops > 1e8
    hw = get_hardware("this-machine")
    assert hw.measured and hw.memory_bytes == m.memory_total and hw.bandwidth == m.bandwidth
    assert estimate("smollm2-135m", hw, detail=False).fits


# --- advice ------------------------------------------------------------------------------------------------------
def test_serve_commands():
    e = estimate("llama-3-70b", "h100-sxm", settings=Settings(tp=4, kv_dtype="fp8"), detail=False)
    assert e.serve_command.startswith("vllm serve meta-llama/Meta-Llama-3-70B")
    assert "--tensor-parallel-size 4" in e.serve_command and "--kv-cache-dtype fp8" in e.serve_command
    s = estimate("qwen2.5-7b", "l40s", settings=Settings(framework="sglang", weights="int4"), detail=False)
    assert s.serve_command.startswith("python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct")
    assert "--quantization awq" in s.serve_command
    g = estimate("llama-3-8b", "apple-m3-max", settings=Settings(weights="q4_k_m"), detail=False)
    assert g.serve_command.startswith("llama-server -m") and "Q4_K_M" in g.serve_command
    v = estimate("internvl2-8b", "a100-80gb", detail=False)
    assert "--trust-remote-code" in v.serve_command and "--limit-mm-per-prompt" in v.serve_command


def test_every_formula_has_its_numbers():
    e = estimate("internvl2-8b", "atlas-300v-pro")
    for name in ("parameters", "weights", "kv_per_token", "kv_total", "activations", "overhead", "budget", "fits",
                 "kv_room", "decode", "prefill", "ridge"):
        assert name in e.formulas and any(c.isdigit() for c in e.formulas[name]), name
    assert "32 x 2 x 8 x 128" in e.formulas["kv_per_token"] and "131,072" in e.formulas["kv_per_token"]
    assert "4,096^2 x 2" in e.formulas["budget"]
    assert "8,075,365,376" in e.formulas["parameters"]


def test_activation_formula_is_the_calibrated_one():
    """--formula prints activations.py's formula (vLLM's profiling peak), not aiconfigurator's
    "x 11 ... + B x V x 4" filled with the new numbers; its terms add up to the answer's bytes."""
    e = estimate("llama-3-8b", "rtx-3090", Workload(context=20000),
                 Settings(max_num_batched_tokens=20000, framework_version="0.7"))
    text = e.formulas["activations"]
    assert "max(forward, sampler)" in text and "x 11" not in text and "B x V x 4" not in text
    # forward = T x b x (2h + max(3I/tp + h, attn/tp)) = 20,000 x 2 x (8,192 + 47,104) = 2,211,840,000 B
    assert "20,000 x 2 x (2 x 4,096 + max(43,008/1 + 4,096, 14,336/1)) = 2,211,840,000 B" in text
    assert "1 x 128,256 x 38.8" in text  # the sampler term with vLLM's fitted bytes per logit
    assert "RoPE cos/sin cache max_position x head_dim x b = 8,192 x 128 x 2 = 2,097,152 B" in text
    assert f"= {e.activation_bytes:,} B" in text and e.activation_bytes == 2_211_840_000 + 2_097_152
    v1 = estimate("llama-3-8b", "rtx-3090", Workload(context=20000), Settings(max_num_batched_tokens=20000))
    assert v1.formulas["activations"].startswith("activations = forward (vLLM V1 samples only after")
    assert "38.8" not in v1.formulas["activations"] and v1.activation_bytes == e.activation_bytes  # forward wins
    plain = estimate("llama-3-8b", "rtx-3090", settings=NONE).formulas["activations"]
    assert "S x V x 4 =" in plain and "RoPE" not in plain  # plain runtimes: fp32 logits, no RoPE cache counted
    vis = estimate("internvl2-8b", "atlas-300v-pro")
    assert "vision images x tiles x patch tokens x hidden x b x 11 = 1 x 13 x 1025 x 1024 x 2 x 11" in \
        vis.formulas["activations"] and f"= {vis.activation_bytes:,} B" in vis.formulas["activations"]


def test_workload_resolution():
    e = estimate("internvl2-8b", "a100-80gb", Workload(context=8192, images=2, tiles=6, output=100), detail=False)
    assert e.image_tokens == 2 * 6 * 256 and e.prompt_tokens == 8192 - 100
    e2 = estimate("llama-3-8b", "a100-80gb", Workload(prompt=1000, output=24), detail=False)
    assert e2.context == 1024
    small = estimate("internvl2-8b", "a100-80gb", Workload(context=2048), detail=False)
    assert small.images == 0 and any("no image" in n for n in small.notes)
    with pytest.raises(SizingError, match="no vision tower"):
        estimate("llama-3-8b", "a100-80gb", Workload(images=1))
    with pytest.raises(SizingError, match="tiles"):
        estimate("internvl2-8b", "a100-80gb", Workload(tiles=41))
    long = estimate("llama-2-7b", "h100-sxm", Workload(context=8192), detail=False)
    assert any("max_position_embeddings" in w for w in long.warnings)


def test_kv_and_mib_units():
    assert MiB == 1 << 20 and GiB == 1 << 30


def test_speed_and_command_are_also_given_where_it_fits():
    e = estimate("llama-3-70b", "rtx-4090", Workload(batch=4, context=8192))
    there = e.at_devices_needed
    assert there.devices == e.devices_needed == 8 and there.tp == 8
    assert "--tensor-parallel-size 8" in there.serve_command
    assert there.decode_tokens_per_s_roofline > 5 * e.decode_tokens_per_s_roofline
    assert estimate("llama-3-8b", "h100-sxm", detail=False).at_devices_needed is None


def test_a_config_files_model_name(tmp_path):
    """Issue #21: the name comes from _name_or_path / name_or_path, else the file, never a folder
    like ``configs`` that merely holds a named config file."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "llama-tiny.json").write_text(json.dumps(TINY))
    assert model_from_path(folder / "llama-tiny.json").display_name == "llama-tiny"
    (folder / "hub.json").write_text(json.dumps({**TINY, "_name_or_path": "org/hub-model"}))
    assert model_from_path(folder / "hub.json").hf_id == "org/hub-model"
    (folder / "old.json").write_text(json.dumps({**TINY, "name_or_path": "org/old-model"}))
    assert model_from_path(folder / "old.json").display_name == "org/old-model"
    model_dir = tmp_path / "Tiny-Llama-1B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY))
    assert model_from_path(model_dir / "config.json").display_name == "Tiny-Llama-1B"
    assert "configs" not in estimate(model_from_path(folder / "llama-tiny.json"), "h100-sxm").serve_command
