"""Hugging Face ``config.json`` -> a sizing description of the model (``ModelSpec``).

Pure Python. Parameter counts follow the modules transformers builds for each architecture
(checked against meta-device instantiation in tests/test_memory_meta.py); KV-cache elements
per token follow sizing.md §3.3 (GQA/MQA, MLA latent, sliding windows, Mamba state).

Families handled:
  llama-like  llama, mistral, mixtral, qwen2(_moe), qwen3(_moe), gemma(2/3), phi3, internlm2,
              and any unknown decoder that has the Llama field names (counted as Llama, noted)
  mla         deepseek_v2, deepseek_v3 (kimi_k2): latent KV, routed + shared experts
  falcon      falcon / RefinedWeb (MQA, parallel attention, LayerNorm, GELU MLP)
  mamba       mamba (v1) selective SSM
  vlm         InternVL chat (vision_config + llm_config), HF-native internvl, llava-style
              (vision_config + text_config, generic CLIP formula, marked approximate)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .formats import SizingError

_MISSING = object()


# --------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer, as far as memory and speed care."""

    kind: str  # "attention" | "mla" | "mamba"
    params: int  # every parameter of the layer
    linear_params: int  # matmul weights (what a quantised format shrinks)
    active_params: int  # parameters touched per token (MoE: top-k experts + shared)
    routed_params: int = 0  # inside params: all routed experts
    expert_params: int = 0  # one routed expert
    num_experts: int = 0
    top_k: int = 0
    kv_elems: int = 0  # KV-cache elements per token (attention / MLA)
    kv_heads: int = 0  # heads the KV splits over under TP; 0 = replicated (MLA)
    kv_scale_slots: int = 0  # per-token scale slots for per-token-head quantised KV
    window: int | None = None  # sliding window (tokens); None = full attention
    state_elems: int = 0  # recurrent state per sequence (Mamba), split over TP
    attn_flops_per_ctx_token: int = 0  # attention FLOPs per (query token x context token)


@dataclass(frozen=True)
class VisionSpec:
    """Vision tower + projector of a vision-language model."""

    kind: str  # "internvit" | "clip (approximate)"
    params: int
    linear_params: int
    projector_params: int
    layers: int
    hidden: int
    heads: int
    intermediate: int
    patch_tokens: int  # tokens the ViT runs per tile (patches + class token)
    tokens_per_tile: int  # LLM tokens per tile after the projector (InternVL: 256)
    max_tiles: int  # default tiles per image (InternVL: 12 + thumbnail = 13)
    formula: tuple[str, ...] = ()

    @property
    def total_params(self) -> int:
        return self.params + self.projector_params


@dataclass(frozen=True)
class Checkpoint:
    """Exact sizes read from safetensors headers in a local model folder."""

    path: str
    files: int
    tensors: int
    stored_bytes: int
    numel: int
    dtypes: tuple[str, ...]
    all_float: bool


@dataclass(frozen=True)
class ModelSpec:
    key: str
    display_name: str
    hf_id: str | None
    model_type: str
    family: str  # words for people: "dense GQA", "MoE + MLA", ...
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    max_position: int | None
    checkpoint_dtype: str  # fp32 | bf16 | fp16 | fp8
    tied: bool
    embed_params: int
    lm_head_params: int
    final_norm_params: int
    layers: tuple[LayerSpec, ...]
    vision: VisionSpec | None = None
    trust_remote_code: bool = False
    param_formula: tuple[str, ...] = ()
    kv_formula: str = ""
    notes: tuple[str, ...] = ()
    source: dict = field(default_factory=dict)
    checkpoint: Checkpoint | None = None

    # -- parameters ---------------------------------------------------------------
    @property
    def llm_params(self) -> int:
        return (self.embed_params + self.lm_head_params + self.final_norm_params
                + sum(layer.params for layer in self.layers))

    @property
    def params_total(self) -> int:
        return self.llm_params + (self.vision.total_params if self.vision else 0)

    @property
    def params_active(self) -> int:
        """Parameters touched per decoded token: top-k experts only, vision tower excluded."""
        return (self.embed_params + self.lm_head_params + self.final_norm_params
                + sum(layer.active_params for layer in self.layers))

    @property
    def is_moe(self) -> bool:
        return any(layer.num_experts for layer in self.layers)

    @property
    def kv_elems_per_token(self) -> int:
        return sum(layer.kv_elems for layer in self.layers)

    @property
    def state_elems_per_seq(self) -> int:
        return sum(layer.state_elems for layer in self.layers)

    @property
    def attention_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.kind in ("attention", "mla"))

    @property
    def has_kv(self) -> bool:
        return self.kv_elems_per_token > 0


