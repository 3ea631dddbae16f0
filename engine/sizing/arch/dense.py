"""GPT-style dense decoders: GPT-2, GPT-NeoX (Pythia), Phi (Phi-1/1.5/2), StarCoder2, BLOOM,
OPT, GPT-J

Same skeleton, different switches: a non-gated GELU/ReLU MLP (2*h*I), LayerNorms with bias
(2*h each), biases on most projections, sometimes learned position embeddings or an LM-head
bias. Parallel residual (NeoX, Phi, GPT-J), partial rotary (NeoX rotary_pct, Phi
partial_rotary_factor, GPT-J rotary_dim) and ALiBi (BLOOM) change no parameter or KV count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .attention import heads, layer_windows, mha_kind
from .fields import get_bool, get_float, get_int, opt_int, req_int
from .records import LayerSpec


@dataclass(frozen=True)
class _Dense:
    """Shapes of a dense decoder whose layers are all alike."""

    label: str  # words for people: "GPT-2", "GPT-NeoX", ...
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int  # MLP width I
    vocab: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    norms_per_layer: int  # LayerNorms (weight + bias, 2*h each) per layer
    extra_norm_params: int = 0  # e.g. Phi's q/k LayerNorms over head_dim
    positions: int = 0  # learned position-embedding rows (GPT-2); 0 = rotary
    tied: bool = False
    lm_head_bias: bool = False
    window: int | None = None
    max_position: int | None = None
    embed_width: int = 0  # token-embedding / LM-head width when not h (OPT word_embed_proj_dim); 0 = h
    embed_extra: int = 0  # embedding-side parameters beyond the tables (BLOOM's embedding LayerNorm, OPT's projections)
    norm_size: int = 2  # parameters per LayerNorm per unit of width: 2 (weight + bias), 0 (no affine, OPT)
    final_norm: bool = True  # a final LayerNorm (OPT without do_layer_norm_before has none)

    @property
    def width(self) -> int:
        """Token-embedding width: ``embed_width`` or h."""
        return self.embed_width or self.hidden

    def attention(self) -> tuple[int, int]:
        """(weights, biases): q h*nh*d + k,v 2*h*nkv*d + o nh*d*h; biases nh*d + 2*nkv*d and h."""
        h, nh, nkv, d = self.hidden, self.heads, self.kv_heads, self.head_dim
        linear = h * nh * d + 2 * h * nkv * d + nh * d * h
        bias = ((nh + 2 * nkv) * d if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return linear, bias

    def mlp(self) -> tuple[int, int]:
        """(weights, biases) of the non-gated MLP: up h*I + down I*h; biases I + h."""
        return 2 * self.hidden * self.inter, (self.inter + self.hidden) if self.mlp_bias else 0

    def norms(self) -> int:
        """LayerNorms per layer: norms_per_layer x 2*h (+ extra)."""
        return self.norms_per_layer * self.norm_size * self.hidden + self.extra_norm_params


def _dense_parts(s: _Dense, formula_head: str) -> dict[str, Any]:
    """ModelSpec fields for a ``_Dense`` shape. KV/token = L x 2 x nkv x d (window on every layer
    when ``s.window``); embeddings V*w (+ P*h learned positions + extras), w = ``s.width``; LM head
    V*w (+ V bias) unless tied (a tied head keeps its bias); final LayerNorm 2*h."""
    attn_linear, attn_bias = s.attention()
    mlp_linear, mlp_bias = s.mlp()
    params = attn_linear + attn_bias + mlp_linear + mlp_bias + s.norms()
    kv_elems = 2 * s.kv_heads * s.head_dim
    layer = LayerSpec("attention", params, attn_linear + mlp_linear, params, kv_elems=kv_elems,
                      kv_heads=s.kv_heads, kv_scale_slots=2 * s.kv_heads, window=s.window,
                      attn_flops_per_ctx_token=4 * s.heads * s.head_dim)
    h, nh, nkv, d, w = s.hidden, s.heads, s.kv_heads, s.head_dim, s.width
    lm_bias = s.vocab if s.lm_head_bias else 0
    embed = s.vocab * w + s.positions * h + s.embed_extra
    formula = (
        formula_head,
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}" + (f" (+ biases {_n(attn_bias)})" if attn_bias else ""),
        f"mlp/layer = 2*h*I (non-gated GELU) = 2*{h}*{s.inter} = {_n(mlp_linear)}"
        + (f" (+ biases {_n(mlp_bias)})" if mlp_bias else ""),
        f"LayerNorms/layer = {s.norms_per_layer} x {s.norm_size}*h" + (f" + q/k LayerNorms {_n(s.extra_norm_params)}"
                                                           if s.extra_norm_params else "") + f" = {_n(s.norms())}",
        f"embeddings V*{'w' if w != h else 'h'} = {s.vocab}*{w}"
        + (f" + learned positions P*h = {s.positions}*{h}" if s.positions else "")
        + (f" + {_n(s.embed_extra)} (embedding LayerNorm / projections)" if s.embed_extra else "")
        + f" = {_n(embed)}; LM head "
        + ("tied" + (f" (+ bias V = {_n(lm_bias)})" if lm_bias else "") if s.tied
           else f"V*{w} = {_n(s.vocab * w)}" + (f" + bias V = {_n(lm_bias)}" if lm_bias else "")),
    )
    kinds = [mha_kind(nh, nkv)] + ([f"sliding window {s.window:,} on every layer"] if s.window else [])
    kv = f"KV elements/token = L x 2 x nkv x d = {s.layers} x 2 x {nkv} x {d} = {_n(s.layers * kv_elems)}"
    return dict(
        hidden=h, num_layers=s.layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=s.vocab, tied=s.tied,
        embed_params=embed, lm_head_params=(0 if s.tied else s.vocab * w) + lm_bias,
        final_norm_params=s.norm_size * h if s.final_norm else 0, layers=(layer,) * s.layers,
        family=f"dense {', '.join(kinds)} ({s.label})",
        param_formula=formula,
        kv_formula=kv + (f"; sliding window {s.window:,}: a sequence holds at most {s.window:,} tokens' KV"
                         if s.window else ""),
        max_position=s.max_position,
    )


def gpt2(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """GPT-2 (``GPT2LMHeadModel``): n_embd / n_layer / n_head; MLP width ``n_inner`` (null = 4 x
    n_embd); fused c_attn h*3h + 3h, c_proj h*h + h; c_fc h*I + I, c_proj I*h + h; ln_1, ln_2
    (2*h each); learned positions n_positions x h; tied LM head."""
    h = req_int(cfg, "n_embd", "hidden_size", what="every layer's width")
    nh = req_int(cfg, "n_head", "num_attention_heads", what="attention")
    if h % nh:
        raise SizingError(f"config field 'n_head': n_embd {h} is not divisible by {nh} heads")
    positions = req_int(cfg, "n_positions", "max_position_embeddings", what="the position embeddings")
    if get_bool(cfg, "add_cross_attention", False):
        raise SizingError("config field 'add_cross_attention': GPT-2 with cross-attention (an encoder-decoder)"
                          " is not supported")
    s = _Dense("GPT-2", h, req_int(cfg, "n_layer", "num_hidden_layers", what="the layer count"), nh, nh, h // nh,
               opt_int(cfg, "n_inner", default=4 * h), req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=2, positions=positions,
               tied=get_bool(cfg, "tie_word_embeddings", True), max_position=positions)
    return _dense_parts(s, "GPT-2: learned position embeddings, LayerNorm, biases everywhere, GELU MLP"
                           f" I = n_inner or 4*h = {s.inter}")


def gpt_neox(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """GPT-NeoX / Pythia (``GPTNeoXForCausalLM``): fused query_key_value h*3h (+3h bias) and dense
    h*h (+h) when ``attention_bias`` (default true); dense_h_to_4h / dense_4h_to_h with biases;
    two LayerNorms per layer even with parallel residual; untied ``embed_out`` by default."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    nh, _, d = heads(cfg, h, kv_names=("num_attention_heads",))
    bias = get_bool(cfg, "attention_bias", True)
    get_float(cfg, "rotary_pct", 1.0, high=1.0)
    s = _Dense("GPT-NeoX", h, req_int(cfg, "num_hidden_layers", what="the layer count"), nh, nh, d,
               req_int(cfg, "intermediate_size", what="the MLP"), req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=bias, o_bias=bias, mlp_bias=True, norms_per_layer=2,
               tied=get_bool(cfg, "tie_word_embeddings", False))
    parallel = "parallel residual" if get_bool(cfg, "use_parallel_residual", True) else "sequential residual"
    return _dense_parts(s, f"GPT-NeoX: {parallel}, partial rotary (no parameters), LayerNorm, non-gated GELU MLP")


