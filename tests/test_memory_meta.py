"""Must show #1 (second half): parameter counts from formulas agree with transformers.

Each config is instantiated on PyTorch's meta device (no weights, no download, no
trust_remote_code) and its parameters counted; the calculator must agree within 0.5 %
(in practice it is exact). Only this test module imports torch/transformers.
"""
import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.memory import get_model, model_from_config  # noqa: E402

PRESETS = Path(__file__).resolve().parents[1] / "presets" / "models"
TOLERANCE = 0.005


def _meta_count(model_type: str, cfg: dict, cls=None) -> int:
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in ("model_type", "quantization_config")}
    config = transformers.CONFIG_MAPPING[model_type](**cfg)
    with torch.device("meta"):
        model = (cls or transformers.AutoModelForCausalLM).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _preset(name: str) -> dict:
    return json.loads((PRESETS / f"{name}.json").read_text())


TEXT_PRESETS = sorted(p.stem for p in PRESETS.glob("*.json") if "vision_config" not in _preset(p.stem))


def test_at_least_eight_architectures_are_checked():
    assert len(TEXT_PRESETS) >= 8
    kinds = {_preset(n)["model_type"] for n in TEXT_PRESETS}
    assert {"llama", "qwen2", "qwen3", "mistral", "mixtral", "deepseek_v2", "gemma2", "phi3", "falcon",
            "mamba", "gpt2", "gpt_neox", "phi", "starcoder2", "jamba", "cohere", "mamba2", "bloom", "opt",
            "gptj"} <= kinds


@pytest.mark.parametrize("name", TEXT_PRESETS)
def test_preset_params_match_meta_device(name):
    cfg = _preset(name)
    expected = _meta_count(cfg["model_type"], cfg)
    ours = get_model(name).params_total
    assert ours == pytest.approx(expected, rel=TOLERANCE), f"{name}: {ours:,} vs transformers {expected:,}"


def test_internvl2_8b_matches_hf_native_internvl_on_meta():
    """InternVL2-8B's LLM (InternLM2) is not in transformers; the HF-native InternVL class with a
    Llama text model of the same shapes and an InternViT of the same shapes is the same count."""
    cfg = _preset("internvl2-8b")
    llm, vis = cfg["llm_config"], cfg["vision_config"]
    text = transformers.LlamaConfig(
        hidden_size=llm["hidden_size"], intermediate_size=llm["intermediate_size"],
        num_hidden_layers=llm["num_hidden_layers"], num_attention_heads=llm["num_attention_heads"],
        num_key_value_heads=llm["num_key_value_heads"], vocab_size=llm["vocab_size"], tie_word_embeddings=False)
    vision = transformers.InternVLVisionConfig(
        hidden_size=vis["hidden_size"], intermediate_size=vis["intermediate_size"],
        num_hidden_layers=vis["num_hidden_layers"], num_attention_heads=vis["num_attention_heads"],
        patch_size=[vis["patch_size"]] * 2, image_size=[vis["image_size"]] * 2, attention_bias=vis["qkv_bias"],
        use_qk_norm=vis["qk_normalization"], norm_type=vis["norm_type"], use_mean_pooling=False)
    config = transformers.InternVLConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                                         downsample_ratio=cfg["downsample_ratio"], tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.InternVLForConditionalGeneration(config)
    expected = sum(p.numel() for p in model.parameters())
    ours = get_model("internvl2-8b").params_total
    assert ours == pytest.approx(expected, rel=TOLERANCE)
    # the HF port adds one final LayerNorm (2 x 1024) that InternViT-300M does not have
    assert expected - ours == 2 * vis["hidden_size"]
    # and the HF-native config form parses to the same numbers (+ that LayerNorm)
    native = model_from_config({**config.to_dict(), "model_type": "internvl"})
    assert native.params_total == expected


