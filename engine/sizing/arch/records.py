"""The sizing records a config becomes: ``ModelSpec`` (the model), ``LayerSpec`` (one decoder
layer), ``VisionSpec`` (a vision tower) and ``Checkpoint`` (exact bytes from safetensors headers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .quantization import QuantScheme


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
    checkpoint_dtype: str  # fp32 | bf16 | fp16 | fp8 (the float dtype of a checkpoint quantized otherwise)
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
    #: a quantized checkpoint's stored format (``quantization_config``); None for float checkpoints
    quantization: QuantScheme | None = None
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

