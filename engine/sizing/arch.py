"""Hugging Face ``config.json`` -> a sizing description of the model (``ModelSpec``).

Pure Python. Parameter counts follow the modules transformers builds for each architecture
(checked against meta-device instantiation in tests/test_memory_meta.py); KV-cache elements
per token follow sizing.md §3.3 (GQA/MQA, MLA latent, sliding windows, Mamba state).

Families handled:
  llama-like  llama, mistral, mixtral, qwen2(_moe), qwen3(_moe), gemma(2/3), phi3, internlm2, ...
              (``_KNOWN_LLAMA_LIKE``); any other model_type is refused by name (``unknown_family``),
              never counted as another family
  mla         deepseek_v2, deepseek_v3 (kimi_k2): latent KV, routed + shared experts
  falcon      falcon / RefinedWeb (MQA, parallel attention, LayerNorm, GELU MLP)
  mamba       mamba (v1) selective SSM
  gpt-style   gpt2 (learned positions, n_inner null = 4h), gpt_neox (Pythia), phi (Phi-1/1.5/2),
              starcoder2: LayerNorm, non-gated GELU MLP, biases (``_Dense``)
  vlm         InternVL chat (vision_config + llm_config), HF-native internvl, Qwen2-VL and
              Qwen2.5-VL (their own ViT + patch merger; flat or nested text_config), llava-style
              (vision_config + text_config, generic CLIP formula, marked approximate)

Every field read is validated (type and range); a bad one raises SizingError with one line
naming it (``config field 'vision_config.depth' must be >= 1, got 0``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.hf_config import MISSING, MISSING_RULE, Fields, config_dtype, got
from .formats import SizingError
from .units import tokens as _n  # a count with thousands separators


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

    kind: str  # "internvit" | "qwen2-vl" | "qwen2.5-vl" | "clip (approximate)"
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
    source: dict[str, Any] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    #: (scaled length, words) when rope_scaling extends max_position_embeddings (``_rope_scaled_positions``)
    rope_positions: tuple[int, str] | None = None

    # -- positions ----------------------------------------------------------------
    @property
    def max_model_len(self) -> int | None:
        """The longest context a server accepts for this model (vLLM's derived max_model_len):
        max_position_embeddings, or its rope-scaled length where rope_scaling extends it; None
        when the config names no limit."""
        return self.rope_positions[0] if self.rope_positions else self.max_position

    @property
    def positions_text(self) -> str:
        """Where ``max_model_len`` comes from, for people: "8,192 positions (max_position_embeddings)"."""
        if self.rope_positions:
            return f"{self.rope_positions[0]:,} positions ({self.rope_positions[1]})"
        return f"{self.max_position or 0:,} positions (max_position_embeddings)"

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

    @property
    def kv_window_bound(self) -> int | None:
        """When every layer with a KV cache has a sliding window (Mistral-7B v0.1, StarCoder2): the
        largest window, the most tokens a sequence ever keeps; None when some layer keeps them all."""
        windows = [layer.window for layer in self.layers if layer.kv_elems]
        if not windows or any(w is None for w in windows):
            return None
        return max(w for w in windows if w is not None)


# --------------------------------------------------------------------------------------
# field access with clear errors
#
# Every reader below either returns a value of the promised type, inside its bounds, or raises
# SizingError with one line naming the field ("config field 'vision_config.patch_size' ...").
# Bounds are generous (no published model comes near them) but keep a hostile config from
# building 10^12 layers or overflowing into absurd answers.

MAX_LAYERS = 10_000  # decoder / vision-tower depth (largest published: 126, Llama-3.1-405B)
MAX_VOCAB = 2 ** 24  # 16,777,216 (largest published: 262,144, Gemma 3)
MAX_POSITIONS = 2 ** 31 - 1  # context length fields
MAX_DIM = 2 ** 24  # any other width, head count or expert count
_LAYER_FIELDS = {"num_hidden_layers", "n_layer", "num_layers", "depth"}
_VOCAB_FIELDS = {"vocab_size"}
_POSITION_FIELDS = {"max_position_embeddings", "n_positions", "n_ctx", "sliding_window", "max_window_layers"}


def _refuse(label: str, rule: str, value: Any) -> SizingError:
    """The calculator's error for a bad field: ``config field 'vision_config.depth' must be >= 1, got 0``,
    ``config is missing 'hidden_size' (needed for every layer's width)``."""
    if rule.startswith(MISSING_RULE):
        return SizingError(f"config is missing {label!r}{rule.removeprefix(MISSING_RULE)}")
    return SizingError(f"config field {label!r} {rule}{got(value)}")


def _default_max(name: str) -> int:
    if name in _LAYER_FIELDS:
        return MAX_LAYERS
    if name in _VOCAB_FIELDS:
        return MAX_VOCAB
    if name in _POSITION_FIELDS:
        return MAX_POSITIONS
    return MAX_DIM


def _fields(cfg: dict[str, Any], where: str = "") -> Fields:
    """The shared readers (engine/core/hf_config.py) over ``cfg``, with the calculator's error and
    bounds; null reads as absent and 0 / 1 as false / true, as transformers reads them."""
    return Fields(cfg, _refuse, where, _default_max, null_is_absent=True, bool_ints=True)


def _find(cfg: dict[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``names`` present with a non-null value, as (name, value); (names[0], None) if none."""
    name, value = _fields(cfg).find(names)
    return name, None if value is MISSING else value


def _int(cfg: dict[str, Any], *names: str, default: Any = MISSING, minimum: int = 1, maximum: int | None = None,
         what: str = "", where: str = "") -> Any:
    """An integer field (the first of ``names`` present); ``default`` (may be None) when absent or null."""
    fields = _fields(cfg, where)
    if default is MISSING:
        return fields.req_int(*names, minimum=minimum, maximum=maximum, what=what)
    return fields.opt_int(*names, default=default, minimum=minimum, maximum=maximum)


def _req_int(cfg: dict[str, Any], *names: str, minimum: int = 1, what: str = "", where: str = "") -> int:
    """A required integer field."""
    return _fields(cfg, where).req_int(*names, minimum=minimum, what=what)


def _opt_int(cfg: dict[str, Any], *names: str, default: int, minimum: int = 1, where: str = "") -> int:
    """An optional integer field with an integer default."""
    return _fields(cfg, where).req_int(*names, default=default, minimum=minimum)


def _float(cfg: dict[str, Any], name: str, default: float, *, low: float = 0.0, high: float = math.inf,
           low_open: bool = True, where: str = "") -> float:
    """A finite real number in (low, high] (``low_open``) or [low, high]; ``default`` when absent or null."""
    return _fields(cfg, where).number(name, default, low=low, high=high, low_open=low_open)


def _bool(cfg: dict[str, Any], name: str, default: bool, where: str = "") -> bool:
    """true / false (0 / 1 accepted, as transformers does); ``default`` when absent or null."""
    return _fields(cfg, where).flag(name, default)


def _int_list(cfg: dict[str, Any], name: str, where: str = "") -> list[int]:
    """A list of non-negative integers (layer indices); [] when absent or null."""
    return _fields(cfg, where).int_list(name, 0, MAX_DIM)


def _str_list(cfg: dict[str, Any], name: str, where: str = "") -> list[str] | None:
    """A list of strings; None when absent or null."""
    return _fields(cfg, where).str_list(name)


def _str(cfg: dict[str, Any], name: str, default: str = "", where: str = "") -> str:
    """A string field; ``default`` when absent or null."""
    return _fields(cfg, where).text(name, default)


def _obj(cfg: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A nested object (``vision_config``, ``text_config`` ...); None when absent or null."""
    return _fields(cfg).obj(name)


def _side(cfg: dict[str, Any], name: str, default: int, where: str = "") -> int:
    """An image/patch side that may be written as ``14`` or ``[14, 14]`` (square only)."""
    fields = _fields(cfg, where)
    value = cfg.get(name)
    label = fields.label(name)
    if isinstance(value, list):
        if len(value) != 2 or value[0] != value[1]:
            raise _refuse(label, "must be one integer or a square [n, n] pair", value)
        value = value[0]
    if value is None:
        return default
    return fields.check_int(label, value, 1, MAX_DIM)


def checkpoint_dtype(cfg: dict[str, Any], default: str = "bf16") -> str:
    """The checkpoint's storage dtype: ``quantization_config.quant_method == "fp8"`` -> fp8, else
    ``torch_dtype`` (transformers 4) or ``dtype`` (transformers 5) read through the one dtype
    vocabulary (``engine.core.hf_config.config_dtype``), one of ``CHECKPOINT_DTYPES`` (fp32/bf16/fp16/fp8);
    ``default`` when neither is given. An unknown spelling is an error naming the field."""
    quant = _obj(cfg, "quantization_config") or {}
    key = config_dtype(_fields(cfg), default) or default
    return "fp8" if str(quant.get("quant_method", "")).lower() == "fp8" else key


# --------------------------------------------------------------------------------------
# llama-like decoders (dense, GQA/MQA, sliding windows, MoE)

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "mamba"}
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}
_QWEN_WINDOW_TYPES = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text",
                      "qwen2_5_vl_text"}
_KNOWN_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3", "gemma3_text", "phi3", "internlm2", "internlm3", "yi", "baichuan", "qwen2_vl", "qwen2_5_vl",
    "qwen2_vl_text", "qwen2_5_vl_text", "granite", "olmo", "olmo2", "smollm3", "ministral", "glm",
}


