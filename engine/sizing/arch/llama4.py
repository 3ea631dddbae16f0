"""Llama-4 text decoders (Scout, Maverick): routed + shared experts on every
``interleave_moe_layer_step``-th layer, chunked local attention on the RoPE layers."""
from __future__ import annotations

from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .attention import heads, mha_kind
from .fields import get_bool, get_int, get_int_list, get_str_list, opt_int, req_int
from .records import LayerSpec


def _moe_layers(cfg: dict[str, Any], n_layers: int) -> set[int]:
    """``moe_layers`` when given, else every ``interleave_moe_layer_step``-th layer (step 1: all,
    Scout; step 2: layers 1, 3, 5, ..., Maverick), as Llama4TextConfig derives it."""
    if cfg.get("moe_layers") is not None:
        return set(get_int_list(cfg, "moe_layers"))
    step = opt_int(cfg, "interleave_moe_layer_step", default=1)
    return set(range(step - 1, n_layers, step))


def _rope_layers(cfg: dict[str, Any], n_layers: int) -> list[bool]:
    """Per layer, whether it uses RoPE (and so chunked attention): ``no_rope_layers`` (1 = RoPE)
    when given and non-empty, else every ``no_rope_layer_interval``-th layer (4) is NoPE."""
    given = get_int_list(cfg, "no_rope_layers")
    if given:
        if len(given) != n_layers:
            raise SizingError(f"config field 'no_rope_layers' has {len(given)} entries for {n_layers} layers")
        return [bool(x) for x in given]
    interval = opt_int(cfg, "no_rope_layer_interval", default=4)
    return [(i + 1) % interval != 0 for i in range(n_layers)]


def _windows(cfg: dict[str, Any], n_layers: int) -> list[int | None]:
    """Attention span per layer: ``attention_chunk_size`` on chunked layers (``layer_types`` when
    given, else the RoPE layers), None (full attention) on the others. A chunked layer attends
    within its chunk, so it keeps at most one chunk of KV per sequence, like a window."""
    chunk: int | None = get_int(cfg, "attention_chunk_size", default=None)
    if chunk is None:
        return [None] * n_layers
    types = get_str_list(cfg, "layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise SizingError(f"config field 'layer_types' has {len(types)} entries for {n_layers} layers")
        return [chunk if t == "chunked_attention" else None for t in types]
    return [chunk if rope else None for rope in _rope_layers(cfg, n_layers)]


def llama4_text(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Llama-4 text model (``Llama4ForCausalLM``): attention q h*nh*d + k,v 2*h*nkv*d + o nh*d*h
    [+ biases with attention_bias]; the q/k norm is an L2 norm without parameters. MoE layers:
    E experts x 3*h*I (gate_up + down, stored fused) + router h*E + a shared expert 3*h*I, top-k
    routed per token (Scout: 16 experts, top-1); dense layers: gated MLP 3*h*I_mlp
    (``intermediate_size_mlp``); two RMSNorms per layer; untied LM head.
    KV/token = L x 2 x nkv x d; chunked layers keep at most ``attention_chunk_size`` tokens."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    n_layers = req_int(cfg, "num_hidden_layers", what="the layer count")
    vocab = req_int(cfg, "vocab_size", what="the embedding table")
    nh, nkv, d = heads(cfg, h)
    inter = req_int(cfg, "intermediate_size", what="the experts")
    inter_mlp = opt_int(cfg, "intermediate_size_mlp", default=16384)
    n_experts = opt_int(cfg, "num_local_experts", default=16)
    top_k = opt_int(cfg, "num_experts_per_tok", default=1)
    if top_k > n_experts:
        raise SizingError(f"config field 'num_experts_per_tok' must be between 1 and {n_experts}, got {top_k}")
    bias = get_bool(cfg, "attention_bias", False)
    moe_layers = _moe_layers(cfg, n_layers)
    windows = _windows(cfg, n_layers)

    attn_linear = h * nh * d + 2 * h * nkv * d + nh * d * h
    attn = attn_linear + ((nh + 2 * nkv) * d + h if bias else 0)
    norms = 2 * h
    expert = 3 * h * inter
    shared = 3 * h * inter
    router = h * n_experts
    dense = 3 * h * inter_mlp
    kv_elems = 2 * nkv * d
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        if i in moe_layers:
            params = attn + norms + router + n_experts * expert + shared
            linear = attn_linear + router + n_experts * expert + shared
            active = attn + norms + router + top_k * expert + shared
            routed, one, count, k = n_experts * expert, expert, n_experts, top_k
        else:
            params = attn + norms + dense
            linear, active, routed, one, count, k = attn_linear + dense, params, 0, 0, 0, 0
        layers.append(LayerSpec("attention", params, linear, active, routed, one, count, k, kv_elems=kv_elems,
                                kv_heads=nkv, kv_scale_slots=2 * nkv, window=windows[i],
                                attn_flops_per_ctx_token=4 * nh * d))
    n_moe = sum(1 for layer in layers if layer.num_experts)
    n_chunked = sum(1 for w in windows if w is not None)
    tied = get_bool(cfg, "tie_word_embeddings", False)
    formula = [
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}" + (f" (+ biases {_n(attn - attn_linear)})" if bias else "")
        + "; q/k L2 norm has no parameters",
        f"MoE layers ({n_moe}): {n_experts} experts x 3*h*I = {n_experts} x 3*{h}*{inter} = {_n(n_experts * expert)}"
        f" + shared expert 3*h*I = {_n(shared)} + router h*E = {_n(router)}; active per token: top-{top_k}"
        " routed + the shared expert",
    ]
    if n_moe < n_layers:
        formula.append(f"dense layers ({n_layers - n_moe}): mlp 3*h*I_mlp = 3*{h}*{inter_mlp} = {_n(dense)}")
    formula.append(f"norms/layer = 2*h = {_n(norms)}")
    kinds = ["MoE " + mha_kind(nh, nkv)]
    first = next((w for w in windows if w is not None), 0)
    if n_chunked:
        kinds.append(f"chunked attention {first:,} on {n_chunked}/{n_layers} layers")
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=vocab, tied=tied,
        embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=tuple(layers), family=", ".join(kinds), param_formula=tuple(formula),
        kv_formula=(f"KV elements/token = L x 2 x nkv x d = {n_layers} x 2 x {nkv} x {d} = {_n(n_layers * kv_elems)}"
                    + (f"; {n_chunked} chunked layers keep at most {first:,} tokens each" if n_chunked else "")),
    )
