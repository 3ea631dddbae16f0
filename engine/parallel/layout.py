"""How a model is split over p pipeline stages x t tensor-parallel ranks (torch-free, so the
calculator and the page can use it without loading torch).

    rank = stage * t + tp_rank            p = 2, t = 2, 30 layers, 9 q heads / 3 KV heads:
                                          stage 0: layers [0, 15)   stage 1: layers [15, 30)
                                          tp 0: q heads [0, 6) kv [0, 2) · tp 1: q [6, 9) kv [2, 3)

Pipeline: contiguous layer ranges, as even as possible (the first stages take the remainder)
unless a split is given. Tensor: KV heads are cut into t contiguous groups and each rank takes
the query heads that read them (so every rank keeps the model's GQA ratio); when t exceeds the
KV heads, each KV head is replicated on t / kv_heads ranks that split its query heads. MLP
columns are cut into t contiguous ranges.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from engine.core.config import PipelineSchedule
from engine.core.trace import ParallelLayout, StageLayout, TensorShard


def even_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """[0, n) cut into k contiguous ranges whose sizes differ by at most one (larger first)."""
    base, extra = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def stage_layouts(num_layers: int, p: int, split: Sequence[int] | None = None) -> tuple[StageLayout, ...]:
    """Layer ranges of the p stages; ``split`` gives layers per stage (ValueError naming
    pipeline_layer_split / pipeline_parallel_size when it does not fit the model)."""
    if p > num_layers:
        raise ValueError(f"pipeline_parallel_size: {p} stages need at least {p} layers; the model has "
                         f"{num_layers}")
    if split is None:
        ranges = even_ranges(num_layers, p)
    else:
        if len(split) != p or sum(split) != num_layers or min(split) < 1:
            raise ValueError(f"pipeline_layer_split: must give {p} layer counts >= 1 summing to the model's "
                             f"{num_layers} layers, got {list(split)}")
        ranges, start = [], 0
        for n in split:
            ranges.append((start, start + n))
            start += n
    return tuple(StageLayout(i, a, b) for i, (a, b) in enumerate(ranges))


def tensor_shards(num_heads: int, num_kv_heads: int, intermediate_size: int, t: int) -> tuple[TensorShard, ...]:
    """What each of t ranks holds (see the module docstring); ValueError naming
    tensor_parallel_size when the heads cannot be split that way."""
    group = num_heads // num_kv_heads  # query heads per KV head
    mlp = even_ranges(intermediate_size, t)
    if t > intermediate_size:
        raise ValueError(f"tensor_parallel_size: {t} ranks exceed the MLP's {intermediate_size} columns")
    if t <= num_kv_heads:
        kv = even_ranges(num_kv_heads, t)
        return tuple(TensorShard(r, a * group, b * group, a, b, *mlp[r]) for r, (a, b) in enumerate(kv))
    if t % num_kv_heads:
        raise ValueError(f"tensor_parallel_size: must be at most the model's {num_kv_heads} KV heads or a "
                         f"multiple of them (each KV head then replicated on t / {num_kv_heads} ranks), got {t}")
    replicas = t // num_kv_heads
    if replicas > group:
        raise ValueError(f"tensor_parallel_size: {t} ranks exceed the model's {num_heads} query heads")
    shards = []
    for r in range(t):
        kv_head, part = divmod(r, replicas)
        a, b = even_ranges(group, replicas)[part]
        shards.append(TensorShard(r, kv_head * group + a, kv_head * group + b, kv_head, kv_head + 1, *mlp[r]))
    return tuple(shards)


def build_layout(num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int, p: int, t: int,
                 schedule: PipelineSchedule = "gpipe", num_microbatches: int = 1,
                 split: Sequence[int] | None = None) -> ParallelLayout:
    return ParallelLayout(p, t, schedule, num_microbatches, stage_layouts(num_layers, p, split),
                          tensor_shards(num_heads, num_kv_heads, intermediate_size, t))


def theory_bubble(p: int, m: int) -> float:
    """GPipe's bubble fraction for p stages and m equal units back to back: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def front_heavy_split(num_layers: int, p: int) -> tuple[int, ...]:
    """Layers per stage with stage 0 taking about twice the share of each later stage (2:1:1...),
    every stage at least one layer: a deliberately unbalanced split, to see its bubbles."""
    if p < 1 or p > num_layers:
        raise ValueError(f"pipeline_parallel_size: {p} stages need 1 to {num_layers} layers")
    if p == 1:
        return (num_layers,)
    first = max(1, min(num_layers - (p - 1), round(num_layers * 2 / (p + 1))))
    rest = [b - a for a, b in even_ranges(num_layers - first, p - 1)]
    return (first, *rest)