# --------------------------------------------------------------------------------------
# field access with clear errors


def _get(cfg: dict, *names: str, default: Any = _MISSING, what: str = "") -> Any:
    for name in names:
        if name in cfg and cfg[name] is not None:
            return cfg[name]
    if default is _MISSING:
        need = f" (needed for {what})" if what else ""
        raise SizingError(f"config is missing {names[0]!r}{need}")
    return default


def _int(cfg: dict, *names: str, default: Any = _MISSING, minimum: int = 1, what: str = "") -> Any:
    value = _get(cfg, *names, default=default, what=what)
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise SizingError(f"config field {names[0]!r} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise SizingError(f"config field {names[0]!r} must be >= {minimum}, got {value}")
    return value


def _bool(cfg: dict, name: str, default: bool) -> bool:
    value = cfg.get(name, default)
    if value is None:
        return default
    if not isinstance(value, (bool, int)):
        raise SizingError(f"config field {name!r} must be true or false, got {value!r}")
    return bool(value)


def _n(x: int) -> str:
    return f"{x:,}"


def checkpoint_dtype(cfg: dict) -> str:
    quant = cfg.get("quantization_config") or {}
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "fp8":
        return "fp8"
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float": "fp32",
            "half": "fp16"}.get(raw, "bf16")


# --------------------------------------------------------------------------------------
# llama-like decoders (dense, GQA/MQA, sliding windows, MoE)

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "mamba"}
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}
_KNOWN_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3", "gemma3_text", "phi3", "internlm2", "internlm3", "yi", "baichuan", "qwen2_vl_text",
    "qwen2_5_vl_text", "granite", "olmo", "olmo2", "smollm3", "ministral", "glm", "starcoder2_llama",
}


def _layer_windows(cfg: dict, model_type: str, n_layers: int) -> list[int | None]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers and window:
        return [int(window) if str(t) in ("sliding_attention", "chunked_attention") else None
                for t in layer_types]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if cfg.get("use_sliding_window") and window:
            first = int(cfg.get("max_window_layers", n_layers))
            return [int(window) if i >= first else None for i in range(n_layers)]
        return [None] * n_layers
    if model_type == "gemma2" and window:
        return [int(window) if (i + 1) % 2 else None for i in range(n_layers)]
    if model_type in ("gemma3", "gemma3_text") and window:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return [int(window) if (i + 1) % pattern else None for i in range(n_layers)]
    if window and model_type not in ("llama",) and cfg.get("use_sliding_window", True) is not False:
        return [int(window)] * n_layers
    return [None] * n_layers


