"""A prefill outside the engine's pool: a throwaway KV cache and fresh-request batches.

Perplexity (engine/studies/evaluation.py), the activation statistics (engine/model/activations.py
``observe_prefill``) and the KV-dtype trade-off (engine/studies/quant_tradeoff.py ``kv_tradeoff``) run
token sequences through a model without touching an engine's pool or its requests:

    pool      ModelRunner(model, ceil(capacity / block_size) blocks, block_size, kv dtype)
    chunks    c0 c1 ...   each a fresh request (start 0, the whole chunk, no row sampled unless
                          ``logits_indices`` says): positions 0 .. len(ci) - 1, its K/V at
                          consecutive slots packed in order
                          (c0 at 0 .. len(c0) - 1, c1 at len(c0) .. len(c0) + len(c1) - 1, ...)

Invariant: one batch's chunks hold at most ``capacity`` tokens, so every slot lies in the
pool. Nothing is freed or kept between batches: a later batch overwrites the slots an earlier
one wrote, and no chunk reads another's slots (each attends to its own context only).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from engine.model.forward_batch import ForwardBatch, build_forward_batch
from engine.model.kv_quant import KVCache
from engine.model.runner import ModelRunner
from engine.model.llama import LlamaModel, Observer

__all__ = ["PrivatePrefill"]


class PrivatePrefill:
    """``model`` over a private KV pool of ``capacity`` tokens in ``kv_cache_dtype`` (module doc)."""

    def __init__(self, model: LlamaModel, capacity: int, block_size: int, kv_cache_dtype: str) -> None:
        self.model = model
        self.capacity = capacity
        self.runner = ModelRunner(model, -(-capacity // block_size), block_size, kv_cache_dtype)

    @property
    def kv_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Per layer (K, V) pools [num_blocks, block_size, kv_heads, head_dim], as the last batch left them."""
        return self.runner.kv_caches

    def batch(self, chunks: Sequence[Sequence[int]], logits_indices: torch.Tensor | None = None) -> ForwardBatch:
        """The chunks as fresh requests at packed slots (module doc); ``logits_indices`` [S], when
        given, replaces the batch's (empty) sampled rows."""
        starts = [sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
        slot_tables = [list(range(s, s + len(c))) for s, c in zip(starts, chunks)]
        batch = build_forward_batch([list(c) for c in chunks], [0] * len(chunks), slot_tables, [False] * len(chunks))
        return batch if logits_indices is None else replace(batch, logits_indices=logits_indices, logits_all_rows=False)

    def logits(self, ids: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
        """One prefill of ``ids`` [L] -> the model's logits at rows ``rows`` [n]: [n, V]."""
        return self.model.forward(self.batch([ids], rows), self.runner.kv_caches)

    def observe(self, chunks: Sequence[Sequence[int]], observer: Observer) -> None:
        """One flattened prefill of ``chunks`` through the decoder layers (no LM head), with
        ``observer`` seeing every linear input."""
        batch = self.batch(chunks)
        self.model.run_layers(self.model.embed(batch), batch, self.runner.kv_caches, observer=observer)