def _layer_windows(cfg: dict[str, Any], model_type: str, n_layers: int) -> list[int | None]:
    """Sliding window per layer (None = full attention): ``layer_types`` when given; Qwen: layers
    >= ``max_window_layers`` when ``use_sliding_window``; Gemma-2: every other layer; Gemma-3: 5 of 6;
    other families with a ``sliding_window``: every layer (Mistral v0.1, Phi-3, StarCoder2)."""
    if cfg.get("sliding_window") is False:  # some exporters write false for "no window"
        cfg = {**cfg, "sliding_window": None}
    window: int | None = _int(cfg, "sliding_window", default=None, minimum=0) or None
    layer_types = _str_list(cfg, "layer_types")
    if layer_types is not None and len(layer_types) != n_layers:
        raise SizingError(f"config field 'layer_types' has {len(layer_types)} entries for {n_layers} layers")
    if layer_types is not None and window:
        return [window if t in ("sliding_attention", "chunked_attention") else None for t in layer_types]
    if model_type in _QWEN_WINDOW_TYPES:
        first = _opt_int(cfg, "max_window_layers", default=n_layers, minimum=0)
        if _bool(cfg, "use_sliding_window", False) and window:
            return [window if i >= first else None for i in range(n_layers)]
        return [None] * n_layers
    if model_type == "gemma2" and window:
        return [window if (i + 1) % 2 else None for i in range(n_layers)]
    if model_type in ("gemma3", "gemma3_text") and window:
        pattern = _opt_int(cfg, "sliding_window_pattern", default=6)
        return [window if (i + 1) % pattern else None for i in range(n_layers)]
    if window and model_type != "llama" and _bool(cfg, "use_sliding_window", True):
        return [window] * n_layers
    return [None] * n_layers