def _llama_like(cfg: dict, model_type: str) -> dict:
    h = _int(cfg, "hidden_size", "n_embd", "d_model", what="every layer's width")
    n_layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", what="the layer count")
    nh = _int(cfg, "num_attention_heads", "n_head", "num_heads", what="attention")
    nkv = _int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=nh, what="the KV cache")
    if cfg.get("multi_query") is True:
        nkv = 1
    explicit_d = cfg.get("head_dim")
    if explicit_d is None and h % nh:
        raise SizingError(f"hidden_size {h} is not divisible by num_attention_heads {nh}; set head_dim")
    d = _int(cfg, "head_dim", default=h // nh, what="attention")
    dv = _int(cfg, "v_head_dim", default=d)
    vocab = _int(cfg, "vocab_size", what="the embedding table")
    if nkv > nh:
        raise SizingError(f"num_key_value_heads {nkv} is larger than num_attention_heads {nh}")
    if nh % nkv:
        raise SizingError(f"num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")

    qkv_bias = model_type in _QKV_BIAS_TYPES or bool(cfg.get("attention_bias")) or bool(cfg.get("bias"))
    o_bias = (bool(cfg.get("attention_bias")) or bool(cfg.get("bias"))) and model_type not in _QKV_BIAS_TYPES
    mlp_bias = bool(cfg.get("mlp_bias"))
    norms_per_layer = 4 if model_type in _FOUR_NORM_TYPES else 2
    qk_norm = 2 * d if model_type in _QK_NORM_TYPES else 0

    attn_linear = h * nh * d + h * nkv * d + h * nkv * dv + nh * dv * h
    attn_bias = (nh * d + nkv * d + nkv * dv if qkv_bias else 0) + (h if o_bias else 0)
    attn = attn_linear + attn_bias
    norms = norms_per_layer * h + qk_norm

    # MoE?
    n_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or cfg.get("top_k") or 0)
    moe = n_experts > 1
    dense_I = _int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner",
                   default=None if moe else _MISSING, what="the MLP")
    if moe:
        if top_k < 1 or top_k > n_experts:
            raise SizingError(f"num_experts_per_tok must be between 1 and {n_experts}, got {top_k}")
        moe_I = _int(cfg, "moe_intermediate_size", "intermediate_size", what="the experts")
        shared_I = int(cfg.get("shared_expert_intermediate_size") or 0)
        shared_gate = h if shared_I and model_type == "qwen2_moe" else 0
        sparse_step = int(cfg.get("decoder_sparse_step") or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        if dense_I is None:
            dense_I = moe_I
    mlp_per_I = 3 * h  # gated (SwiGLU / GeGLU)
    mlp_bias_of = (lambda inter: 2 * inter + h) if mlp_bias else (lambda inter: 0)

    windows = _layer_windows(cfg, model_type, n_layers)
    kv_elems = nkv * (d + dv)
    layers: list[LayerSpec] = []
    n_moe_layers = 0
    for i in range(n_layers):
        is_moe_layer = moe and i not in mlp_only and (i + 1) % sparse_step == 0
        if is_moe_layer:
            n_moe_layers += 1
            expert = mlp_per_I * moe_I
            router = h * n_experts
            shared = mlp_per_I * shared_I + shared_gate
            params = attn + norms + router + n_experts * expert + shared
            linear = attn_linear + router + n_experts * expert + shared
            active = attn + norms + router + top_k * expert + shared
            layers.append(LayerSpec("attention", params, linear, active, n_experts * expert, expert,
                                    n_experts, top_k, kv_elems, nkv, 2 * nkv, windows[i],
                                    attn_flops_per_ctx_token=2 * nh * (d + dv)))
        else:
            mlp = mlp_per_I * dense_I + mlp_bias_of(dense_I)
            params = attn + norms + mlp
            layers.append(LayerSpec("attention", params, attn_linear + mlp_per_I * dense_I, params,
                                    kv_elems=kv_elems, kv_heads=nkv, kv_scale_slots=2 * nkv, window=windows[i],
                                    attn_flops_per_ctx_token=2 * nh * (d + dv)))

    tied = _bool(cfg, "tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    formula = [
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}" + (f"  (+ biases {_n(attn_bias)})" if attn_bias else ""),
    ]
    if moe:
        formula.append(
            f"MoE layers ({n_moe_layers}): {n_experts} experts x 3*h*I_moe = {n_experts} x 3*{h}*{moe_I}"
            f" = {_n(n_experts * mlp_per_I * moe_I)} + router h*E = {_n(h * n_experts)}"
            + (f" + shared 3*h*{shared_I} = {_n(mlp_per_I * shared_I + shared_gate)}" if shared_I else "")
            + f"; active per token: top-{top_k} experts")
        if n_moe_layers < n_layers:
            formula.append(f"dense layers ({n_layers - n_moe_layers}): mlp 3*h*I = 3*{h}*{dense_I}"
                           f" = {_n(mlp_per_I * dense_I)}")
    else:
        formula.append(f"mlp/layer = 3*h*I = 3*{h}*{dense_I} = {_n(mlp_per_I * dense_I)}"
                       + (f" (+ biases {_n(mlp_bias_of(dense_I))})" if mlp_bias else ""))
    formula.append(f"norms/layer = {norms_per_layer}*h" + (f" + q/k-norm 2*d" if qk_norm else "")
                   + f" = {_n(norms)}")
    kinds = []
    if nkv == 1:
        kinds.append("MQA")
    elif nkv < nh:
        kinds.append("GQA")
    else:
        kinds.append("MHA")
    if any(w is not None for w in windows):
        n_sw = sum(1 for w in windows if w is not None)
        kinds.append(f"sliding window {windows[[w is not None for w in windows].index(True)]:,} on {n_sw}/{n_layers} layers")
    family = ("MoE " if moe else "dense ") + ", ".join(kinds)
    per_layer_kv = (f"L x 2 x nkv x d = {n_layers} x 2 x {nkv} x {d}" if d == dv
                    else f"L x nkv x (d_k + d_v) = {n_layers} x {nkv} x ({d} + {dv})")
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=vocab,
        tied=tied, embed_params=vocab * h, lm_head_params=0 if tied else vocab * h,
        final_norm_params=h, layers=tuple(layers), family=family, param_formula=tuple(formula),
        kv_formula=f"KV elements/token = {per_layer_kv} = {_n(n_layers * kv_elems)}",
    )


