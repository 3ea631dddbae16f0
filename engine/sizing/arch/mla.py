"""DeepSeek multi-head latent attention (MLA) with routed and shared experts."""
from __future__ import annotations

from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .fields import get_bool, get_int
from .records import LayerSpec



def mla(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """DeepSeek-V2/V3 multi-head latent attention: q (h*q_r + q_r*nh*(d_nope+d_rope), or h*nh*(...)
    without q-LoRA) + kv_a h*(r+d_rope) + kv_b r*nh*(d_nope+d_v) + o nh*d_v*h (+ norms); MoE layers
    from first_k_dense_replace: E routed + shared experts of 3*h*I_moe + router h*E (+ bias for
    noaux_tc); KV/token = L*(kv_lora_rank + qk_rope_head_dim), no factor 2."""
    h = get_int(cfg, "hidden_size", what="every layer's width")
    n_layers = get_int(cfg, "num_hidden_layers", what="the layer count")
    nh = get_int(cfg, "num_attention_heads", what="attention")
    vocab = get_int(cfg, "vocab_size", what="the embedding table")
    kv_r = get_int(cfg, "kv_lora_rank", what="MLA")
    q_r = get_int(cfg, "q_lora_rank", default=None, what="MLA")
    d_nope = get_int(cfg, "qk_nope_head_dim", what="MLA")
    d_rope = get_int(cfg, "qk_rope_head_dim", what="MLA")
    d_v = get_int(cfg, "v_head_dim", what="MLA")
    dense_I = get_int(cfg, "intermediate_size", what="the dense MLP")
    n_experts = get_int(cfg, "n_routed_experts", default=0, minimum=0)
    if n_experts:
        moe_I = get_int(cfg, "moe_intermediate_size", what="the experts")
        top_k = get_int(cfg, "num_experts_per_tok", what="the experts")
        if top_k > n_experts:
            raise SizingError(f"num_experts_per_tok {top_k} exceeds n_routed_experts {n_experts}")
        n_shared = get_int(cfg, "n_shared_experts", default=0, minimum=0)
        first_dense = get_int(cfg, "first_k_dense_replace", default=0, minimum=0)
        freq = get_int(cfg, "moe_layer_freq", default=1)
        router_bias = n_experts if str(cfg.get("topk_method", "")) == "noaux_tc" else 0

    q = (h * q_r + q_r + q_r * nh * (d_nope + d_rope)) if q_r else h * nh * (d_nope + d_rope)
    q_linear = (h * q_r + q_r * nh * (d_nope + d_rope)) if q_r else h * nh * (d_nope + d_rope)
    kv_a = h * (kv_r + d_rope)
    kv_b = kv_r * nh * (d_nope + d_v)
    o = nh * d_v * h
    attn_linear = q_linear + kv_a + kv_b + o
    attn = q + kv_a + kv_r + kv_b + o  # + kv_a_layernorm
    norms = 2 * h
    kv_elems = kv_r + d_rope
    # attention in the latent space (weights absorbed): QK over (kv_r + rope), PV over kv_r
    attn_flops = 2 * nh * (kv_r + d_rope) + 2 * nh * kv_r
    layers = []
    n_moe = 0
    for i in range(n_layers):
        if n_experts and i >= first_dense and i % freq == 0:
            n_moe += 1
            expert = 3 * h * moe_I
            shared = 3 * h * moe_I * n_shared
            router = h * n_experts + router_bias
            params = attn + norms + router + n_experts * expert + shared
            linear = attn_linear + h * n_experts + n_experts * expert + shared
            active = attn + norms + router + top_k * expert + shared
            layers.append(LayerSpec("mla", params, linear, active, n_experts * expert, expert, n_experts,
                                    top_k, kv_elems, 0, 1, None, attn_flops_per_ctx_token=attn_flops))
        else:
            mlp = 3 * h * dense_I
            params = attn + norms + mlp
            layers.append(LayerSpec("mla", params, attn_linear + mlp, params, kv_elems=kv_elems, kv_heads=0,
                                    kv_scale_slots=1, attn_flops_per_ctx_token=attn_flops))
    q_text = (f"q_a h*q_r + q_b q_r*nh*(d_nope+d_rope) = {h}*{q_r} + {q_r}*{nh}*({d_nope}+{d_rope})" if q_r
              else f"q h*nh*(d_nope+d_rope) = {h}*{nh}*({d_nope}+{d_rope})")
    formula = [
        f"MLA attention/layer = {q_text} + kv_a h*(r+d_rope) {h}*({kv_r}+{d_rope}) + kv_b r*nh*(d_nope+d_v)"
        f" {kv_r}*{nh}*({d_nope}+{d_v}) + o nh*d_v*h {nh}*{d_v}*{h} (+ norms) = {_n(attn)}",
    ]
    if n_experts:
        formula.append(
            f"MoE layers ({n_moe}): {n_experts} routed x 3*h*I_moe (3*{h}*{moe_I}) + {n_shared} shared"
            f" + router = {_n(n_experts * 3 * h * moe_I + 3 * h * moe_I * n_shared + h * n_experts + router_bias)};"
            f" active: top-{top_k}")
    formula.append(f"dense layers ({n_layers - n_moe}): 3*h*I = 3*{h}*{dense_I} = {_n(3 * h * dense_I)}")
    tied = get_bool(cfg, "tie_word_embeddings", False)
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nh, head_dim=d_nope + d_rope, vocab=vocab,
        tied=tied, embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=tuple(layers), family=("MoE + " if n_experts else "") + "MLA (latent KV)",
        param_formula=tuple(formula),
        kv_formula=(f"MLA KV elements/token = L x (kv_lora_rank + qk_rope_head_dim) = {n_layers} x ({kv_r} + {d_rope})"
                    f" = {_n(n_layers * kv_elems)} (no factor 2; the naive MHA formula L x nh x (d_k + d_v) would give"
                    f" {n_layers} x {nh} x ({d_nope + d_rope} + {d_v}) = {_n(n_layers * nh * (d_nope + d_rope + d_v))})"),
    )

