"""Fuzz: the calculator's config parser under one-field mutations and extreme-but-valid shapes.

Every model preset (presets/models/*.json) plus the published GPT-2-XL / Pythia-6.9B /
StarCoder2-7B shapes is mutated one field at a time (wrong type, zero, negative, NaN, infinity,
huge, float, bool, list, missing, null). A required field under any of those, or an optional
field under a value of the wrong kind, must be refused with a SizingError (a ValueError) whose
message names the field, within the harness's time limit. Extreme but valid configs (one
layer, the largest vocabulary and depth the parser allows, thousands of experts ...) must be
accepted quickly with a finite, positive parameter count. No torch needed.
"""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from engine.memory import SizingError, model_from_config, parse_config_text
from engine.sizing.arch import MAX_LAYERS, MAX_VOCAB, ModelSpec

from .harness import expect_accepted, expect_rejected

PRESETS = Path(__file__).resolve().parents[2] / "presets" / "models"
SECONDS = 5.0


def _presets() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(PRESETS.glob("*.json"))}


BASES: dict[str, dict[str, Any]] = {
    **_presets(),
    "gpt2-xl": dict(model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, n_positions=1024, vocab_size=50257),
    "pythia-6.9b": dict(model_type="gpt_neox", hidden_size=4096, intermediate_size=16384, num_attention_heads=32,
                        num_hidden_layers=32, vocab_size=50432, rotary_pct=0.25, tie_word_embeddings=False),
    "starcoder2-7b": dict(model_type="starcoder2", hidden_size=4608, intermediate_size=18432, num_attention_heads=36,
                          num_key_value_heads=4, num_hidden_layers=32, vocab_size=49152, sliding_window=4096),
}

# Fields each family cannot do without (dotted = nested). Families not listed use LLAMA.
LLAMA = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
REQUIRED: dict[str, tuple[str, ...]] = {
    "gpt2": ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size"),
    "gpt2-xl": ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size"),
    "falcon-7b": ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"),
    "mamba-1.4b": ("hidden_size", "num_hidden_layers", "vocab_size"),
    "mamba-2.8b": ("hidden_size", "num_hidden_layers", "vocab_size"),
    "deepseek-v2-lite": LLAMA + ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                 "moe_intermediate_size", "num_experts_per_tok"),
    "deepseek-v3": LLAMA + ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
    "internvl2-8b": tuple(f"llm_config.{f}" for f in LLAMA) + (
        "vision_config.hidden_size", "vision_config.num_hidden_layers", "vision_config.intermediate_size"),
    "qwen2.5-vl-7b-instruct": LLAMA + ("vision_config.intermediate_size",),
    "mamba-codestral-7b": ("hidden_size", "num_hidden_layers", "vocab_size"),
    "bloom-560m": ("hidden_size", "n_layer", "n_head", "vocab_size"),
    "opt-350m": ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "ffn_dim",
                 "max_position_embeddings"),
    "gpt-j-6b": ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size"),
    "llama-4-scout-17b-16e": tuple(f"text_config.{f}" for f in LLAMA),
    # the published Gemma-3 text_config leaves heads and vocabulary to Gemma3TextConfig's defaults
    "gemma-3-4b-it": ("text_config.hidden_size", "text_config.num_hidden_layers", "text_config.intermediate_size"),
}
# Optional integer fields: absent/null take a default, but a value of the wrong kind is refused.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "gpt2": ("n_inner",),
    "mistral-7b": ("sliding_window", "num_key_value_heads"),
    "llama-3-8b": ("num_key_value_heads", "max_position_embeddings"),
    "qwen3-8b": ("head_dim",),
    "mixtral-8x7b": ("num_local_experts",),
    "qwen2-vl-7b-instruct": ("vision_config.depth", "vision_config.embed_dim", "vision_config.spatial_merge_size",
                             "vision_config.temporal_patch_size"),
    "qwen2.5-vl-7b-instruct": ("vision_config.depth", "vision_config.out_hidden_size", "vision_config.num_heads"),
    "internvl2-8b": ("max_dynamic_patch", "vision_config.patch_size", "vision_config.image_size"),
    "starcoder2-3b": ("sliding_window",),
    "mamba-1.4b": ("state_size", "conv_kernel"),
    "mamba-2.8b": ("state_size", "conv_kernel"),
    "jamba-v0.1": ("attn_layer_period", "num_experts", "mamba_d_state", "mamba_dt_rank"),
    "mamba-codestral-7b": ("num_heads", "n_groups", "state_size"),
    "opt-350m": ("word_embed_proj_dim",),
    "gpt-j-6b": ("n_inner", "rotary_dim"),
    "llama-4-scout-17b-16e": ("text_config.num_local_experts", "text_config.attention_chunk_size",
                              "text_config.intermediate_size_mlp", "vision_config.num_hidden_layers",
                              "vision_config.projector_input_dim"),
    "gemma-3-4b-it": ("text_config.num_attention_heads", "text_config.head_dim", "text_config.vocab_size",
                      "vision_config.num_hidden_layers", "vision_config.hidden_size", "mm_tokens_per_image"),
}

