"""A worker's slice of the model: one pipeline stage's layers, one tensor-parallel rank's heads
and columns (engine/parallel/layout.py decides which).

    qkv  [(nq + 2 nkv) d, h]  column-parallel: the rows of this rank's q heads, k heads, v heads
    o    [h, nq d]            row-parallel: the columns of its q heads -> partial sums, all-reduced
    gate_up [2 I, h]          column-parallel: its gate rows and its up rows
    down [h, I]               row-parallel: its columns -> partial sums, all-reduced

Biases of the column-parallel projections are sliced with their rows; o_proj's bias is kept
on rank 0 only, so the all-reduce adds it once. The embedding lives on the first stage, the
final norm and LM head on the last; the other stages hold empty tensors in their place.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch

from engine.model.llama import FusedLayer, LlamaModel
from engine.core.trace import StageLayout, TensorShard

_NOTHING = torch.empty(0)


def shard_model(model: LlamaModel, stage: StageLayout, shard: TensorShard, num_stages: int,
                tensor_parallel_size: int) -> LlamaModel:
    """A LlamaModel holding only what rank (stage, shard.tp_rank) computes: new tensors, so the
    full model can be freed. ``all_reduce`` is left for the worker to set (t > 1)."""
    out = copy.copy(model)
    c = model.config
    layers = model.layers[stage.start_layer:stage.end_layer]
    if tensor_parallel_size > 1:
        out.config = replace(c, num_attention_heads=shard.q_end - shard.q_start,
                             num_key_value_heads=shard.kv_end - shard.kv_start,
                             intermediate_size=shard.mlp_end - shard.mlp_start)
        layers = [_slice_layer(layer, model, shard) for layer in layers]
    out.layers = [_own(layer) for layer in layers]
    out.first_layer = stage.start_layer
    first, last = stage.stage == 0, stage.stage == num_stages - 1
    out.embed_tokens = model.embed_tokens if first else _NOTHING
    out.lm_head = model.lm_head if last else _NOTHING
    out.norm = model.norm if last else _NOTHING
    return out


def _slice_layer(layer: FusedLayer, model: LlamaModel, s: TensorShard) -> FusedLayer:
    c, d = model.config, model.config.head_dim
    nq, nkv, inter = c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    qkv_rows = torch.cat([torch.arange(s.q_start * d, s.q_end * d),
                          nq * d + torch.arange(s.kv_start * d, s.kv_end * d),
                          (nq + nkv) * d + torch.arange(s.kv_start * d, s.kv_end * d)])
    mlp_rows = torch.cat([torch.arange(s.mlp_start, s.mlp_end), inter + torch.arange(s.mlp_start, s.mlp_end)])
    qkv, o, gate_up, down = (_plain(w) for w in (layer.qkv, layer.o, layer.gate_up, layer.down))
    return FusedLayer(
        input_layernorm=layer.input_layernorm,
        post_attention_layernorm=layer.post_attention_layernorm,
        qkv=qkv[qkv_rows],  # [(nq_r + 2 nkv_r) d, h]
        qkv_bias=None if layer.qkv_bias is None else layer.qkv_bias[qkv_rows],
        o=o[:, s.q_start * d:s.q_end * d],  # [h, nq_r d]
        o_bias=layer.o_bias if s.tp_rank == 0 else None,
        gate_up=gate_up[mlp_rows],  # [2 I_r, h]
        down=down[:, s.mlp_start:s.mlp_end],  # [h, I_r]
    )


def _plain(w: object) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):  # EngineConfig refuses quantization with t > 1
        raise ValueError("tensor_parallel_size: quantized weights cannot be split across ranks")
    return w


def _own(layer: FusedLayer) -> FusedLayer:
    """Contiguous copies of the plain tensors (a slice would keep the whole matrix alive)."""
    def own(t: object) -> object:
        return t.contiguous().clone() if isinstance(t, torch.Tensor) else t
    return FusedLayer(*(own(getattr(layer, f)) for f in FusedLayer.__dataclass_fields__))  # type: ignore[arg-type]
