"""Falcon / RefinedWeb decoders."""
from __future__ import annotations

from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .fields import get_bool, get_int, opt_int
from .records import LayerSpec



def falcon(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Falcon / RefinedWeb: fused qkv h*(nh+2*nkv)*d + dense h*h, GELU MLP 2*h*ffn (4h), optional
    biases, 1 or 2 LayerNorms (2h each) per layer; nkv = 1 (multi_query), nh, or num_kv_heads
    (new decoder architecture); KV/token = L*2*nkv*d."""
    h = get_int(cfg, "hidden_size", "n_embed", what="every layer's width")
    n_layers = get_int(cfg, "num_hidden_layers", "n_layer", what="the layer count")
    nh = get_int(cfg, "num_attention_heads", "n_head", what="attention")
    vocab = get_int(cfg, "vocab_size", what="the embedding table")
    if h % nh:
        raise SizingError(f"hidden_size {h} is not divisible by num_attention_heads {nh}")
    d = h // nh
    new_arch = get_bool(cfg, "new_decoder_architecture", False)
    if new_arch:
        nkv = get_int(cfg, "num_kv_heads", "n_head_kv", default=nh)
    elif get_bool(cfg, "multi_query", True):
        nkv = 1
    else:
        nkv = nh
    bias = get_bool(cfg, "bias", False)
    ffn = get_int(cfg, "ffn_hidden_size", default=4 * h)
    qkv = h * (nh + 2 * nkv) * d
    attn_linear = qkv + h * h
    mlp_linear = 2 * h * ffn
    biases = ((nh + 2 * nkv) * d + h + ffn + h) if bias else 0
    if new_arch:
        n_ln = 2 if opt_int(cfg, "num_ln_in_parallel_attn", default=2) == 2 else 1
    elif get_bool(cfg, "parallel_attn", True):
        n_ln = 1
    else:
        n_ln = 2
    norms = n_ln * 2 * h
    params = attn_linear + mlp_linear + biases + norms
    layer = LayerSpec("attention", params, attn_linear + mlp_linear, params, kv_elems=2 * nkv * d,
                      kv_heads=nkv, kv_scale_slots=2 * nkv, attn_flops_per_ctx_token=4 * nh * d)
    tied = get_bool(cfg, "tie_word_embeddings", True)
    formula = (
        f"attention/layer = fused qkv h*(nh+2*nkv)*d + dense h*h = {h}*({nh}+2*{nkv})*{d} + {h}*{h} = {_n(attn_linear)}",
        f"mlp/layer = 2*h*I (GELU, I = {ffn}) = {_n(mlp_linear)}; LayerNorms {n_ln}x2h = {_n(norms)}",
    )
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=vocab, tied=tied,
        embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=2 * h,
        layers=(layer,) * n_layers, family="dense " + ("MQA" if nkv == 1 else "GQA" if nkv < nh else "MHA"),
        param_formula=formula,
        kv_formula=f"KV elements/token = L x 2 x nkv x d = {n_layers} x 2 x {nkv} x {d} = {_n(n_layers * 2 * nkv * d)}",
    )

