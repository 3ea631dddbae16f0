"""The calculator's config parser (engine/sizing/arch/): bad configs are refused clearly.

Every malformed config.json (pasted, uploaded or read from a folder) must give one
``SizingError`` (a ``ValueError``) whose one-line message names the offending field, never a
TypeError / KeyError / ZeroDivisionError / IndexError or a silently wrong answer. New families
(GPT-2, GPT-NeoX, Phi, StarCoder2, Qwen2-VL) are checked here for their KV bytes and layout;
their parameter counts against transformers are in tests/test_memory_meta.py.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.memory import SizingError, get_model, model_from_config, parse_config_text

PRESETS = Path(__file__).resolve().parents[1] / "presets" / "models"


def _preset(name: str) -> dict[str, Any]:
    return json.loads((PRESETS / f"{name}.json").read_text())


def _with(name: str, path: str, value: Any) -> dict[str, Any]:
    """A preset with one (possibly nested, dotted) field replaced; ``...`` deletes it."""
    cfg = copy.deepcopy(_preset(name))
    *parents, last = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


def _refused(cfg: Any, field: str) -> str:
    with pytest.raises(SizingError) as info:
        model_from_config(cfg)
    message = str(info.value)
    assert field.lower() in message.lower(), message
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------------------------
# not a config at all


@pytest.mark.parametrize("cfg", [[], "llama", 5, None, 3.5, True])
def test_a_config_must_be_an_object(cfg: Any) -> None:
    _refused(cfg, "JSON object")


def test_an_empty_object_names_the_first_missing_field() -> None:
    _refused({}, "missing 'model_type'")
    _refused({"model_type": "llama"}, "hidden_size")


@pytest.mark.parametrize("text", ["[]", "5", "null", '"x"'])
def test_pasted_text_that_is_not_an_object(text: str) -> None:
    with pytest.raises(SizingError, match="JSON object"):
        parse_config_text(text)


# --------------------------------------------------------------------------------------------
# wrongly typed / out-of-range fields (regressions: each was a TypeError, a silent default or
# an absurd answer before)

BAD_FIELDS = [
    # (preset, field, value, words the message must contain)
    ("llama-3-8b", "hidden_size", "4096", "hidden_size"),
    ("llama-3-8b", "hidden_size", True, "hidden_size"),
    ("llama-3-8b", "hidden_size", None, "hidden_size"),
    ("llama-3-8b", "hidden_size", 4096.5, "hidden_size"),
    ("llama-3-8b", "hidden_size", 4096.0, "hidden_size"),
    ("llama-3-8b", "hidden_size", float("nan"), "hidden_size"),
    ("llama-3-8b", "hidden_size", float("inf"), "hidden_size"),
    ("llama-3-8b", "hidden_size", -4096, "hidden_size"),
    ("llama-3-8b", "hidden_size", [4096], "hidden_size"),
    ("llama-3-8b", "num_attention_heads", 0, "num_attention_heads"),
    ("llama-3-8b", "num_attention_heads", -32, "num_attention_heads"),
    ("llama-3-8b", "num_key_value_heads", 0, "num_key_value_heads"),
    ("llama-3-8b", "num_hidden_layers", 0, "num_hidden_layers"),
    ("llama-3-8b", "num_hidden_layers", 10**12, "num_hidden_layers"),
    ("llama-3-8b", "vocab_size", 10**12, "vocab_size"),
    ("llama-3-8b", "intermediate_size", "big", "intermediate_size"),
    ("llama-3-8b", "torch_dtype", 5, "torch_dtype"),
    ("llama-3-8b", "torch_dtype", "float13", "torch_dtype"),
    ("llama-3-8b", "torch_dtype", ["bfloat16"], "torch_dtype"),
    ("llama-3-8b", "max_position_embeddings", -1, "max_position_embeddings"),
    ("llama-3-8b", "max_position_embeddings", "8k", "max_position_embeddings"),
    ("llama-3-8b", "tie_word_embeddings", "yes", "tie_word_embeddings"),
    ("llama-3-8b", "rope_theta", 0, "rope_theta"),
    ("llama-3-8b", "rope_theta", "big", "rope_theta"),
    ("llama-3-8b", "model_type", 5, "model_type"),
    ("llama-3-8b", "architectures", 5, "architectures"),
    ("llama-3-8b", "_source", 5, "_source"),
    ("llama-3-8b", "_source", "abc", "_source"),
    ("llama-3-8b", "quantization_config", 5, "quantization_config"),
    ("mixtral-8x7b", "num_local_experts", "8", "num_local_experts"),
    ("mixtral-8x7b", "num_local_experts", [8], "num_local_experts"),
    ("mixtral-8x7b", "num_experts_per_tok", 0, "num_experts_per_tok"),
    ("mixtral-8x7b", "num_experts_per_tok", 9, "num_experts_per_tok"),
    ("mistral-7b", "sliding_window", "abc", "sliding_window"),
    ("mistral-7b", "sliding_window", [4096], "sliding_window"),
    ("mistral-7b", "sliding_window", -5, "sliding_window"),
    ("gemma-2-9b", "sliding_window", "4k", "sliding_window"),
    ("qwen2.5-7b", "max_window_layers", "x", "max_window_layers"),
    ("qwen2.5-7b", "use_sliding_window", "true", "use_sliding_window"),
    ("deepseek-v2-lite", "kv_lora_rank", 0, "kv_lora_rank"),
    ("deepseek-v2-lite", "n_routed_experts", "64", "n_routed_experts"),
    ("mamba-1.4b", "time_step_rank", "x", "time_step_rank"),
    ("mamba-1.4b", "state_size", -16, "state_size"),
    ("falcon-7b", "multi_query", "no", "multi_query"),
    ("falcon-7b", "ffn_hidden_size", 0, "ffn_hidden_size"),
    ("internvl2-8b", "downsample_ratio", "half", "downsample_ratio"),
    ("internvl2-8b", "downsample_ratio", 0, "downsample_ratio"),
    ("internvl2-8b", "max_dynamic_patch", -3, "max_dynamic_patch"),
    ("internvl2-8b", "vision_config", 5, "vision_config"),
    ("internvl2-8b", "vision_config.patch_size", "14", "patch_size"),
    ("internvl2-8b", "vision_config.patch_size", [], "patch_size"),
    ("internvl2-8b", "vision_config.image_size", 0, "image_size"),
    ("internvl2-8b", "vision_config.hidden_size", None, "hidden_size"),
    ("internvl2-8b", "llm_config.num_hidden_layers", "32", "num_hidden_layers"),
    ("internvl2-8b", "llm_config", 5, "llm_config"),
]


@pytest.mark.parametrize("preset,field,value,words", BAD_FIELDS,
                         ids=[f"{p}:{f}={v!r}"[:60] for p, f, v, _ in BAD_FIELDS])
def test_bad_field_is_refused_naming_it(preset: str, field: str, value: Any, words: str) -> None:
    _refused(_with(preset, field, value), words)


def test_qwen2_moe_mlp_only_layers_must_be_a_list_of_layer_indices() -> None:
    cfg = dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
               num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=100)
    for bad in (5, "0,1", [0.5], [True]):
        _refused({**cfg, "mlp_only_layers": bad}, "mlp_only_layers")


def test_layer_types_must_be_a_list_of_strings() -> None:
    for bad in (5, "sliding_attention", [1, 2]):
        _refused(_with("gemma-2-9b", "layer_types", bad), "layer_types")


def test_text_config_must_be_an_object() -> None:
    _refused({"model_type": "llava", "text_config": 5, "vision_config": {}}, "text_config")


def test_known_dtype_spellings_are_accepted() -> None:
    for raw, want in [("float16", "fp16"), ("half", "fp16"), ("bfloat16", "bf16"), ("float32", "fp32"),
                      ("float", "fp32"), ("torch.float16", "fp16"), ("BF16", "bf16")]:
        assert model_from_config(_with("llama-3-8b", "torch_dtype", raw)).checkpoint_dtype == want


def test_checkpoint_dtype_speaks_the_one_dtype_vocabulary() -> None:
    """checkpoint_dtype reads names through formats.dtype_key: every spelling the calculator knows
    for a storage dtype is accepted in a config and gives the same key the rest of it uses."""
    from engine.sizing.formats import CHECKPOINT_DTYPES, DTYPE_ALIASES, dtype_key
    for alias, key in DTYPE_ALIASES.items():
        if key in CHECKPOINT_DTYPES:
            for spelled in (alias, alias.upper(), f"torch.{alias}"):
                got = model_from_config(_with("llama-3-8b", "torch_dtype", spelled)).checkpoint_dtype
                assert got == dtype_key(spelled) == key, spelled
    for bad in ("int8", "q4_k_m", "float8_e5m2", "torch.", ""):
        _refused(_with("llama-3-8b", "torch_dtype", bad), "torch_dtype")


def test_transformers_5_dtype_key_is_read() -> None:
    cfg = _with("llama-3-8b", "torch_dtype", ...)
    assert model_from_config({**cfg, "dtype": "float16"}).checkpoint_dtype == "fp16"
    _refused({**cfg, "dtype": "int3"}, "dtype")


def test_every_preset_still_parses() -> None:
    for path in sorted(PRESETS.glob("*.json")):
        spec = get_model(path.stem)
        assert spec.params_total > 0 and math.isfinite(spec.params_total)


# --------------------------------------------------------------------------------------------
# the new families: shapes the calculator must get right beyond the parameter count


def _gpt2(**over: Any) -> dict[str, Any]:
    """openai-community/gpt2 config.json (n_inner null -> 4 * n_embd)."""
    cfg: dict[str, Any] = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=768, n_layer=12,
                               n_head=12, n_positions=1024, n_ctx=1024, n_inner=None, vocab_size=50257,
                               activation_function="gelu_new")
    cfg.update(over)
    return cfg


def test_gpt2_parses_with_n_inner_null() -> None:
    spec = model_from_config(_gpt2())
    assert spec.params_total == 124_439_808  # published "124M"; equal to transformers' count
    assert spec.kv_elems_per_token == 2 * 12 * 768  # MHA: 2 x L x h
    assert spec.tied and spec.lm_head_params == 0
    assert spec.max_position == 1024
    assert spec.checkpoint_dtype == "fp32"  # GPT-2's config has no torch_dtype; the checkpoint is fp32


def test_gpt2_explicit_n_inner_is_used() -> None:
    small = model_from_config(_gpt2(n_inner=1024)).params_total
    default = model_from_config(_gpt2()).params_total
    assert default - small == 12 * (2 * 768 * (3072 - 1024) + (3072 - 1024))


def test_gpt2_bad_fields_are_named() -> None:
    _refused(_gpt2(n_embd=None), "n_embd")
    _refused(_gpt2(n_head=7), "n_head")  # 768 % 7 != 0
    _refused(_gpt2(n_inner="4h"), "n_inner")
    _refused(_gpt2(n_positions=0), "n_positions")
    _refused(_gpt2(add_cross_attention=True), "add_cross_attention")  # was silently under-counted


def test_sliding_window_false_means_no_window() -> None:
    spec = model_from_config(_with("mistral-7b", "sliding_window", False))
    assert {layer.window for layer in spec.layers} == {None}


def test_gpt_neox_is_not_counted_as_gated() -> None:
    """Pythia-1.4B: 1,414,647,808 (EleutherAI's published count)."""
    cfg = dict(model_type="gpt_neox", hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
               num_hidden_layers=24, vocab_size=50304, rotary_pct=0.25, use_parallel_residual=True,
               tie_word_embeddings=False, torch_dtype="float16")
    spec = model_from_config(cfg)
    assert spec.params_total == 1_414_647_808
    assert spec.kv_elems_per_token == 2 * 24 * 2048
    assert "non-gated" in " ".join(spec.param_formula)


def test_starcoder2_sliding_window_on_every_layer() -> None:
    cfg = dict(model_type="starcoder2", hidden_size=3072, intermediate_size=12288, num_attention_heads=24,
               num_key_value_heads=2, num_hidden_layers=30, vocab_size=49152, use_bias=True, sliding_window=4096)
    spec = model_from_config(cfg)
    assert spec.kv_elems_per_token == 30 * 2 * 2 * 128
    assert {layer.window for layer in spec.layers} == {4096}
    assert spec.tied  # Starcoder2Config ties by default
    no_window = model_from_config({**cfg, "sliding_window": None})
    assert {layer.window for layer in no_window.layers} == {None}


def test_qwen2_vl_flat_and_nested_forms_agree() -> None:
    flat = _preset("qwen2-vl-7b-instruct")
    text_keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                 "sliding_window", "use_sliding_window", "max_window_layers", "torch_dtype")
    nested = {k: v for k, v in flat.items() if k not in text_keys}
    nested["text_config"] = {"model_type": "qwen2_vl_text", **{k: flat[k] for k in text_keys if k in flat}}
    a, b = model_from_config(flat), model_from_config(nested)
    assert a.params_total == b.params_total
    assert a.kv_elems_per_token == b.kv_elems_per_token == 28 * 2 * 4 * 128
    assert a.vision is not None and a.vision.kind == "qwen2-vl"
    assert a.vision.tokens_per_tile == 256  # a 448x448 region: 32x32 patches merged 2x2