SYNTHETIC = {
    "qwen2_moe (shared expert + gate)": ("qwen2_moe", dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=384,
        num_experts=8, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=1000, decoder_sparse_step=2, mlp_only_layers=[3])),
    "qwen3_moe": ("qwen3_moe", dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=4,
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=48, vocab_size=1000)),
    "falcon new decoder (40B style)": ("falcon", dict(
        hidden_size=512, num_hidden_layers=3, num_attention_heads=16, num_kv_heads=4, new_decoder_architecture=True,
        parallel_attn=True, bias=False, vocab_size=1000)),
    "falcon sequential with bias": ("falcon", dict(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, multi_query=False, parallel_attn=False,
        bias=True, vocab_size=500)),
    "deepseek_v3 with q_lora": ("deepseek_v3", dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=8,
        num_experts_per_tok=2, first_k_dense_replace=2, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=24, vocab_size=300, n_group=1, topk_group=1)),
    "mamba with biases": ("mamba", dict(
        hidden_size=128, num_hidden_layers=3, vocab_size=300, state_size=8, expand=2, conv_kernel=3,
        use_bias=True, use_conv_bias=False, tie_word_embeddings=False)),
    "gemma3 text (qk-norm, 5:1 sliding)": ("gemma3_text", dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64, vocab_size=1000, sliding_window=128)),
}


@pytest.mark.parametrize("label", list(SYNTHETIC))
def test_synthetic_architectures_match_meta_device(label):
    model_type, cfg = SYNTHETIC[label]
    expected = _meta_count(model_type, cfg)
    ours = model_from_config({"model_type": model_type, **copy.deepcopy(cfg)}).params_total
    assert ours == pytest.approx(expected, rel=TOLERANCE), f"{label}: {ours:,} vs {expected:,}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_type=st.sampled_from(["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2"]),
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([16, 32, 48]),
    width_per_head=st.sampled_from([16, 24, 32]),  # transformers insists hidden % heads == 0
    inter=st.integers(32, 300),
    layers=st.integers(1, 4),
    vocab=st.integers(10, 3000),
    tied=st.booleans(),
    bias=st.booleans(),
)
def test_random_llama_family_configs_match_meta_device(model_type, kv_heads, group, head_dim, width_per_head, inter,
                                                       layers, vocab, tied, bias):
    cfg = dict(hidden_size=width_per_head * kv_heads * group, intermediate_size=inter, num_hidden_layers=layers,
               num_attention_heads=kv_heads * group, num_key_value_heads=kv_heads, head_dim=head_dim,
               vocab_size=vocab, tie_word_embeddings=tied, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    if model_type in ("llama", "qwen3", "gemma2"):
        cfg["attention_bias"] = bias
    if model_type == "llama":
        cfg["mlp_bias"] = bias
    if model_type == "phi3":
        cfg.pop("head_dim")
        cfg["hidden_size"] = head_dim * kv_heads * group
    expected = _meta_count(model_type, cfg)
    assert model_from_config({"model_type": model_type, **cfg}).params_total == expected


# --------------------------------------------------------------------------------------------
# GPT-2, GPT-NeoX, Phi, StarCoder2, Qwen2-VL / Qwen2.5-VL (issue 7). Each config below is the
# published config.json of the named checkpoint, written from its Hugging Face model page
# (https://huggingface.co/<id>/blob/main/config.json), keeping the fields that shape the model
# (dropouts, token ids and other fields that create no parameter are left out). Expected KV
# elements per token are derived by hand from the shapes (2 x L x nkv x d).

PUBLISHED = {
    # openai-community/gpt2: n_inner absent (null) = 4 x n_embd; 124M on the model card
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, n_ctx=1024, vocab_size=50257,
                          activation_function="gelu_new", layer_norm_epsilon=1e-5), 2 * 12 * 768),
    # openai-community/gpt2-xl: 1.5B on the model card
    "gpt2-xl": ("gpt2", dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024, n_ctx=1024, vocab_size=50257,
                             activation_function="gelu_new", layer_norm_epsilon=1e-5), 2 * 48 * 1600),
    # EleutherAI/pythia-1.4b (Pythia README: 1,414,647,808 params)
    "pythia-1.4b": ("gpt_neox", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                                     num_hidden_layers=24, vocab_size=50304, rotary_pct=0.25, rotary_emb_base=10000,
                                     use_parallel_residual=True, max_position_embeddings=2048, hidden_act="gelu",
                                     tie_word_embeddings=False, torch_dtype="float16"), 2 * 24 * 2048),
    # EleutherAI/pythia-6.9b (Pythia README: 6,857,302,016 params)
    "pythia-6.9b": ("gpt_neox", dict(hidden_size=4096, intermediate_size=16384, num_attention_heads=32,
                                     num_hidden_layers=32, vocab_size=50432, rotary_pct=0.25, rotary_emb_base=10000,
                                     use_parallel_residual=True, max_position_embeddings=2048, hidden_act="gelu",
                                     tie_word_embeddings=False, torch_dtype="float16"), 2 * 32 * 4096),
    # microsoft/phi-2: 2.7B on the model card
    "phi-2": ("phi", dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32,
                          num_hidden_layers=32, vocab_size=51200, partial_rotary_factor=0.4, qk_layernorm=False,
                          max_position_embeddings=2048, hidden_act="gelu_new", tie_word_embeddings=False,
                          rope_theta=10000.0, torch_dtype="float16"), 2 * 32 * 2560),
    # bigcode/starcoder2-3b (tie_word_embeddings absent: Starcoder2Config ties by default); 3B
    "starcoder2-3b": ("starcoder2", dict(hidden_size=3072, intermediate_size=12288, num_attention_heads=24,
                                         num_key_value_heads=2, num_hidden_layers=30, vocab_size=49152, use_bias=True,
                                         sliding_window=4096, max_position_embeddings=16384, norm_epsilon=1e-5,
                                         rope_theta=999999.4420358813, torch_dtype="float32"), 2 * 30 * 2 * 128),
    # bigcode/starcoder2-7b: 7B
    "starcoder2-7b": ("starcoder2", dict(hidden_size=4608, intermediate_size=18432, num_attention_heads=36,
                                         num_key_value_heads=4, num_hidden_layers=32, vocab_size=49152, use_bias=True,
                                         sliding_window=4096, max_position_embeddings=16384, norm_epsilon=1e-5,
                                         rope_theta=1000000.0, torch_dtype="float32"), 2 * 32 * 4 * 128),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_gpt_style_models_match_meta_device(name):
    model_type, cfg, kv = PUBLISHED[name]
    expected = _meta_count(model_type, cfg)
    spec = model_from_config({"model_type": model_type, **copy.deepcopy(cfg)})
    assert spec.params_total == pytest.approx(expected, rel=TOLERANCE), f"{name}: {spec.params_total:,} vs {expected:,}"
    assert spec.kv_elems_per_token == kv


