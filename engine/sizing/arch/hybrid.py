"""Hybrid attention + state-space decoders: Jamba (attention on some layers, Mamba on the rest,
mixture of experts on every other layer)."""
from __future__ import annotations

from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .attention import heads, mha_kind
from .fields import get_bool, opt_int, req_int
from .records import LayerSpec
from .ssm import mamba_mixer, time_step_rank


def jamba(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Jamba (``JambaForCausalLM``): layer i is attention when i % attn_layer_period ==
    attn_layer_offset, else Mamba; its feed-forward is MoE when i % expert_layer_period ==
    expert_layer_offset (and num_experts > 1), else a gated MLP 3*h*I.
    Attention: q h*nh*d + k,v 2*h*nkv*d + o nh*d*h, no biases. Mamba: in_proj h*2*Di (+ bias) +
    conv Di*K (+ Di) + x_proj Di*(R+2N) + dt_proj R*Di + Di + A_log Di*N + D Di + out_proj Di*h
    (+ h) + dt/B/C RMSNorms R + 2N, Di = mamba_expand*h. MoE: E experts x 3*h*I (stored fused)
    + router h*E. Two RMSNorms (2h) per layer; untied LM head by default.
    KV/token = attention layers x 2 x nkv x d; Mamba state/sequence = Mamba layers x (Di*(K-1) + Di*N)."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    n_layers = req_int(cfg, "num_hidden_layers", what="the layer count")
    vocab = req_int(cfg, "vocab_size", what="the embedding table")
    nh, nkv, d = heads(cfg, h)
    inter = req_int(cfg, "intermediate_size", what="the MLP")
    attn_period = opt_int(cfg, "attn_layer_period", default=8)
    attn_offset = opt_int(cfg, "attn_layer_offset", default=4, minimum=0)
    expert_period = opt_int(cfg, "expert_layer_period", default=2)
    expert_offset = opt_int(cfg, "expert_layer_offset", default=1, minimum=0)
    if attn_offset >= attn_period:
        raise SizingError(f"config field 'attn_layer_offset' ({attn_offset}) must be smaller than"
                          f" attn_layer_period ({attn_period})")
    if expert_offset >= expert_period:
        raise SizingError(f"config field 'expert_layer_offset' ({expert_offset}) must be smaller than"
                          f" expert_layer_period ({expert_period})")
    n_experts = opt_int(cfg, "num_experts", "num_local_experts", default=16)
    top_k = opt_int(cfg, "num_experts_per_tok", default=2)
    if n_experts > 1 and top_k > n_experts:
        raise SizingError(f"config field 'num_experts_per_tok' must be between 1 and {n_experts}, got {top_k}")
    n_state = opt_int(cfg, "mamba_d_state", default=16)
    k_conv = opt_int(cfg, "mamba_d_conv", default=4)
    d_inner = opt_int(cfg, "mamba_expand", default=2) * h
    rank = time_step_rank(cfg, "mamba_dt_rank", h)
    mamba, mamba_linear, state = mamba_mixer(h, d_inner, n_state, k_conv, rank, get_bool(cfg, "mamba_proj_bias", False),
                                             get_bool(cfg, "mamba_conv_bias", True), inner_norms=True)

    attn_linear = h * nh * d + 2 * h * nkv * d + nh * d * h
    mlp = 3 * h * inter
    expert = 3 * h * inter
    router = h * n_experts
    norms = 2 * h
    kv_elems = 2 * nkv * d
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        is_attn = i % attn_period == attn_offset
        mixer, mixer_linear = (attn_linear, attn_linear) if is_attn else (mamba, mamba_linear)
        kind = "attention" if is_attn else "mamba"
        kv = dict(kv_elems=kv_elems, kv_heads=nkv, kv_scale_slots=2 * nkv, attn_flops_per_ctx_token=4 * nh * d) \
            if is_attn else dict(state_elems=state)
        if n_experts > 1 and i % expert_period == expert_offset:
            params = mixer + norms + router + n_experts * expert
            linear = mixer_linear + router + n_experts * expert
            active = mixer + norms + router + top_k * expert
            layers.append(LayerSpec(kind, params, linear, active, n_experts * expert, expert, n_experts, top_k,
                                    **kv))
        else:
            params = mixer + norms + mlp
            layers.append(LayerSpec(kind, params, mixer_linear + mlp, params, **kv))
    n_attn = sum(1 for layer in layers if layer.kind == "attention")
    n_moe = sum(1 for layer in layers if layer.num_experts)
    tied = get_bool(cfg, "tie_word_embeddings", False)
    formula = (
        f"layout: attention on layers i % {attn_period} == {attn_offset} ({n_attn} of {n_layers}), Mamba on the"
        f" other {n_layers - n_attn}; MoE on layers i % {expert_period} == {expert_offset} ({n_moe})",
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}",
        f"mamba/layer = in_proj h*2*Di + conv Di*K (+bias) + x_proj Di*(R+2N) + dt_proj R*Di+Di + A,D Di*N+Di"
        f" + out_proj Di*h + dt/B/C norms R+2N, with h={h}, Di={d_inner}, K={k_conv}, R={rank}, N={n_state}"
        f" = {_n(mamba)}",
        f"MoE layers ({n_moe}): {n_experts} experts x 3*h*I = {n_experts} x 3*{h}*{inter} = {_n(n_experts * expert)}"
        f" + router h*E = {_n(router)}; active per token: top-{top_k} experts; dense MLP 3*h*I = {_n(mlp)};"
        f" norms/layer 2*h = {_n(norms)}",
    )
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=vocab, tied=tied,
        embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=tuple(layers),
        family=f"hybrid Mamba + attention ({n_attn}/{n_layers} attention layers, {mha_kind(nh, nkv)})"
               + (", MoE" if n_moe else ""),
        param_formula=formula,
        kv_formula=(f"KV elements/token = attention layers x 2 x nkv x d = {n_attn} x 2 x {nkv} x {d}"
                    f" = {_n(n_attn * kv_elems)}; Mamba state/sequence = {n_layers - n_attn} x (Di x (K-1) + Di x N)"
                    f" = {n_layers - n_attn} x ({d_inner} x {k_conv - 1} + {d_inner} x {n_state})"
                    f" = {_n((n_layers - n_attn) * state)} elements"),
    )
