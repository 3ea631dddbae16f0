"""A Hugging Face ``config.json`` -> ``ModelSpec``: which family parses it, the text model of a
composite, the vision tower, positions and the checkpoint dtype."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..formats import SizingError
from .dense import bloom, gpt2, gpt_neox, gptj, opt, phi, starcoder2
from .falcon import falcon
from .fields import float_dtype, get_bool, get_float, get_int, get_obj, get_str, get_str_list, opt_int, req_int
from .hybrid import jamba
from .llama import KNOWN_LLAMA_LIKE, llama_like
from .llama4 import llama4_text
from .mla import mla
from .quantization import quant_scheme
from .records import ModelSpec, VisionSpec
from .ssm import mamba
from .vision import clip_vit, internvit, llama4_vision, qwen_vl_vision, siglip_gemma3

_GPT_FAMILIES = {"gpt2": gpt2, "gpt_neox": gpt_neox, "phi": phi, "starcoder2": starcoder2, "bloom": bloom,
                 "opt": opt, "gptj": gptj}
_OWN_PARSERS = {"jamba": jamba, "llama4_text": llama4_text}
_OTHER_FAMILIES = {"deepseek_v2", "deepseek_v3", "kimi_k2", "falcon", "mamba", "mamba2", "llama4"}
_ARCH_NAMES = {"gpt2lmheadmodel": "gpt2", "gptneoxforcausallm": "gpt_neox", "phiforcausallm": "phi",
               "starcoder2forcausallm": "starcoder2", "bloomforcausallm": "bloom", "optforcausallm": "opt",
               "gptjforcausallm": "gptj", "jambaforcausallm": "jamba", "llama4forcausallm": "llama4_text"}
#: a composite's nested text config that names no model_type: the text model its top-level type builds
_NESTED_TEXT_TYPES = {"llama4": "llama4_text", "gemma3": "gemma3_text"}
_DEFAULT_DTYPE = {"gpt2": "fp32", "gptj": "fp32"}  # their config.json names no dtype; the checkpoints are fp32
_QWEN_VL_TYPES = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl"}
_QWEN_VL_VISION_TYPES = {"qwen2_vl_vision": "qwen2-vl", "qwen2_5_vl_vision": "qwen2.5-vl"}
_Parser = Callable[[dict[str, Any], str], dict[str, Any]]


def _model_type(cfg: dict[str, Any], where: str = "") -> str:
    return get_str(cfg, "model_type", where=where).lower()


def _architectures(cfg: dict[str, Any]) -> list[str]:
    value = cfg.get("architectures")
    if isinstance(value, str):
        return [value]
    return get_str_list(cfg, "architectures") or []


def _family_parser(cfg: dict[str, Any], where: str = "") -> tuple[str, _Parser, list[str]]:
    """(model_type, parser, notes) for a decoder config, by ``model_type`` then ``architectures``."""
    notes: list[str] = []
    model_type = _model_type(cfg, where)
    archs = [a.lower() for a in _architectures(cfg)]
    if not model_type:
        model_type = next((_ARCH_NAMES[a] for a in archs if a in _ARCH_NAMES), "")
    arch = " ".join(archs)
    if model_type in _GPT_FAMILIES:
        return model_type, _GPT_FAMILIES[model_type], notes
    if model_type == "llama4":  # a flat Llama-4 config (the text fields at the top level)
        model_type = "llama4_text"
    if model_type in _OWN_PARSERS:
        return model_type, _OWN_PARSERS[model_type], notes
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2") or "kv_lora_rank" in cfg:
        return model_type or "deepseek_v3", mla, notes
    if model_type in ("falcon", "refinedweb", "refinedwebmodel") or "falcon" in arch or "refinedweb" in arch:
        return "falcon", falcon, notes
    if model_type.startswith("mamba") or "mamba" in arch or ("state_size" in cfg and "num_attention_heads" not in cfg):
        return model_type or "mamba", mamba, notes
    if not model_type and "internlm2" in arch:
        model_type = "internlm2"
    if not model_type and where:  # a composite's nested text config without one: transformers' default
        model_type = "llama"
    if model_type not in KNOWN_LLAMA_LIKE:
        raise unknown_family(model_type)
    return model_type, llama_like, notes


def supported_model_types() -> list[str]:
    """Every decoder ``model_type`` the calculator counts exactly (vision-language wrappers size
    their text model by its own model_type)."""
    return sorted(KNOWN_LLAMA_LIKE | set(_GPT_FAMILIES) | set(_OWN_PARSERS) | _OTHER_FAMILIES)


def unknown_family(model_type: str) -> SizingError:
    """Refusal of a family the calculator does not count: counting it as another family would give
    a confident wrong answer (Jamba as Llama: +78% parameters, 8x the KV bytes)."""
    if not model_type:
        return SizingError(f"config is missing 'model_type' (and names no architecture the calculator knows): "
                           f"the family decides how parameters and KV are counted. Supported: "
                           f"{', '.join(supported_model_types())}")
    return SizingError(f"model_type {model_type[:80]!r} is not a family the calculator sizes, and counting it as "
                       f"another family would be silently wrong. Supported: {', '.join(supported_model_types())}")


def _decoder(cfg: dict[str, Any], where: str = "") -> tuple[dict[str, Any], str, list[str]]:
    model_type, parser, notes = _family_parser(cfg, where)
    if "rope_theta" in cfg:
        get_float(cfg, "rope_theta", 10000.0, where=where)
    return parser(cfg, model_type), model_type, notes


def _text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The language model's config and its dotted prefix: ``llm_config`` (InternVL chat),
    ``text_config`` (transformers composites, when the top level has no ``hidden_size``), or the
    config itself (flat form, e.g. Qwen2-VL as published). The top level's
    ``tie_word_embeddings`` applies to a nested text config that does not set its own; a nested
    config without a model_type gets the one its composite builds (llama4 -> llama4_text)."""
    get_bool(cfg, "tie_word_embeddings", False)  # validated even where the nested config decides
    llm = get_obj(cfg, "llm_config")
    if llm is not None:
        return llm, "llm_config"
    text = get_obj(cfg, "text_config")
    if text is not None and "hidden_size" not in cfg:
        if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in text:
            text = {**text, "tie_word_embeddings": cfg["tie_word_embeddings"]}
        nested_type = _NESTED_TEXT_TYPES.get(_model_type(cfg))
        if nested_type and not text.get("model_type"):
            text = {**text, "model_type": nested_type}
        return text, "text_config"
    return cfg, ""