def test_qwen2_vl_vision_fields_are_named() -> None:
    _refused(_with("qwen2-vl-7b-instruct", "vision_config.depth", 0), "depth")
    _refused(_with("qwen2-vl-7b-instruct", "vision_config.embed_dim", "1280"), "embed_dim")
    _refused(_with("qwen2-vl-7b-instruct", "vision_config.spatial_merge_size", 0), "spatial_merge_size")
    _refused(_with("qwen2.5-vl-7b-instruct", "vision_config.intermediate_size", None), "intermediate_size")
    _refused(_with("qwen2.5-vl-7b-instruct", "vision_config.out_hidden_size", -1), "out_hidden_size")


# --------------------------------------------------------------------------------------------
# where a config comes from: names, paths and text (engine/sizing/models.py)


@pytest.mark.parametrize("name,words", [
    ("x" * 5000, "5,000 characters"),  # was OSError: File name too long
    ("x" * 300, "cannot use"),  # one path component over NAME_MAX: was OSError
    ("a\x00b", "unknown model"),
    ("no/such/dir/config.json", "not found"),
])
def test_bad_model_names_are_one_line_errors(name: str, words: str) -> None:
    with pytest.raises(SizingError, match=words) as info:
        get_model(name)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("text,words", [
    ("[" * 100_000, "nested too deeply"),  # was RecursionError
    ('{"vocab_size": ' + "9" * 5000 + "}", "digits"),  # was a bare ValueError from int()
    ("{" + " " * (17 * 2 ** 20) + "}", "at most"),
])
def test_hostile_config_text_is_refused(text: str, words: str) -> None:
    with pytest.raises(SizingError, match=words):
        parse_config_text(text)


def test_index_with_a_bad_weight_map_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_preset("smollm2-135m")))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(SizingError, match="weight_map"):
        get_model(str(tmp_path))