# --------------------------------------------------------------------------------------
# DeepSeek MLA (+ MoE)


def _mla(cfg: dict, model_type: str) -> dict:
    h = _int(cfg, "hidden_size", what="every layer's width")
    n_layers = _int(cfg, "num_hidden_layers", what="the layer count")
    nh = _int(cfg, "num_attention_heads", what="attention")
    vocab = _int(cfg, "vocab_size", what="the embedding table")
    kv_r = _int(cfg, "kv_lora_rank", what="MLA")
    q_r = _int(cfg, "q_lora_rank", default=None, what="MLA")
    d_nope = _int(cfg, "qk_nope_head_dim", what="MLA")
    d_rope = _int(cfg, "qk_rope_head_dim", what="MLA")
    d_v = _int(cfg, "v_head_dim", what="MLA")
    dense_I = _int(cfg, "intermediate_size", what="the dense MLP")
    n_experts = _int(cfg, "n_routed_experts", default=0, minimum=0)
    if n_experts:
        moe_I = _int(cfg, "moe_intermediate_size", what="the experts")
        top_k = _int(cfg, "num_experts_per_tok", what="the experts")
        if top_k > n_experts:
            raise SizingError(f"num_experts_per_tok {top_k} exceeds n_routed_experts {n_experts}")
        n_shared = _int(cfg, "n_shared_experts", default=0, minimum=0)
        first_dense = _int(cfg, "first_k_dense_replace", default=0, minimum=0)
        freq = _int(cfg, "moe_layer_freq", default=1)
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
    tied = _bool(cfg, "tie_word_embeddings", False)
    return dict(
        hidden=h, num_layers=n_layers, num_heads=nh, num_kv_heads=nh, head_dim=d_nope + d_rope, vocab=vocab,
        tied=tied, embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=tuple(layers), family=("MoE + " if n_experts else "") + "MLA (latent KV)",
        param_formula=tuple(formula),
        kv_formula=(f"MLA KV elements/token = L x (kv_lora_rank + qk_rope_head_dim) = {n_layers} x ({kv_r} + {d_rope})"
                    f" = {_n(n_layers * kv_elems)} (no factor 2; the naive MHA formula L x nh x (d_k + d_v) would give"
                    f" {n_layers} x {nh} x ({d_nope + d_rope} + {d_v}) = {_n(n_layers * nh * (d_nope + d_rope + d_v))})"),
    )


# --------------------------------------------------------------------------------------
# Falcon