def _tiles(cfg: dict[str, Any]) -> int:
    """InternVL tiles per image: max_dynamic_patch (12) + a thumbnail when use_thumbnail and > 1 tile."""
    max_patch = opt_int(cfg, "max_dynamic_patch", default=12)
    thumb = get_bool(cfg, "use_thumbnail", True) and max_patch > 1
    return max_patch + (1 if thumb else 0)


def _vision(cfg: dict[str, Any], top_type: str, llm_hidden: int) -> tuple[VisionSpec | None, list[str], bool]:
    """(vision tower or None, notes, trust_remote_code) for a composite config's ``vision_config``."""
    vc = get_obj(cfg, "vision_config")
    if vc is None:
        return None, [], False
    vision_type = _model_type(vc, "vision_config")
    qwen = _QWEN_VL_TYPES.get(top_type) or _QWEN_VL_VISION_TYPES.get(vision_type)
    if qwen:
        return qwen_vl_vision(vc, qwen, llm_hidden), [], False
    if top_type == "llama4" or vision_type == "llama4_vision_model":
        return llama4_vision(vc, llm_hidden), [], False
    if top_type == "gemma3":
        return siglip_gemma3(vc, llm_hidden, opt_int(cfg, "mm_tokens_per_image", default=256)), [], False
    downsample = get_float(cfg, "downsample_ratio", 0.5, high=1.0)
    if "llm_config" in cfg or top_type == "internvl_chat":
        return internvit(vc, llm_hidden, downsample, hf_native=False, max_tiles=_tiles(cfg)), [], True
    if top_type == "internvl" or vision_type == "internvl_vision":
        return internvit(vc, llm_hidden, downsample, hf_native=True, max_tiles=_tiles(cfg)), [], False
    note = ("vision tower counted with a generic CLIP-style formula (approximate);"
            " a local folder with safetensors gives exact bytes")
    return clip_vit(vc, llm_hidden), [note], False


