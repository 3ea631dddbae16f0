"""Paged attention over a flattened mixed batch: the attention-backend seam and its torch
backend, the reference (CPU; the oracle).

The seam: ``AttentionBackend`` is the one call per layer the Llama forward makes (write this
step's K/V into their slots, then attend); ``attention_backend(name)`` picks one by
``EngineConfig.attention_backend`` from ``ATTENTION_BACKENDS``. A new backend (e.g. Triton) is
one module with a class of these two methods, plus one entry in ``ATTENTION_BACKENDS``
(docs/architecture.md); "triton" (triton_attention.py, over engine/kernels) is one. The rest
of this docstring is the torch backend's.

Each layer's cache is ``[num_blocks, block_size, kv_heads, head_dim]``; viewed as rows it is
``[num_slots, kv_heads * head_dim]`` and a token's K/V live at its slot (see kv_cache.py).

Rule: query token at position p of a request attends to that request's positions 0..p,
whether they were computed in an earlier step (cached prefix) or in this one (causal within
the chunk).

How the batch is cut (the layout is built once per step in forward_batch.py):

    flat batch rows   [ d0 | p1 p1 p1 | d2 | d3 ]      d = decode, p = prefill chunk
    prefill chunks    one SDPA per request over exactly its seq_len slots
    decodes           one SDPA per decode group; a group is padded to its own longest
                      context, so a short decode never pays for a long one elsewhere:

        group A (short)   d0: [s s s s . .]   d3: [s s s s s s]     width 6, '.' masked
        group B (long)    d2: [s s s s s s s s s s s s s s s s s]   width 17, no mask

Invariant: each row's output depends only on its own request's K/V at exactly its own
positions (padding slots repeat the row's own last slot and are masked), so the result
equals one attention per request over exactly its slots, whatever the grouping.

Decode groups use the GQA layout directly: the query heads that share a KV head become the
rows of one query block, ``q [n, kv_heads, heads / kv_heads, d]`` against ``k [n, kv_heads,
width, d]``, so K/V are never repeated per query head. Gathers use ``index_select`` on the
row view (one contiguous row per slot), which is several times cheaper on CPU than advanced
indexing of the 3-D view.

A layer cache may be quantized (``kv_quant.QuantizedKV``: int8/fp8 data + fp32 scales per
token-head): ``write_kv`` quantizes, ``gather_kv`` dequantizes into the compute dtype, so the
attention below runs on exactly the values the cache holds.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.model import kv_quant
from engine.model.forward_batch import DecodeGroup, ForwardBatch, SequenceKV
from engine.model.kv_quant import KVCache, QuantizedKV
from engine.model.triton_attention import TritonAttention

#: What attention gathers from: a float cache as rows [num_slots, kvh * d], or a quantized cache.
KVRows = torch.Tensor | QuantizedKV


def write_kv(k_cache: KVCache, v_cache: KVCache, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter this step's K/V ([T, kv_heads, head_dim]) into their slots (quantizing into a
    quantized cache: data and per-token-head scales)."""
    kvh, d = k.shape[1], k.shape[2]
    for cache, x in ((k_cache, k), (v_cache, v)):
        if isinstance(cache, QuantizedKV):
            kv_quant.write(cache, x, slot_mapping)
        else:
            cache.view(-1, kvh, d).index_copy_(0, slot_mapping, x.to(cache.dtype))


def as_rows(cache: KVCache) -> KVRows:
    """A float cache [num_blocks, block_size, kvh, d] as rows [num_slots, kvh * d]; a quantized
    cache as itself (it gathers its own rows)."""
    if isinstance(cache, QuantizedKV):
        return cache
    return cache.view(-1, cache.shape[2] * cache.shape[3])


def _kv_heads(rows: KVRows, d: int) -> int:
    return rows.shape[2] if isinstance(rows, QuantizedKV) else rows.shape[1] // d


def gather_kv(cache_rows: KVRows, slots: torch.Tensor, kvh: int, dtype: torch.dtype) -> torch.Tensor:
    """cache_rows [num_slots, kvh * d] (or a quantized cache), slots [L] -> [L, kvh, d] in the
    compute dtype (dequantized: data * scale)."""
    if isinstance(cache_rows, QuantizedKV):
        return kv_quant.gather(cache_rows, slots, dtype)
    return cache_rows.index_select(0, slots).view(slots.shape[0], kvh, -1).to(dtype)


