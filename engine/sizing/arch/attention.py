"""Attention head layouts and sliding windows, shared by the decoder families."""
from __future__ import annotations

from typing import Any

from ..formats import SizingError
from .fields import find_field, get_bool, get_int, get_str_list, opt_int, req_int

_QWEN_WINDOW_TYPES = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text",
                      "qwen2_5_vl_text"}


def layer_windows(cfg: dict[str, Any], model_type: str, n_layers: int) -> list[int | None]:
    """Sliding window per layer (None = full attention): ``layer_types`` when given; Qwen: layers
    >= ``max_window_layers`` when ``use_sliding_window``; Gemma-2: every other layer; Gemma-3: 5 of 6;
    Cohere2: 3 of 4;
    other families with a ``sliding_window``: every layer (Mistral v0.1, Phi-3, StarCoder2)."""
    if cfg.get("sliding_window") is False:  # some exporters write false for "no window"
        cfg = {**cfg, "sliding_window": None}
    window: int | None = get_int(cfg, "sliding_window", default=None, minimum=0) or None
    layer_types = get_str_list(cfg, "layer_types")
    if layer_types is not None and len(layer_types) != n_layers:
        raise SizingError(f"config field 'layer_types' has {len(layer_types)} entries for {n_layers} layers")
    if layer_types is not None and window:
        return [window if t in ("sliding_attention", "chunked_attention") else None for t in layer_types]
    if model_type in _QWEN_WINDOW_TYPES:
        first = opt_int(cfg, "max_window_layers", default=n_layers, minimum=0)
        if get_bool(cfg, "use_sliding_window", False) and window:
            return [window if i >= first else None for i in range(n_layers)]
        return [None] * n_layers
    if model_type == "gemma2" and window:
        return [window if (i + 1) % 2 else None for i in range(n_layers)]
    if model_type in ("gemma3", "gemma3_text", "cohere2") and window:
        # Gemma-3: 5 local layers of 6; Command-R7B (cohere2): 3 of 4
        pattern = opt_int(cfg, "sliding_window_pattern", default=4 if model_type == "cohere2" else 6)
        return [window if (i + 1) % pattern else None for i in range(n_layers)]
    if window and model_type != "llama" and get_bool(cfg, "use_sliding_window", True):
        return [window] * n_layers
    return [None] * n_layers


def heads(cfg: dict[str, Any], h: int, names: tuple[str, ...] = ("num_attention_heads", "n_head", "num_heads"),
           kv_names: tuple[str, ...] = ("num_key_value_heads", "num_kv_heads", "n_head_kv")) -> tuple[int, int, int]:
    """(query heads nh, KV heads nkv, head_dim d): d = ``head_dim`` if given, else h / nh (must divide);
    nkv defaults to nh and must divide it."""
    nh = req_int(cfg, *names, what="attention")
    nkv = opt_int(cfg, *kv_names, default=nh)
    if cfg.get("multi_query") is True:
        nkv = 1
    if cfg.get("head_dim") is None and h % nh:
        raise SizingError(f"config field {find_field(cfg, names)[0]!r}: hidden size {h} is not divisible by {nh}"
                          " attention heads; set head_dim")
    d = opt_int(cfg, "head_dim", default=h // nh)
    if nkv > nh:
        raise SizingError(f"config field 'num_key_value_heads' ({nkv}) is larger than num_attention_heads ({nh})")
    if nh % nkv:
        raise SizingError(f"config field 'num_key_value_heads': num_attention_heads {nh} is not a multiple of {nkv}")
    return nh, nkv, d



def mha_kind(nh: int, nkv: int) -> str:
    return "MQA" if nkv == 1 else "GQA" if nkv < nh else "MHA"