def _heads(cfg: dict[str, Any], h: int, names: tuple[str, ...] = ("num_attention_heads", "n_head", "num_heads"),
           kv_names: tuple[str, ...] = ("num_key_value_heads", "num_kv_heads", "n_head_kv")) -> tuple[int, int, int]:
    """(query heads nh, KV heads nkv, head_dim d): d = ``head_dim`` if given, else h / nh (must divide);
    nkv defaults to nh and must divide it."""
    nh = _req_int(cfg, *names, what="attention")
    nkv = _opt_int(cfg, *kv_names, default=nh)
    if cfg.get("multi_query") is True:
        nkv = 1
    if cfg.get("head_dim") is None and h % nh:
        raise SizingError(f"config field {_find(cfg, names)[0]!r}: hidden size {h} is not divisible by {nh}"
                          " attention heads; set head_dim")
    d = _opt_int(cfg, "head_dim", default=h // nh)
    if nkv > nh:
        raise SizingError(f"config field 'num_key_value_heads' ({nkv}) is larger than num_attention_heads ({nh})")
    if nh % nkv:
        raise SizingError(f"config field 'num_key_value_heads': num_attention_heads {nh} is not a multiple of {nkv}")
    return nh, nkv, d


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
    n_experts = _opt_int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    if n_experts <= 1:
        return _Moe()
    top_k = _opt_int(cfg, "num_experts_per_tok", "moe_topk", "top_k", default=0, minimum=0)
    if top_k < 1 or top_k > n_experts:
        raise SizingError(f"config field 'num_experts_per_tok' must be between 1 and {n_experts}, got {top_k}")
    return _Moe(n_experts, top_k, _req_int(cfg, "moe_intermediate_size", "intermediate_size", what="the experts"),
                _opt_int(cfg, "shared_expert_intermediate_size", default=0, minimum=0),
                _opt_int(cfg, "decoder_sparse_step", default=1), frozenset(_int_list(cfg, "mlp_only_layers")))


def _mha_kind(nh: int, nkv: int) -> str:
    return "MQA" if nkv == 1 else "GQA" if nkv < nh else "MHA"


def _llama_like(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Llama-style decoder: attention h*d*nh (q) + 2*h*d*nkv (k, v) + d*nh*h (o) [+ q/k/v bias
    for Qwen2], gated MLP 3*h*I [+ biases], RMSNorms 2*h (4*h for Gemma-2/3) [+ q/k-norm 2*d];
    MoE layers: E experts x 3*h*I_moe + router h*E [+ shared expert]; KV/token = L*nkv*(d_k+d_v)."""
    h = _req_int(cfg, "hidden_size", "n_embd", "d_model", what="every layer's width")
    n_layers = _req_int(cfg, "num_hidden_layers", "n_layer", "num_layers", what="the layer count")
    nh, nkv, d = _heads(cfg, h)
    dv = _opt_int(cfg, "v_head_dim", default=d)
    vocab = _req_int(cfg, "vocab_size", what="the embedding table")

    any_bias = _bool(cfg, "attention_bias", False) or _bool(cfg, "bias", False)
    qkv_bias = model_type in _QKV_BIAS_TYPES or any_bias
    o_bias = any_bias and model_type not in _QKV_BIAS_TYPES
    mlp_bias = _bool(cfg, "mlp_bias", False)
    norms_per_layer = 4 if model_type in _FOUR_NORM_TYPES else 2
    qk_norm = 2 * d if model_type in _QK_NORM_TYPES else 0

    attn_linear = h * nh * d + h * nkv * d + h * nkv * dv + nh * dv * h
    attn_bias = (nh * d + nkv * d + nkv * dv if qkv_bias else 0) + (h if o_bias else 0)
    attn = attn_linear + attn_bias
    norms = norms_per_layer * h + qk_norm

    moe = _moe_fields(cfg)
    dense_I: int = _int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner",
                        default=moe.inter if moe.experts else MISSING, what="the MLP")
    shared_gate = h if moe.shared_inter and model_type == "qwen2_moe" else 0
    mlp_per_I = 3 * h  # gated (SwiGLU / GeGLU)
    mlp_bias_params = 2 * dense_I + h if mlp_bias else 0

    windows = _layer_windows(cfg, model_type, n_layers)
    kv_elems = nkv * (d + dv)
    flops = 2 * nh * (d + dv)
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        if moe.is_moe_layer(i):
            expert = mlp_per_I * moe.inter
            router = h * moe.experts
            shared = mlp_per_I * moe.shared_inter + shared_gate
            params = attn + norms + router + moe.experts * expert + shared
            linear = attn_linear + router + moe.experts * expert + shared
            active = attn + norms + router + moe.top_k * expert + shared
            layers.append(LayerSpec("attention", params, linear, active, moe.experts * expert, expert,
                                    moe.experts, moe.top_k, kv_elems, nkv, 2 * nkv, windows[i],
                                    attn_flops_per_ctx_token=flops))
        else:
            params = attn + norms + mlp_per_I * dense_I + mlp_bias_params
            layers.append(LayerSpec("attention", params, attn_linear + mlp_per_I * dense_I, params,
                                    kv_elems=kv_elems, kv_heads=nkv, kv_scale_slots=2 * nkv, window=windows[i],
                                    attn_flops_per_ctx_token=flops))
    n_moe_layers = sum(1 for layer in layers if layer.num_experts)

    tied = _bool(cfg, "tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
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
            + f"; active per token: top-{moe.top_k} experts")
        if n_moe_layers < n_layers:
            formula.append(f"dense layers ({n_layers - n_moe_layers}): mlp 3*h*I = 3*{h}*{dense_I}"
                           f" = {_n(mlp_per_I * dense_I)}")
    else:
        formula.append(f"mlp/layer = 3*h*I = 3*{h}*{dense_I} = {_n(mlp_per_I * dense_I)}"
                       + (f" (+ biases {_n(mlp_bias_params)})" if mlp_bias else ""))
    formula.append(f"norms/layer = {norms_per_layer}*h" + (" + q/k-norm 2*d" if qk_norm else "")
                   + f" = {_n(norms)}")
    kinds = [_mha_kind(nh, nkv)]
    if any(w is not None for w in windows):
        n_sw = sum(1 for w in windows if w is not None)
        first_window = next(w for w in windows if w is not None)
        kinds.append(f"sliding window {first_window:,} on {n_sw}/{n_layers} layers")
    family = ("MoE " if moe.experts else "dense ") + ", ".join(kinds)
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


def _mla(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """DeepSeek-V2/V3 multi-head latent attention: q (h*q_r + q_r*nh*(d_nope+d_rope), or h*nh*(...)
    without q-LoRA) + kv_a h*(r+d_rope) + kv_b r*nh*(d_nope+d_v) + o nh*d_v*h (+ norms); MoE layers
    from first_k_dense_replace: E routed + shared experts of 3*h*I_moe + router h*E (+ bias for
    noaux_tc); KV/token = L*(kv_lora_rank + qk_rope_head_dim), no factor 2."""
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


def _falcon(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Falcon / RefinedWeb: fused qkv h*(nh+2*nkv)*d + dense h*h, GELU MLP 2*h*ffn (4h), optional
    biases, 1 or 2 LayerNorms (2h each) per layer; nkv = 1 (multi_query), nh, or num_kv_heads
    (new decoder architecture); KV/token = L*2*nkv*d."""
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
        n_ln = 2 if _opt_int(cfg, "num_ln_in_parallel_attn", default=2) == 2 else 1
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


def _mamba(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Mamba v1: in_proj h*2*Di + conv Di*K (+Di) + x_proj Di*(R+2N) + dt_proj R*Di+Di + A, D
    Di*N+Di + out_proj Di*h + norm h; no per-token KV, a state of L*(Di*(K-1) + Di*N) per sequence."""
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
# GPT-style dense decoders: GPT-2, GPT-NeoX (Pythia), Phi (Phi-1/1.5/2), StarCoder2
#
# Same skeleton, different switches: a non-gated GELU MLP (2*h*I), LayerNorms with bias
# (2*h each), biases on most projections, sometimes learned position embeddings or an LM-head
# bias. Parallel residual (NeoX, Phi) and partial rotary (NeoX rotary_pct, Phi
# partial_rotary_factor) change no parameter or KV count.


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
        return self.norms_per_layer * 2 * self.hidden + self.extra_norm_params


def _dense_parts(s: _Dense, formula_head: str) -> dict[str, Any]:
    """ModelSpec fields for a ``_Dense`` shape. KV/token = L x 2 x nkv x d (window on every layer
    when ``s.window``); embeddings V*h (+ P*h learned positions); LM head V*h (+ V bias) unless
    tied (a tied head keeps its bias); final LayerNorm 2*h."""
    attn_linear, attn_bias = s.attention()
    mlp_linear, mlp_bias = s.mlp()
    params = attn_linear + attn_bias + mlp_linear + mlp_bias + s.norms()
    kv_elems = 2 * s.kv_heads * s.head_dim
    layer = LayerSpec("attention", params, attn_linear + mlp_linear, params, kv_elems=kv_elems,
                      kv_heads=s.kv_heads, kv_scale_slots=2 * s.kv_heads, window=s.window,
                      attn_flops_per_ctx_token=4 * s.heads * s.head_dim)
    h, nh, nkv, d = s.hidden, s.heads, s.kv_heads, s.head_dim
    lm_bias = s.vocab if s.lm_head_bias else 0
    formula = (
        formula_head,
        f"attention/layer = h*d*nh + 2*h*d*nkv + d*nh*h = {h}*{d}*{nh} + 2*{h}*{d}*{nkv} + {d}*{nh}*{h}"
        f" = {_n(attn_linear)}" + (f" (+ biases {_n(attn_bias)})" if attn_bias else ""),
        f"mlp/layer = 2*h*I (non-gated GELU) = 2*{h}*{s.inter} = {_n(mlp_linear)}"
        + (f" (+ biases {_n(mlp_bias)})" if mlp_bias else ""),
        f"LayerNorms/layer = {s.norms_per_layer} x 2*h" + (f" + q/k LayerNorms {_n(s.extra_norm_params)}"
                                                           if s.extra_norm_params else "") + f" = {_n(s.norms())}",
        f"embeddings V*h = {s.vocab}*{h}" + (f" + learned positions P*h = {s.positions}*{h}" if s.positions else "")
        + f" = {_n(s.vocab * h + s.positions * h)}; LM head "
        + ("tied" + (f" (+ bias V = {_n(lm_bias)})" if lm_bias else "") if s.tied
           else f"V*h = {_n(s.vocab * h)}" + (f" + bias V = {_n(lm_bias)}" if lm_bias else "")),
    )
    kinds = [_mha_kind(nh, nkv)] + ([f"sliding window {s.window:,} on every layer"] if s.window else [])
    kv = f"KV elements/token = L x 2 x nkv x d = {s.layers} x 2 x {nkv} x {d} = {_n(s.layers * kv_elems)}"
    return dict(
        hidden=h, num_layers=s.layers, num_heads=nh, num_kv_heads=nkv, head_dim=d, vocab=s.vocab, tied=s.tied,
        embed_params=s.vocab * h + s.positions * h, lm_head_params=(0 if s.tied else s.vocab * h) + lm_bias,
        final_norm_params=2 * h, layers=(layer,) * s.layers, family=f"dense {', '.join(kinds)} ({s.label})",
        param_formula=formula,
        kv_formula=kv + (f"; sliding window {s.window:,}: a sequence holds at most {s.window:,} tokens' KV"
                         if s.window else ""),
        max_position=s.max_position,
    )


def _gpt2(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """GPT-2 (``GPT2LMHeadModel``): n_embd / n_layer / n_head; MLP width ``n_inner`` (null = 4 x
    n_embd); fused c_attn h*3h + 3h, c_proj h*h + h; c_fc h*I + I, c_proj I*h + h; ln_1, ln_2
    (2*h each); learned positions n_positions x h; tied LM head."""
    h = _req_int(cfg, "n_embd", "hidden_size", what="every layer's width")
    nh = _req_int(cfg, "n_head", "num_attention_heads", what="attention")
    if h % nh:
        raise SizingError(f"config field 'n_head': n_embd {h} is not divisible by {nh} heads")
    positions = _req_int(cfg, "n_positions", "max_position_embeddings", what="the position embeddings")
    if _bool(cfg, "add_cross_attention", False):
        raise SizingError("config field 'add_cross_attention': GPT-2 with cross-attention (an encoder-decoder)"
                          " is not supported")
    s = _Dense("GPT-2", h, _req_int(cfg, "n_layer", "num_hidden_layers", what="the layer count"), nh, nh, h // nh,
               _opt_int(cfg, "n_inner", default=4 * h), _req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=2, positions=positions,
               tied=_bool(cfg, "tie_word_embeddings", True), max_position=positions)
    return _dense_parts(s, "GPT-2: learned position embeddings, LayerNorm, biases everywhere, GELU MLP"
                           f" I = n_inner or 4*h = {s.inter}")


def _gpt_neox(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """GPT-NeoX / Pythia (``GPTNeoXForCausalLM``): fused query_key_value h*3h (+3h bias) and dense
    h*h (+h) when ``attention_bias`` (default true); dense_h_to_4h / dense_4h_to_h with biases;
    two LayerNorms per layer even with parallel residual; untied ``embed_out`` by default."""
    h = _req_int(cfg, "hidden_size", what="every layer's width")
    nh, _, d = _heads(cfg, h, kv_names=("num_attention_heads",))
    bias = _bool(cfg, "attention_bias", True)
    _float(cfg, "rotary_pct", 1.0, high=1.0)
    s = _Dense("GPT-NeoX", h, _req_int(cfg, "num_hidden_layers", what="the layer count"), nh, nh, d,
               _req_int(cfg, "intermediate_size", what="the MLP"), _req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=bias, o_bias=bias, mlp_bias=True, norms_per_layer=2,
               tied=_bool(cfg, "tie_word_embeddings", False))
    parallel = "parallel residual" if _bool(cfg, "use_parallel_residual", True) else "sequential residual"
    return _dense_parts(s, f"GPT-NeoX: {parallel}, partial rotary (no parameters), LayerNorm, non-gated GELU MLP")


def _phi(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Phi-1/1.5/2 (``PhiForCausalLM``): q/k/v/dense with biases, fc1/fc2 with biases, one
    LayerNorm per layer (parallel attention + MLP), optional q/k LayerNorms over head_dim
    (``qk_layernorm``: 2 x 2*d), LM head with a bias (V*h + V), untied by default."""
    h = _req_int(cfg, "hidden_size", what="every layer's width")
    nh, nkv, d = _heads(cfg, h)
    _float(cfg, "partial_rotary_factor", 0.5, high=1.0)
    s = _Dense("Phi", h, _req_int(cfg, "num_hidden_layers", what="the layer count"), nh, nkv, d,
               _req_int(cfg, "intermediate_size", what="the MLP"), _req_int(cfg, "vocab_size", what="the embedding table"),
               qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=1,
               extra_norm_params=4 * d if _bool(cfg, "qk_layernorm", False) else 0,
               tied=_bool(cfg, "tie_word_embeddings", False), lm_head_bias=True)
    return _dense_parts(s, "Phi: parallel attention + MLP under one LayerNorm, partial rotary, dense GELU MLP,"
                           " LM head with bias")


def _starcoder2(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """StarCoder2 (``Starcoder2ForCausalLM``): GQA q/k/v/o and c_fc/c_proj, all with biases when
    ``use_bias`` (default true); two LayerNorms per layer; tied embeddings by default;
    ``sliding_window`` (4,096 in the published 3B/7B/15B) on every layer."""
    h = _req_int(cfg, "hidden_size", what="every layer's width")
    nh, nkv, d = _heads(cfg, h)
    bias = _bool(cfg, "use_bias", True)
    n_layers = _req_int(cfg, "num_hidden_layers", what="the layer count")
    windows = _layer_windows(cfg, model_type, n_layers)
    s = _Dense("StarCoder2", h, n_layers, nh, nkv, d, _req_int(cfg, "intermediate_size", what="the MLP"),
               _req_int(cfg, "vocab_size", what="the embedding table"), qkv_bias=bias, o_bias=bias, mlp_bias=bias,
               norms_per_layer=2, tied=_bool(cfg, "tie_word_embeddings", True), window=windows[0] if windows else None)
    return _dense_parts(s, "StarCoder2: GQA, LayerNorm, non-gated GELU MLP (c_fc, c_proj)"
                           + (" with biases" if bias else ""))


# --------------------------------------------------------------------------------------
# Qwen2-VL / Qwen2.5-VL vision towers

QWEN_VL_TILE_SIDE = 448  # pixels: one "tile" of a Qwen2-VL image = a 448x448 region = 1,024 patches
QWEN_VL_DEFAULT_TILES = 5  # ~1 megapixel: 1,280 tokens, Qwen's suggested max_pixels = 1280*28*28


@dataclass(frozen=True)
class _QwenVit:
    """Qwen2-VL / Qwen2.5-VL vision transformer (native resolution, no tiling of its own)."""

    version: str  # "qwen2-vl" | "qwen2.5-vl"
    width: int  # e: embed_dim (Qwen2-VL) / hidden_size (Qwen2.5-VL)
    depth: int
    heads: int
    inter: int  # MLP width: e*mlp_ratio (Qwen2-VL) / intermediate_size (Qwen2.5-VL)
    out: int  # merger output = the LLM's hidden size
    channels: int
    patch: int
    temporal: int
    merge: int

    @property
    def gated(self) -> bool:
        return self.version == "qwen2.5-vl"

    def patch_embed(self) -> int:
        """Conv3d without bias: channels x temporal_patch x patch x patch x e."""
        return self.channels * self.temporal * self.patch * self.patch * self.width

    def block(self) -> tuple[int, int]:
        """(params, matmul weights) of one block: qkv 3e^2 + 3e, proj e^2 + e, MLP (gated SiLU
        3*e*I + 2I + e for Qwen2.5-VL, GELU fc1/fc2 2*e*I + I + e for Qwen2-VL), two norms
        (RMSNorm e each for Qwen2.5-VL, LayerNorm 2e each for Qwen2-VL)."""
        e, i = self.width, self.inter
        mlp_linear = (3 if self.gated else 2) * e * i
        mlp_bias = (2 * i if self.gated else i) + e
        norms = 2 * e if self.gated else 4 * e
        linear = 4 * e * e + mlp_linear
        return linear + 3 * e + e + mlp_bias + norms, linear

    def merger(self) -> int:
        """PatchMerger: norm over e (RMSNorm e / LayerNorm 2e), then Linear(e*m^2 -> e*m^2) + bias,
        GELU, Linear(e*m^2 -> out) + bias."""
        wide = self.width * self.merge * self.merge
        return (self.width if self.gated else 2 * self.width) + wide * wide + wide + wide * self.out + self.out


def _qwen_vit_fields(vc: dict[str, Any], version: str, llm_hidden: int) -> _QwenVit:
    """Read a Qwen2-VL (``embed_dim``, ``mlp_ratio``, ``hidden_size`` = merger output) or Qwen2.5-VL
    (``hidden_size`` = width, ``intermediate_size``, ``out_hidden_size``) vision_config."""
    w = "vision_config"
    if version == "qwen2-vl":
        width = _opt_int(vc, "embed_dim", default=1280, where=w)
        ratio = _float(vc, "mlp_ratio", 4.0, high=1024.0, where=w)
        inter = int(width * ratio)
        out = _opt_int(vc, "hidden_size", default=llm_hidden, where=w)
        out_name = "hidden_size"
    else:
        width = _opt_int(vc, "hidden_size", default=1280, where=w)
        inter = _req_int(vc, "intermediate_size", what="the vision MLP", where=w)
        out = _opt_int(vc, "out_hidden_size", default=llm_hidden, where=w)
        out_name = "out_hidden_size"
    if out != llm_hidden:
        raise SizingError(f"config field 'vision_config.{out_name}' ({out}) must equal the language model's"
                          f" hidden size ({llm_hidden})")
    heads = _opt_int(vc, "num_heads", default=16, where=w)
    if width % heads:
        raise SizingError(f"config field 'vision_config.num_heads': width {width} is not divisible by {heads} heads")
    return _QwenVit(version, width, _opt_int(vc, "depth", default=32, where=w), heads, max(1, inter), out,
                    _opt_int(vc, "in_channels", "in_chans", default=3, where=w),
                    _opt_int(vc, "patch_size", "spatial_patch_size", default=14, where=w),
                    _opt_int(vc, "temporal_patch_size", default=2, where=w),
                    _opt_int(vc, "spatial_merge_size", default=2, where=w))


def _qwen_vl_vision(vc: dict[str, Any], version: str, llm_hidden: int) -> VisionSpec:
    """Qwen2-VL / Qwen2.5-VL vision tower: patch embed + depth x block (+ merger as the projector).
    Images run at native resolution; the calculator counts them in 448x448 "tiles": (448/patch)^2
    patch tokens each, merged m x m into (448/patch)^2 / m^2 LLM tokens (256 for patch 14, m 2)."""
    v = _qwen_vit_fields(vc, version, llm_hidden)
    if QWEN_VL_TILE_SIDE % (v.patch * v.merge):
        raise SizingError(f"config fields 'vision_config.patch_size' ({v.patch}) x 'spatial_merge_size' ({v.merge})"
                          f" must divide {QWEN_VL_TILE_SIDE}")
    block, block_linear = v.block()
    tower = v.patch_embed() + v.depth * block
    projector = v.merger()
    patches = (QWEN_VL_TILE_SIDE // v.patch) ** 2
    tokens = patches // (v.merge * v.merge)
    mlp = ("gated SiLU MLP 3*e*I" if v.gated else "GELU MLP 2*e*I") + f", I = {v.inter}"
    attention = ("window attention (full attention on the blocks in fullatt_block_indexes), RMSNorm" if v.gated
                 else "full attention over the image, LayerNorm")
    formula = (
        f"vision ({v.version}) = patch embed Conv3d {v.channels}*{v.temporal}*{v.patch}*{v.patch}*{v.width}"
        f" = {_n(v.patch_embed())} + {v.depth} blocks x {_n(block)} (qkv + proj + {mlp}; {attention}) = {_n(tower)}",
        f"projector (patch merger) = norm + {v.width * v.merge ** 2}*{v.width * v.merge ** 2}"
        f" + {v.width * v.merge ** 2}*{v.out} (+ biases) = {_n(projector)}",
        f"tokens per {QWEN_VL_TILE_SIDE}x{QWEN_VL_TILE_SIDE} region = ({QWEN_VL_TILE_SIDE}/{v.patch})^2 /"
        f" {v.merge}^2 = {tokens}; default {QWEN_VL_DEFAULT_TILES} regions = {QWEN_VL_DEFAULT_TILES * tokens}"
        " tokens (~1 MP; the processor's own max_pixels allows up to 16,384 tokens per image)",
    )
    return VisionSpec(v.version, tower, v.depth * block_linear + v.patch_embed(), projector, v.depth, v.width,
                      v.heads, v.inter, patches, tokens, QWEN_VL_DEFAULT_TILES, formula)


# --------------------------------------------------------------------------------------
# vision towers


def _internvit(vc: dict[str, Any], llm_hidden: int, downsample: float, hf_native: bool, max_tiles: int) -> VisionSpec:
    """InternViT (InternVL): embeddings (class token + Conv2d patch embed with bias + positions),
    layers of qkv 3e^2 (+ bias) + proj e^2 + e + MLP 2*e*I + I + e + two norms + layer scales 2e
    [+ q/k-norm]; projector mlp1 = LN(e*r^2) + Linear(e*r^2 -> h) + Linear(h -> h) with biases,
    r = 1/downsample_ratio; tokens/tile = (image/patch)^2 x downsample^2."""
    w = "vision_config"
    vh = _req_int(vc, "hidden_size", what="the vision tower", where=w)
    vl = _req_int(vc, "num_hidden_layers", what="the vision tower", where=w)
    vi = _req_int(vc, "intermediate_size", what="the vision tower", where=w)
    heads = _opt_int(vc, "num_attention_heads", default=16, where=w)
    patch = _side(vc, "patch_size", 14, where=w)
    image = _side(vc, "image_size", 448, where=w)
    if image < patch:
        raise SizingError(f"config field 'vision_config.image_size' ({image}) is smaller than its patch_size ({patch})")
    channels = _opt_int(vc, "num_channels", default=3, where=w)
    qkv_bias = _bool(vc, "attention_bias" if hf_native else "qkv_bias", True, where=w)
    qk_norm = _bool(vc, "use_qk_norm" if hf_native else "qk_normalization", False, where=w)
    norm_each = 2 * vh if _str(vc, "norm_type", "layer_norm", where=w) == "layer_norm" else vh
    n_patches = (image // patch) ** 2
    emb = vh + channels * patch * patch * vh + vh + (n_patches + 1) * vh
    linear = 3 * vh * vh + vh * vh + vh * vi + vi * vh
    layer = linear + (3 * vh if qkv_bias else 0) + vh + 2 * norm_each + 2 * vh + vi + vh + (2 * vh if qk_norm else 0)
    tower = emb + vl * layer + (2 * vh if hf_native else 0)
    ratio = round(1 / downsample)
    proj_in = vh * ratio * ratio
    projector = 2 * proj_in + proj_in * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    tokens = max(1, int(n_patches * downsample * downsample))
    formula = (
        f"vision (InternViT) = embeddings {_n(emb)} + {vl} layers x {_n(layer)} = {_n(tower)}",
        f"projector (mlp1) = LN 2*{proj_in} + {proj_in}*{llm_hidden} + {llm_hidden}*{llm_hidden} (+ biases) = {_n(projector)}",
        f"tokens/tile = (image/patch)^2 * downsample^2 = ({image}/{patch})^2 * {downsample}^2 = {tokens}",
    )
    return VisionSpec("internvit", tower, vl * linear + channels * patch * patch * vh, projector, vl, vh, heads, vi,
                      n_patches + 1, tokens, max_tiles, formula)


def _clip_vit(vc: dict[str, Any], llm_hidden: int) -> VisionSpec:
    """Generic CLIP-style ViT (approximate, for llava-style configs): patch + position embeddings,
    layers of 4e^2 + 2*e*I with biases and two LayerNorms, pre/post LayerNorms; 2-layer MLP projector."""
    w = "vision_config"
    vh = _req_int(vc, "hidden_size", what="the vision tower", where=w)
    vl = _req_int(vc, "num_hidden_layers", "depth", what="the vision tower", where=w)
    vi = _opt_int(vc, "intermediate_size", default=4 * vh, where=w)
    heads = _opt_int(vc, "num_attention_heads", "num_heads", default=max(1, vh // 64), where=w)
    patch = _side(vc, "patch_size", 14, where=w)
    image = _side(vc, "image_size", 336, where=w)
    n_patches = max(1, (image // patch) ** 2)
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

_GPT_FAMILIES = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "phi": _phi, "starcoder2": _starcoder2}
_OTHER_FAMILIES = {"deepseek_v2", "deepseek_v3", "kimi_k2", "falcon", "mamba", "mamba2"}
_ARCH_NAMES = {"gpt2lmheadmodel": "gpt2", "gptneoxforcausallm": "gpt_neox", "phiforcausallm": "phi",
               "starcoder2forcausallm": "starcoder2"}
_DEFAULT_DTYPE = {"gpt2": "fp32"}  # GPT-2's config.json names no dtype; its checkpoint is fp32
_QWEN_VL_TYPES = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl"}
_QWEN_VL_VISION_TYPES = {"qwen2_vl_vision": "qwen2-vl", "qwen2_5_vl_vision": "qwen2.5-vl"}
_Parser = Callable[[dict[str, Any], str], dict[str, Any]]


def _model_type(cfg: dict[str, Any], where: str = "") -> str:
    return _str(cfg, "model_type", where=where).lower()


def _architectures(cfg: dict[str, Any]) -> list[str]:
    value = cfg.get("architectures")
    if isinstance(value, str):
        return [value]
    return _str_list(cfg, "architectures") or []


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
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2") or "kv_lora_rank" in cfg:
        return model_type or "deepseek_v3", _mla, notes
    if model_type in ("falcon", "refinedweb", "refinedwebmodel") or "falcon" in arch or "refinedweb" in arch:
        return "falcon", _falcon, notes
    if model_type.startswith("mamba") or "mamba" in arch or ("state_size" in cfg and "num_attention_heads" not in cfg):
        return model_type or "mamba", _mamba, notes
    if not model_type and "internlm2" in arch:
        model_type = "internlm2"
    if not model_type and where:  # a composite's nested text config without one: transformers' default
        model_type = "llama"
    if model_type not in _KNOWN_LLAMA_LIKE:
        raise unknown_family(model_type)
    return model_type, _llama_like, notes


def supported_model_types() -> list[str]:
    """Every decoder ``model_type`` the calculator counts exactly (vision-language wrappers size
    their text model by its own model_type)."""
    return sorted(_KNOWN_LLAMA_LIKE | set(_GPT_FAMILIES) | _OTHER_FAMILIES)


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
        _float(cfg, "rope_theta", 10000.0, where=where)
    return parser(cfg, model_type), model_type, notes


def _text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The language model's config and its dotted prefix: ``llm_config`` (InternVL chat),
    ``text_config`` (transformers composites, when the top level has no ``hidden_size``), or the
    config itself (flat form, e.g. Qwen2-VL as published). The top level's
    ``tie_word_embeddings`` applies to a nested text config that does not set its own."""
    _bool(cfg, "tie_word_embeddings", False)  # validated even where the nested config decides
    llm = _obj(cfg, "llm_config")
    if llm is not None:
        return llm, "llm_config"
    text = _obj(cfg, "text_config")
    if text is not None and "hidden_size" not in cfg:
        if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in text:
            text = {**text, "tie_word_embeddings": cfg["tie_word_embeddings"]}
        return text, "text_config"
    return cfg, ""


def _tiles(cfg: dict[str, Any]) -> int:
    """InternVL tiles per image: max_dynamic_patch (12) + a thumbnail when use_thumbnail and > 1 tile."""
    max_patch = _opt_int(cfg, "max_dynamic_patch", default=12)
    thumb = _bool(cfg, "use_thumbnail", True) and max_patch > 1
    return max_patch + (1 if thumb else 0)


def _vision(cfg: dict[str, Any], top_type: str, llm_hidden: int) -> tuple[VisionSpec | None, list[str], bool]:
    """(vision tower or None, notes, trust_remote_code) for a composite config's ``vision_config``."""
    vc = _obj(cfg, "vision_config")
    if vc is None:
        return None, [], False
    vision_type = _model_type(vc, "vision_config")
    qwen = _QWEN_VL_TYPES.get(top_type) or _QWEN_VL_VISION_TYPES.get(vision_type)
    if qwen:
        return _qwen_vl_vision(vc, qwen, llm_hidden), [], False
    downsample = _float(cfg, "downsample_ratio", 0.5, high=1.0)
    if "llm_config" in cfg or top_type == "internvl_chat":
        return _internvit(vc, llm_hidden, downsample, hf_native=False, max_tiles=_tiles(cfg)), [], True
    if top_type == "internvl" or vision_type == "internvl_vision":
        return _internvit(vc, llm_hidden, downsample, hf_native=True, max_tiles=_tiles(cfg)), [], False
    note = ("vision tower counted with a generic CLIP-style formula (approximate);"
            " a local folder with safetensors gives exact bytes")
    return _clip_vit(vc, llm_hidden), [note], False


def _source(cfg: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    """Provenance: the caller's ``source`` or the preset's ``_source`` object (string values)."""
    raw = given if given is not None else cfg.get("_source")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SizingError(f"config field '_source' must be an object, got {type(raw).__name__}")
    for name in ("hf_id", "display_name"):
        _str(raw, name, where="_source")
    return dict(raw)


def _max_position(parts: dict[str, Any], text_cfg: dict[str, Any], cfg: dict[str, Any], where: str) -> int | None:
    """The context limit: the family's own (GPT-2 n_positions) or ``max_position_embeddings``."""
    own = parts.pop("max_position", None)
    if own is not None:
        return int(own)
    if text_cfg.get("max_position_embeddings") is not None:
        value: int = _int(text_cfg, "max_position_embeddings", where=where)
        return value
    top: int | None = _int(cfg, "max_position_embeddings", default=None)
    return top


#: rope types whose length max_position_embeddings already counts (vLLM's _get_and_verify_max_len)
_ROPE_ALREADY_COUNTED = ("su", "longrope", "llama3")


def _rope_scaled_positions(text_cfg: dict[str, Any], model_type: str, max_pos: int | None,
                           where: str) -> tuple[int, str] | None:
    """The rope-scaled length, as vLLM derives max_model_len: with ``rope_scaling`` of a type other
    than su / longrope / llama3 (and not Gemma-3, whose max_position_embeddings is already scaled),
    max_position_embeddings x factor, or original_max_position_embeddings x factor for yarn.
    None when rope_scaling is absent or does not extend the limit."""
    rope = _obj(text_cfg, "rope_scaling")
    if rope is None or max_pos is None or "gemma3" in model_type:
        return None
    prefix = f"{where}.rope_scaling" if where else "rope_scaling"
    rope_type = _str(rope, "rope_type", where=prefix) or _str(rope, "type", where=prefix)
    if not rope_type or rope_type in _ROPE_ALREADY_COUNTED:
        return None
    factor = _float(rope, "factor", 1.0, high=1e6, where=prefix)
    base, base_name = max_pos, "max_position_embeddings"
    if rope_type == "yarn":
        base = _req_int(rope, "original_max_position_embeddings", what="yarn rope scaling", where=prefix)
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
    has_dtype = any(cfg.get(k) is not None for k in ("torch_dtype", "dtype", "quantization_config"))
    dtype = checkpoint_dtype(cfg if has_dtype else text_cfg, _DEFAULT_DTYPE.get(model_type, "bf16"))
    name_or_path = _str(cfg, "_name_or_path") or _str(cfg, "name_or_path") or None
    display = src.get("display_name") or name_or_path or key
    return ModelSpec(
        key=key, display_name=str(display), hf_id=src.get("hf_id") or name_or_path,
        model_type=top_type or model_type, max_position=max_pos, checkpoint_dtype=dtype,
        vision=vision, trust_remote_code=trust_remote_code, notes=tuple(notes), source=src,
        rope_positions=_rope_scaled_positions(text_cfg, model_type, max_pos, where), **parts,
    )