def _source(cfg: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    """Provenance: the caller's ``source`` or the preset's ``_source`` object (string values)."""
    raw = given if given is not None else cfg.get("_source")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SizingError(f"config field '_source' must be an object, got {type(raw).__name__}")
    for name in ("hf_id", "display_name"):
        get_str(raw, name, where="_source")
    return dict(raw)


def _max_position(parts: dict[str, Any], text_cfg: dict[str, Any], cfg: dict[str, Any], where: str) -> int | None:
    """The context limit: the family's own (GPT-2 n_positions) or ``max_position_embeddings``."""
    own = parts.pop("max_position", None)
    if own is not None:
        return int(own)
    if text_cfg.get("max_position_embeddings") is not None:
        value: int = get_int(text_cfg, "max_position_embeddings", where=where)
        return value
    top: int | None = get_int(cfg, "max_position_embeddings", default=None)
    return top


#: rope types whose length max_position_embeddings already counts (vLLM's _get_and_verify_max_len)
_ROPE_ALREADY_COUNTED = ("su", "longrope", "llama3")


def _rope_scaled_positions(text_cfg: dict[str, Any], model_type: str, max_pos: int | None,
                           where: str) -> tuple[int, str] | None:
    """The rope-scaled length, as vLLM derives max_model_len: with ``rope_scaling`` of a type other
    than su / longrope / llama3 (and not Gemma-3, whose max_position_embeddings is already scaled),
    max_position_embeddings x factor, or original_max_position_embeddings x factor for yarn.
    None when rope_scaling is absent or does not extend the limit."""
    rope = get_obj(text_cfg, "rope_scaling")
    if rope is None or max_pos is None or "gemma3" in model_type:
        return None
    prefix = f"{where}.rope_scaling" if where else "rope_scaling"
    rope_type = get_str(rope, "rope_type", where=prefix) or get_str(rope, "type", where=prefix)
    if not rope_type or rope_type in _ROPE_ALREADY_COUNTED:
        return None
    factor = get_float(rope, "factor", 1.0, high=1e6, where=prefix)
    base, base_name = max_pos, "max_position_embeddings"
    if rope_type == "yarn":
        base = req_int(rope, "original_max_position_embeddings", what="yarn rope scaling", where=prefix)
        base_name = "original_max_position_embeddings"
    scaled = int(base * factor)
    if scaled <= max_pos:
        return None
    return scaled, f"{base_name} {base:,} x rope_scaling {rope_type} factor {factor:g}"


def model_from_config(cfg: Any, key: str = "custom", source: dict[str, Any] | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (a dict). Any malformed field raises
    SizingError (a ValueError) with one line naming it."""
    if not isinstance(cfg, dict):
        raise SizingError(f"a config must be a JSON object, got {type(cfg).__name__}")
    src = _source(cfg, source)
    top_type = _model_type(cfg)
    _architectures(cfg)
    text_cfg, where = _text_config(cfg)
    parts, model_type, notes = _decoder(text_cfg, where)
    vision, more, trust_remote_code = _vision(cfg, top_type, parts["hidden"])
    notes += more
    if vision is not None:
        parts["family"] = "vision-language: " + parts["family"]
        parts["param_formula"] = parts["param_formula"] + vision.formula
    if model_type in ("internlm2", "internlm3"):
        trust_remote_code = True
    max_pos = _max_position(parts, text_cfg, cfg, where)
    quantization = quant_scheme(cfg) or (quant_scheme(text_cfg) if where else None)
    has_dtype = any(cfg.get(k) is not None for k in ("torch_dtype", "dtype"))
    dtype = float_dtype(cfg if has_dtype else text_cfg, _DEFAULT_DTYPE.get(model_type, "bf16"))
    if quantization is not None and quantization.is_fp8:  # fp8 checkpoints: the calculator's fp8 format
        dtype = "fp8"
    name_or_path = get_str(cfg, "_name_or_path") or get_str(cfg, "name_or_path") or None
    display = src.get("display_name") or name_or_path or key
    return ModelSpec(
        key=key, display_name=str(display), hf_id=src.get("hf_id") or name_or_path,
        model_type=top_type or model_type, max_position=max_pos, checkpoint_dtype=dtype, quantization=quantization,
        vision=vision, trust_remote_code=trust_remote_code, notes=tuple(notes), source=src,
        rope_positions=_rope_scaled_positions(text_cfg, model_type, max_pos, where), **parts,
    )