def prefill_attention(q: torch.Tensor, k_rows: KVRows, v_rows: KVRows,
                      seq: SequenceKV, scale: float) -> torch.Tensor:
    """One request's chunk: q [T, H, d] (whole batch) -> [q_len, H, d]."""
    kvh = _kv_heads(k_rows, q.shape[2])
    qs = q[seq.q_start: seq.q_start + seq.q_len].transpose(0, 1)  # [H, n, d]
    ks = gather_kv(k_rows, seq.kv_slots, kvh, q.dtype).transpose(0, 1)  # [KVH, L, d]
    vs = gather_kv(v_rows, seq.kv_slots, kvh, q.dtype).transpose(0, 1)  # [KVH, L, d]
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seq.mask, is_causal=seq.mask is None,
                                       scale=scale, enable_gqa=True)  # [H, n, d]
    return o.transpose(0, 1)


def decode_group_attention(q_rows: torch.Tensor, k_rows: KVRows, v_rows: KVRows,
                           group: DecodeGroup, scale: float) -> torch.Tensor:
    """One decode group: q_rows [n, H, d] (the group's rows, in order) -> [n, H, d]."""
    n, w = group.num_rows, group.width
    heads, d = q_rows.shape[1], q_rows.shape[2]
    kvh = _kv_heads(k_rows, d)
    q = q_rows.reshape(n, kvh, heads // kvh, d)  # [n, KVH, G, d]: G query heads per KV head
    kg = gather_kv(k_rows, group.slots, kvh, q.dtype).view(n, w, kvh, d).transpose(1, 2)  # [n, KVH, w, d]
    vg = gather_kv(v_rows, group.slots, kvh, q.dtype).view(n, w, kvh, d).transpose(1, 2)  # [n, KVH, w, d]
    o = F.scaled_dot_product_attention(q, kg, vg, attn_mask=group.mask, scale=scale)  # [n, KVH, G, d]
    return o.reshape(n, heads, d)


def paged_attention(q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
                    batch: ForwardBatch, scale: float) -> torch.Tensor:
    """q [T, heads, head_dim] -> out [T, heads, head_dim]; K/V already written for this step."""
    k_rows = as_rows(k_cache)  # [num_slots, KVH * d] (or the quantized cache)
    v_rows = as_rows(v_cache)
    groups = batch.decode_groups
    if not batch.prefills and len(groups) == 1:  # decode-only step, one group = rows 0..T-1
        return decode_group_attention(q, k_rows, v_rows, groups[0], scale)
    out = torch.empty_like(q)
    for seq in batch.prefills:
        out[seq.q_start: seq.q_start + seq.q_len] = prefill_attention(q, k_rows, v_rows, seq, scale)
    for group in groups:
        o = decode_group_attention(q.index_select(0, group.rows), k_rows, v_rows, group, scale)
        out.index_copy_(0, group.rows, o)
    return out


class AttentionBackend(Protocol):
    """One layer's attention over a flattened batch, with that layer's paged K/V cache."""

    name: str

    def write_kv(self, k_cache: KVCache, v_cache: KVCache, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Scatter this step's K/V [T, kv_heads, head_dim] into their slots."""
        ...

    def attention(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, batch: ForwardBatch,
                  scale: float) -> torch.Tensor:
        """q [T, heads, head_dim] -> [T, heads, head_dim]; each row attends to its own request's
        positions 0..p (K/V of this step already written)."""
        ...


class TorchAttention:
    """The reference backend: ``write_kv`` and ``paged_attention`` above."""

    name = "torch"

    def write_kv(self, k_cache: KVCache, v_cache: KVCache, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv(k_cache, v_cache, k, v, slot_mapping)

    def attention(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, batch: ForwardBatch,
                  scale: float) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, batch, scale)


TORCH_ATTENTION = TorchAttention()

#: EngineConfig.attention_backend -> the backend's constructor (given EngineConfig.device).
ATTENTION_BACKENDS: dict[str, Callable[[str], AttentionBackend]] = {
    "torch": lambda device: TORCH_ATTENTION,  # SDPA runs on either device
    "triton": lambda device: TritonAttention(device=device),
}


def attention_backend(name: str, device: str = "cpu") -> AttentionBackend:
    """The backend registered as ``name`` for tensors on ``device``; an unknown one (or one that
    cannot run there) is a ValueError naming the knob."""
    factory = ATTENTION_BACKENDS.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"attention_backend: must be one of {sorted(ATTENTION_BACKENDS)}, got {str(name)[:40]!r}")
    return factory(device)
