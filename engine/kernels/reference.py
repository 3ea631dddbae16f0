"""The float64 torch reference of ``paged_attention``: the oracle the kernels are tested against.

Rule: for request i (new tokens rows qsl[i] .. qsl[i+1] - 1, context seq_len = seq_lens[i]),
position p's K/V is at block block_tables[i, p // block_size], offset p % block_size; the query at
position p = seq_len - q_len + j attends to positions 0..p with softmax(q·kᵀ · scale) (query head h
reads KV head h // (heads / kv_heads)). Computed in float64 with the whole score matrix
materialised: no tiles, no online softmax, nothing in common with the kernel but the rule.
"""
from __future__ import annotations

import torch


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                              scale: float, k_scale: torch.Tensor | None = None,
                              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same arguments and layouts as ``engine.kernels.paged_attention`` -> [T, heads, head_dim] float64
    (a quantized cache: data * scale, in float64)."""
    heads, d = q.shape[1], q.shape[2]
    block_size, kvh = k_cache.shape[1], k_cache.shape[2]
    group = heads // kvh
    out = torch.zeros(q.shape, dtype=torch.float64)
    qsl = [int(x) for x in query_start_loc.tolist()]
    for i, seq_len in enumerate(int(x) for x in seq_lens.tolist()):
        pos = torch.arange(seq_len)
        blocks = block_tables[i].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].double()  # [L, KVH, d]
        v = v_cache[blocks, pos % block_size].double()
        if k_scale is not None and v_scale is not None:
            k = k * k_scale[blocks, pos % block_size].double().unsqueeze(-1)
            v = v * v_scale[blocks, pos % block_size].double().unsqueeze(-1)
        k = k.repeat_interleave(group, dim=1)  # [L, H, d]
        v = v.repeat_interleave(group, dim=1)
        qs = q[qsl[i]: qsl[i + 1]].double()  # [n, H, d]
        n = qs.shape[0]
        scores = torch.einsum("nhd,lhd->hnl", qs, k) * scale  # [H, n, L]
        allowed = pos[None, :] <= torch.arange(seq_len - n, seq_len)[:, None]  # [n, L]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[qsl[i]: qsl[i + 1]] = torch.einsum("hnl,lhd->nhd", probs, v)
    return out