def test_starcoder2_window_is_modelled_on_every_layer():
    spec = model_from_config({"model_type": "starcoder2", **PUBLISHED["starcoder2-3b"][1]})
    assert {layer.window for layer in spec.layers} == {4096}


GPT_VARIANTS = {
    "gpt2 untied, explicit n_inner": ("gpt2", dict(n_embd=128, n_layer=3, n_head=4, n_positions=64, n_inner=200,
                                                   vocab_size=500, tie_word_embeddings=False)),
    "gpt_neox no attention bias, tied": ("gpt_neox", dict(hidden_size=128, intermediate_size=300,
                                                          num_attention_heads=8, num_hidden_layers=2, vocab_size=400,
                                                          attention_bias=False, tie_word_embeddings=True)),
    "phi GQA + qk_layernorm": ("phi", dict(hidden_size=128, intermediate_size=256, num_attention_heads=8,
                                           num_key_value_heads=2, num_hidden_layers=2, vocab_size=300,
                                           qk_layernorm=True)),
    "phi tied (the LM-head bias stays)": ("phi", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                                      num_hidden_layers=2, vocab_size=300, tie_word_embeddings=True)),
    "starcoder2 without biases, untied": ("starcoder2", dict(hidden_size=128, intermediate_size=512,
                                                             num_attention_heads=8, num_key_value_heads=2,
                                                             num_hidden_layers=2, vocab_size=300, use_bias=False,
                                                             tie_word_embeddings=False, sliding_window=None)),
}