DELETE = object()
# (label, value): refused for any integer field
WRONG = [("string", "4096"), ("negative", -7), ("nan", math.nan), ("inf", math.inf), ("huge", 10 ** 15),
         ("float", 2.5), ("bool", True), ("list", [64])]
# refused for a required field only
MISSING = [("zero", 0), ("missing", DELETE), ("null", None)]


def _mutate(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


def _cases() -> list[tuple[str, str, str, Any]]:
    out = []
    for name, base in BASES.items():
        for field in REQUIRED.get(name, LLAMA):
            for label, value in WRONG + MISSING:
                out.append((name, field, label, value))
        for field in OPTIONAL.get(name, ()):
            for label, value in WRONG:
                out.append((name, field, label, value))
    return out


CASES = _cases()


@pytest.mark.parametrize("name,field,label,value", CASES, ids=[f"{n}:{f}={lab}" for n, f, lab, _ in CASES])
def test_one_bad_field_is_refused_naming_it(name: str, field: str, label: str, value: Any) -> None:
    cfg = _mutate(BASES[name], field, value)
    expect_rejected(lambda: model_from_config(cfg), match=re.escape(field.split(".")[-1]), seconds=SECONDS)


TOP_LEVEL = [("torch_dtype", 5), ("torch_dtype", "float13"), ("torch_dtype", {"x": 1}), ("model_type", 5),
             ("architectures", 5), ("architectures", [1]), ("tie_word_embeddings", "yes"), ("_source", "abc"),
             ("quantization_config", "fp8")]
TOP_CASES = [(name, f, v) for name in BASES for f, v in TOP_LEVEL]


@pytest.mark.parametrize("name,field,value", TOP_CASES, ids=[f"{n}:{f}={v!r}" for n, f, v in TOP_CASES])
def test_bad_top_level_field_is_refused(name: str, field: str, value: Any) -> None:
    cfg = {**copy.deepcopy(BASES[name]), field: value}
    expect_rejected(lambda: model_from_config(cfg), match=re.escape(field), seconds=SECONDS)


NOT_CONFIGS = [[], "llama", 5, None, 2.5, True, [{"hidden_size": 1}]]


@pytest.mark.parametrize("cfg", NOT_CONFIGS, ids=[repr(c) for c in NOT_CONFIGS])
def test_not_an_object_is_refused(cfg: Any) -> None:
    expect_rejected(lambda: model_from_config(cfg), match="JSON object", seconds=SECONDS)


BAD_TEXT = [("empty", "", "empty"), ("blank", "  \n", "empty"), ("truncated", '{"hidden_size": 4096', "malformed"),
            ("deep", "[" * 100_000, "nested too deeply"), ("long int", '{"vocab_size": ' + "9" * 5000 + "}", "digits"),
            ("not utf-8", b"\xff\xfe{", "UTF-8"), ("array", "[1, 2]", "JSON object"),
            ("NaN literal", '{"model_type": "llama", "hidden_size": NaN}', "hidden_size"),
            ("too big", "{" + " " * (17 * 2 ** 20) + "}", "at most")]


@pytest.mark.parametrize("label,text,words", BAD_TEXT, ids=[b[0] for b in BAD_TEXT])
def test_bad_config_text_is_refused(label: str, text: Any, words: str) -> None:
    expect_rejected(lambda: parse_config_text(text), match=re.escape(words), seconds=SECONDS)


# --------------------------------------------------------------------------------------------
# extreme but valid


def _llama(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=128, vocab_size=100)
    cfg.update(over)
    return cfg


EXTREME: dict[str, dict[str, Any]] = {
    "smallest llama (1 of everything)": _llama(hidden_size=1, num_hidden_layers=1, num_attention_heads=1,
                                               num_key_value_heads=1, intermediate_size=1, vocab_size=1),
    "deepest allowed": _llama(num_hidden_layers=MAX_LAYERS),
    "largest vocabulary allowed": _llama(vocab_size=MAX_VOCAB),
    "very wide": _llama(hidden_size=65536, num_attention_heads=512, num_key_value_heads=8, intermediate_size=2 ** 20),
    "MQA with huge head_dim": _llama(num_key_value_heads=1, head_dim=8192),
    "longest context": _llama(max_position_embeddings=2 ** 31 - 1),
    "sliding window of 1": {**BASES["mistral-7b"], "sliding_window": 1},
    "sliding_window 0 means none": {**BASES["mistral-7b"], "sliding_window": 0},
    "4096 experts, top-1": dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=1, intermediate_size=32, vocab_size=100, num_local_experts=4096,
                                num_experts_per_tok=1),
    "all experts active": dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=32, vocab_size=100, num_local_experts=8, num_experts_per_tok=8),
    "gpt2 one position, n_inner 1": dict(model_type="gpt2", n_embd=8, n_layer=1, n_head=1, n_positions=1,
                                         n_inner=1, vocab_size=1),
    "gpt2 n_inner null": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=32, n_inner=None,
                              vocab_size=10),
    "gpt_neox 1000 layers": dict(model_type="gpt_neox", hidden_size=64, intermediate_size=256, num_attention_heads=4,
                                 num_hidden_layers=1000, vocab_size=10),
    "phi rotary 1.0, qk_layernorm": dict(model_type="phi", hidden_size=64, intermediate_size=256,
                                         num_attention_heads=4, num_hidden_layers=1, vocab_size=10,
                                         partial_rotary_factor=1.0, qk_layernorm=True),
    "starcoder2 MQA, no window": dict(model_type="starcoder2", hidden_size=64, intermediate_size=256,
                                      num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=2,
                                      vocab_size=10, sliding_window=None),
    "qwen2-vl one block, merge 1": {**BASES["qwen2-vl-7b-instruct"],
                                    "vision_config": {"depth": 1, "embed_dim": 16, "num_heads": 1,
                                                      "hidden_size": 3584, "spatial_merge_size": 1}},
    "qwen2.5-vl vision defaults only": {**BASES["qwen2.5-vl-7b-instruct"],
                                       "vision_config": {"intermediate_size": 8}},
    "mamba 1 state": {**BASES["mamba-1.4b"], "state_size": 1, "conv_kernel": 1},
    "integers as 1/0 booleans": _llama(tie_word_embeddings=1, attention_bias=0),
    "dtype spelled torch.float16": _llama(torch_dtype="torch.float16"),
}