def _falcon(cfg: dict, model_type: str) -> dict:
    h = _int(cfg, "hidden_size", "n_embed", what="every layer's width")
    n_layers = _int(cfg, "num_hidden_layers", "n_layer", what="the layer count")
    nh = _int(cfg, "num_attention_heads", "n_head", what="attention")
    vocab = _int(cfg, "vocab_size", what="the embedding table")
    if h % nh:
        raise SizingError(f"hidden_size {h} is not divisible by num_attention_heads {nh}")
    d = h // nh
    new_arch = _bool(cfg, "new_decoder_architecture", False)
    if new_arch:
        nkv = _int(cfg, "num_kv_heads", "n_head_kv", default=nh)
    elif _bool(cfg, "multi_query", True):
        nkv = 1
    else:
        nkv = nh
    bias = _bool(cfg, "bias", False)
    ffn = _int(cfg, "ffn_hidden_size", default=4 * h)
    qkv = h * (nh + 2 * nkv) * d
    attn_linear = qkv + h * h
    mlp_linear = 2 * h * ffn
    biases = ((nh + 2 * nkv) * d + h + ffn + h) if bias else 0
    if new_arch:
        n_ln = 2 if int(cfg.get("num_ln_in_parallel_attn") or 2) == 2 else 1
    elif _bool(cfg, "parallel_attn", True):
        n_ln = 1
    else:
        n_ln = 2
    norms = n_ln * 2 * h
    params = attn_linear + mlp_linear + biases + norms
    layer = LayerSpec("attention", params, attn_linear + mlp_linear, params, kv_elems=2 * nkv * d,
                      kv_heads=nkv, kv_scale_slots=2 * nkv, attn_flops_per_ctx_token=4 * nh * d)
    tied = _bool(cfg, "tie_word_embeddings", True)
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


# --------------------------------------------------------------------------------------
# Mamba (v1)


def _mamba(cfg: dict, model_type: str) -> dict:
    if model_type == "mamba2":
        raise SizingError("mamba2 configs are not supported yet (mamba v1 is)")
    h = _int(cfg, "hidden_size", "d_model", what="every layer's width")
    n_layers = _int(cfg, "num_hidden_layers", "n_layer", what="the layer count")
    vocab = _int(cfg, "vocab_size", what="the embedding table")
    n_state = _int(cfg, "state_size", "d_state", default=16)
    expand = _int(cfg, "expand", default=2)
    d_inner = _int(cfg, "intermediate_size", default=expand * h)
    k_conv = _int(cfg, "conv_kernel", "d_conv", default=4)
    dt_rank = cfg.get("time_step_rank", "auto")
    dt_rank = math.ceil(h / 16) if dt_rank in (None, "auto") else _int(cfg, "time_step_rank")
    use_bias = _bool(cfg, "use_bias", False)
    conv_bias = _bool(cfg, "use_conv_bias", True)
    in_proj = h * 2 * d_inner + (2 * d_inner if use_bias else 0)
    conv = d_inner * k_conv + (d_inner if conv_bias else 0)
    x_proj = d_inner * (dt_rank + 2 * n_state)
    dt_proj = dt_rank * d_inner + d_inner
    a_d = d_inner * n_state + d_inner
    out_proj = d_inner * h + (h if use_bias else 0)
    params = in_proj + conv + x_proj + dt_proj + a_d + out_proj + h
    linear = h * 2 * d_inner + d_inner * (dt_rank + 2 * n_state) + dt_rank * d_inner + d_inner * h
    state = d_inner * (k_conv - 1) + d_inner * n_state
    layer = LayerSpec("mamba", params, linear, params, state_elems=state)
    tied = _bool(cfg, "tie_word_embeddings", True)
    formula = (
        f"mamba/layer = in_proj h*2*Di + conv Di*K (+bias) + x_proj Di*(R+2N) + dt_proj R*Di+Di + A,D Di*N+Di"
        f" + out_proj Di*h + norm h, with h={h}, Di={d_inner}, K={k_conv}, R={dt_rank}, N={n_state} = {_n(params)}",
    )
    return dict(
        hidden=h, num_layers=n_layers, num_heads=0, num_kv_heads=0, head_dim=0, vocab=vocab, tied=tied,
        embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=(layer,) * n_layers, family="SSM (Mamba): constant state per sequence, no per-token KV",
        param_formula=formula,
        kv_formula=(f"no per-token KV; state/sequence = L x (Di x (K-1) + Di x N) = {n_layers} x ({d_inner} x {k_conv - 1}"
                    f" + {d_inner} x {n_state}) = {_n(n_layers * state)} elements"),
    )


