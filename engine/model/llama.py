"""A compact Llama-family decoder (Llama, Mistral, Qwen2-style qkv bias, SmolLM) over one
flattened batch per step.

    input_ids [T] -> embed -> L x ( RMSNorm -> qkv -> RoPE -> paged attention -> o_proj (+)
                                    RMSNorm -> SwiGLU MLP (+) ) -> RMSNorm -> lm_head [S, V]

Weights keep Hugging Face names, so the same state dict loads into ``LlamaForCausalLM`` for
the parity tests. The forward is split into ``embed / run_layers / compute_logits`` so a
pipeline stage can run a layer range.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.model import cpu_decode
from engine.model.attention import TORCH_ATTENTION, AttentionBackend
from engine.model.kv_quant import KVCache
from engine.model.forward_batch import ForwardBatch
from engine.model.quant_cache import cached_quantize
from engine.model.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine.model.weights import check_tensors
from engine.core.config import QuantConfig
from engine.model.quantization import QuantizedLinear, Weight, check_group_size, is_linear_weight, is_table, \
    linear, quantize_table, quantize_weight

if TYPE_CHECKING:
    from engine.model.smoothing import Smoothing

__all__ = ["AllReduce", "FusedLayer", "LlamaModel", "ModelConfig", "Observer", "SUPPORTED_ARCHITECTURES", "rms_norm", "rotate_half"]

#: Called as observer(layer_index, linear, x) with x, the input of one of a layer's four
#: linear calls: "qkv" [T, h], "o" [T, nq * d], "gate_up" [T, h], "down" [T, intermediate].
#: It must not modify x (engine/model/activations.py reads it; the forward's arithmetic is unchanged).
Observer = Callable[[int, str, torch.Tensor], None]

#: Tensor parallelism's all-reduce (engine/parallel/shard.py): sums a rank's partial o_proj / down_proj
#: output [T, h] over the ranks of its stage, in place, and returns it.
AllReduce = Callable[[torch.Tensor], torch.Tensor]


ROPE_TABLE_POSITIONS = 1024  # the first RoPE table's positions (``LlamaModel.rope``; it grows by doubling)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 and cast back, as Hugging Face does."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class FusedLayer:
    """One decoder layer's weights, with q|k|v and gate|up concatenated for one GEMM each.
    The four projections are plain tensors, or ``QuantizedLinear`` in a quantized model."""

    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    qkv: Weight
    qkv_bias: torch.Tensor | None
    o: Weight
    o_bias: torch.Tensor | None
    gate_up: Weight
    down: Weight

    def tensors(self) -> list[Weight]:
        return [t for t in (self.input_layernorm, self.post_attention_layernorm, self.qkv,
                            self.qkv_bias, self.o, self.o_bias, self.gate_up, self.down)
                if t is not None]

    def with_dtype(self, dtype: torch.dtype) -> FusedLayer:
        """Norms and biases (what stays 16 bit in a quantized model) cast to ``dtype``."""
        def c(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)
        def w(t: Weight) -> Weight:
            return t.to(dtype) if isinstance(t, torch.Tensor) else t
        return FusedLayer(self.input_layernorm.to(dtype), self.post_attention_layernorm.to(dtype), w(self.qkv),
                          c(self.qkv_bias), w(self.o), c(self.o_bias), w(self.gate_up), w(self.down))


#: The four projections of a layer a scheme quantizes (FusedLayer field names).
PROJECTIONS = ("qkv", "o", "gate_up", "down")


class LlamaModel:
    """Holds the weights (read-only, shareable across engines) and runs the forward."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, quantization: QuantConfig | None = None,
                 smoothing: Smoothing | None = None) -> None:
        """``quantization`` (engine/model/quantization.py) quantizes the projections from the fp32
        ``weights`` and the embedding / LM head table; it computes in bfloat16 only.
        ``smoothing`` is only recorded here (what engine/model/smoothing.py moved): the ``weights``
        passed are already smoothed."""
        check_tensors(config, {k: tuple(v.shape) for k, v in weights.items()}, "weights")
        if quantization is not None and dtype != torch.bfloat16:
            raise ValueError(f"dtype: quantization={quantization.scheme!r} computes in bfloat16, got {dtype}")
        self.config = config
        self.dtype = dtype
        self.quantization = quantization
        self.quant_cache_status = "none"  # quantized: "hit" / "miss" / "rebuilt" / "off" (quant_cache.py)
        self.smoothing = smoothing
        # Quantized: the tensors to quantize stay fp32 (quantized from the originals below).
        w = {k: v if quantization is not None and (is_linear_weight(k) or is_table(k)) else v.to(dtype)
             for k, v in weights.items()}
        self.embed_tokens: Weight = w["model.embed_tokens.weight"]  # [V, h]
        self.norm = w["model.norm.weight"]
        # Tied: the embedding is the head (as Hugging Face ties it), whatever else was passed.
        self.lm_head: Weight = self.embed_tokens if config.tie_word_embeddings else w["lm_head.weight"]
        if quantization is None:
            self.layers = [self._fuse_layer(w, i) for i in range(config.num_hidden_layers)]
        else:
            c = config
            check_group_size(quantization, {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
                                            "o_proj (heads x head_dim)": c.num_attention_heads * c.head_dim})
            full = {k: v.float() for k, v in w.items()}  # fp32 originals (no copy if already fp32)
            fused = [self._fuse_layer(full, i) for i in range(c.num_hidden_layers)]

            def build() -> dict[str, QuantizedLinear]:
                out: dict[str, QuantizedLinear] = {}
                for i, layer in enumerate(fused):
                    for proj in PROJECTIONS:
                        t = getattr(layer, proj)
                        assert isinstance(t, torch.Tensor)
                        out[f"layers.{i}.{proj}"] = quantize_weight(t, quantization)
                out["embed_tokens"] = quantize_table(full["model.embed_tokens.weight"], quantization)
                if not c.tie_word_embeddings:
                    out["lm_head"] = quantize_table(full["lm_head.weight"], quantization)
                return out

            # The quantized tensors come from the disk cache when it has them (quant_cache.py).
            q, self.quant_cache_status = cached_quantize(weights, quantization, build)
            self.layers = [replace(layer, qkv=q[f"layers.{i}.qkv"], o=q[f"layers.{i}.o"],
                                   gate_up=q[f"layers.{i}.gate_up"], down=q[f"layers.{i}.down"]).with_dtype(dtype)
                           for i, layer in enumerate(fused)]
            self.embed_tokens = q["embed_tokens"]
            self.lm_head = self.embed_tokens if c.tie_word_embeddings else q["lm_head"]
        c = config
        # A pipeline / tensor-parallel shard (engine/parallel/shard.py) holds layers [first_layer, ...)
        # only, with its share of the heads and columns, and sums partial outputs with all_reduce.
        self.first_layer = 0
        self.all_reduce: AllReduce | None = None
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
        self._inv_freq = inv_freq.to(self.device)  # [head_dim / 2] fp32, the same arithmetic as HF
        self._rope = self._rope_table(ROPE_TABLE_POSITIONS)  # [2, P, 1, head_dim] (``rope``)

    @staticmethod
    def _fuse_layer(w: dict[str, torch.Tensor], i: int) -> FusedLayer:
        p = f"model.layers.{i}."
        qkv_bias = None
        if p + "self_attn.q_proj.bias" in w:
            qkv_bias = torch.cat([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
        return FusedLayer(
            input_layernorm=w[p + "input_layernorm.weight"],
            post_attention_layernorm=w[p + "post_attention_layernorm.weight"],
            # Fused projections: one GEMM instead of three (q|k|v) and two (gate|up).
            qkv=torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
            qkv_bias=qkv_bias,
            o=w[p + "self_attn.o_proj.weight"],
            o_bias=w.get(p + "self_attn.o_proj.bias"),
            gate_up=torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
            down=w[p + "mlp.down_proj.weight"],
        )

    # -- forward pieces -----------------------------------------------------------------
    def rope(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, d] in the model's dtype for the batch's positions: rows of a table of
        every position below the longest context seen so far (``_rope_table``; it doubles when a
        context outgrows it). Why: the ten torch ops that compute them per step cost ~0.15 ms right
        after a decode step's weights have streamed through the caches, and a table row is the
        same whatever else shares the batch."""
        end = max(batch.seq_lens, default=0)  # every position is below its request's context length
        table = self._rope
        if table.shape[1] < end:
            table = self._rope = self._rope_table(max(end, 2 * table.shape[1]))
        cos, sin = table[:, batch.positions].unbind(0)
        return cos, sin

    def _rope_table(self, n: int) -> torch.Tensor:
        """[2, n, 1, d]: cos and sin of positions 0..n-1, the same arithmetic as HF's rotary
        embedding (position x inv_freq in fp32, duplicated to d, then cos / sin, cast to dtype)."""
        freqs = torch.arange(n, device=self.device).float().unsqueeze(1) * self._inv_freq.unsqueeze(0)  # [n, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return torch.stack((emb.cos().to(self.dtype), emb.sin().to(self.dtype))).unsqueeze(2)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        if isinstance(self.embed_tokens, QuantizedLinear):
            return self.embed_tokens.embed(batch.input_ids)  # [T, h] bf16, rows dequantized
        return self.embed_tokens[batch.input_ids]  # [T, h]

    def run_layers(self, hidden: torch.Tensor, batch: ForwardBatch,
                   kv_caches: list[tuple[KVCache, KVCache]],
                   start: int = 0, end: int | None = None, observer: Observer | None = None,
                   attention: AttentionBackend = TORCH_ATTENTION) -> torch.Tensor:
        """Layers [start, end) over the batch; ``self.layers`` and ``kv_caches`` hold layers
        first_layer .. (all of them, except in a pipeline stage's shard).

        Tensor parallel (``all_reduce`` set): each rank computes its heads' attention and its
        MLP columns; o_proj and down_proj (row-parallel) give partial sums, all-reduced before
        the residual add, so every rank ends the layer with the full hidden state.

        ``observer`` (see ``Observer``) sees the input of every linear call just before it;
        when it is None nothing extra is computed, and either way the output is bit-identical.
        ``attention`` is the attention backend (engine/model/attention.py; the torch one by default).
        A decode-only step on CPU (fp32, or int4 weights) runs the layers in C instead
        (engine/model/cpu_decode.py says where).
        """
        c = self.config
        end = c.num_hidden_layers if end is None else end
        whole = observer is None and start == 0 == self.first_layer and end == c.num_hidden_layers \
            and self.all_reduce is None
        cos, sin = self.rope(batch)
        if cpu_decode.applies(c, self.layers, hidden, batch, kv_caches, whole, attention.name):
            # the same arithmetic, in one C call
            return cpu_decode.run_layers(c, self.layers, hidden, cos, sin, batch, kv_caches)
        nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        scale = d ** -0.5
        T = hidden.shape[0]
        for i in range(start, end):
            layer = self.layers[i - self.first_layer]
            k_cache, v_cache = kv_caches[i - self.first_layer]
            x = rms_norm(hidden, layer.input_layernorm, c.rms_norm_eps)
            if observer is not None:
                observer(i, "qkv", x)
            qkv = linear(x, layer.qkv, layer.qkv_bias)  # [T, (nq + 2 nkv) d]
            # (the ignore: torch leaves Tensor.split unannotated)
            q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)  # type: ignore[no-untyped-call]
            q = q.view(T, nq, d)
            k = k.view(T, nkv, d)
            v = v.view(T, nkv, d)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            attention.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
            attn = attention.attention(q, k_cache, v_cache, batch, scale)  # [T, nq, d]
            a = attn.reshape(T, nq * d)
            if observer is not None:
                observer(i, "o", a)
            hidden = hidden + self._reduce(linear(a, layer.o, layer.o_bias))
            x = rms_norm(hidden, layer.post_attention_layernorm, c.rms_norm_eps)
            if observer is not None:
                observer(i, "gate_up", x)
            gate, up = linear(x, layer.gate_up).chunk(2, dim=-1)
            act = F.silu(gate) * up  # [T, intermediate]
            if observer is not None:
                observer(i, "down", act)
            hidden = hidden + self._reduce(linear(act, layer.down))
        return hidden

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.all_reduce is None else self.all_reduce(partial)

    def compute_logits(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Final norm and LM head for the sampled rows only: [S, V] fp32."""
        rows = hidden if batch.logits_all_rows else hidden[batch.logits_indices]
        eps = self.config.rms_norm_eps
        h = cpu_decode.final_norm(rows, self.norm, eps) if cpu_decode.norm_applies(rows, self.norm) \
            else rms_norm(rows, self.norm, eps)
        return linear(h, self.lm_head).float()

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[KVCache, KVCache]],
                observer: Observer | None = None, attention: AttentionBackend = TORCH_ATTENTION) -> torch.Tensor:
        hidden = self.run_layers(self.embed(batch), batch, kv_caches, observer=observer, attention=attention)
        return self.compute_logits(hidden, batch)

    @property
    def device(self) -> torch.device:
        """Where the weights live (EngineConfig.device: the KV cache and each step's batch follow)."""
        return self.norm.device

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight as stored (codes + scales for a quantized one)."""
        tensors: list[Weight] = [self.embed_tokens, self.norm]
        if self.lm_head is not self.embed_tokens:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors.extend(layer.tensors())
        return sum(t.nbytes if isinstance(t, QuantizedLinear) else t.numel() * t.element_size() for t in tensors)
