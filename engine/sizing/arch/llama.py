"""Llama-style decoders: dense, GQA/MQA, sliding windows, mixture of experts; Cohere (Command-R)
and Gemma-3 are switches on the same skeleton."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.hf_config import MISSING
from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .attention import heads, layer_windows, mha_kind
from .fields import get_bool, get_int, get_int_list, opt_int, req_int
from .records import LayerSpec

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "mamba", "cohere", "cohere2"}
_COHERE_TYPES = {"cohere", "cohere2"}  # one LayerNorm (weight only) per layer, parallel attention + MLP
_GEMMA3_TYPES = {"gemma3", "gemma3_text"}
#: Gemma3TextConfig defaults the published google/gemma-3-*-it configs rely on (their text_config
#: names only the shapes that differ): head_dim 256 is not hidden / heads
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "sliding_window": 4096, "max_position_embeddings": 131_072,
}
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}
KNOWN_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3", "gemma3_text", "phi3", "internlm2", "internlm3", "yi", "baichuan", "qwen2_vl", "qwen2_5_vl",
    "qwen2_vl_text", "qwen2_5_vl_text", "granite", "olmo", "olmo2", "smollm3", "ministral", "glm",
    "cohere", "cohere2", "gpt_oss",
}


@dataclass(frozen=True)
class _Moe:
    """Mixture-of-experts fields of a llama-like config (0 experts = dense)."""

    experts: int = 0
    top_k: int = 0
    inter: int = 0  # moe_intermediate_size
    shared_inter: int = 0  # shared_expert_intermediate_size (Qwen2-MoE)
    sparse_step: int = 1  # decoder_sparse_step: every n-th layer is MoE
    mlp_only: frozenset[int] = frozenset()

    def is_moe_layer(self, i: int) -> bool:
        return self.experts > 1 and i not in self.mlp_only and (i + 1) % self.sparse_step == 0


def _moe_fields(cfg: dict[str, Any]) -> _Moe:
    n_experts = opt_int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    if n_experts <= 1:
        return _Moe()
    top_k = opt_int(cfg, "num_experts_per_tok", "moe_topk", "top_k", default=0, minimum=0)
    if top_k < 1 or top_k > n_experts:
        raise SizingError(f"config field 'num_experts_per_tok' must be between 1 and {n_experts}, got {top_k}")
    return _Moe(n_experts, top_k, req_int(cfg, "moe_intermediate_size", "intermediate_size", what="the experts"),
                opt_int(cfg, "shared_expert_intermediate_size", default=0, minimum=0),
                opt_int(cfg, "decoder_sparse_step", default=1), frozenset(get_int_list(cfg, "mlp_only_layers")))


def with_gemma3_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """A Gemma-3 text config with the Gemma3TextConfig defaults filled in where a field is absent
    (an explicit null stays null, as in transformers), so a published nested text_config and the
    same config written flat count the same."""
    return {**GEMMA3_TEXT_DEFAULTS, **cfg}


def llama_like(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Llama-style decoder: attention h*d*nh (q) + 2*h*d*nkv (k, v) + d*nh*h (o) [+ q/k/v bias
    for Qwen2], gated MLP 3*h*I [+ biases], RMSNorms 2*h (4*h for Gemma-2/3) [+ q/k-norm 2*d];
    Cohere: one LayerNorm h (weight only) per layer [+ q/k LayerNorms (nh + nkv)*d with use_qk_norm];
    MoE layers: E experts x 3*h*I_moe + router h*E [+ shared expert] [gpt-oss: + sinks nh + router
    bias E + expert biases E*(2*I + h)]; KV/token = L*nkv*(d_k+d_v)."""
    gemma3 = model_type in _GEMMA3_TYPES
    if gemma3:
        cfg = with_gemma3_defaults(cfg)
    h = req_int(cfg, "hidden_size", "n_embd", "d_model", what="every layer's width")
    n_layers = req_int(cfg, "num_hidden_layers", "n_layer", "num_layers", what="the layer count")
    nh, nkv, d = heads(cfg, h)
    dv = opt_int(cfg, "v_head_dim", default=d)
    vocab = req_int(cfg, "vocab_size", what="the embedding table")

    any_bias = get_bool(cfg, "attention_bias", False) or get_bool(cfg, "bias", False)
    qkv_bias = model_type in _QKV_BIAS_TYPES or any_bias
    o_bias = any_bias and model_type not in _QKV_BIAS_TYPES
    mlp_bias = get_bool(cfg, "mlp_bias", False)
    norms_per_layer = 4 if model_type in _FOUR_NORM_TYPES else 1 if model_type in _COHERE_TYPES else 2
    qk_norm = 2 * d if model_type in _QK_NORM_TYPES else 0
    if model_type in _COHERE_TYPES and get_bool(cfg, "use_qk_norm", False):
        qk_norm = (nh + nkv) * d  # LayerNorm weights over (heads, head_dim), Command-R+

    attn_linear = h * nh * d + h * nkv * d + h * nkv * dv + nh * dv * h
    attn_bias = (nh * d + nkv * d + nkv * dv if qkv_bias else 0) + (h if o_bias else 0)
    attn = attn_linear + attn_bias
    norms = norms_per_layer * h + qk_norm

    moe = _moe_fields(cfg)
    dense_I: int = get_int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner",
                        default=moe.inter if moe.experts else MISSING, what="the MLP")
    shared_gate = h if moe.shared_inter and model_type == "qwen2_moe" else 0
    # gpt-oss: attention sinks (one per head), a router bias, biases on every expert's gate_up and down
    gpt_oss = model_type == "gpt_oss"
    sinks = nh if gpt_oss else 0
    router_bias = moe.experts if gpt_oss else 0
    expert_bias = 2 * moe.inter + h if gpt_oss else 0
    mlp_per_I = 3 * h  # gated (SwiGLU / GeGLU)
    mlp_bias_params = 2 * dense_I + h if mlp_bias else 0

    windows = layer_windows(cfg, model_type, n_layers)
    kv_elems = nkv * (d + dv)
    flops = 2 * nh * (d + dv)
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        if moe.is_moe_layer(i):
            expert = mlp_per_I * moe.inter
            router = h * moe.experts
            shared = mlp_per_I * moe.shared_inter + shared_gate
            biases = sinks + router_bias + moe.experts * expert_bias  # 16-bit in every checkpoint format
            params = attn + norms + router + moe.experts * expert + shared + biases
            linear = attn_linear + router + moe.experts * expert + shared
            active = attn + norms + router + moe.top_k * (expert + expert_bias) + shared + sinks + router_bias
            layers.append(LayerSpec("attention", params, linear, active, moe.experts * expert, expert,
                                    moe.experts, moe.top_k, kv_elems, nkv, 2 * nkv, windows[i],
                                    attn_flops_per_ctx_token=flops))
        else:
            params = attn + norms + mlp_per_I * dense_I + mlp_bias_params
            layers.append(LayerSpec("attention", params, attn_linear + mlp_per_I * dense_I, params,
                                    kv_elems=kv_elems, kv_heads=nkv, kv_scale_slots=2 * nkv, window=windows[i],
                                    attn_flops_per_ctx_token=flops))
    n_moe_layers = sum(1 for layer in layers if layer.num_experts)

    tied = get_bool(cfg, "tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    formula = [
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}" + (f"  (+ biases {_n(attn_bias)})" if attn_bias else ""),
    ]
    if moe.experts:
        formula.append(
            f"MoE layers ({n_moe_layers}): {moe.experts} experts x 3*h*I_moe = {moe.experts} x 3*{h}*{moe.inter}"
            f" = {_n(moe.experts * mlp_per_I * moe.inter)} + router h*E = {_n(h * moe.experts)}"
            + (f" + shared 3*h*{moe.shared_inter} = {_n(mlp_per_I * moe.shared_inter + shared_gate)}"
               if moe.shared_inter else "")
            + (f" + sinks, router and expert biases {_n(sinks + router_bias + moe.experts * expert_bias)}"
               if gpt_oss else "")
            + f"; active per token: top-{moe.top_k} experts")
        if n_moe_layers < n_layers:
            formula.append(f"dense layers ({n_layers - n_moe_layers}): mlp 3*h*I = 3*{h}*{dense_I}"
                           f" = {_n(mlp_per_I * dense_I)}")
    else:
        formula.append(f"mlp/layer = 3*h*I = 3*{h}*{dense_I} = {_n(mlp_per_I * dense_I)}"
                       + (f" (+ biases {_n(mlp_bias_params)})" if mlp_bias else ""))
    qk_text = " + q/k LayerNorms (nh+nkv)*d" if model_type in _COHERE_TYPES else " + q/k-norm 2*d"
    formula.append(f"norms/layer = {norms_per_layer}*h" + (qk_text if qk_norm else "") + f" = {_n(norms)}")
    kinds = [mha_kind(nh, nkv)]
    if any(w is not None for w in windows):
        n_sw = sum(1 for w in windows if w is not None)
        first_window = next(w for w in windows if w is not None)
        kinds.append(f"sliding window {first_window:,} on {n_sw}/{n_layers} layers")
    family = ("MoE " if moe.experts else "dense ") + ", ".join(kinds)
    per_layer_kv = (f"L x 2 x nkv x d = {n_layers} x 2 x {nkv} x {d}" if d == dv
                    else f"L x nkv x (d_k + d_v) = {n_layers} x {nkv} x ({d} + {dv})")
    extra: dict[str, Any] = {}
    if gemma3:  # the default context length too, which the nested text_config leaves out
        extra["max_position"] = get_int(cfg, "max_position_embeddings", default=None)
    return dict(
        **extra, hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=vocab,
        tied=tied, embed_params=vocab * h, lm_head_params=0 if tied else vocab * h,
        final_norm_params=h, layers=tuple(layers), family=family, param_formula=tuple(formula),
        kv_formula=f"KV elements/token = {per_layer_kv} = {_n(n_layers * kv_elems)}",
    )

