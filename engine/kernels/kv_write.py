"""Writing this step's K/V into the paged cache through the slot mapping (a Triton kernel).

Rule: token t's K (and V) [kv_heads, head_dim] go to slot s = slot_mapping[t], i.e. block
s // block_size, offset s % block_size of the cache [num_blocks, block_size, kv_heads, head_dim],
cast to the cache's dtype. One program per token writes all its heads:

    k [T, kv_heads, head_dim]        slot_mapping [T]         k_cache [num_blocks, block_size, ...]
    t=0  [h0 | h1]  ------------->   s=37  ---------------->  block 37 // bs, offset 37 % bs
    t=1  [h0 | h1]  ------------->   s=5   ---------------->  block  5 // bs, offset  5 % bs

Invariant: only the T addressed slots change; slots are distinct within a step (the engine's
block tables are disjoint), so the programs never race. A quantized cache (int8 / fp8 with
per-token-head scales, engine/model/kv_quant.py) is refused with a ValueError naming k_cache:
its write (absmax scale, round-half-even) is not ported yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.validation import check_kv_write


@triton.jit
def _write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    ok = (h[:, None] < KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=ok)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=ok)
    tl.store(kc_ptr + blk * stride_cb + off * stride_cs + h[:, None] * stride_ch + d[None, :],
             k.to(kc_ptr.dtype.element_ty), mask=ok)
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :],
             v.to(vc_ptr.dtype.element_ty), mask=ok)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter k, v [T, kv_heads, head_dim] into the caches' slots [T], in place (module rule).
    Bad inputs (shapes, dtypes, a slot outside the cache, a quantized cache) are a ValueError
    naming the argument, before the launch."""
    check_kv_write(k_cache, v_cache, k, v, slot_mapping)
    if k.shape[0] == 0:
        return
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache: the caches must be contiguous (the kernel writes them in place)")
    k, v = k.contiguous(), v.contiguous()
    kvh, d = k.shape[1], k.shape[2]
    _write_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        KV_HEADS=kvh, HEAD_DIM=d, H_PAD=_pow2(kvh), D_PAD=_pow2(d), BLOCK_SIZE=k_cache.shape[1],
    )