@pytest.mark.parametrize("label", list(EXTREME))
def test_extreme_but_valid_config_is_accepted(label: str) -> None:
    cfg = copy.deepcopy(EXTREME[label])
    spec = expect_accepted(lambda: model_from_config(cfg), seconds=SECONDS)
    assert isinstance(spec, ModelSpec)
    assert isinstance(spec.params_total, int) and 0 < spec.params_total < 10 ** 18
    assert math.isfinite(float(spec.params_total)) and spec.params_active <= spec.params_total
    assert spec.kv_elems_per_token >= 0 and spec.num_layers == len(spec.layers)


def test_refusals_are_sizing_errors_not_other_value_errors() -> None:
    """The CLI and the page catch SizingError; a bare ValueError from deep inside would escape them."""
    for name, field, _, value in CASES[::37]:
        with pytest.raises(SizingError):
            model_from_config(_mutate(BASES[name], field, value))


@pytest.mark.parametrize("model_type", ["my_new_decoder", "rwkv", "MODEL", ""])
def test_an_unknown_family_is_refused_by_name_not_counted_as_llama(model_type: str) -> None:
    cfg = _llama(model_type=model_type)
    expect_rejected(lambda: model_from_config(cfg), f"'{model_type.lower()}' is not a family" if model_type
                    else "missing 'model_type'", exc=SizingError, seconds=SECONDS)
