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

from collections.abc import Sequence

from engine.trace import ParallelLayout, ScheduleName, StageLayout, TensorShard


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
                 schedule: ScheduleName = "gpipe", num_microbatches: int = 1,
                 split: Sequence[int] | None = None) -> ParallelLayout:
    return ParallelLayout(p, t, schedule, num_microbatches, stage_layouts(num_layers, p, split),
                          tensor_shards(num_heads, num_kv_heads, intermediate_size, t))


def theory_bubble(p: int, m: int) -> float:
    """GPipe's bubble fraction for p stages and m equal units back to back: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)