@pytest.mark.parametrize("label", list(GPT_VARIANTS))
def test_gpt_style_variants_match_meta_device_exactly(label):
    model_type, cfg = GPT_VARIANTS[label]
    expected = _meta_count(model_type, cfg)
    assert model_from_config({"model_type": model_type, **copy.deepcopy(cfg)}).params_total == expected


# Qwen/Qwen2-VL-7B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct config.json (flat transformers-4 form,
# as published); both model pages say 8.29B params.
_QWEN_VL_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, vocab_size=152064, max_window_layers=28, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False, tie_word_embeddings=False,
                     torch_dtype="bfloat16", rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
QWEN_VL = {
    "Qwen2-VL-7B-Instruct": ("qwen2_vl", "Qwen2VLForConditionalGeneration", dict(
        _QWEN_VL_TEXT, max_position_embeddings=32768, vision_config=dict(
            depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, in_chans=3, hidden_size=3584, patch_size=14,
            spatial_merge_size=2, spatial_patch_size=14, temporal_patch_size=2))),
    "Qwen2.5-VL-7B-Instruct": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", dict(
        _QWEN_VL_TEXT, max_position_embeddings=128000, vision_config=dict(
            depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16, in_chans=3,
            out_hidden_size=3584, patch_size=14, spatial_merge_size=2, spatial_patch_size=14, window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, temporal_patch_size=2))),
}


def _qwen_vl_meta(model_type: str, cls_name: str, cfg: dict):
    config = transformers.CONFIG_MAPPING[model_type](**copy.deepcopy(cfg))
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(config)
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return config, total, vision


@pytest.mark.parametrize("name", list(QWEN_VL))
def test_qwen_vl_matches_meta_device_flat_and_nested(name):
    model_type, cls_name, cfg = QWEN_VL[name]
    config, expected, expected_vision = _qwen_vl_meta(model_type, cls_name, cfg)
    flat = model_from_config({"model_type": model_type, **copy.deepcopy(cfg)})
    assert flat.params_total == pytest.approx(expected, rel=TOLERANCE), f"{flat.params_total:,} vs {expected:,}"
    assert flat.vision.total_params == expected_vision
    assert flat.kv_elems_per_token == 2 * 28 * 4 * 128
    # transformers 5 writes the nested form (text_config / vision_config); it parses the same
    nested = model_from_config(json.loads(json.dumps(config.to_dict())))
    assert "hidden_size" not in config.to_dict() and "text_config" in config.to_dict()
    assert nested.params_total == flat.params_total
    assert nested.kv_elems_per_token == flat.kv_elems_per_token


def test_qwen_vl_presets_match_meta_device():
    for name, (model_type, cls_name, _) in zip(("qwen2-vl-7b-instruct", "qwen2.5-vl-7b-instruct"), QWEN_VL.values()):
        cfg = {k: v for k, v in _preset(name).items() if not k.startswith("_") and k != "model_type"}
        _, expected, _ = _qwen_vl_meta(model_type, cls_name, cfg)
        assert get_model(name).params_total == pytest.approx(expected, rel=TOLERANCE)


# --------------------------------------------------------------------------------------------
# Issue #21 item 2: Jamba, Command-R (cohere / cohere2), Llama-4, Gemma-3 multimodal, Mamba2,
# BLOOM, OPT, GPT-J. The presets hold the published config.json of each checkpoint; text-only
# ones are checked by test_preset_params_match_meta_device above, the composites (Llama-4,
# Gemma-3) here with their ForConditionalGeneration class. Expected KV elements per token are
# computed from the config fields here, independently of the parser.


def _attention_kv(layers: int, nkv: int, head_dim: int) -> int:
    return layers * 2 * nkv * head_dim