def parse_layer_split(text: str) -> tuple[int, ...]:
    """"20, 10" or "20:10" -> (20, 10); ValueError naming pipeline_layer_split otherwise."""
    parts = [s.strip() for s in text.replace(":", ",").split(",") if s.strip()]
    if not parts or not all(s.isdigit() for s in parts):
        raise ValueError(f"pipeline_layer_split: give layers per stage as whole numbers, e.g. '20, 10'; "
                         f"got {text[:40]!r}")
    return tuple(int(s) for s in parts)


class ModelDims(NamedTuple):
    """The sizes of a Llama-family decoder that decide what each worker holds."""

    num_layers: int
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> "ModelDims":
        """From a Hugging Face config.json dict, read by the engine's one parser of it
        (engine/model/model_config.py: defaults and checks included)."""
        from engine.model.model_config import ModelConfig

        c = ModelConfig.from_hf(dict(config))
        return cls(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                   c.num_key_value_heads, c.head_dim, c.vocab_size, c.tie_word_embeddings)


class WorkerBytes(NamedTuple):
    """What one worker process holds: its stage's layers, sliced to its shard, and their KV cache."""

    rank: int
    stage: int
    tp_rank: int
    num_layers: int
    weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


def worker_bytes(layout: ParallelLayout, dims: ModelDims, dtype_bytes: float, pool_tokens: int,
                 kv_bytes_per_token: float | None = None) -> tuple[WorkerBytes, ...]:
    """Per-worker weights + KV pool, from the layout itself (the rule engine/parallel/shard.py slices by).

    Per layer, rank r holds q/o for its query heads, k/v for its KV heads (replicated when t
    exceeds the KV heads), gate/up/down for its MLP columns, both norms whole; the first stage
    holds the embedding (vocab x hidden), the last the final norm and the LM head (a tied head
    is one tensor with the embedding when one stage holds both). KV: pool_tokens x the model's
    KV bytes per token (the engine's ``kv_cache_bytes_per_token``, scales of a quantized cache
    included; default 2 x layers x KV heads x head_dim x ``dtype_bytes``) x the worker's share
    of layers and KV heads. ``dtype_bytes`` per weight element.
    """
    d, t = dims, layout.tensor_parallel_size
    per_token = (2 * d.num_layers * d.num_kv_heads * d.head_dim * dtype_bytes if kv_bytes_per_token is None
                 else kv_bytes_per_token)
    last = layout.pipeline_parallel_size - 1
    out = []
    for s in layout.stages:
        layers = s.end_layer - s.start_layer
        for shard in layout.shards:
            q = (shard.q_end - shard.q_start) * d.head_dim
            kv = (shard.kv_end - shard.kv_start) * d.head_dim
            mlp = shard.mlp_end - shard.mlp_start
            per_layer = 2 * d.hidden * q + 2 * d.hidden * kv + 3 * d.hidden * mlp + 2 * d.hidden
            elements = layers * per_layer
            if s.stage == 0:
                elements += d.vocab * d.hidden
            if s.stage == last:
                elements += d.hidden + (0 if d.tied and last == 0 else d.vocab * d.hidden)
            out.append(WorkerBytes(s.stage * t + shard.tp_rank, s.stage, shard.tp_rank, layers,
                                   round(elements * dtype_bytes),
                                   round(pool_tokens * per_token * layers * kv / (d.num_layers * d.num_kv_heads
                                                                                  * d.head_dim))))
    return tuple(out)


class CommBytes(NamedTuple):
    """Bytes on the wire per token of a forward pass."""

    pipeline: float  # activations sent across the p - 1 stage boundaries
    tensor: float  # per rank: 2 all-reduces per layer, each a ring moving 2 (t - 1) / t x hidden


def comm_bytes_per_token(hidden: int, num_layers: int, p: int, t: int, dtype_bytes: float) -> CommBytes:
    """PP: hidden x bytes per stage boundary per token. TP: a ring all-reduce of N bytes sends
    2 (t - 1) / t x N per rank; a layer does two (after attention and after the MLP)."""
    return CommBytes((p - 1) * hidden * dtype_bytes, num_layers * 2 * 2 * (t - 1) / t * hidden * dtype_bytes)