def phi(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Phi-1/1.5/2 (``PhiForCausalLM``): q/k/v/dense with biases, fc1/fc2 with biases, one
    LayerNorm per layer (parallel attention + MLP), optional q/k LayerNorms over head_dim
    (``qk_layernorm``: 2 x 2*d), LM head with a bias (V*h + V), untied by default."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    nh, nkv, d = heads(cfg, h)
    get_float(cfg, "partial_rotary_factor", 0.5, high=1.0)
    s = _Dense("Phi", h, req_int(cfg, "num_hidden_layers", what="the layer count"), nh, nkv, d,
               req_int(cfg, "intermediate_size", what="the MLP"), req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=1,
               extra_norm_params=4 * d if get_bool(cfg, "qk_layernorm", False) else 0,
               tied=get_bool(cfg, "tie_word_embeddings", False), lm_head_bias=True)
    return _dense_parts(s, "Phi: parallel attention + MLP under one LayerNorm, partial rotary, dense GELU MLP,"
                           " LM head with bias")


def starcoder2(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """StarCoder2 (``Starcoder2ForCausalLM``): GQA q/k/v/o and c_fc/c_proj, all with biases when
    ``use_bias`` (default true); two LayerNorms per layer; tied embeddings by default;
    ``sliding_window`` (4,096 in the published 3B/7B/15B) on every layer."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    nh, nkv, d = heads(cfg, h)
    bias = get_bool(cfg, "use_bias", True)
    n_layers = req_int(cfg, "num_hidden_layers", what="the layer count")
    windows = layer_windows(cfg, model_type, n_layers)
    s = _Dense("StarCoder2", h, n_layers, nh, nkv, d, req_int(cfg, "intermediate_size", what="the MLP"),
               req_int(cfg, "vocab_size", what="the embedding table"), qkv_bias=bias, o_bias=bias, mlp_bias=bias,
               norms_per_layer=2, tied=get_bool(cfg, "tie_word_embeddings", True), window=windows[0] if windows else None)
    return _dense_parts(s, "StarCoder2: GQA, LayerNorm, non-gated GELU MLP (c_fc, c_proj)"
                           + (" with biases" if bias else ""))



def bloom(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """BLOOM (``BloomForCausalLM``): hidden_size (n_embed) / n_layer / n_head; ALiBi (no position
    parameters); word_embeddings_layernorm 2*h after the embedding; fused query_key_value h*3h + 3h,
    dense h*h + h; dense_h_to_4h / dense_4h_to_h (always 4h) with biases; two LayerNorms per
    layer; tied LM head by default."""
    h = req_int(cfg, "hidden_size", "n_embed", what="every layer's width")
    nh = req_int(cfg, "n_head", "num_attention_heads", what="attention")
    if h % nh:
        raise SizingError(f"config field 'n_head': hidden_size {h} is not divisible by {nh} heads")
    s = _Dense("BLOOM", h, req_int(cfg, "n_layer", "num_hidden_layers", what="the layer count"), nh, nh, h // nh,
               4 * h, req_int(cfg, "vocab_size", what="the embedding table"), qkv_bias=True, o_bias=True,
               mlp_bias=True, norms_per_layer=2, tied=get_bool(cfg, "tie_word_embeddings", True), embed_extra=2 * h)
    return _dense_parts(s, "BLOOM: ALiBi (no position parameters), embedding LayerNorm, fused qkv, GELU MLP 4h,"
                           " biases everywhere")


def opt(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """OPT (``OPTForCausalLM``): learned positions (max_position_embeddings + 2 rows: OPT offsets
    position ids by 2); token embedding V*w with w = ``word_embed_proj_dim`` (default h) and, when
    w != h, project_in w*h and project_out h*w (no bias); q/k/v/out_proj and fc1/fc2 (``ffn_dim``)
    with biases when ``enable_bias``; two LayerNorms per layer (no parameters when
    ``layer_norm_elementwise_affine`` is false); a final LayerNorm only when
    ``do_layer_norm_before`` (opt-350m has none); tied LM head V*w by default."""
    h = req_int(cfg, "hidden_size", what="every layer's width")
    nh, _, d = heads(cfg, h, kv_names=("num_attention_heads",))
    positions = req_int(cfg, "max_position_embeddings", what="the position embeddings")
    w = opt_int(cfg, "word_embed_proj_dim", default=h)
    bias = get_bool(cfg, "enable_bias", True)
    affine = get_bool(cfg, "layer_norm_elementwise_affine", True)
    final_norm = get_bool(cfg, "do_layer_norm_before", True) and not get_bool(cfg, "_remove_final_layer_norm", False)
    s = _Dense("OPT", h, req_int(cfg, "num_hidden_layers", what="the layer count"), nh, nh, d,
               req_int(cfg, "ffn_dim", what="the MLP"), req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=bias, o_bias=bias, mlp_bias=bias, norms_per_layer=2, positions=positions + 2,
               tied=get_bool(cfg, "tie_word_embeddings", True), max_position=positions, embed_width=w,
               embed_extra=2 * w * h if w != h else 0, norm_size=2 if affine else 0, final_norm=final_norm)
    return _dense_parts(s, f"OPT: learned positions ({positions} + 2 offset rows), LayerNorm "
                           + ("before" if get_bool(cfg, "do_layer_norm_before", True) else "after")
                           + f" each block, ReLU MLP I = ffn_dim = {s.inter}"
                           + (f", embeddings of width {w} projected to {h}" if w != h else ""))


def gptj(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """GPT-J (``GPTJForCausalLM``): n_embd / n_layer / n_head; q/k/v/out_proj without bias; fc_in /
    fc_out with biases, MLP width ``n_inner`` (null = 4 x n_embd); one LayerNorm per layer
    (parallel attention + MLP); partial rotary (``rotary_dim``, no parameters); untied LM head
    with a bias (V*h + V)."""
    h = req_int(cfg, "n_embd", "hidden_size", what="every layer's width")
    nh = req_int(cfg, "n_head", "num_attention_heads", what="attention")
    if h % nh:
        raise SizingError(f"config field 'n_head': n_embd {h} is not divisible by {nh} heads")
    positions = req_int(cfg, "n_positions", "max_position_embeddings", what="the context length")
    get_int(cfg, "rotary_dim", default=None)
    s = _Dense("GPT-J", h, req_int(cfg, "n_layer", "num_hidden_layers", what="the layer count"), nh, nh, h // nh,
               opt_int(cfg, "n_inner", default=4 * h), req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=False, o_bias=False, mlp_bias=True, norms_per_layer=1,
               tied=get_bool(cfg, "tie_word_embeddings", False), lm_head_bias=True, max_position=positions)
    return _dense_parts(s, "GPT-J: parallel attention + MLP under one LayerNorm, partial rotary, no attention"
                           f" biases, GELU MLP I = n_inner or 4*h = {s.inter}, LM head with bias")