def _expected_kv(name: str) -> int:
    cfg = _preset(name)
    text = cfg.get("text_config", cfg)
    if name == "jamba-v0.1":
        period, offset = text["attn_layer_period"], text["attn_layer_offset"]
        attn = sum(1 for i in range(text["num_hidden_layers"]) if i % period == offset)
        return _attention_kv(attn, text["num_key_value_heads"], text["hidden_size"] // text["num_attention_heads"])
    if name == "mamba-codestral-7b":
        return 0
    if name == "gemma-3-4b-it":  # Gemma3TextConfig defaults: 4 KV heads of 256
        return _attention_kv(text["num_hidden_layers"], 4, 256)
    if name in ("bloom-560m", "gpt-j-6b"):
        width = text.get("hidden_size") or text["n_embd"]
        return _attention_kv(text.get("n_layer"), text["n_head"], width // text["n_head"])
    if name == "opt-350m":
        return _attention_kv(text["num_hidden_layers"], text["num_attention_heads"],
                             text["hidden_size"] // text["num_attention_heads"])
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return _attention_kv(text["num_hidden_layers"], text["num_key_value_heads"], head_dim)


NEW_FAMILY_PRESETS = ["jamba-v0.1", "command-r-v01", "llama-4-scout-17b-16e", "gemma-3-4b-it", "mamba-codestral-7b",
                      "bloom-560m", "opt-350m", "gpt-j-6b"]


@pytest.mark.parametrize("name", NEW_FAMILY_PRESETS)
def test_new_family_kv_elements_per_token_are_exact(name):
    assert get_model(name).kv_elems_per_token == _expected_kv(name)


def test_jamba_kv_only_on_attention_layers_and_mamba_state_on_the_rest():
    cfg = _preset("jamba-v0.1")
    spec = get_model("jamba-v0.1")
    attn = [i for i in range(32) if i % 8 == 4]
    assert [i for i, layer in enumerate(spec.layers) if layer.kind == "attention"] == attn == [4, 12, 20, 28]
    d_inner = cfg["mamba_expand"] * cfg["hidden_size"]
    state = d_inner * (cfg["mamba_d_conv"] - 1) + d_inner * cfg["mamba_d_state"]
    assert spec.state_elems_per_seq == (32 - len(attn)) * state
    assert sum(1 for layer in spec.layers if layer.num_experts) == 16  # odd layers
    assert spec.params_active < spec.params_total / 2  # top-2 of 16 experts (~12 B of ~52 B)


def test_mamba2_state_per_sequence():
    cfg = _preset("mamba-codestral-7b")
    spec = get_model("mamba-codestral-7b")
    conv_dim = cfg["expand"] * cfg["hidden_size"] + 2 * cfg["n_groups"] * cfg["state_size"]
    per_layer = conv_dim * (cfg["conv_kernel"] - 1) + cfg["num_heads"] * cfg["head_dim"] * cfg["state_size"]
    assert spec.state_elems_per_seq == cfg["num_hidden_layers"] * per_layer
    assert not spec.has_kv


def _composite_meta(cfg: dict, cls_name: str) -> tuple[int, int]:
    """(all parameters, vision tower + projector parameters) of a composite on the meta device."""
    clean = {k: v for k, v in copy.deepcopy(cfg).items() if not k.startswith("_") and k != "model_type"}
    text = clean.get("text_config", {})
    if isinstance(text.get("attn_temperature_tuning"), int):  # published as 4; transformers 5 types it bool
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    config = transformers.CONFIG_MAPPING[cfg["model_type"]](**clean)
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(config)
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters()
                 if any(k in n for k in ("vision_model.", "vision_tower.", "multi_modal_projector.")))
    return total, vision


@pytest.mark.parametrize("name, cls_name", [("llama-4-scout-17b-16e", "Llama4ForConditionalGeneration"),
                                            ("gemma-3-4b-it", "Gemma3ForConditionalGeneration")])
def test_composite_presets_match_meta_device(name, cls_name):
    expected, expected_vision = _composite_meta(_preset(name), cls_name)
    spec = get_model(name)
    assert spec.params_total == pytest.approx(expected, rel=TOLERANCE), f"{name}: {spec.params_total:,} vs {expected:,}"
    assert spec.vision is not None and spec.vision.total_params == expected_vision


def test_llama4_scout_active_and_total_params():
    spec = get_model("llama-4-scout-17b-16e")
    assert 16.5e9 < spec.params_active < 17.5e9  # "17B active"
    assert 108e9 < spec.params_total < 110e9  # "109B total"
    windows = [layer.window for layer in spec.layers]
    assert windows == [None if (i + 1) % 4 == 0 else 8192 for i in range(48)]  # NoPE layers attend globally
    assert spec.max_model_len == 262144


def test_gemma3_nested_and_flat_text_configs_give_the_same_text_figures():
    nested_cfg = _preset("gemma-3-4b-it")
    nested = model_from_config(copy.deepcopy(nested_cfg))
    flat = model_from_config(copy.deepcopy(nested_cfg["text_config"]))
    assert flat.model_type == "gemma3_text" and flat.vision is None
    for field in ("llm_params", "kv_elems_per_token", "head_dim", "num_heads", "num_kv_heads", "vocab", "max_model_len"):
        assert getattr(nested, field) == getattr(flat, field), field
    assert [layer.window for layer in nested.layers] == [layer.window for layer in flat.layers]
    assert nested.head_dim == 256 and nested.vocab == 262208 and nested.max_model_len == 131072
    # and the flat text config is exactly transformers' Gemma3ForCausalLM
    assert flat.params_total == _meta_count("gemma3_text", nested_cfg["text_config"])


NEW_SYNTHETIC = {
    "cohere with qk-norm and biases (Command-R+ style)": ("cohere", dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=1000, use_qk_norm=True, attention_bias=True)),
    "cohere2 sliding 3 of 4, untied": ("cohere2", dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
        vocab_size=500, sliding_window=64, tie_word_embeddings=False)),
    "llama4 text, Maverick-style interleave 2": ("llama4_text", dict(
        hidden_size=128, intermediate_size=64, intermediate_size_mlp=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=1, interleave_moe_layer_step=2,
        vocab_size=500, attention_chunk_size=32)),
    "jamba with proj bias, tied": ("jamba", dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=0, mamba_proj_bias=True, mamba_conv_bias=False, vocab_size=300, tie_word_embeddings=True)),
    "mamba2 with biases": ("mamba2", dict(
        hidden_size=128, num_hidden_layers=2, num_heads=8, head_dim=32, n_groups=2, state_size=16, expand=2,
        vocab_size=300, use_bias=True, use_conv_bias=False)),
    "opt-125m style (no projection, final LayerNorm)": ("opt", dict(
        hidden_size=128, ffn_dim=512, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
        vocab_size=300, do_layer_norm_before=True, word_embed_proj_dim=128)),
    "opt without biases or affine LayerNorms, untied": ("opt", dict(
        hidden_size=128, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32,
        vocab_size=300, enable_bias=False, layer_norm_elementwise_affine=False, word_embed_proj_dim=64,
        tie_word_embeddings=False)),
    "bloom untied": ("bloom", dict(hidden_size=128, n_layer=2, n_head=4, vocab_size=300, tie_word_embeddings=False)),
    "gptj with n_inner, tied (the head keeps its bias)": ("gptj", dict(
        n_embd=128, n_layer=2, n_head=4, n_inner=300, rotary_dim=16, n_positions=64, vocab_size=300,
        tie_word_embeddings=True)),
}


@pytest.mark.parametrize("label", list(NEW_SYNTHETIC))
def test_new_family_variants_match_meta_device_exactly(label):
    model_type, cfg = NEW_SYNTHETIC[label]
    expected = _meta_count(model_type, cfg)
    assert model_from_config({"model_type": model_type, **copy.deepcopy(cfg)}).params_total == expected


def test_layouts_of_the_variants():
    """Windows and expert placement the parameter count cannot see."""
    c2 = model_from_config({"model_type": "cohere2", **NEW_SYNTHETIC["cohere2 sliding 3 of 4, untied"][1]})
    assert [layer.window for layer in c2.layers] == [64, 64, 64, None]
    assert c2.kv_elems_per_token == 4 * 2 * 1 * 32
    mav = model_from_config({"model_type": "llama4_text",
                             **NEW_SYNTHETIC["llama4 text, Maverick-style interleave 2"][1]})
    assert [bool(layer.num_experts) for layer in mav.layers] == [False, True, False, True]
    assert [layer.window for layer in mav.layers] == [32, 32, 32, None]
    opt = get_model("opt-350m")
    assert opt.final_norm_params == 0 and opt.max_model_len == 2048  # LayerNorm after each block: no final one
