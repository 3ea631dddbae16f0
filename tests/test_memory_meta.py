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


TEXT_PRESETS = sorted(p.stem for p in PRESETS.glob("*.json") if p.stem != "internvl2-8b")


def test_at_least_eight_architectures_are_checked():
    assert len(TEXT_PRESETS) >= 8
    kinds = {_preset(n)["model_type"] for n in TEXT_PRESETS}
    assert {"llama", "qwen2", "qwen3", "mistral", "mixtral", "deepseek_v2", "gemma2", "phi3", "falcon",
            "mamba"} <= kinds


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