# --------------------------------------------------------------------------------------
# vision towers


def _internvit(vc: dict, llm_hidden: int, downsample: float, hf_native: bool, max_tiles: int) -> VisionSpec:
    vh = _int(vc, "hidden_size", what="the vision tower")
    vl = _int(vc, "num_hidden_layers", what="the vision tower")
    vi = _int(vc, "intermediate_size", what="the vision tower")
    heads = _int(vc, "num_attention_heads", default=16)
    patch = vc.get("patch_size", 14)
    image = vc.get("image_size", 448)
    patch = int(patch[0] if isinstance(patch, list) else patch)
    image = int(image[0] if isinstance(image, list) else image)
    if patch < 1 or image < patch:
        raise SizingError(f"vision_config: image_size {image} / patch_size {patch} do not make sense")
    channels = _int(vc, "num_channels", default=3)
    qkv_bias = _bool(vc, "attention_bias" if hf_native else "qkv_bias", True)
    qk_norm = _bool(vc, "use_qk_norm" if hf_native else "qk_normalization", False)
    norm_each = 2 * vh if str(vc.get("norm_type", "layer_norm")) == "layer_norm" else vh
    n_patches = (image // patch) ** 2
    emb = vh + channels * patch * patch * vh + vh + (n_patches + 1) * vh
    linear = 3 * vh * vh + vh * vh + vh * vi + vi * vh
    layer = linear + (3 * vh if qkv_bias else 0) + vh + 2 * norm_each + 2 * vh + vi + vh + (2 * vh if qk_norm else 0)
    tower = emb + vl * layer + (2 * vh if hf_native else 0)
    ratio = round(1 / downsample)
    proj_in = vh * ratio * ratio
    projector = 2 * proj_in + proj_in * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    tokens = int(n_patches * downsample * downsample)
    formula = (
        f"vision (InternViT) = embeddings {_n(emb)} + {vl} layers x {_n(layer)} = {_n(tower)}",
        f"projector (mlp1) = LN 2*{proj_in} + {proj_in}*{llm_hidden} + {llm_hidden}*{llm_hidden} (+ biases) = {_n(projector)}",
        f"tokens/tile = (image/patch)^2 * downsample^2 = ({image}/{patch})^2 * {downsample}^2 = {tokens}",
    )
    return VisionSpec("internvit", tower, vl * linear + channels * patch * patch * vh, projector, vl, vh, heads, vi,
                      n_patches + 1, tokens, max_tiles, formula)


def _clip_vit(vc: dict, llm_hidden: int) -> VisionSpec:
    vh = _int(vc, "hidden_size", what="the vision tower")
    vl = _int(vc, "num_hidden_layers", "depth", what="the vision tower")
    vi = _int(vc, "intermediate_size", default=4 * vh)
    heads = _int(vc, "num_attention_heads", "num_heads", default=max(1, vh // 64))
    patch = int(vc.get("patch_size", 14) if not isinstance(vc.get("patch_size"), list) else vc["patch_size"][0])
    image = int(vc.get("image_size", 336) if not isinstance(vc.get("image_size"), list) else vc["image_size"][0])
    n_patches = (image // max(1, patch)) ** 2
    emb = vh + 3 * patch * patch * vh + (n_patches + 1) * vh
    linear = 4 * vh * vh + 2 * vh * vi
    layer = linear + 4 * vh + 4 * vh + vi + vh
    tower = emb + 2 * vh + vl * layer + 2 * vh
    projector = vh * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    formula = (f"vision (generic CLIP formula, approximate) = {_n(tower)}; projector 2-layer MLP = {_n(projector)}",
               f"tokens/image = (image/patch)^2 = ({image}/{patch})^2 = {n_patches}")
    return VisionSpec("clip (approximate)", tower, vl * linear, projector, vl, vh, heads, vi, n_patches + 1,
                      n_patches, 1, formula)


# --------------------------------------------------------------------------------------
# entry point


def _family_parser(cfg: dict) -> tuple[str, Any, list[str]]:
    notes: list[str] = []
    model_type = str(cfg.get("model_type") or "").lower()
    arch = " ".join(str(a) for a in (cfg.get("architectures") or [])).lower()
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2") or "kv_lora_rank" in cfg:
        return model_type or "deepseek_v3", _mla, notes
    if model_type in ("falcon", "refinedweb", "refinedwebmodel") or "falcon" in arch or "refinedweb" in arch:
        return "falcon", _falcon, notes
    if model_type.startswith("mamba") or "mamba" in arch or ("state_size" in cfg and "num_attention_heads" not in cfg):
        return model_type or "mamba", _mamba, notes
    if not model_type and "internlm2" in arch:
        model_type = "internlm2"
    if model_type not in _KNOWN_LLAMA_LIKE:
        notes.append(f"model_type {model_type or '(none)'!r} is not one the calculator knows by name;"
                     " counted as a Llama-style decoder (gated MLP, RMSNorm) from its fields")
    return model_type or "llama", _llama_like, notes


def _decoder(cfg: dict) -> tuple[dict, str, list[str]]:
    model_type, parser, notes = _family_parser(cfg)
    return parser(cfg, model_type), model_type, notes


def model_from_config(cfg: Any, key: str = "custom", source: dict | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (a dict)."""
    if not isinstance(cfg, dict):
        raise SizingError(f"a config must be a JSON object, got {type(cfg).__name__}")
    source = dict(source or cfg.get("_source") or {})
    notes: list[str] = []
    vision = None
    top_type = str(cfg.get("model_type") or "").lower()
    text_cfg = cfg
    if isinstance(cfg.get("llm_config"), dict):
        text_cfg = cfg["llm_config"]
    elif isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        text_cfg = cfg["text_config"]
    elif cfg.get("text_config") is not None and not isinstance(cfg.get("text_config"), dict):
        raise SizingError("config field 'text_config' must be an object")
    parts, model_type, more = _decoder(text_cfg)
    notes += more
    trust_remote_code = False

    vc = cfg.get("vision_config")
    if vc is not None:
        if not isinstance(vc, dict):
            raise SizingError("config field 'vision_config' must be an object")
        downsample = float(cfg.get("downsample_ratio", 0.5) or 0.5)
        if not 0 < downsample <= 1:
            raise SizingError(f"downsample_ratio must be in (0, 1], got {downsample}")
        max_patch = int(cfg.get("max_dynamic_patch", 12) or 12)
        thumb = bool(cfg.get("use_thumbnail", True)) and max_patch > 1
        tiles = max_patch + (1 if thumb else 0)
        if "llm_config" in cfg or top_type == "internvl_chat":
            vision = _internvit(vc, parts["hidden"], downsample, hf_native=False, max_tiles=tiles)
            trust_remote_code = True
        elif top_type == "internvl" or str(vc.get("model_type", "")) == "internvl_vision":
            vision = _internvit(vc, parts["hidden"], downsample, hf_native=True, max_tiles=tiles)
        else:
            vision = _clip_vit(vc, parts["hidden"])
            notes.append("vision tower counted with a generic CLIP-style formula (approximate);"
                         " a local folder with safetensors gives exact bytes")
        parts["family"] = "vision-language: " + parts["family"]
        parts["param_formula"] = parts["param_formula"] + vision.formula
    if model_type in ("internlm2", "internlm3"):
        trust_remote_code = True

    max_pos = text_cfg.get("max_position_embeddings", cfg.get("max_position_embeddings"))
    if max_pos is not None:
        max_pos = _int({"max_position_embeddings": max_pos}, "max_position_embeddings")
    display = source.get("display_name") or cfg.get("_name_or_path") or key
    return ModelSpec(
        key=key, display_name=str(display), hf_id=source.get("hf_id") or cfg.get("_name_or_path"),
        model_type=top_type or model_type, max_position=max_pos,
        checkpoint_dtype=checkpoint_dtype(cfg if "torch_dtype" in cfg or "quantization_config" in cfg else text_cfg),
        vision=vision, trust_remote_code=trust_remote_code, notes=tuple(notes), source=source, **parts,
    )
