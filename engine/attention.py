"""Paged attention over a flattened mixed batch: the torch reference (CPU; the oracle).

Each layer's cache is ``[num_blocks, block_size, kv_heads, head_dim]``; viewed flat it is
``[num_slots, kv_heads, head_dim]`` and a token's K/V live at its slot (see kv_cache.py).

Rule: query token at position p of a request attends to that request's positions 0..p,
whether they were computed in an earlier step (cached prefix) or in this one (causal within
the chunk). Decodes (one query each) are gathered into one padded batch; prefill chunks are
computed one request at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.forward_batch import ForwardBatch


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter this step's K/V ([T, kv_heads, head_dim]) into their slots."""
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    batch: ForwardBatch, scale: float) -> torch.Tensor:
    """q [T, heads, head_dim] -> out [T, heads, head_dim]; K/V already written for this step."""
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, kvh, d)
    v_flat = v_cache.view(-1, kvh, d)
    out = torch.empty_like(q)
    for seq in batch.prefills:
        qs = q[seq.q_start: seq.q_start + seq.q_len].transpose(0, 1)  # [H, n, d]
        ks = k_flat[seq.kv_slots].to(q.dtype).transpose(0, 1)  # [KVH, L, d]
        vs = v_flat[seq.kv_slots].to(q.dtype).transpose(0, 1)
        if seq.q_len == seq.seq_len:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            first = seq.seq_len - seq.q_len
            rows = torch.arange(first, seq.seq_len).unsqueeze(1)
            mask = torch.arange(seq.seq_len).unsqueeze(0) <= rows  # [n, L]
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[seq.q_start: seq.q_start + seq.q_len] = o.transpose(0, 1)
    if batch.decode_rows.numel():
        qd = q[batch.decode_rows].unsqueeze(2)  # [D, H, 1, d]
        kd = k_flat[batch.decode_slots].to(q.dtype).transpose(1, 2)  # [D, KVH, Lmax, d]
        vd = v_flat[batch.decode_slots].to(q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=batch.decode_mask, scale=scale,
                                           enable_gqa=True)
        out[batch.decode_rows] = o.squeeze(2)
    return out
